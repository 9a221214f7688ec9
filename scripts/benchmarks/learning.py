"""Learning benchmark: does a profile keep the promise of its ``[expect]`` table where its runs
end? The metric over each run's last stretch, steps and wall time to its first crossing, medians
over seeds, and the learning curves.

    python scripts/bench.py learning --profile cartpole-appo --seeds 3
    python scripts/bench.py learning --profile mujoco-appo --set device=cpu
    python scripts/bench.py learning --profile atari-appo --budget-seconds 3600 --seeds 1 --set device=cpu

The promise is the profile's ``[expect]`` table (fastrl.config.schema.ExpectConfig), e.g.

    [expect]
    metric = "episode_return_mean"
    threshold = 475
    budget_seconds = 60        # or budget_env_steps = 2_000_000
    hardware = "2-core CPU"

``--metric``, ``--target``, ``--budget-steps`` and ``--budget-seconds`` replace its parts; a
budget flag replaces the table's budget.

Each seed trains the profile (plus ``--set``) with the budget as its limit on the budget's own
clock: a step budget sets ``train_for_env_steps``, a time budget ``train_for_seconds`` (which
counts from when the run's processes start, so the run goes on a few seconds of start-up past a
wall budget); the profile's other limit stays. ``learner.lr_decay`` decays over that limit, so a
budget shorter than the profile's own trains with another schedule than ``fastrl-train`` gives.

A promise is judged on where each run ends, the policy a user is left with: the mean of the
metric over the run's last stretch, ``expect.final_stretch`` of its budget (10% by default: the
last 200K env steps of a 2M budget, the last 6 s of a 60 s one; env steps when the promise has
both budgets; of the run instead where its other limit ended it first), must reach the
threshold (benchmarks.threshold). Where no report in the stretch
has the metric (evaluations every minute, a stretch of seconds), the last report that has it
stands alone. The promise holds when more than half of the seeds keep it.

Beside it, each run's first report with the metric >= the threshold: env steps there (for
``eval_*`` metrics the env steps where the evaluated weights were taken) and wall time from the
train() call, start-up included; a report interval (``report_every_s``, ``--set
report_every_s=1`` for finer) is the resolution. Its median over seeds counts a seed that never
crossed as later than every seed that did, so it exists while more than half of the seeds cross.
A run that crosses and falls back keeps its crossing and loses the promise.

``--window LOW:HIGH`` (env steps, e.g. ``1.4M:1.6M``) also prints each run's mean of the metric
over the reports in that range: a level to compare code or settings by, steadier than one report.

Run directories are kept (``OUT_DIR/PROFILE/seed<k>``: metrics.jsonl, config.toml) for
``fastrl-plot`` or ``--no-train``; the curves (mean over seeds, min-max band, the threshold and
the budget as lines) go to ``OUT_DIR/PROFILE.png``. Ctrl-C stops the bench with the running
seed's final checkpoint written; the same command with ``--resume`` continues it (and runs the
seeds after it), leaving runs that reached their budget as they are.
"""
from __future__ import annotations

import argparse
import re
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from fastrl.config import ExpectConfig, build_config
from fastrl.files.run_dir import holds_run
from fastrl.learner.runtime import NonFiniteTraining
from fastrl.profiler import hardware
from fastrl.reporting.curves import EVAL_KEYS, EVAL_X, metrics_rows, plot_learning_curves
from fastrl.reporting.figures import pyplot
from fastrl.run.training import RunError, train

from .options import add_set, overrides
from .threshold import final_stretch, first_reaching, is_number, median_to_threshold

DEFAULT_METRIC = "episode_return_mean"
# The bench owns these: seeds come from --seeds, the run's limit from the budget.
BENCH_KEYS = ("seed", "train_for_env_steps", "train_for_seconds")
SCALES = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6}
NUMBER = r"[-+]?\d[\d,_]*(?:\.\d+)?"


class PromiseError(ValueError):
    """A profile's promise that cannot be read or checked as asked; one line that names the fix."""


class BenchStopped(RuntimeError):
    """SIGINT or SIGTERM stopped a seed's run: the bench stops there, one line saying what is kept."""


