"""Time to a threshold, the one rule of every benchmark that times learning.

A run reaches ``metric >= threshold`` at its first report whose metric is a finite number at or
above the threshold; its env steps and wall time there are its time to the threshold (wall time
counts from the train() call, start-up included). Over seeds, the median counts a seed that never
reached the threshold as later than every seed that did, so it exists while more than half of the
seeds reached it. A promise of where a run ends (``expect.final_reports``) is judged instead on
the mean of the metric over the run's last reports (``final_mean``).
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


def final_mean(reports: list[dict], metric: str, count: int) -> float | None:
    """The mean of ``metric`` over the last ``count`` reports that have it as a number: where a
    run ended, steadier than its last report; None when fewer than ``count`` have it."""
    values = [report[metric] for report in reports if is_number(report.get(metric))][-count:]
    return sum(values) / count if count and len(values) == count else None


def median_to_threshold(times: list[float | None]) -> float | None:
    """Median over seeds of each one's time to the threshold (None: never reached); None where more
    than half never reached it (or there were none)."""
    if not times:
        return None
    median = statistics.median(math.inf if time is None else time for time in times)
    return median if math.isfinite(median) else None
