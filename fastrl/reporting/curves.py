"""Learning curves (fastrl-plot): metrics of run directories, runs that differ only in their seed
grouped into one mean line with a min-max band, one subplot per metrics key.

A run directory holds ``config.toml`` and ``metrics.jsonl`` (one JSON object per report). Runs
whose configs are equal except for ``NOT_EXPERIMENT_KEYS`` (the seed, and keys that say how a
run is watched, saved or kept alive rather than what it learns) form one ``SeedGroup``. Each
run's curve is interpolated onto the group's common grid, the x values of all its runs where
every run has data, and ``seed_band`` takes the mean, min and max there: a mean over fewer runs
at the ends would jump where a run stops.

A key with a ``*`` draws every key it matches in its subplot, one line each, the ``*`` standing
for one ``/``-separated part: ``member/*/episode_return_mean`` is each member of a population
(fastrl.tuning.pbt), ``policy/*/episode_return_mean`` each policy of a multi-agent run.
"""
from __future__ import annotations

import json
import math
import re
import textwrap
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import flat_config, load_run_config
from .figures import PlotError, engineering_axis, figure_path, pyplot, save

X_AXES = {"env_steps": "env steps", "wall_time": "wall time (s)"}
WILDCARD = "*"
LEGEND_WIDTH = 60  # characters a legend line holds before it wraps
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
class Metrics:
    """Columns of a run's reports: ``columns[key]`` float64 [R] for the keys read, one entry per
    report, NaN where that report holds no finite number for it; ``keys``, every key that holds
    a number in some report."""

    columns: dict[str, np.ndarray]
    keys: set[str]
    reports: int


@dataclass
class Run:
    path: Path
    config: dict  # flat: {"seed": 1, "learner.lr": 0.001, ...}
    metrics: Metrics


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


def load_run(run_dir: Path, keys: Iterable[str] = ()) -> Run:
    """A run directory's flat config and its metrics, with the columns of ``keys``; PlotError
    (one line) when it has no metrics."""
    path = Path(run_dir)
    if not path.is_dir():
        raise PlotError(f"run directory '{run_dir}' does not exist; check the path")
    metrics = read_metrics(metrics_rows(path), keys)
    if not metrics.reports:
        raise PlotError(f"no metrics in '{run_dir}': metrics.jsonl is missing or empty; pass a run directory "
                        f"that fastrl-train has reported into")
    return Run(path, flat_config(load_run_config(path).to_dict()), metrics)


