"""Profile fastrl's throughput: raw env, sampling and training FPS on the same cores, the
per-component breakdown and a one-line bottleneck diagnosis; or search the throughput knobs.

    python scripts/profile_fps.py --profile cartpole-appo --seconds 15 --json /tmp/prof.json
    python scripts/profile_fps.py --profile atari-appo --set device=cpu --autotune --budget-seconds 300

The same command as `fastrl-profile` (fastrl.cli.profile_main; the work is in fastrl.profiler).
"""
import sys

from fastrl.cli import profile_main

if __name__ == "__main__":
    sys.exit(profile_main())
