"""Numba kernels for fastrl: pure functions on numpy arrays (time-major ``[T, B]``).

The torch wrappers live in :mod:`fastrl.kernels.torch_ops`, imported on demand so that
processes that never touch torch (rollout workers) do not load it.
"""
from .categorical import sample_categorical
from .gae import gae
from .nstep import nstep_targets, nstep_windows
from .sumtree import SumTree
from .vtrace import vtrace

__all__ = ["SumTree", "gae", "nstep_targets", "nstep_windows", "sample_categorical", "vtrace"]
