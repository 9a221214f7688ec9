"""Trainer benchmark: throughput against the raw env limit, and CartPole time-to-solve.

    python scripts/bench.py throughput                       # CartPole: FPS figures + 3 seeds to 475
    python scripts/bench.py throughput --pong --seconds 30   # also Pong (setup pong-cpu) on this CPU
    python scripts/bench.py throughput --dqn                 # also cartpole-dqn: FPS + 3 seeds to 400

Every FPS figure is printed next to the raw env throughput of the same process layout, measured
in the same invocation (fastrl.profiler); cartpole-appo is measured with its own settings and in
scripts/benchmarks/setups/cartpole-earlier.toml. Time-to-solve is wall-clock from the train() call (process
start-up included) to the first report with episode_return_mean >= --target (benchmarks.threshold).
"""
from __future__ import annotations

import sys
import tempfile

from fastrl.config import build_config
from fastrl.evaluation.episodes import evaluate_run
from fastrl.profiler import hardware, profile
from fastrl.run.training import train

from .options import load_setup
from .threshold import first_reaching, median_to_threshold

METRIC = "episode_return_mean"
# The CPU targets of cartpole-appo with its own settings.
TARGETS = {"solve_seconds": 60.0, "train_env_steps_per_s": 100_000, "sample_ratio": 0.6, "train_ratio": 0.35,
           "dqn_solve_seconds": 120.0}
DQN_TARGET_RETURN = 400.0
# The training mean of an Ape-X run averages actors with epsilon up to 0.4: the greedy policy's
# return on the final checkpoint is measured beside it.
GREEDY_EVAL_EPISODES = 20


def time_to_target(profile_name: str, seed: int, target: float, limit_s: float, greedy_episodes: int = 0) -> dict:
    cfg = build_config(profile_name, {"seed": seed, "device": "cpu", "report_every_s": 1.0,
                                      "train_for_seconds": limit_s, "train_for_env_steps": 0})
    with tempfile.TemporaryDirectory(prefix="fastrl-bench-") as run_dir:
        result = train(cfg, run_dir=run_dir, quiet=True)
        greedy = (evaluate_run(run_dir, greedy_episodes, deterministic=True)["episode_return_mean"]
                  if greedy_episodes else None)
    hit = first_reaching(result.reports, METRIC, target)
    return {"profile": profile_name, "seed": seed, "seconds": hit["wall_time"] if hit else None,
            "env_steps": hit["env_steps"] if hit else None, "policy_lag_mean": hit["policy_lag_mean"] if hit else None,
            "final_return": result.final[METRIC], "final_greedy_return": greedy,
            "greedy_episodes": greedy_episodes}


def solve_times(profile_name: str, seeds: int, target: float, limit_s: float,
                greedy_episodes: int = 0) -> tuple[list[dict], float | None]:
    """One run per seed, and the median seconds to ``target`` over them (benchmarks.threshold)."""
    runs = [time_to_target(profile_name, seed, target, limit_s, greedy_episodes) for seed in range(seeds)]
    return runs, median_to_threshold([r["seconds"] for r in runs])


def print_solve_times(profile_name: str, runs: list[dict], median: float | None, target: float, limit_s: float) -> None:
    for r in runs:
        shown = (f"{r['seconds']:.1f} s ({r['env_steps']:,} env steps, policy lag {r['policy_lag_mean']:.1f})"
                 if r["seconds"] is not None else f"not within {limit_s:g} s")
        print(f"{profile_name} seed {r['seed']}: return >= {target:g} after {shown}")
        greedy = ("" if r["final_greedy_return"] is None
                  else f", greedy policy {r['final_greedy_return']:.1f} over {r['greedy_episodes']} episodes")
        print(f"  after {limit_s:g} s: training mean {r['final_return'] or 0:.1f}{greedy}")
    print(f"{profile_name} median time to {target:g}: " + (f"{median:.1f} s" if median is not None
                                                          else "more than half the seeds did not solve it"))