def metrics_rows(run_dir: Path) -> Iterator[dict]:
    """The reports in a run directory's metrics.jsonl, one dict at a time: the file is read line
    by line, as a long run's reports do not fit in memory as dicts. A run killed while writing a
    report leaves a partial last line, which is skipped; PlotError (one line naming the file and
    the line) for any other line that is not a JSON object in UTF-8."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        return
    unparsed = 0  # the number of a line that was not JSON: only the last line may be
    with open(metrics, "rb") as lines:
        for number, line in enumerate(lines, 1):
            if unparsed:
                raise PlotError(f"{metrics} line {unparsed} is not JSON; was the file edited by hand?")
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise PlotError(f"{metrics} line {number} is not UTF-8 text; was the file edited by hand?") from None
            try:
                row = json.loads(text)
            except ValueError:  # not JSON, or an integer too long for Python to read
                unparsed = number
                continue
            if not isinstance(row, dict):
                raise PlotError(f"{metrics} line {number} is not a JSON object; was the file edited by hand?")
            yield row


def read_metrics(rows: Iterable[dict], keys: Iterable[str]) -> Metrics:
    """The columns ``keys`` of ``rows`` (reports, read one at a time), and every key with a number;
    a key with a ``*`` reads a column for every key it matches (NaN in the reports before it
    first appears)."""
    keys = list(keys)
    values = {key: array("d") for key in keys if WILDCARD not in key}
    patterns = [key_pattern(key) for key in keys if WILDCARD in key]
    unmatched: set[str] = set()
    numeric: set[str] = set()
    reports = 0
    for row in rows:
        for key in (row.keys() - values.keys() - unmatched if patterns else ()):
            if any(pattern.fullmatch(key) for pattern in patterns):
                values[key] = array("d", [math.nan]) * reports
            else:
                unmatched.add(key)
        reports += 1
        numeric.update(key for key, value in row.items() if _is_number(value))
        for key, column in values.items():
            column.append(_number(row.get(key)))
    return Metrics({key: np.asarray(column, dtype=np.float64) for key, column in values.items()}, numeric, reports)


def key_pattern(key: str) -> re.Pattern:
    """``key`` as a regular expression, each ``*`` one part of a ``/``-separated key."""
    return re.compile("[^/]+".join(re.escape(part) for part in key.split(WILDCARD)))


def matching_keys(key: str, present: list[str]) -> list[str]:
    """The keys of ``present`` that ``key`` draws: itself, or with a ``*`` every key it matches,
    numbers in their order (member/2 before member/10)."""
    if WILDCARD not in key:
        return [key] if key in present else []
    pattern = key_pattern(key)
    return sorted((k for k in present if pattern.fullmatch(k)),
                  key=lambda k: [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", k)])


def line_name(key: str, matched: str) -> str:
    """What tells ``matched``'s line from the others ``key`` draws: its parts up to the last ``*``'s
    (``member/3`` for ``member/*/episode_return_mean``); "" for a key without one."""
    if WILDCARD not in key:
        return ""
    parts = key.split("/")
    last = max(i for i, part in enumerate(parts) if WILDCARD in part)
    return "/".join(matched.split("/")[:last + 1])


def title(key: str) -> str:
    """What a subplot's title says was measured: MEASURED's words for ``key``, or for a key with a
    ``*`` its last part's words and the key itself."""
    if WILDCARD not in key:
        return MEASURED.get(key, key)
    words = MEASURED.get(key.rsplit("/", 1)[-1])
    return f"{words}: {key}" if words else key


def experiment(config: dict) -> dict:
    """The keys of a flat config that change what a run learns, as comparable JSON text."""
    return {key: json.dumps(value, sort_keys=True) for key, value in config.items()
            if key not in NOT_EXPERIMENT_KEYS and key.split(".")[0] not in NOT_EXPERIMENT_SECTIONS}


def group_by_seed(runs: list[Run]) -> list[SeedGroup]:
    """Runs with equal experiments, in the order first seen. A label is the env id plus each
    key where the group departs from the others, e.g. ``CartPole-v1 learner.lr=0.001``: where most
    groups share a key's value, only the groups that differ name it, so a screen of one-key
    changes reads ``learner.num_epochs=1`` and its baseline ``(the others' common settings)``."""
    members: dict[tuple, list[Run]] = {}
    for run in runs:
        members.setdefault(tuple(sorted(experiment(run.config).items())), []).append(run)
    experiments = [dict(key) for key in members]
    differing = [key for key in experiments[0] if key != "env.id"
                 and len({settings.get(key) for settings in experiments}) > 1]
    common = {key: _majority([settings.get(key) for settings in experiments]) for key in differing}
    groups = []
    for settings, group_runs in zip(experiments, members.values()):
        config = group_runs[0].config
        named = [f"{key}={config[key]}" for key in differing if settings.get(key) != common[key]]
        if differing and not named:
            named = ["(the others' common settings)"]
        groups.append(SeedGroup(" ".join([str(config["env.id"]), *named]), group_runs))
    return groups


_TIE = object()  # equal to no value: on a tie every group names the key


def _majority(values: list):
    """The value more groups hold than any other, or _TIE."""
    (first, count), *rest = Counter(values).most_common(2)
    return first if not rest or count > rest[0][1] else _TIE


EVAL_X = {"env_steps": "eval_at_env_steps"}  # see fastrl.evaluation.evaluator
EVAL_KEYS = ("eval_", "eval/")  # an evaluation's figures (eval/<opponent>/...: against a scripted opponent)


def series_keys(x_key: str, y_keys: list[str]) -> set[str]:
    """The metrics columns that ``series`` reads to draw ``y_keys`` against ``x_key``."""
    return {x_key, *y_keys, *(EVAL_X[x_key] for y_key in y_keys if y_key.startswith(EVAL_KEYS) and x_key in EVAL_X)}


def series(metrics: Metrics, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(x [K], y [K]) float64 of the reports where both are numbers, x increasing.

    A resumed run continues from its last checkpoint, so its metrics.jsonl can step back in x:
    the reports of the first attempt beyond that point were redone, and the later ones count. A
    report is kept when every later report is further along in x.

    An evaluation (``eval_*`` and ``eval/*`` keys) is drawn at the env steps where its weights were taken, not at
    the later report that carried it."""
    x, y = metrics.columns[x_key], metrics.columns[y_key]
    if y_key.startswith(EVAL_KEYS) and x_key in EVAL_X:
        x = np.where(np.isnan(y), np.nan, metrics.columns[EVAL_X[x_key]])
    reported = np.flatnonzero(~np.isnan(x))
    later = np.append(np.minimum.accumulate(x[reported][::-1])[::-1][1:], np.inf)  # min x of the later reports
    kept = reported[x[reported] < later]
    kept = kept[~np.isnan(y[kept])]
    return x[kept], y[kept]


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _number(value) -> float:
    """``value`` as a float; NaN for null, text, booleans, infinities and integers beyond a float's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        number = float(value)
    except OverflowError:
        return math.nan
    return number if math.isfinite(number) else math.nan


def _is_number(value) -> bool:
    return not math.isnan(_number(value))


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
    """Every key that holds a number in some report of some run, sorted."""
    return sorted(set().union(*(run.metrics.keys for run in runs)))


def plot_learning_curves(run_dirs: list[Path], x_key: str, y_keys: list[str], out: Path,
                         targets: dict[str, float] | None = None,
                         x_limit: float | None = None) -> tuple[Path, list[SeedGroup]]:
    """Draw ``y_keys`` (one subplot each) against ``x_key`` for the runs in ``run_dirs`` into
    ``out`` (a PNG, or any format matplotlib infers from the suffix; ``.png`` is added to a name
    without one); returns the file written (absolute) and the groups drawn.
    ``targets`` ({y_key: value}) and ``x_limit`` draw reference lines, a promise's return and its
    budget on the x axis (scripts/bench.py learning). Raises PlotError or ConfigError (one line)."""
    plt = pyplot("fastrl-plot")
    if x_key not in X_AXES:
        raise PlotError(f"--x {x_key}: choose one of {', '.join(X_AXES)}")
    path = figure_path(out, "--out")
    runs = [load_run(Path(run_dir), series_keys(x_key, y_keys)) for run_dir in run_dirs]
    present = metric_keys(runs)
    drawn = {y_key: matching_keys(y_key, present) for y_key in y_keys}
    for y_key, keys in drawn.items():
        if not keys:
            missing = "matches no key of these runs' metrics" if WILDCARD in y_key else "not in these runs' metrics"
            raise PlotError(f"--y {y_key}: {missing}; keys present: {', '.join(present)}")
    groups = group_by_seed(runs)
    columns = min(len(y_keys), 2)
    rows = math.ceil(len(y_keys) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.5 * rows), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, y_key in zip(axes.flat, y_keys):
        lines = [(group, key) for group in groups for key in drawn[y_key]]
        for index, (group, key) in enumerate(lines):
            curves = [curve for curve in (series(run.metrics, x_key, key) for run in group.runs) if len(curve[0])]
            if not curves:
                continue  # this group's runs never reported this key (e.g. evaluation was off)
            band = seed_band(curves)
            color = colors[index % len(colors)]
            name = line_name(y_key, key)
            label = f"{name}: {group.legend(len(curves))}" if name else group.legend(len(curves))
            # Runs that differ in many keys get long labels; unwrapped, the legend covers the plot.
            ax.plot(band.x, band.mean, color=color, label=textwrap.fill(label, LEGEND_WIDTH))
            ax.fill_between(band.x, band.low, band.high, color=color, alpha=0.2, linewidth=0)
        if y_key in (targets or {}):
            ax.axhline(targets[y_key], color="black", linestyle="--", linewidth=1, label=f"target {targets[y_key]:g}")
        if x_limit is not None:
            ax.axvline(x_limit, color="black", linestyle=":", linewidth=1, label=f"budget {x_limit:,.0f}")
        ax.set_title(title(y_key))
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
    save(plt, fig, path)
    return path, groups