@dataclass(frozen=True)
class Promise:
    metric: str  # a metrics.jsonl key
    threshold: float  # reached when the metric >= threshold
    budget_steps: int = 0  # env steps; 0 = no step budget
    budget_seconds: float = 0.0  # wall seconds from the train() call; 0 = no time budget
    hardware: str = ""  # what the profile says the budget holds on ("" = not said)
    final_stretch: float = 0.1  # judged on the mean over this fraction of the budget, at the run's end

    @property
    def clock(self) -> str:
        """The metrics.jsonl key the stretch is measured on: the budget's own clock."""
        return "env_steps" if self.budget_steps else "wall_time"

    def stretch(self, run_end: float) -> float:
        """The last stretch's length on ``clock`` for a run that ended at ``run_end`` there: its
        fraction of the budget, or of the run where the run's other limit (a profile's
        train_for_env_steps under a time budget) ended it first."""
        return self.final_stretch * min(run_end, self.budget_steps if self.budget_steps else self.budget_seconds)

    def describe(self) -> str:
        budgets = ([f"{self.budget_steps:,} env steps"] if self.budget_steps else []) + \
                  ([f"{self.budget_seconds:g} s wall"] if self.budget_seconds else [])
        on = f" on {self.hardware}" if self.hardware else ""
        return (f"mean {self.metric} over the last {self.final_stretch:.0%} of {' and '.join(budgets)} >= "
                f"{self.threshold:g}{on}")


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("_", ""))


def profile_promise(profile: str, expect: ExpectConfig) -> Promise:
    """The promise of a profile's ``[expect]`` table (fastrl.config.schema validated its form);
    PromiseError (one line naming the profile) when it states none."""
    if not expect.stated:
        raise PromiseError(f"profile '{profile}' states no promise: add an [expect] table (metric, threshold, "
                           f"budget_env_steps or budget_seconds, hardware), or pass --target with --budget-steps "
                           f"or --budget-seconds")
    return Promise(expect.metric, expect.threshold, expect.budget_env_steps, expect.budget_seconds, expect.hardware,
                   expect.final_stretch)


def resolve_promise(profile: str, expect: ExpectConfig, metric: str | None = None, target: float | None = None,
                    budget_steps: int | None = None, budget_seconds: float | None = None) -> Promise:
    """The profile's promise with the command line's parts in place of its own; a profile without
    one is fine when ``target`` and a budget are given."""
    has_budget = budget_steps is not None or budget_seconds is not None
    try:
        promise = profile_promise(profile, expect)
    except PromiseError:
        if target is None or not has_budget:
            raise
        promise = Promise(DEFAULT_METRIC, target)
    if has_budget:
        # The profile's hardware was about its own budget, not this one.
        promise = replace(promise, budget_steps=budget_steps or 0, budget_seconds=budget_seconds or 0.0, hardware="")
    return replace(promise, metric=metric or promise.metric,
                   threshold=promise.threshold if target is None else target)


def run_outcome(rows: list[dict], promise: Promise) -> dict:
    """One run's metrics.jsonl rows judged against ``promise``: ``reached`` when the mean of the
    metric over the run's last stretch (``final_mean`` over ``stretch_reports`` reports) is at or
    above the threshold; beside it ``first_env_steps`` and ``first_wall_time`` of the first report
    at or above it (None when none was); the metric's ``final`` and ``max`` values (None when it
    was never a number); and where the run ended."""
    values = [row[promise.metric] for row in rows if is_number(row.get(promise.metric))]
    mean, count = final_stretch(rows, promise.metric, promise.clock, promise.stretch(rows[-1][promise.clock])) \
        if rows else (None, 0)
    first = first_reaching(rows, promise.metric, promise.threshold)
    steps_key = EVAL_X["env_steps"] if promise.metric.startswith(EVAL_KEYS) else "env_steps"
    return {"reached": mean is not None and mean >= promise.threshold, "final_mean": mean, "stretch_reports": count,
            "first_env_steps": first[steps_key] if first else None,
            "first_wall_time": first["wall_time"] if first else None,
            "final": values[-1] if values else None, "max": max(values) if values else None,
            "last_env_steps": rows[-1]["env_steps"] if rows else 0,
            "last_wall_time": rows[-1]["wall_time"] if rows else 0.0}


