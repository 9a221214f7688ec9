"""Evaluation: episodes for ``fastrl-eval``, the evaluator process during training, videos."""
