"""n-step return targets for replay-based value learning (Q-learning as in Ape-X, Horgan et
al. 2018, "Distributed Prioritized Experience Replay"; n-step returns: Sutton & Barto 2018,
section 7.1), time-major ``[T, B]``."""
from __future__ import annotations

import operator

import numba
import numpy as np

from .vtrace import time_major_inputs


def nstep_targets(rewards, discounts, n):
    r"""Discounted n-step returns and how to bootstrap them, cut at episode ends.

    With ``m_t = min(n, T - t)`` steps available from ``t`` inside the ``[T, B]`` window,

        G_t = sum_{k<m_t} (prod_{j<k} discount_{t+j}) r_{t+k},
        bootstrap_discount_t = prod_{j<m_t} discount_{t+j},
        bootstrap_index_t = t + m_t,

    so the n-step target is ``G_t + bootstrap_discount_t * Q(x_{t + m_t})``, e.g.
    ``returns + bootstrap_discounts * q[bootstrap_indices]`` with ``q`` of shape ``[T + 1, B]``
    whose last row holds the values of the state after the window. ``discounts`` hold
    ``gamma * (1 - terminated_t)``: a 0 inside the window drops every later reward and makes
    the bootstrap discount 0 (the index is then irrelevant), so returns never cross an episode.

    Args:
        rewards: ``[T, B]``.
        discounts: ``[T, B]`` gamma * (1 - terminated_t), same dtype as rewards.
        n: number of steps, an integer >= 1 (1 gives the one-step TD target).

    All arrays share one dtype, float32 or float64, and any strides.

    Returns:
        ``(returns, bootstrap_discounts, bootstrap_indices)``: ``[T, B]`` arrays of the input
        dtype, and ``[T]`` int64 time indices t + m_t in ``[1, T]`` (the same for every column).

    Raises:
        ValueError: when shapes or dtypes disagree, or n < 1.
    """
    (rewards, discounts), _ = time_major_inputs("nstep_targets", None, rewards=rewards,
                                                discounts=discounts)
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"nstep_targets: n must be an integer >= 1, got {n}")
    returns, bootstrap_discounts = _nstep_sums(rewards, discounts, n)
    num_steps = rewards.shape[0]
    bootstrap_indices = np.minimum(np.arange(num_steps, dtype=np.int64) + n, num_steps)
    return returns, bootstrap_discounts, bootstrap_indices


@numba.njit(cache=True)
def _nstep_sums(rewards, discounts, n):
    num_steps = rewards.shape[0]
    returns = np.zeros_like(rewards)
    bootstrap_discounts = np.ones_like(rewards)
    # O(T B n) forward sums: n is small in practice (3-10), and unlike a backward recursion
    # this never divides by a discount that may be 0.
    for t in range(num_steps):
        for k in range(min(n, num_steps - t)):
            _add_step(returns[t], bootstrap_discounts[t], rewards[t + k], discounts[t + k])
    return returns, bootstrap_discounts


@numba.njit(cache=True)
def _add_step(returns, bootstrap_discounts, rewards, discounts):
    # A function of 1-D rows so that LLVM vectorizes it over B (see vtrace._vtrace_step).
    for b in range(returns.shape[0]):
        returns[b] += bootstrap_discounts[b] * rewards[b]
        bootstrap_discounts[b] *= discounts[b]
