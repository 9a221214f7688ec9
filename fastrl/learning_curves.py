"""Learning curves (fastrl-plot): metrics of run directories, runs that differ only in their seed
grouped into one mean line with a min-max band, one subplot per metrics key.

A run directory holds ``config.toml`` and ``metrics.jsonl`` (one JSON object per report). Runs
whose configs are equal except for ``NOT_EXPERIMENT_KEYS`` (the seed, and keys that say how a
run is watched, saved or kept alive rather than what it learns) form one ``SeedGroup``. Each
run's curve is interpolated onto the group's common grid, the x values of all its runs where
every run has data, and ``seed_band`` takes the mean, min and max there: a mean over fewer runs
at the ends would jump where a run stops.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import SECTIONS, load_run_config
from .plotting import PlotError, engineering_axis, pyplot, save

X_AXES = {"env_steps": "env steps", "wall_time": "wall time (s)"}
# Budgets (train_for_env_steps, train_for_seconds) are not here: learner.lr_decay decays the
# learning rate over the budget, so two budgets are two experiments.
NOT_EXPERIMENT_KEYS = ("seed", "report_every_s", "checkpoint_every_s", "keep_checkpoints", "max_worker_restarts",
                       "restart_window_s", "dist_timeout_s")
# How a run is evaluated or logged, and what its profile promises, never change what it learns.
NOT_EXPERIMENT_SECTIONS = ("logging", "eval", "expect")
# What a subplot's title says was measured, for the keys Reporter and the evaluator write.
MEASURED = {
    "episode_return_mean": "episode return (mean of recent training episodes)",
    "episode_length_mean": "episode length (mean of recent training episodes)",
    "eval_return_mean": "evaluation return (mean over one evaluation's episodes)",
    "eval_return_std": "evaluation return (std over one evaluation's episodes)",
    "eval_length_mean": "evaluation episode length (mean over one evaluation's episodes)",
    "fps": "frames per second (env steps x frame skip)",
    "env_steps_per_s": "env steps per second",
    "policy_lag_mean": "policy lag (learner updates behind the acting policy)",
}


@dataclass
class Run:
    path: Path
    config: dict  # flat: {"seed": 1, "learner.lr": 0.001, ...}
    rows: list[dict]  # metrics.jsonl, one dict per report; a value may be None (null)


@dataclass
class SeedGroup:
    label: str  # env id and the config keys that tell this group from the others
    runs: list[Run]

    def legend(self, count: int) -> str:
        """``label (N seeds)`` for ``count`` runs drawn; "runs" where two of the group's runs share a seed."""
        seeds = {run.config["seed"] for run in self.runs}
        word = "seed" if len(seeds) == len(self.runs) else "run"
        return f"{self.label} ({_count(count, word)})"


@dataclass
class Band:
    """A group's curve on its common grid: all arrays [G], ``x`` increasing."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def load_run(run_dir: Path) -> Run:
    """A run directory's flat config and metrics; PlotError (one line) when it has no metrics."""
    path = Path(run_dir)
    if not path.is_dir():
        raise PlotError(f"run directory '{run_dir}' does not exist; check the path")
    metrics = path / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number < len(lines):
                raise PlotError(f"{metrics} line {number} is not JSON; was the file edited by hand?") from None
            continue  # a run killed while writing a report leaves a partial last line: the rest is fine
        if not isinstance(row, dict):
            raise PlotError(f"{metrics} line {number} is not a JSON object; was the file edited by hand?")
        rows.append(row)
    if not rows:
        raise PlotError(f"no metrics in '{run_dir}': metrics.jsonl is missing or empty; pass a run directory "
                        f"that fastrl-train has reported into")
    return Run(path, flat_config(load_run_config(path).to_dict()), rows)


def flat_config(config: dict) -> dict:
    """{"learner": {"lr": 0.001}} -> {"learner.lr": 0.001}; tables inside a section (env.kwargs)
    stay one value, as they are one setting."""
    flat = {}
    for key, value in config.items():
        if key in SECTIONS:
            flat.update({f"{key}.{name}": setting for name, setting in value.items()})
        else:
            flat[key] = value
    return flat


def experiment(config: dict) -> dict:
    """The keys of a flat config that change what a run learns, as comparable JSON text."""
    return {key: json.dumps(value, sort_keys=True) for key, value in config.items()
            if key not in NOT_EXPERIMENT_KEYS and key.split(".")[0] not in NOT_EXPERIMENT_SECTIONS}


def group_by_seed(runs: list[Run]) -> list[SeedGroup]:
    """Runs with equal experiments, in the order first seen. A label is the env id plus each
    key whose value differs between groups, e.g. ``CartPole-v1 learner.lr=0.001``."""
    members: dict[tuple, list[Run]] = {}
    for run in runs:
        members.setdefault(tuple(sorted(experiment(run.config).items())), []).append(run)
    experiments = [dict(key) for key in members]
    differing = [key for key in experiments[0] if key != "env.id"
                 and len({settings.get(key) for settings in experiments}) > 1]
    groups = []
    for group_runs in members.values():
        config = group_runs[0].config
        label = " ".join([str(config["env.id"])] + [f"{key}={config[key]}" for key in differing])
        groups.append(SeedGroup(label, group_runs))
    return groups


