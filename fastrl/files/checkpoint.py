"""Checkpoints: atomic, durable writes (fastrl.files.run_dir.write_file_atomic) and safe loading with fallback.

A checkpoint is ``RUN_DIR/checkpoints/ckpt_<env_steps:012d>.pt``: learner state (model,
optimizer, version, updates), counters, RNG states and the config it was trained with, all as
tensors and plain data. It is loaded with ``torch.load(weights_only=True)``, which refuses
pickled objects: a checkpoint file cannot run code (one that needs more is treated as corrupt).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

from .run_dir import make_dir, write_file_atomic

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
    """No usable checkpoint; the message says where we looked and what to do."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint is sound but does not fit what was asked (another env or model): every
    checkpoint of the run would say the same, so there is nothing to fall back to."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of a run, oldest first."""
    directory = checkpoint_dir(run_dir)
    return sorted(directory.glob("ckpt_*.pt")) if directory.is_dir() else []


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Temporary files of saves that a killed process never finished."""
    directory = checkpoint_dir(run_dir)
    if directory.is_dir():
        for tmp in [*directory.glob(".ckpt_*.tmp"), *directory.glob(".best.*.tmp")]:
            tmp.unlink(missing_ok=True)


def set_aside_newer_checkpoints(run_dir: Path, chosen: Path) -> list[Path]:
    """Rename checkpoints newer than ``chosen`` (skipped as unusable) to ``*.pt.bad``: pruning goes
    by name, so left in place they would outrank, and delete, the resumed run's new ones."""
    moved = []
    for path in list_checkpoints(run_dir):
        if path.name > chosen.name:
            bad = path.with_name(path.name + ".bad")
            os.replace(path, bad)
            moved.append(bad)
    return moved


BEST_CHECKPOINT = "best.pt"


def best_checkpoint_path(run_dir: Path) -> Path:
    """The best evaluated weights of a run (written by evaluation during training; never pruned:
    the rolling checkpoints are ``ckpt_*.pt``)."""
    return checkpoint_dir(run_dir) / BEST_CHECKPOINT


def save_checkpoint(run_dir: Path, state: dict, env_steps: int, keep: int) -> Path:
    """Write ``state`` as the checkpoint at ``env_steps`` and keep the newest ``keep``.

    Raises CheckpointError naming the path and the OS error (a full disk, say); no temporary
    file is left behind."""
    path = checkpoint_dir(run_dir) / f"ckpt_{env_steps:012d}.pt"
    write_checkpoint_file(path, state)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def write_checkpoint_file(path: Path, state: dict) -> None:
    """Write ``state`` to ``path`` atomically and durably (fastrl.files.run_dir.write_file_atomic)."""
    try:
        make_dir(path.parent)  # never through a link: pruning would delete in its target
        write_file_atomic(path, lambda f: torch.save(state, f))
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc}; free space (or fix the "
                              f"directory), then continue the run with --resume") from None


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # truncated zip, a pickle that weights_only refuses, ...
        raise CheckpointError(f"checkpoint '{path}' is corrupt or truncated, or holds more than tensors and "
                              f"plain data ({type(exc).__name__})") from None
    if not isinstance(state, dict) or "learner" not in state or "counters" not in state:
        raise CheckpointError(f"checkpoint '{path}' is not a fastrl checkpoint")
    steps = state["counters"].get("env_steps") if isinstance(state["counters"], dict) else None
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise CheckpointError(f"checkpoint '{path}' has no env step count (counters.env_steps), so fastrl did "
                              f"not write it: move it out of the run's checkpoints/ and use another")
    return state


def warn(message: str) -> None:
    """Warnings go to stderr: the commands' stdout carries their JSON result alone. A stderr that
    is gone (a closed pipe) loses the warning, never the run."""
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def load_latest_checkpoint(run_dir: Path, map_location="cpu", warn=warn, check=None) -> tuple[Path, dict]:
    """The newest checkpoint that loads and passes ``check(state)``; corrupt or unfitting ones
    are reported and skipped, except a CheckpointMismatch, which ``check`` raises to stop."""
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise CheckpointError(f"no checkpoint in '{checkpoint_dir(run_dir)}': train first, or pass the run "
                              f"directory that fastrl-train wrote")
    for path in reversed(candidates):
        try:
            state = load_checkpoint(path, map_location)
            if check is not None:
                check(state)
            return path, state
        except CheckpointMismatch:
            raise
        except CheckpointError as exc:
            warn(f"fastrl: {exc}; falling back to the previous checkpoint")
    raise CheckpointError(f"no checkpoint in '{checkpoint_dir(run_dir)}' is usable (see above); start a new run")


def load_model_state(model: torch.nn.Module, state: dict, path_hint: str = "the checkpoint") -> None:
    """Load a checkpoint's model weights into ``model``; CheckpointError if they do not fit."""
    try:
        model.load_state_dict(state["learner"]["model"])
    except (KeyError, RuntimeError, TypeError) as exc:
        first = str(exc).strip().splitlines()
        detail = first[1].strip() if len(first) > 1 else (first[0] if first else type(exc).__name__)
        raise CheckpointError(f"{path_hint} does not fit this model ({detail[:200]})") from None


def model_fit_check(model: torch.nn.Module):
    """A ``check`` for load_latest_checkpoint: the weights load into ``model`` (loaded into it)."""
    return lambda state: load_model_state(model, state)


def capture_rng(device: torch.device | str = "cpu") -> dict:
    """torch's and numpy's global RNG states as tensors and plain data (loadable with weights_only),
    and on a CUDA ``device`` that GPU's generator (dropout and sampling on the GPU draw from it,
    not from the CPU's)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    rng = {"torch": torch.get_rng_state(),
           "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                     "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    device = torch.device(device)
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def restore_rng(rng: dict, device: torch.device | str = "cpu") -> None:
    """Undo :func:`capture_rng`; a saved GPU generator goes to ``device`` when that is a GPU (a
    CPU run, or a checkpoint from one, has none to restore)."""
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    saved = rng.get("numpy")
    if isinstance(saved, dict):
        np.random.set_state((saved["kind"], saved["keys"].numpy().astype(np.uint32), saved["pos"],
                             saved["has_gauss"], saved["cached_gaussian"]))
    device = torch.device(device)
    if "cuda" in rng and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], device)
