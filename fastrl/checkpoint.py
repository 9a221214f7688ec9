"""Checkpoints: atomic writes (temporary file, fsync, rename) and loading with fallback.

A checkpoint is ``RUN_DIR/checkpoints/ckpt_<env_steps:012d>.pt``: learner state (model,
optimizer, version, updates), counters, RNG states and the config it was trained with.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
    """No usable checkpoint; the message says where we looked and what to do."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of a run, oldest first."""
    directory = checkpoint_dir(run_dir)
    return sorted(directory.glob("ckpt_*.pt")) if directory.is_dir() else []


def save_checkpoint(run_dir: Path, state: dict, env_steps: int, keep: int) -> Path:
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt_{env_steps:012d}.pt"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # truncated zip, bad pickle, ...
        raise CheckpointError(f"checkpoint '{path}' is corrupt or truncated ({type(exc).__name__})") from None
    if not isinstance(state, dict) or "learner" not in state or "counters" not in state:
        raise CheckpointError(f"checkpoint '{path}' is not a fastrl checkpoint")
    return state


def load_latest_checkpoint(run_dir: Path, map_location="cpu", warn=print) -> tuple[Path, dict]:
    """The newest checkpoint that loads; corrupt ones are reported and skipped."""
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise CheckpointError(f"no checkpoint in '{checkpoint_dir(run_dir)}': train first, or pass the run "
                              f"directory that fastrl-train wrote")
    for path in reversed(candidates):
        try:
            return path, load_checkpoint(path, map_location)
        except CheckpointError as exc:
            warn(f"fastrl: {exc}; falling back to the previous checkpoint")
    raise CheckpointError(f"every checkpoint in '{checkpoint_dir(run_dir)}' is corrupt; start a new run")
