"""Learning checks: a policy reaches a score within a budget. Minutes each, so the suite leaves them
out; `python scripts/bench.py learning-checks` (or `pytest tests/learning --learning`) runs them."""
