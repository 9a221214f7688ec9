"""Agent rows/s of multi-agent games against the single-agent path, at the same rows per batch.

    python scripts/bench.py agents                            # 2 and 4 agents per game against 1
    python scripts/bench.py agents --agents 2 4 8 --rounds 5 --sampling
    python scripts/bench.py agents --setup cartpole-earlier --set env.kwargs='{length = 8}'

fastrl's cost per agent row must not depend on how rows are grouped into agents. Every run steps
fastrl.envs.toy.AgreementGames, whose games are stepped in numpy with no Python per game or
agent, in one setup (the profile on the CPU, or a setup of scripts/benchmarks/setups/ with
``--setup``, plus ``--set``) with ``env.id`` set to it: only ``env.kwargs.agents`` changes, so
every run has the same rows per batch, and one agent per game is the single-agent path with the
same work per row.
Each is measured the way fastrl-profile measures training or sampling
(:func:`fastrl.profiler.measure.measure_run`: steady state after start-up and warm-up), in a
fresh interpreter. Each round runs every grouping once, ascending on even rounds and descending
on odd ones, so that no grouping always follows the same neighbour on a drifting machine; the
figure to quote is the median over rounds of each grouping's agent rows/s over the single-agent
run's of the same round (target: at least 0.8).
"""
from __future__ import annotations

import shlex
import statistics

from fastrl.config import DEFAULT_PROFILE, build_config
from fastrl.envs.base import check_whole_games
from fastrl.profiler import hardware
from fastrl.profiler.measure import STARTUP_ESTIMATE_S, check_durations

from .compare import measure
from .options import add_rounds, add_set, add_setup, load_setup, overrides

GAMES = "fastrl.envs.toy:AgreementGames"
TARGET_RATIO = 0.8


def add_arguments(p) -> None:
    p.add_argument("--agents", type=int, nargs="+", default=[2, 4], metavar="A",
                   help="agents per game of the multi-agent runs, each against one agent per game (default 2 4)")
    p.add_argument("--profile", help=f"the profile measured on the CPU (default {DEFAULT_PROFILE})")
    add_setup(p, "every run in this setup, in place of --profile on the CPU")
    add_set(p, "overrides of every run, on top of the profile's or the setup's (repeat for several)")
    add_rounds(p, 3, "rounds, each running every grouping once")
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds of each run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of steady running before the window")
    p.add_argument("--sampling", action="store_true", help="measure sampling (sample_only) instead of training")


# Bad input stops before any run, with one line.
ERRORS = (ValueError,)  # ConfigError, ProfileError, and a split that holds no whole games


def command_line(args) -> str:
    """The command that repeats this measurement, every option spelled out."""
    parts = ["python", "scripts/bench.py", "agents", "--agents", *map(str, args.agents)]
    parts += ["--setup", args.setup] if args.setup else ["--profile", args.profile or DEFAULT_PROFILE]
    for text in args.set:
        parts += ["--set", text]
    parts += ["--rounds", str(args.rounds), "--seconds", f"{args.seconds:g}", "--warmup", f"{args.warmup:g}"]
    return shlex.join(parts + (["--sampling"] if args.sampling else []))


def round_order(groupings: list[int], r: int) -> list[int]:
    return groupings if r % 2 == 0 else groupings[::-1]


def run_settings(args) -> tuple[str, dict[int, dict]]:
    """The profile and each grouping's overrides (agents per game -> settings); bad keys or values,
    and splits that cannot hold whole games of a grouping, stop here in one line."""
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if any(a < 2 for a in args.agents):
        raise ValueError(f"--agents counts the agents of a multi-agent game, each 2 or more: got {args.agents}")
    if args.setup and args.profile:
        raise ValueError("--setup names its profile: leave --profile out")
    check_durations(args.seconds, args.warmup)
    setup = load_setup(args.setup) if args.setup else None
    profile = setup.profile if setup else args.profile or DEFAULT_PROFILE
    base = {**(setup.overrides if setup else {"device": "cpu"}), **overrides(args.set), "env.id": GAMES}
    kwargs = build_config(profile, base).env.kwargs  # --set gives it as text, a setup as a table
    settings = {}
    for agents in [1, *args.agents]:
        settings[agents] = {**base, "env.kwargs": {**kwargs, "agents": agents}}
        cfg = build_config(profile, settings[agents])
        check_whole_games(GAMES, agents, cfg.env.envs_per_worker // cfg.env.num_splits)
    return profile, settings


def run(args) -> dict:
    profile, settings = run_settings(args)
    groupings = list(settings)
    what = "sampling" if args.sampling else "training"
    command = command_line(args)
    print(f"command: {command}", flush=True)
    rates: dict[int, list[float]] = {a: [] for a in groupings}
    ratios: dict[int, list[float]] = {a: [] for a in args.agents}
    startup_s = STARTUP_ESTIMATE_S
    for r in range(args.rounds):
        for agents in round_order(groupings, r):
            result = measure(None, profile, settings[agents], args, startup_s)
            startup_s = max(startup_s, result["startup_s"])
            rates[agents].append(result["env_steps_per_s"])
        for agents in args.agents:
            ratios[agents].append(rates[agents][-1] / rates[1][-1])
        shown = "  ".join(f"{a} agents {rates[a][-1]:,.0f}" + (f" ({ratios[a][-1]:.2f})" if a > 1 else "")
                          for a in groupings)
        print(f"round {r} ({' then '.join(map(str, round_order(groupings, r)))}): {what} agent rows/s  {shown}",
              flush=True)
    cfg = build_config(profile, settings[1])
    rows = cfg.env.envs_per_worker // cfg.env.num_splits
    print(f"hardware: {hardware()}")
    print(f"{profile} {what} on {GAMES}, {cfg.env.num_workers} workers x {cfg.env.envs_per_worker} rows in batches "
          f"of {rows} rows, medians over {args.rounds} rounds")
    print(f"{'agents per game':>15} {'agent rows/s':>13} {'/ 1 agent':>10}")
    medians = {a: statistics.median(rates[a]) for a in groupings}
    median_ratios = {a: statistics.median(ratios[a]) for a in args.agents}
    for a in groupings:
        judged = (f"{median_ratios[a]:>10.2f}  target >= {TARGET_RATIO:g} "
                  f"{'met' if median_ratios[a] >= TARGET_RATIO else 'NOT met'}") if a > 1 else f"{'1.00':>10}"
        print(f"{a:>15} {medians[a]:>13,.0f} {judged}")
    print(f"command: {command}")
    return {"profile": profile, "measured": what, "env_id": GAMES, "rows_per_batch": rows,
            "settings": {str(a): s for a, s in settings.items()}, "rates": {str(a): v for a, v in rates.items()},
            "ratios": {str(a): v for a, v in ratios.items()},
            "median_ratios": {str(a): v for a, v in median_ratios.items()}, "target_ratio": TARGET_RATIO,
            "command": command, "hardware": hardware()}