EVAL_X = {"env_steps": "eval_at_env_steps"}  # see fastrl.evaluator


def series(rows: list[dict], x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(x [K], y [K]) float64 of the rows where both are numbers, x increasing.

    A resumed run continues from its last checkpoint, so its metrics.jsonl can step back in x:
    the reports of the first attempt beyond that point were redone, and the later ones count.

    An evaluation (``eval_*`` keys) is drawn at the env steps where its weights were taken, not at
    the later report that carried it."""
    if y_key.startswith("eval_") and x_key in EVAL_X:
        rows = [row for row in rows if _is_number(row.get(y_key)) and _is_number(row.get(EVAL_X[x_key]))]
        x_key = EVAL_X[x_key]
    points: list[tuple[float, float | None]] = []
    for row in rows:
        x = row.get(x_key)
        if not _is_number(x):
            continue
        while points and points[-1][0] >= x:
            points.pop()
        y = row.get(y_key)
        points.append((float(x), float(y) if _is_number(y) else None))
    kept = [(x, y) for x, y in points if y is not None]
    return np.array([x for x, _ in kept], np.float64), np.array([y for _, y in kept], np.float64)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def seed_band(curves: list[tuple[np.ndarray, np.ndarray]]) -> Band:
    """Mean, min and max of ``curves`` ((x [K_i], y [K_i]), x increasing, K_i >= 1) on the grid
    of their x values inside [max of their first x, min of their last x]: the range every curve
    covers, each one interpolated linearly between its own points. Empty arrays when they share
    no range."""
    start = max(x[0] for x, _ in curves)
    stop = min(x[-1] for x, _ in curves)
    grid = np.unique(np.concatenate([x[(x >= start) & (x <= stop)] for x, _ in curves]))
    values = np.stack([np.interp(grid, x, y) for x, y in curves])  # [runs, G]
    return Band(grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0))


def metric_keys(runs: list[Run]) -> list[str]:
    """Every key that holds a number in some row of some run, sorted."""
    return sorted({key for run in runs for row in run.rows for key, value in row.items() if _is_number(value)})


def plot_learning_curves(run_dirs: list[Path], x_key: str, y_keys: list[str], out: Path,
                         targets: dict[str, float] | None = None, x_limit: float | None = None) -> list[SeedGroup]:
    """Draw ``y_keys`` (one subplot each) against ``x_key`` for the runs in ``run_dirs`` into
    ``out`` (a PNG, or any format matplotlib infers from the suffix); returns the groups drawn.
    ``targets`` ({y_key: value}) and ``x_limit`` draw reference lines, a promise's return and its
    budget on the x axis (scripts/bench_learning.py). Raises PlotError or ConfigError (one line)."""
    plt = pyplot("fastrl-plot")
    if x_key not in X_AXES:
        raise PlotError(f"--x {x_key}: choose one of {', '.join(X_AXES)}")
    if not Path(out).resolve().parent.is_dir():
        raise PlotError(f"--out {out}: the directory does not exist")
    runs = [load_run(Path(run_dir)) for run_dir in run_dirs]
    present = metric_keys(runs)
    for y_key in y_keys:
        if y_key not in present:
            raise PlotError(f"--y {y_key}: not in these runs' metrics; keys present: {', '.join(present)}")
    groups = group_by_seed(runs)
    columns = min(len(y_keys), 2)
    rows = math.ceil(len(y_keys) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.5 * rows), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, y_key in zip(axes.flat, y_keys):
        for index, group in enumerate(groups):
            curves = [curve for curve in (series(run.rows, x_key, y_key) for run in group.runs) if len(curve[0])]
            if not curves:
                continue  # this group's runs never reported this key (e.g. evaluation was off)
            band = seed_band(curves)
            color = colors[index % len(colors)]
            ax.plot(band.x, band.mean, color=color, label=group.legend(len(curves)))
            ax.fill_between(band.x, band.low, band.high, color=color, alpha=0.2, linewidth=0)
        if y_key in (targets or {}):
            ax.axhline(targets[y_key], color="black", linestyle="--", linewidth=1, label=f"target {targets[y_key]:g}")
        if x_limit is not None:
            ax.axvline(x_limit, color="black", linestyle=":", linewidth=1, label=f"budget {x_limit:,.0f}")
        ax.set_title(MEASURED.get(y_key, y_key))
        ax.set_xlabel(X_AXES[x_key])
        ax.set_ylabel(y_key)
        if x_key == "env_steps":
            engineering_axis(ax.xaxis)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    for ax in axes.flat[len(y_keys):]:
        ax.set_visible(False)
    fig.suptitle(f"{_count(len(runs), 'run')} in {_count(len(groups), 'group')}\nline: mean over seeds; band: "
                 f"min to max; both where every seed has data", fontsize=10)
    save(plt, fig, out)
    return groups
