"""Time to a threshold and where a run ends: the two rules of every benchmark that judges learning.

A run reaches ``metric >= threshold`` at its first report whose metric is a finite number at or
above the threshold; its env steps and wall time there are its time to the threshold (wall time
counts from the train() call, start-up included). Over seeds, the median counts a seed that never
reached the threshold as later than every seed that did, so it exists while more than half of the
seeds reached it. A promise is judged on where a run ends (``final_stretch``): the mean of the
metric over the reports of the run's last stretch, the first crossing shown beside it.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def first_reaching(reports: Iterable[dict], metric: str, threshold: float) -> dict | None:
    """The first report (a metrics.jsonl row) with ``metric >= threshold``; None when none has."""
    return next((report for report in reports if is_number(report.get(metric)) and report[metric] >= threshold),
                None)


def final_stretch(reports: list[dict], metric: str, clock: str, length: float) -> tuple[float | None, int]:
    """The mean of ``metric`` over the reports of the run's last stretch, those whose ``clock``
    (``env_steps`` or ``wall_time``) is within ``length`` of the last report's, and how many
    reports it averages. Where none of them has the metric as a number (an evaluation can be rarer
    than the stretch is long), the last report that has it stands alone. (None, 0) when none has."""
    if not reports:
        return None, 0
    since = reports[-1][clock] - length
    values = [r[metric] for r in reports if r[clock] >= since and is_number(r.get(metric))]
    if not values:
        values = [r[metric] for r in reports if is_number(r.get(metric))][-1:]
    return (statistics.fmean(values), len(values)) if values else (None, 0)


def median_to_threshold(times: list[float | None]) -> float | None:
    """Median over seeds of each one's time to the threshold (None: never reached); None where more
    than half never reached it (or there were none)."""
    if not times:
        return None
    median = statistics.median(math.inf if time is None else time for time in times)
    return median if math.isfinite(median) else None
