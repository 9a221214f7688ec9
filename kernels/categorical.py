"""Sampling a categorical policy on the CPU in one compiled pass (inverse-CDF sampling)."""
from __future__ import annotations

import numba
import numpy as np


def sample_categorical(logits, uniforms):
    r"""Draw one action per row of ``logits`` and return its log-probability.

    With ``p_a = softmax(logits)_a``, row b takes the first action a whose cumulative
    probability ``sum_{j<=a} p_j`` exceeds ``uniforms[b]``, so action a is drawn with probability
    ``p_a`` when ``uniforms[b] ~ U[0, 1)``; actions of probability 0 (logit ``-inf``) are never
    drawn. The log-probability is ``logits_a - logsumexp(logits)``.

    Args:
        logits: ``[B, A]`` float32 or float64, finite or ``-inf`` (at least one finite per row).
        uniforms: ``[B]`` floats in ``[0, 1)``.

    Returns:
        ``(actions, logp)``: int64 ``[B]`` and ``[B]`` of the logits' dtype.

    Raises:
        ValueError: when the shapes disagree (the message names them).
    """
    logits, uniforms = np.asarray(logits), np.asarray(uniforms)
    if logits.ndim != 2 or uniforms.shape != logits.shape[:1]:
        raise ValueError(f"sample_categorical needs logits [B, A] and uniforms [B]; got {logits.shape} "
                         f"and {uniforms.shape}")
    return _sample_rows(logits, uniforms)


@numba.njit(cache=True, nogil=True)
def _sample_rows(logits, uniforms):
    B, A = logits.shape
    actions = np.empty(B, np.int64)
    logp = np.empty(B, logits.dtype)
    weights = np.empty(A, np.float64)
    for b in range(B):
        top = logits[b, 0]
        for a in range(1, A):
            top = max(top, logits[b, a])
        total = 0.0
        last_possible = 0
        for a in range(A):
            weights[a] = np.exp(np.float64(logits[b, a] - top))
            total += weights[a]
            if weights[a] > 0.0:
                last_possible = a
        threshold = uniforms[b] * total
        # Rounding can leave the cumulative sum just short of the threshold: take the last
        # action of positive probability then, never one of probability 0.
        action = last_possible
        cumulative = 0.0
        for a in range(A):
            cumulative += weights[a]
            if threshold < cumulative and weights[a] > 0.0:
                action = a
                break
        actions[b] = action
        logp[b] = logits[b, action] - top - np.log(total)
    return actions, logp
