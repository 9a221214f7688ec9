"""Side by side: a profile's steady env steps/s with and without some overrides, alternating.

    python scripts/bench_compare.py --set retain_freed_memory=false --rounds 3
    python scripts/bench_compare.py --profile atari-appo --pong --set learner.precision=auto
    python scripts/bench_compare.py --profile atari-appo-cpu --set learner.batch_size=256 --sampling
    git worktree add ../fastrl-2d7dbce 2d7dbce   # the code as it was at a commit, as the baseline:
    python scripts/bench_compare.py --profile atari-appo --pong --base-code ../fastrl-2d7dbce \
        --set learner.precision=auto

Each round measures the baseline (the profile with ``--base`` overrides, or bench_train's Pong
CPU layout with ``--pong``) and the variant (the same plus ``--set``) the way fastrl-profile
measures training or sampling (:func:`fastrl.profiler.measure.measure_run`: steady state after
start-up and warm-up), each run in a fresh interpreter. ``--base-code DIR`` runs the baseline
with another checkout of fastrl (DIR first on PYTHONPATH, e.g. a git worktree of an older
commit), so a change is measured against the code before it. Even rounds run the baseline first
and odd rounds the variant first (ABBA), so neither side always inherits the previous run's
leftovers or a drifting machine; the median of the per-round ratios is the figure to quote.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from fastrl.config import DEFAULT_PROFILE, ConfigError, build_config, parse_override
from fastrl.profiler import hardware
from fastrl.profiler.diagnosis import ProfileError
from fastrl.profiler.measure import PONG_ON_CPU, STARTUP_ESTIMATE_S, check_durations

# One measurement, in the interpreter of the code measured (this API dates back to 2026-11-23).
MEASURE = """
import json, sys
import fastrl
from fastrl.config import build_config
from fastrl.profiler.measure import measure_run_patiently
if __name__ == "__main__":
    profile, overrides, seconds, warmup, sampling, startup = json.loads(sys.argv[1])
    run = measure_run_patiently(build_config(profile, overrides), seconds, warmup, sampling, startup)
    print(json.dumps({"env_steps_per_s": run.env_steps_per_s, "startup_s": run.startup_s, "code": fastrl.__file__}))
"""


def measure(code: Path | None, profile: str, overrides: dict, args, startup_s: float) -> dict:
    """One run's steady env steps/s, start-up seconds and the fastrl it imported."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
    spec = json.dumps([profile, overrides, args.seconds, args.warmup, args.sampling, startup_s])
    # The interpreter puts its working directory first on sys.path: DIR's, so it imports DIR's fastrl.
    out = subprocess.run([sys.executable, "-c", MEASURE, spec], env=env, cwd=code, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench_compare: a run with {overrides} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def round_order(r: int) -> tuple[str, str]:
    return ("base", "variant") if r % 2 == 0 else ("variant", "base")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default=DEFAULT_PROFILE)
    p.add_argument("--set", dest="variant", action="append", required=True, metavar="SECTION.KEY=VALUE",
                   help="the variant's overrides (repeat for several)")
    p.add_argument("--base", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="overrides of both runs (default: device=cpu)")
    p.add_argument("--pong", action="store_true", help="both runs in bench_train's Pong CPU layout (PONG_ON_CPU)")
    p.add_argument("--base-code", type=Path, metavar="DIR",
                   help="run the baseline with the fastrl checkout in DIR (e.g. a git worktree of an older commit)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds of each run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of steady running before the window")
    p.add_argument("--sampling", action="store_true", help="measure sampling (sample_only) instead of training")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.base_code is not None and not (args.base_code / "fastrl" / "__init__.py").is_file():
        p.error(f"--base-code {args.base_code} holds no fastrl package (expected {args.base_code}/fastrl/__init__.py)")
    try:
        check_durations(args.seconds, args.warmup)
        changes = dict(parse_override(item) for item in args.variant)
        base = {**(PONG_ON_CPU if args.pong else {"device": "cpu"}),
                **dict(parse_override(item) for item in args.base)}
        build_config(args.profile, {**base, **changes})  # bad keys or values stop here, before any run
        if args.base_code is None:
            build_config(args.profile, base)
    except (ConfigError, ProfileError) as exc:
        p.error(str(exc))
    what = "sampling" if args.sampling else "training"
    rates: dict[str, list[float]] = {"base": [], "variant": []}
    ratios = []
    startup_s = STARTUP_ESTIMATE_S
    runs = {"base": (args.base_code.resolve() if args.base_code else None, base),
            "variant": (None, {**base, **changes})}
    for r in range(args.rounds):
        for name in round_order(r):
            code, overrides = runs[name]
            run = measure(code, args.profile, overrides, args, startup_s)
            startup_s = max(startup_s, run["startup_s"])
            rates[name].append(run["env_steps_per_s"])
            if r == 0:
                print(f"{name} imports {run['code']}", flush=True)
        ratios.append(rates["variant"][-1] / rates["base"][-1])
        print(f"round {r} ({' then '.join(round_order(r))}): {what} base {rates['base'][-1]:,.0f}  "
              f"variant {rates['variant'][-1]:,.0f} env steps/s  variant/base {ratios[-1]:.2f}", flush=True)
    print(f"hardware: {hardware()}")
    where = f" with the code in {args.base_code}" if args.base_code else ""
    print(f"{args.profile} {what}, base {base}{where}, variant adds {changes}: "
          f"variant/base median {statistics.median(ratios):.2f} over {args.rounds} rounds")
    print(json.dumps({"profile": args.profile, "measured": what, "base": base, "variant": {**base, **changes},
                      "base_code": str(args.base_code) if args.base_code else None,
                      "rates": rates, "ratios": ratios, "median_ratio": statistics.median(ratios),
                      "hardware": hardware()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