def window_mean(rows: list[dict], metric: str, window: tuple[int, int]) -> float | None:
    """Mean of ``metric`` over the reports with ``window[0] <= env_steps <= window[1]`` (None when
    none has a number there): a level to compare runs by where one report is noisy."""
    low, high = window
    values = [row[metric] for row in rows if low <= row["env_steps"] <= high and is_number(row.get(metric))]
    return statistics.fmean(values) if values else None


def summarize(outcomes: list[dict], promise: Promise) -> dict:
    """How many seeds kept the promise at their runs' end and whether more than half did (it
    holds); the median of their last stretches' means; and, beside it, the median env steps and
    wall seconds to the first crossing (None where more than half the seeds never crossed)."""
    kept = sum(o["reached"] for o in outcomes)
    means = [o["final_mean"] for o in outcomes if o["final_mean"] is not None]
    return {"seeds": len(outcomes), "seeds_reached": kept,
            "median_final_mean": statistics.median(means) if len(means) == len(outcomes) and means else None,
            "median_first_env_steps": median_to_threshold([o["first_env_steps"] for o in outcomes]),
            "median_first_wall_time": median_to_threshold([o["first_wall_time"] for o in outcomes]),
            "holds": kept > len(outcomes) / 2}


def run_overrides(promise: Promise, seed: int, settings: dict) -> dict:
    """What one seed's run sets on top of its profile: ``settings`` (--set), the seed, and the
    budget as the run's limit on the budget's clock."""
    overrides = {**settings, "seed": seed}
    if promise.budget_steps:
        overrides["train_for_env_steps"] = promise.budget_steps
    if promise.budget_seconds:
        overrides["train_for_seconds"] = promise.budget_seconds
    return overrides


def run_finished(run_dir: Path, cfg) -> bool:
    """Whether the run in ``run_dir`` reached one of ``cfg``'s limits (its last report says so):
    --resume leaves it as it is."""
    last = None
    for last in metrics_rows(run_dir):
        pass
    if last is None:
        return False
    return bool(cfg.train_for_env_steps and (last.get("env_steps") or 0) >= cfg.train_for_env_steps) or \
        bool(cfg.train_for_seconds and (last.get("trained_seconds") or 0) >= cfg.train_for_seconds)


def describe_outcome(profile: str, seed: int, outcome: dict, promise: Promise) -> str:
    mean = outcome["final_mean"]
    if mean is None:
        judged = f"{promise.metric} never reported ({outcome['last_env_steps']:,} env steps)"
    else:
        judged = (f"mean {promise.metric} {mean:.4g} over the last {outcome['stretch_reports']} report(s) "
                  f"{'>=' if outcome['reached'] else '<'} {promise.threshold:g} at {outcome['last_env_steps']:,} "
                  f"env steps, {outcome['last_wall_time']:.1f} s wall")
    first = ("never >= the threshold" if outcome["first_env_steps"] is None else
             f"first >= at {outcome['first_env_steps']:,} env steps, {outcome['first_wall_time']:.1f} s wall")
    final = "" if outcome["final"] is None else f"; final {outcome['final']:.1f}, max {outcome['max']:.1f}"
    if "window" in outcome:
        (low, high), window = outcome["window"], outcome["window_mean"]
        final += f", mean {'-' if window is None else f'{window:.1f}'} over {low:,}-{high:,} env steps"
    return f"{profile} seed {seed}: {judged}; {first}{final}"


def plan(args, settings: dict) -> list[dict]:
    """Per profile: its promise, run directories and configs, all checked before any training."""
    plans = []
    for profile in args.profiles:
        name = Path(profile).stem
        promise = resolve_promise(name, build_config(profile, settings).expect, args.metric, args.target,
                                  args.budget_steps, args.budget_seconds)
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        configs = [build_config(profile, run_overrides(promise, seed, settings)) for seed in seeds]
        if promise.metric.startswith(EVAL_KEYS) and not configs[0].eval.every_s:
            raise PromiseError(f"profile '{name}': --metric {promise.metric} needs evaluation during training: "
                               f"--set eval.every_s=SECONDS")
        run_dirs = [args.out_dir / name / f"seed{seed}" for seed in seeds]
        for run_dir in run_dirs:
            if args.no_train and not (run_dir / "metrics.jsonl").is_file():
                raise PromiseError(f"--no-train: '{run_dir}' holds no metrics.jsonl; run without --no-train first")
            if not args.no_train and not args.overwrite and not args.resume and holds_run(run_dir):
                raise PromiseError(f"'{run_dir}' already holds a run: pass --resume to continue it, --overwrite to "
                                   f"replace it, --no-train to judge it again, or another --out-dir")
        plot = args.plot or args.out_dir / f"{name}.png"
        plans.append({"profile": name, "promise": promise, "seeds": seeds, "configs": configs,
                      "run_dirs": run_dirs, "plot": None if args.no_plot else plot})
    return plans


