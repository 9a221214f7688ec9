"""What evaluation during training costs: training env steps/s with ``eval.every_s`` on and off.

    flock /tmp/fastrl-bench.lock python scripts/bench.py eval --seconds 40 --every 10 --rounds 2
    flock /tmp/fastrl-bench.lock python scripts/bench.py eval --pong --seconds 60 --every 20

Each round trains the profile with evaluation off, then on (same config otherwise), and measures
the steady-state training throughput with the profiler's measurement (start-up and warm-up left
out); the ratio on / off is taken within a round, and the median over rounds is printed, so a
drift of the shared machine's load between rounds does not enter a ratio. ``--every`` should leave
several evaluations inside ``--seconds``.
"""
from __future__ import annotations

import statistics

from fastrl.config import build_config
from fastrl.profiler import hardware
from fastrl.profiler.measure import STARTUP_ESTIMATE_S, default_warmup, measure_run_patiently

from .options import add_rounds, add_set, load_setup, overrides


def training_rate(profile: str, overrides: dict, seconds: float, startup_s: float) -> tuple[float, float]:
    """Steady-state training env steps/s, and the start-up the run took (the next run's allowance)."""
    cfg = build_config(profile, overrides)
    run = measure_run_patiently(cfg, seconds, default_warmup(seconds), sample_only=False, startup_s=startup_s)
    return run.env_steps_per_s, max(startup_s, run.startup_s + 2.0)


def compare(profile: str, overrides: dict, every_s: float, seconds: float, rounds: int) -> dict:
    startup_s = STARTUP_ESTIMATE_S
    off_rates, on_rates = [], []
    for _ in range(rounds):
        off, startup_s = training_rate(profile, {**overrides, "eval.every_s": 0.0}, seconds, startup_s)
        on, startup_s = training_rate(profile, {**overrides, "eval.every_s": every_s}, seconds, startup_s)
        off_rates.append(off)
        on_rates.append(on)
    ratios = [on / off for on, off in zip(on_rates, off_rates)]
    return {"profile": profile, "overrides": overrides, "every_s": every_s, "seconds": seconds,
            "off_env_steps_per_s": off_rates, "on_env_steps_per_s": on_rates, "ratios": ratios,
            "median_ratio": statistics.median(ratios)}


def add_arguments(p) -> None:
    p.add_argument("--seconds", type=float, default=40.0, help="measured seconds of each training run")
    p.add_argument("--every", type=float, default=10.0, help="eval.every_s of the runs with evaluation on")
    add_rounds(p, 2, "off/on pairs per profile")
    p.add_argument("--pong", action="store_true", help="also Pong (atari-appo in the pong-cpu setup)")
    p.add_argument("--no-cartpole", action="store_true", help="skip cartpole-appo")
    add_set(p)


def run(args) -> list[dict]:
    settings = overrides(args.set)
    rows = []
    if not args.no_cartpole:
        rows.append(compare("cartpole-appo", {"device": "cpu", **settings}, args.every, args.seconds, args.rounds))
    if args.pong:
        pong = load_setup("pong-cpu")
        rows.append(compare(pong.profile, {**pong.overrides, **settings}, args.every, args.seconds, args.rounds))
    print(f"\nhardware: {hardware()}")
    print(f"training env steps/s, evaluation off vs on (eval.every_s={args.every:g}), {args.seconds:g} s measured")
    for r in rows:
        for off, on in zip(r["off_env_steps_per_s"], r["on_env_steps_per_s"]):
            print(f"  {r['profile']:<14} off {off:>10,.0f}  on {on:>10,.0f}  on/off {on / off:.2f}")
        print(f"  {r['profile']:<14} median on/off {r['median_ratio']:.2f}")
    return rows
