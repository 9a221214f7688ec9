"""Side by side: a profile's steady env steps/s with and without some overrides, alternating.

    python scripts/bench.py compare --set retain_freed_memory=false --rounds 3
    python scripts/bench.py compare --setup pong-cpu --set learner.precision=auto
    python scripts/bench.py compare --profile atari-appo-cpu --set learner.batch_size=256 --sampling
    git worktree add ../fastrl-2d7dbce 2d7dbce   # the code as it was at a commit, as the baseline:
    python scripts/bench.py compare --setup pong-cpu --base-code ../fastrl-2d7dbce \
        --set learner.precision=auto

Each round measures the baseline (the profile on the CPU, or a setup of scripts/benchmarks/setups/
with ``--setup``, plus the ``--base`` overrides) and the variant (the same plus ``--set``) the way
fastrl-profile measures training or sampling (:func:`fastrl.profiler.measure.measure_run`: steady
state after start-up and warm-up), each run in a fresh interpreter. ``--base-code DIR`` runs the baseline
with another checkout of fastrl (DIR first on PYTHONPATH, e.g. a git worktree of an older
commit), so a change is measured against the code before it. Even rounds run the baseline first
and odd rounds the variant first (ABBA), so neither side always inherits the previous run's
leftovers or a drifting machine; the median of the per-round ratios is the figure to quote.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from fastrl.config import DEFAULT_PROFILE, build_config
from fastrl.profiler import hardware
from fastrl.profiler.measure import STARTUP_ESTIMATE_S, check_durations

from .options import add_rounds, add_set, add_setup, load_setup, overrides

# One measurement, in the interpreter of the code measured: it needs no more of that code than
# build_config and measure_run_patiently, so an older checkout can be the baseline.
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


def measure(code: Path | None, profile: str, settings: dict, args, startup_s: float) -> dict:
    """One run's steady env steps/s, start-up seconds and the fastrl it imported."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
    spec = json.dumps([profile, settings, args.seconds, args.warmup, args.sampling, startup_s])
    # The interpreter puts its working directory first on sys.path: DIR's, so it imports DIR's fastrl.
    out = subprocess.run([sys.executable, "-c", MEASURE, spec], env=env, cwd=code, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench.py compare: a run with {settings} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def round_order(r: int) -> tuple[str, str]:
    return ("base", "variant") if r % 2 == 0 else ("variant", "base")


def add_arguments(p) -> None:
    p.add_argument("--profile", help=f"the profile measured on the CPU (default {DEFAULT_PROFILE})")
    add_setup(p, "both runs in this setup, in place of --profile on the CPU")
    add_set(p, "the variant's overrides (repeat for several)", required=True)
    p.add_argument("--base", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides of both runs, on top of the profile's or the setup's")
    p.add_argument("--base-code", type=Path, metavar="DIR",
                   help="run the baseline with the fastrl checkout in DIR (e.g. a git worktree of an older commit)")
    add_rounds(p, 3, "base/variant pairs, alternating which runs first")
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds of each run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of steady running before the window")
    p.add_argument("--sampling", action="store_true", help="measure sampling (sample_only) instead of training")


# Bad input stops before any run, with one line.
ERRORS = (ValueError,)  # ConfigError, ProfileError


def run(args) -> dict:
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.base_code is not None and not (args.base_code / "fastrl" / "__init__.py").is_file():
        raise ValueError(f"--base-code {args.base_code} holds no fastrl package "
                         f"(expected {args.base_code}/fastrl/__init__.py)")
    if args.setup and args.profile:
        raise ValueError("--setup names its profile: leave --profile out")
    check_durations(args.seconds, args.warmup)
    setup = load_setup(args.setup) if args.setup else None
    profile = setup.profile if setup else args.profile or DEFAULT_PROFILE
    changes = overrides(args.set)
    base = {**(setup.overrides if setup else {"device": "cpu"}), **overrides(args.base)}
    build_config(profile, {**base, **changes})  # bad keys or values stop here, before any run
    if args.base_code is None:
        build_config(profile, base)
    what = "sampling" if args.sampling else "training"
    rates: dict[str, list[float]] = {"base": [], "variant": []}
    ratios = []
    startup_s = STARTUP_ESTIMATE_S
    runs = {"base": (args.base_code.resolve() if args.base_code else None, base),
            "variant": (None, {**base, **changes})}
    for r in range(args.rounds):
        for name in round_order(r):
            code, settings = runs[name]
            result = measure(code, profile, settings, args, startup_s)
            startup_s = max(startup_s, result["startup_s"])
            rates[name].append(result["env_steps_per_s"])
            if r == 0:
                print(f"{name} imports {result['code']}", flush=True)
        ratios.append(rates["variant"][-1] / rates["base"][-1])
        print(f"round {r} ({' then '.join(round_order(r))}): {what} base {rates['base'][-1]:,.0f}  "
              f"variant {rates['variant'][-1]:,.0f} env steps/s  variant/base {ratios[-1]:.2f}", flush=True)
    print(f"hardware: {hardware()}")
    where = f" with the code in {args.base_code}" if args.base_code else ""
    print(f"{profile} {what}, base {base}{where}, variant adds {changes}: "
          f"variant/base median {statistics.median(ratios):.2f} over {args.rounds} rounds")
    return {"profile": profile, "measured": what, "base": base, "variant": {**base, **changes},
            "base_code": str(args.base_code) if args.base_code else None,
            "rates": rates, "ratios": ratios, "median_ratio": statistics.median(ratios), "hardware": hardware()}