def run(args) -> dict:
    settings = overrides(args.set)
    owned = [key for key in settings if key in BENCH_KEYS]
    if owned:
        raise PromiseError(f"--set {owned[0]}: the bench sets it (seeds from --first-seed and --seeds, the run's "
                           f"limit from the promise or --budget-steps / --budget-seconds)")
    if args.plot and len(args.profiles) > 1:
        raise PromiseError("--plot names one figure: pass one --profile, or leave --plot out for "
                           "OUT_DIR/PROFILE.png each")
    if args.resume and (args.overwrite or args.no_train):
        raise PromiseError(f"--resume continues the runs in --out-dir: it goes with neither "
                           f"{'--overwrite' if args.overwrite else '--no-train'}")
    if not args.no_plot:
        pyplot("--plot")  # a missing matplotlib fails now, not after the training
    plans = plan(args, settings)
    results = []
    for p in plans:
        outcomes = []
        for seed, cfg, run_dir in zip(p["seeds"], p["configs"], p["run_dirs"]):
            resume = args.resume and holds_run(run_dir)
            if not args.no_train and not (resume and run_finished(run_dir, cfg)):
                stopped_by = train(cfg, run_dir=run_dir, quiet=True, overwrite=args.overwrite, resume=resume).stopped_by
                if stopped_by:  # the run stopped itself at the signal: so does the bench, not only this seed
                    raise BenchStopped(f"{stopped_by} stopped {p['profile']} seed {seed} (its run directory keeps "
                                       f"what it trained; --resume continues it); the seeds before it are in "
                                       f"{args.out_dir}")
            rows = list(metrics_rows(run_dir))
            outcome = {"seed": seed, "run_dir": str(run_dir), **run_outcome(rows, p["promise"])}
            if args.window:
                outcome.update(window=args.window, window_mean=window_mean(rows, p["promise"].metric, args.window))
            print(describe_outcome(p["profile"], seed, outcome, p["promise"]), flush=True)
            outcomes.append(outcome)
        if p["plot"] is not None and all(o["final"] is None for o in outcomes):
            print(f"{p['profile']}: no curve to draw, no run reported {p['promise'].metric}")
            p["plot"] = None
        if p["plot"] is not None:
            promise = p["promise"]
            x_key = args.x_key or ("wall_time" if promise.budget_seconds and not promise.budget_steps else "env_steps")
            budget = promise.budget_steps if x_key == "env_steps" else promise.budget_seconds
            Path(p["plot"]).parent.mkdir(parents=True, exist_ok=True)
            plot_learning_curves(p["run_dirs"], x_key, [promise.metric], Path(p["plot"]),
                                 targets={promise.metric: promise.threshold}, x_limit=budget or None)
        results.append({"profile": p["profile"], "promise": asdict(p["promise"]), "settings": settings,
                        "runs": outcomes, **summarize(outcomes, p["promise"]),
                        "plot": str(p["plot"]) if p["plot"] is not None else None})
    machine = hardware()
    print_table(results, machine)
    return {"hardware": machine, "profiles": results}


def print_table(results: list[dict], machine: dict) -> None:
    print(f"\nhardware: {machine}")
    print("kept: seeds whose mean over the run's last stretch reached the threshold; first crossing: median over "
          "seeds of the first report at or above it (wall time from the train() call, start-up included), a seed "
          "that never crossed counting as never")
    print(f"{'profile':<16} {'promise':<72} {'kept':>6} {'median end':>11} {'first: env steps':>17} "
          f"{'wall s':>8} {'holds':>6}")
    for r in results:
        promise = Promise(**r["promise"])
        end = "-" if r["median_final_mean"] is None else f"{r['median_final_mean']:.4g}"
        steps = "-" if r["median_first_env_steps"] is None else f"{r['median_first_env_steps']:,.0f}"
        seconds = "-" if r["median_first_wall_time"] is None else f"{r['median_first_wall_time']:.1f}"
        print(f"{r['profile']:<16} {promise.describe():<72} {r['seeds_reached']:>2}/{r['seeds']:<3} {end:>11} "
              f"{steps:>17} {seconds:>8} {'yes' if r['holds'] else 'no':>6}")
        if r["plot"]:
            print(f"  curves: {r['plot']}")