def throughput_row(name: str, cfg, seconds: float) -> dict:
    figures = profile(cfg, seconds=seconds, profile_name=name, log=lambda m: print(f"  {m}", file=sys.stderr))
    return {"profile": name, "env_fps": figures.env_fps, "sample_fps": figures.sample_fps,
            "train_fps": figures.train_fps, "sample_ratio": figures.sample_ratio,
            "train_ratio": figures.train_ratio, "frame_skip": figures.frame_skip,
            "diagnosis": figures.diagnosis}


def add_arguments(p) -> None:
    p.add_argument("--seconds", type=float, default=15.0, help="length of each throughput measurement")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--limit", type=float, default=60.0, help="wall-clock budget per seed")
    p.add_argument("--pong", action="store_true", help="also measure atari-appo (Pong) in the pong-cpu setup")
    p.add_argument("--dqn", action="store_true", help="also measure cartpole-dqn: throughput and seeds to 400")
    p.add_argument("--dqn-limit", type=float, default=180.0, help="wall-clock budget per cartpole-dqn seed")


def setup_config(name: str):
    setup = load_setup(name)
    return build_config(setup.profile, setup.overrides)


def run(args) -> dict:
    rows = [throughput_row("cartpole-appo", build_config("cartpole-appo", {"device": "cpu"}), args.seconds),
            throughput_row("cartpole earlier", setup_config("cartpole-earlier"), args.seconds)]
    if args.pong:
        rows.append(throughput_row("atari-appo (cpu)", setup_config("pong-cpu"), args.seconds))
    if args.dqn:
        rows.append(throughput_row("cartpole-dqn", build_config("cartpole-dqn", {"device": "cpu"}), args.seconds))
    seeds, median = solve_times("cartpole-appo", args.seeds, args.target, args.limit)
    dqn_seeds, dqn_median = (solve_times("cartpole-dqn", args.seeds, DQN_TARGET_RETURN, args.dqn_limit,
                                         GREEDY_EVAL_EPISODES) if args.dqn else ([], None))

    print(f"\nhardware: {hardware()}")
    print(f"{'profile':<18} {'raw env/s':>11} {'sampling/s':>11} {'ratio':>6} {'training/s':>11} {'ratio':>6}"
          f" {'train frames/s':>15}")
    for r in rows:
        print(f"{r['profile']:<18} {r['env_fps']:>11,.0f} {r['sample_fps']:>11,.0f} {r['sample_ratio']:>6.2f} "
              f"{r['train_fps']:>11,.0f} {r['train_ratio']:>6.2f} {r['train_fps'] * r['frame_skip']:>15,.0f}")
        print(f"  diagnosis: {r['diagnosis']}")
    print_solve_times("cartpole-appo", seeds, median, args.target, args.limit)
    if args.dqn:
        print_solve_times("cartpole-dqn", dqn_seeds, dqn_median, DQN_TARGET_RETURN, args.dqn_limit)
    print("targets")
    checks = [("cartpole-appo median seconds to 475", median, "at most", TARGETS["solve_seconds"]),
              ("cartpole-appo training env steps/s", rows[0]["train_fps"], "at least",
               TARGETS["train_env_steps_per_s"]),
              ("cartpole-appo sampling / raw", rows[0]["sample_ratio"], "at least", TARGETS["sample_ratio"]),
              ("cartpole-appo training / raw", rows[0]["train_ratio"], "at least", TARGETS["train_ratio"])]
    if args.dqn:
        checks.append(("cartpole-dqn median seconds to 400", dqn_median, "at most", TARGETS["dqn_solve_seconds"]))
    for name, value, sense, bound in checks:
        met = value is not None and (value <= bound if sense == "at most" else value >= bound)
        shown = "-" if value is None else f"{value:,.2f}"
        print(f"  {name:<40} {shown:>12}  target {sense} {bound:,g}  {'met' if met else 'NOT met'}")
    return {"throughput": rows, "time_to_target": seeds + dqn_seeds, "median_seconds": median,
            "dqn_median_seconds": dqn_median, "hardware": hardware()}
