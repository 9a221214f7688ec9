"""Torch front-ends of the numba kernels, for the learner.

Imported on its own (``from fastrl.kernels.torch_ops import vtrace_torch``) so that processes
which never touch torch do not load it through ``fastrl.kernels``. The targets carry no
gradient: inputs are detached, copied to the CPU, and the results are moved back to the device
and dtype of ``rewards``. float16 and bfloat16 are computed in float32, which numpy supports.
"""
from __future__ import annotations

import numpy as np
import torch

from .gae import gae
from .vtrace import vtrace

_NUMPY_UNSUPPORTED = (torch.float16, torch.bfloat16)


def vtrace_torch(log_rhos: torch.Tensor, discounts: torch.Tensor, rewards: torch.Tensor,
                 values: torch.Tensor, bootstrap_value: torch.Tensor, clip_rho_threshold=1.0,
                 clip_pg_rho_threshold=1.0, clip_c_threshold=1.0,
                 lambda_=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fastrl.kernels.vtrace` on tensors: ``[T, B]`` inputs, ``[B]`` bootstrap_value.

    Returns:
        ``(vs, pg_advantages)``, ``[T, B]`` tensors on the device and dtype of ``rewards``.
    """
    vs, pg_advantages = vtrace(
        _to_numpy(log_rhos), _to_numpy(discounts), _to_numpy(rewards), _to_numpy(values),
        _to_numpy(bootstrap_value), clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold, clip_c_threshold=clip_c_threshold,
        lambda_=lambda_)
    return _like(vs, rewards), _like(pg_advantages, rewards)


def gae_torch(rewards: torch.Tensor, values: torch.Tensor, bootstrap_value: torch.Tensor,
              discounts: torch.Tensor, lambda_: float,
              valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fastrl.kernels.gae` on tensors: ``[T, B]`` inputs, ``[B]`` bootstrap_value,
    optional ``[T, B]`` bool ``valid`` (False on the autoreset step; None: all valid).

    Returns:
        ``(advantages, returns)``, ``[T, B]`` tensors on the device and dtype of ``rewards``.
    """
    advantages, returns = gae(_to_numpy(rewards), _to_numpy(values), _to_numpy(bootstrap_value),
                              _to_numpy(discounts), lambda_,
                              valid=None if valid is None else _to_numpy(valid))
    return _like(advantages, rewards), _like(returns, rewards)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype in _NUMPY_UNSUPPORTED:
        tensor = tensor.float()
    return tensor.numpy()


def _like(array: np.ndarray, reference: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(array).to(device=reference.device, dtype=reference.dtype)