def env_steps(text: str) -> int:
    """``2M``, ``500K``, ``2_000_000`` -> an int; ValueError for anything else."""
    match = re.fullmatch(rf"({NUMBER})\s*([kKM]?)", text.strip())
    if match is None:
        raise ValueError(text)
    return int(_number(match[1]) * SCALES[match[2]])


def env_step_window(text: str) -> tuple[int, int]:
    """``1.4M:1.6M`` -> (1_400_000, 1_600_000), low <= high."""
    try:
        low, high = (env_steps(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH in env steps (e.g. 1.4M:1.6M), got '{text}'") from None
    if low > high:
        raise argparse.ArgumentTypeError(f"LOW must be <= HIGH, got '{text}'")
    return low, high


def positive(parse, zero_ok: bool = False):
    """An argparse type: ``parse(text)``, which must be > 0 (>= 0 with ``zero_ok``)."""
    def checked(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
        if not (value >= 0 if zero_ok else value > 0):
            raise argparse.ArgumentTypeError(f"must be {'>=' if zero_ok else '>'} 0, got '{text}'")
        return value
    return checked


def add_arguments(p) -> None:
    p.add_argument("--profile", dest="profiles", nargs="+", action="extend", required=True, metavar="NAME",
                   help="profile names or TOML paths (repeatable)")
    p.add_argument("--seeds", type=positive(int), default=3,
                   help="runs per profile, seeds K..K+N-1 with K from --first-seed (default 3)")
    p.add_argument("--first-seed", type=positive(int, zero_ok=True), default=0, metavar="K",
                   help="the first seed (default 0): more seeds later, beside runs already made, without redoing them")
    add_set(p, "override for every run (e.g. device=cpu, report_every_s=1)")
    p.add_argument("--metric", help="metrics key to judge (default: the promise's, e.g. episode_return_mean)")
    p.add_argument("--target", type=float, help="threshold in place of the promise's")
    p.add_argument("--budget-steps", type=positive(env_steps), metavar="N",
                   help="env-step budget (2M, 500K, ...) in place of the promise's budget (and the runs' "
                        "train_for_env_steps)")
    p.add_argument("--budget-seconds", type=positive(float), metavar="S",
                   help="wall-time budget in place of the promise's budget (and the runs' train_for_seconds)")
    p.add_argument("--window", type=env_step_window, metavar="LOW:HIGH",
                   help="also print each run's mean of the metric over reports in this env-step range (1.4M:1.6M)")
    p.add_argument("--x", dest="x_key", choices=("env_steps", "wall_time"),
                   help="x axis of the curves (default: the budget's; env_steps when there are both)")
    p.add_argument("--out-dir", type=Path, default=Path("runs/bench_learning"),
                   help="run directories go to OUT_DIR/PROFILE/seed<k> (default runs/bench_learning)")
    p.add_argument("--overwrite", action="store_true", help="replace runs already in those directories")
    p.add_argument("--resume", action="store_true",
                   help="continue the runs already in those directories to the budget (one a signal stopped, or "
                        "to a larger --budget-steps), start the seeds that have none, then judge them all")
    p.add_argument("--no-train", action="store_true",
                   help="judge and plot the runs already in OUT_DIR again (e.g. with another --target)")
    p.add_argument("--plot", type=Path, metavar="PATH.png", help="the figure (default OUT_DIR/PROFILE.png)")
    p.add_argument("--no-plot", action="store_true", help="draw no figure (no matplotlib needed)")


# Each one line naming the fix: ConfigError, PlotError, PromiseError, BenchStopped and the run's own.
ERRORS = (ValueError, RunError, NonFiniteTraining, OSError, BenchStopped)
