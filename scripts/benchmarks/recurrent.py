"""Recurrent-core benchmark: what an LSTM costs on cartpole-appo, and how fast LSTM / GRU APPO
solve the memory task.

    flock /tmp/fastrl-bench.lock python scripts/bench.py recurrent --seconds 30 --seeds 3

Throughput: ``cartpole-appo`` as it is and with ``model.core=lstm`` (plus any ``--set`` overrides,
applied to both), each trained for the same ``--seconds`` in this invocation. Env steps/s and
learner updates/s are steady-state rates: counted from the first report with a learner update to
the last report, so process start-up is left out.

Time-to-solve: APPO with an LSTM and with a GRU core (scripts/benchmarks/setups/memory-appo.toml), and
R2D2 (LSTM, memory-r2d2.toml), on MemoryEnv (fastrl.envs.toy: a cue on the first step, to be
named ``--length`` steps later; feed-forward expected return 0), one run per seed; wall-clock from
the train() call (start-up included) to the first report with episode_return_mean >= ``--target``
(benchmarks.threshold; for R2D2 that training mean includes its actors' epsilon-greedy exploration).
"""
from __future__ import annotations

import tempfile

from fastrl.config import build_config
from fastrl.profiler import hardware
from fastrl.run.training import train

from .options import add_set, load_setup, overrides
from .threshold import first_reaching, median_to_threshold

METRIC = "episode_return_mean"


def run_reports(profile: str, overrides: dict) -> list[dict]:
    cfg = build_config(profile, {"report_every_s": 1.0, **overrides})
    with tempfile.TemporaryDirectory(prefix="fastrl-bench-") as run_dir:
        return train(cfg, run_dir=run_dir, quiet=True).reports


def throughput(name: str, overrides: dict, seconds: float) -> dict:
    reports = run_reports("cartpole-appo", {"device": "cpu", "train_for_seconds": seconds,
                                            "train_for_env_steps": 0, **overrides})
    steady = [r for r in reports if r["learner_updates"] > 0]
    if len(steady) < 2:
        raise SystemExit(f"{name}: fewer than two reports after the first learner update in {seconds:g} s; "
                         f"raise --seconds")
    first, last = steady[0], steady[-1]
    elapsed = last["wall_time"] - first["wall_time"]
    return {"name": name, "seconds": elapsed, "env_steps": last["env_steps"],
            "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / elapsed,
            "updates_per_s": (last["learner_updates"] - first["learner_updates"]) / elapsed,
            "final_return": last["episode_return_mean"]}


LEARNERS = ("lstm", "gru", "r2d2")


def time_to_solve(core: str, seed: int, length: int, target: float, max_steps: int, limit_s: float) -> dict:
    """``core`` lstm / gru (APPO) or r2d2 (its LSTM)."""
    setup = load_setup("memory-r2d2" if core == "r2d2" else "memory-appo")
    settings = setup.overrides if core == "r2d2" else {**setup.overrides, "model.core": core}
    reports = run_reports(setup.profile, {**settings, "env.kwargs": {"length": length}, "seed": seed,
                                           "train_for_env_steps": max_steps, "train_for_seconds": limit_s})
    hit = first_reaching(reports, METRIC, target)
    return {"core": core, "seed": seed, "seconds": hit["wall_time"] if hit else None,
            "env_steps": hit["env_steps"] if hit else None, "final_return": reports[-1][METRIC]}


def add_arguments(p) -> None:
    p.add_argument("--seconds", type=float, default=30.0, help="training seconds of each throughput run")
    add_set(p, "override for both throughput runs (e.g. model.core_size=128)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--learners", nargs="+", choices=LEARNERS, default=list(LEARNERS),
                   help="which MemoryEnv learners to time (default: all)")
    p.add_argument("--no-throughput", action="store_true", help="skip the cartpole-appo throughput runs")
    p.add_argument("--length", type=int, default=5, help="MemoryEnv: steps from the cue to the decision")
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--max-steps", type=int, default=200_000, help="env-step budget per MemoryEnv seed")
    p.add_argument("--limit", type=float, default=150.0, help="wall-clock budget per MemoryEnv seed")


def run(args) -> dict:
    settings = overrides(args.set)
    rows = [] if args.no_throughput else [throughput("feed-forward", settings, args.seconds),
                                          throughput("lstm", {**settings, "model.core": "lstm"}, args.seconds)]
    solves = [time_to_solve(core, seed, args.length, args.target, args.max_steps, args.limit)
              for core in args.learners for seed in range(args.seeds)]

    print(f"\nhardware: {hardware()}")
    if rows:
        print(f"cartpole-appo, {args.seconds:g} s each{' with ' + ' '.join(args.set) if args.set else ''}")
        print(f"{'model':<14} {'env steps/s':>12} {'updates/s':>10} {'final return':>13}")
        for r in rows:
            print(f"{r['name']:<14} {r['env_steps_per_s']:>12,.0f} {r['updates_per_s']:>10.2f} "
                  f"{r['final_return'] or 0:>13.1f}")
        ff, lstm = rows
        print(f"{'lstm / ff':<14} {lstm['env_steps_per_s'] / ff['env_steps_per_s']:>12.2f} "
              f"{lstm['updates_per_s'] / ff['updates_per_s']:>10.2f}")
    medians = {}
    if solves:
        print(f"MemoryEnv(length={args.length}) APPO (lstm, gru) and R2D2, seconds to return >= {args.target:g}:")
    for core in args.learners if solves else ():
        runs = [s for s in solves if s["core"] == core]
        for s in runs:
            shown = (f"{s['seconds']:.1f} s ({s['env_steps']:,} env steps)" if s["seconds"] is not None
                     else "not solved")
            print(f"  {core} seed {s['seed']}: {shown}; final return {s['final_return'] or 0:.2f}")
        medians[core] = median_to_threshold([s["seconds"] for s in runs])
        median = f"{medians[core]:.1f} s" if medians[core] is not None else "more than half the seeds did not solve it"
        print(f"  {core} median: {median}")
    return {"throughput": rows, "memory": solves, "memory_median_seconds": medians}
