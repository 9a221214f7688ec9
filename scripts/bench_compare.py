"""Side by side: a profile's steady env steps/s with and without some overrides, alternating.

    python scripts/bench_compare.py --set retain_freed_memory=false --rounds 3
    python scripts/bench_compare.py --profile atari-appo-cpu --set learner.batch_size=256 --sampling

Each round measures the baseline (the profile with ``--base`` overrides) and then the variant
(the same plus ``--set``) the way fastrl-profile measures training or sampling
(:func:`fastrl.profiler.measure.measure_run`: steady state after start-up and warm-up). Rounds
alternate so that a shared machine's drift falls on both; the median of the per-round ratios is
the figure to quote.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from fastrl.config import DEFAULT_PROFILE, build_config
from fastrl.profiler import hardware
from fastrl.profiler.measure import measure_run


def parse_overrides(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"bench_compare: --set/--base take SECTION.KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default=DEFAULT_PROFILE)
    p.add_argument("--set", dest="variant", action="append", required=True, metavar="SECTION.KEY=VALUE",
                   help="the variant's overrides (repeat for several)")
    p.add_argument("--base", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="overrides of both runs (default: device=cpu)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds of each run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of steady running before the window")
    p.add_argument("--sampling", action="store_true", help="measure sampling (sample_only) instead of training")
    args = p.parse_args(argv)
    base = {"device": "cpu", **parse_overrides(args.base)}
    variant = {**base, **parse_overrides(args.variant)}
    configs = {"base": build_config(args.profile, base), "variant": build_config(args.profile, variant)}
    what = "sampling" if args.sampling else "training"
    rates: dict[str, list[float]] = {"base": [], "variant": []}
    ratios = []
    for r in range(args.rounds):
        for name, cfg in configs.items():
            rates[name].append(measure_run(cfg, args.seconds, args.warmup, args.sampling).env_steps_per_s)
        ratios.append(rates["variant"][-1] / rates["base"][-1])
        print(f"round {r}: {what} base {rates['base'][-1]:,.0f}  variant {rates['variant'][-1]:,.0f} env steps/s  "
              f"variant/base {ratios[-1]:.2f}", flush=True)
    print(f"hardware: {hardware()}")
    print(f"{args.profile} {what}, base {base}, variant adds {parse_overrides(args.variant)}: "
          f"variant/base median {statistics.median(ratios):.2f} over {args.rounds} rounds")
    print(json.dumps({"profile": args.profile, "measured": what, "base": base, "variant": variant, "rates": rates,
                      "ratios": ratios, "median_ratio": statistics.median(ratios), "hardware": hardware()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
