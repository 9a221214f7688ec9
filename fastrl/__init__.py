"""fastrl: an asynchronous reinforcement-learning trainer for one machine, with optional
multi-node learners.

From Python::

    import fastrl
    cfg = fastrl.build_config("cartpole-appo", {"learner.lr": 1e-3})
    result = fastrl.train(cfg, run_dir="runs/cp")
"""
from __future__ import annotations

__all__ = ["build_config", "train"]


def __getattr__(name: str):
    # Imported on first use: every child process imports this package, and most of them (and
    # `fastrl.kernels` on its own) need neither the runner nor the config loader.
    if name == "train":
        from .run.training import train
        return train
    if name == "build_config":
        from .config import build_config
        return build_config
    raise AttributeError(f"module 'fastrl' has no attribute {name!r}")
