"""Sampling SAC's tanh-squashed Gaussian policy on the CPU in one compiled pass: the maths of
fastrl.models.heads.SquashedGaussianHead (bounded log-std, reparameterized draw, tanh, exact
log-probability, affine map onto the action bounds) for the numpy inference path
(fastrl/sampling/numpy_mlp.py), where the same steps in torch are a dozen small ops."""
from __future__ import annotations

import math

import numba
import numpy as np

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def sample_squashed_gaussian(params, normals, center, half_width, log_std_range):
    r"""Draw one action per row of ``params`` and return its log-probability.

    Row b, dimension j: ``mean = params[b, j]``, ``raw = params[b, d + j]``,
    ``log_std = lo + softplus(raw - lo) - softplus(raw - hi)`` with ``(lo, hi) = log_std_range``,
    ``u = mean + exp(log_std) * normals[b, j]``, action ``center[j] + half_width[j] * tanh(u)``.
    The log-probability is that of ``tanh(u)`` in ``[-1, 1]^d``:
    ``sum_j (-normals^2 / 2 - log_std - log(2 pi) / 2) - sum_j 2 (log 2 - u - softplus(-2u))``.

    Args:
        params: ``[B, 2d]`` float32 (means, then raw log-stds).
        normals: ``[B, d]`` standard normal draws.
        center, half_width: ``[d]`` the bounds' midpoints and half-widths.
        log_std_range: ``(lo, hi)``.

    Returns:
        ``(actions, logp)``: float32 ``[B, d]`` and ``[B]``.

    Raises:
        ValueError: when the shapes disagree (the message names them).
    """
    params, normals = np.asarray(params, np.float32), np.asarray(normals, np.float32)
    center, half_width = np.asarray(center, np.float32), np.asarray(half_width, np.float32)
    if (params.ndim != 2 or normals.ndim != 2 or params.shape != (len(normals), 2 * normals.shape[1])
            or center.shape != normals.shape[1:] or half_width.shape != normals.shape[1:]):
        raise ValueError(f"sample_squashed_gaussian needs params [B, 2d], normals [B, d], center and half_width "
                         f"[d]; got {params.shape}, {normals.shape}, {center.shape} and {half_width.shape}")
    actions = np.empty(normals.shape, np.float32)
    logp = np.empty(len(params), np.float32)
    squashed_gaussian_rows(params, normals, center, half_width, float(log_std_range[0]), float(log_std_range[1]),
                           actions, logp)
    return actions, logp


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def squashed_gaussian_rows(params, normals, center, half_width, lo, hi, actions, logp):
    """:func:`sample_squashed_gaussian` into ``actions`` and ``logp``, without its argument checks,
    for callers whose shapes are right by construction. Sums in float64."""
    B, d = normals.shape
    for b in range(B):
        total = 0.0
        for j in range(d):
            raw = np.float64(params[b, d + j])
            log_std = lo + _softplus(raw - lo) - _softplus(raw - hi)
            eps = np.float64(normals[b, j])
            u = np.float64(params[b, j]) + math.exp(log_std) * eps
            actions[b, j] = center[j] + half_width[j] * np.float32(math.tanh(u))
            total += -0.5 * eps * eps - log_std - _HALF_LOG_2PI - 2.0 * (_LOG_2 - u - _softplus(-2.0 * u))
        logp[b] = total
