"""The profile's PNG (fastrl-profile --plot): throughput bars and the component breakdown, drawn
with the helpers every fastrl figure shares (``fastrl.reporting.figures``; ``PlotError`` and ``pyplot`` are
re-exported from there for ``fastrl.profiler``'s callers)."""
from __future__ import annotations

import itertools
from pathlib import Path

from ..reporting.figures import engineering_axis, pyplot, save
from .diagnosis import GROUPS, share_keys
from .measure import ProfileResult


def bars(ax, labels: list[str], values: list[float], colors: list[str], reference: float | None = None,
         reference_label: str | None = None) -> None:
    """Horizontal bars, top to bottom, each labelled with its value and, given a ``reference``,
    its ratio to it; the reference is drawn as a dashed line."""
    ax.barh(labels, values, color=colors)
    if reference is not None:
        ax.axvline(reference, color="black", linestyle="--", linewidth=1, label=reference_label)
    for y, value in enumerate(values):
        ratio = f" ({value / reference:.2f})" if reference else ""
        ax.text(value, y, f" {value:,.0f}{ratio}", va="center", fontsize=8)
    ax.invert_yaxis()


def stacked_bars(plt, ax, rows: dict[str, dict[str, float]]) -> None:
    """Horizontal bars, top to bottom, one per row label, stacked from its ``{segment: value}``
    in order; a segment name keeps one colour (and one legend entry) across rows."""
    names = list(dict.fromkeys(name for segments in rows.values() for name in segments))
    colors = dict(zip(names, itertools.cycle(plt.get_cmap("tab20").colors)))
    labelled = set()
    for y, segments in enumerate(rows.values()):
        x = 0.0
        for name, value in segments.items():
            ax.barh(y, value, left=x, color=colors[name], label=None if name in labelled else name)
            labelled.add(name)
            x += value
    ax.set_yticks(range(len(rows)), list(rows))
    ax.invert_yaxis()


def plot_profile(result: ProfileResult, path: str | Path) -> None:
    """A PNG: throughput against the raw env limit (left) and the component breakdown (right)."""
    plt = pyplot("--plot")
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6), gridspec_kw={"width_ratios": [1, 1.4]})
    bars(left, ["raw env", "sampling", "training"], [result.env_fps, result.sample_fps, result.train_fps],
         ["#888888", "#4c72b0", "#dd8452"], reference=result.env_fps, reference_label="raw env limit")
    left.set_xlabel("env steps / s")
    engineering_axis(left.xaxis)
    left.set_title(f"{result.env_id}: throughput vs raw env")
    left.legend(loc="lower right", fontsize=8)
    parts = [key for key in share_keys(result.breakdown["train"]) if not key.endswith("/busy")]
    # No batcher runs when the workers act for themselves: their acting is a rollout segment.
    groups = [group for group in GROUPS if not (result.acting_in_workers and group == "inference")]
    stacked_bars(plt, right, {f"{group} ({run})": {part: result.breakdown[run][part] for part in parts
                                                    if part.startswith(group + "/")}
                              for group in groups for run in ("sample", "train")})
    right.set_xlabel("share of wall time (rollout: per worker)")
    right.set_title("breakdown")
    right.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.suptitle(result.diagnosis, fontsize=9)
    save(plt, fig, path)
