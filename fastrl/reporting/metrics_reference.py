"""docs/metrics.md, from the one declaration of the metrics.jsonl keys in fastrl.reporting.metrics
(``python -m fastrl.reporting.metrics_reference > docs/metrics.md``; tests/unit/test_docs.py checks
that it is current)."""
from __future__ import annotations

import sys

from .metrics import CLOCK_FIGURES, METRICS


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """docs/metrics.md: one row per key (key, the reports that hold it, meaning)."""
    lines = ["# Metrics", "",
             "Generated from `fastrl/reporting/metrics.py` by "
             "`python -m fastrl.reporting.metrics_reference > docs/metrics.md`; "
             "`tests/unit/test_docs.py` checks that it is current and that a run writes no undeclared key.", "",
             "A run appends one JSON object per report (every `report_every_s`; a serial run every "
             "`report_every_env_steps`, by default 10 learner batches) to `RUN_DIR/metrics.jsonl`. "
             "TensorBoard (when installed) and Weights & Biases (`logging.wandb`) receive the same figures. "
             "A figure that is not known yet (no episode has ended) is `null`.", "",
             "`<...>` in a key is filled in by the run: `<policy>` is `policy/<name>` with several policies or "
             "`member/<k>` in a population, `<stat>` is a `learner/` statistic, `<key>` an entry of "
             "`env.info_keys`, `<opponent>` an entry of `eval.opponents`.", "",
             "Keys ending in `_s` under `rollout/`, `inference/` and `learner/` are cumulative seconds. "
             "The difference between two reports gives each component's share of the time between them; "
             "`fastrl-profile` reads them so ([profiler.md](profiler.md)).", "",
             "Figures of the clock: " + ", ".join(f"`{key}`" for key in CLOCK_FIGURES) + " and every key ending "
             "in `_s`. Two serial runs with one seed differ in these alone "
             "([reproducibility.md](reproducibility.md)).", "",
             "| key | in which reports | meaning |", "|---|---|---|"]
    for metric in METRICS:
        lines.append(f"| `{_cell(metric.key)}` | {_cell(metric.when)} | {_cell(metric.meaning)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
