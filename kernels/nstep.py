"""n-step return targets for replay-based value learning (Q-learning as in Ape-X, Horgan et
al. 2018, "Distributed Prioritized Experience Replay"; n-step returns: Sutton & Barto 2018,
section 7.1), time-major ``[T, B]``.

One implementation of the window rule, :func:`nstep_windows`, serves every n-step target in
fastrl: :func:`nstep_targets` (the DQN learner's arrival priorities) slides it along whole
trajectories, and fastrl.replay.buffer applies it to the windows of the transitions it samples."""
from __future__ import annotations

import operator

import numba
import numpy as np

from .vtrace import time_major_inputs, valid_mask


def nstep_targets(rewards, discounts, n, valid=None):
    r"""Discounted n-step returns and how to bootstrap them, cut at episode ends.

    With ``m_t`` the number of steps of the window from ``t``: at most ``n``, at most the
    ``T - t`` steps left in the ``[T, B]`` window, and only valid steps (the window stops before
    the first invalid step),

        G_t = sum_{k<m_t} (prod_{j<k} discount_{t+j}) r_{t+k},
        bootstrap_discount_t = prod_{j<m_t} discount_{t+j},
        bootstrap_index_t = t + m_t,

    so the n-step target is ``G_t + bootstrap_discount_t * Q(x_{t + m_t})``, with ``q`` of shape
    ``[T + 1, B]`` whose last row holds the values of the state after the window.

    Episode ends under next-step autoreset (gymnasium 1.x, envpool), where ``x_{t+1}`` after a
    done step ``t`` is the final observation and step ``t + 1`` is the reset step:

    - terminated step: ``discount = 0`` drops every later reward and makes the bootstrap
      discount 0 (the index is then irrelevant).
    - truncated step ``t`` (time limit): its discount is gamma, and the window stops after it
      only because step ``t + 1`` is invalid: the target bootstraps from ``Q(x_{t+1})``, the
      final observation. Without ``valid`` the window runs on into the next episode.
    - invalid step ``t`` (the autoreset step: its action was discarded): an empty window,
      ``m_t = 0``: ``G_t = 0``, bootstrap discount 1, bootstrap index ``t``. It must not be
      trained on (mask it out of the losses), and no window runs across it.

    Args:
        rewards: ``[T, B]``.
        discounts: ``[T, B]`` gamma * (1 - terminated_t), same dtype as rewards.
        n: number of steps, an integer >= 1 (1 gives the one-step TD target).
        valid: ``[T, B]`` bool, or numbers with 0 for invalid: False on the autoreset step after
            a done. None (the default) means every step is valid.

    The float arrays share one dtype, float32 or float64, and any strides.

    Returns:
        ``(returns, bootstrap_discounts, bootstrap_indices)``: ``[T, B]`` arrays of the input
        dtype, and int64 time indices ``t + m_t``. Without ``valid`` the indices are ``[T]``, in
        ``[1, T]`` and the same for every column (``q[bootstrap_indices]`` gathers the rows);
        with ``valid`` they are ``[T, B]`` in ``[0, T]``
        (``np.take_along_axis(q, bootstrap_indices, axis=0)``).

    Raises:
        ValueError: when shapes or dtypes disagree, or n < 1.
    """
    (rewards, discounts), _ = time_major_inputs("nstep_targets", None, rewards=rewards,
                                                discounts=discounts)
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"nstep_targets: n must be an integer >= 1, got {n}")
    mask = valid_mask("nstep_targets", valid, rewards.shape, "rewards")
    returns, bootstrap_discounts, bootstrap_indices = _nstep_sums(rewards, discounts, mask, n)
    if valid is None:
        # Every column then has the same windows: keep the [T] indices callers index rows with.
        num_steps = rewards.shape[0]
        bootstrap_indices = np.minimum(np.arange(num_steps, dtype=np.int64) + n, num_steps)
    return returns, bootstrap_discounts, bootstrap_indices


@numba.njit(cache=True)
def _nstep_sums(rewards, discounts, valid, n):
    num_steps = rewards.shape[0]
    returns = np.empty_like(rewards)
    bootstrap_discounts = np.empty_like(rewards)
    bootstrap_indices = np.empty(rewards.shape, dtype=np.int64)
    for t in range(num_steps):
        stop = min(t + n, num_steps)
        nstep_windows(rewards[t:stop], discounts[t:stop], valid[t:stop], returns[t],
                      bootstrap_discounts[t], bootstrap_indices[t])
        bootstrap_indices[t] += t
    return returns, bootstrap_discounts, bootstrap_indices


@numba.njit(cache=True)
def nstep_windows(rewards, discounts, valid, returns, bootstrap_discounts, steps):
    r"""The n-step window rule, for ``B`` windows side by side: the one implementation behind
    :func:`nstep_targets` and the transitions that fastrl.replay.buffer samples.

    Window b is column b of the time-major inputs, row k its k-th step. It takes the steps before
    its first invalid one, at most all n: ``m_b`` steps, and

        returns_b = sum_{k<m_b} (prod_{j<k} discounts[j, b]) rewards[k, b],
        bootstrap_discounts_b = prod_{j<m_b} discounts[j, b],

    so its target is ``returns_b + bootstrap_discounts_b * Q(x_b)`` with ``x_b`` the observation
    after step ``m_b - 1`` (a terminated step has discount 0). Under next-step autoreset the step
    after a done is invalid, so a window ends at its episode's end; an invalid step 0 makes an
    empty window (``m_b = 0``, return 0, bootstrap discount 1). Sums run forward: unlike a backward
    recursion they never divide by a discount that may be 0.

    Args:
        rewards, discounts: ``[n, B]`` floats of one dtype, any strides.
        valid: ``[n, B]`` bool.
        returns, bootstrap_discounts: ``[B]`` outputs; the sums run in their dtype.
        steps: ``[B]`` int64 output, ``m_b`` in ``[0, n]``.
    """
    returns[:] = 0.0
    bootstrap_discounts[:] = 1.0
    steps[:] = 0
    # O(n B): n is small in practice (3-10).
    for k in range(rewards.shape[0]):
        _add_step(k, rewards[k], discounts[k], valid[k], returns, bootstrap_discounts, steps)


@numba.njit(cache=True)
def _add_step(k, rewards, discounts, valid, returns, bootstrap_discounts, steps):
    # A function of 1-D rows so that LLVM vectorizes it over B (see vtrace._vtrace_step).
    for b in range(returns.shape[0]):
        if steps[b] == k and valid[b]:  # still open: the window took every earlier step
            returns[b] += bootstrap_discounts[b] * rewards[b]
            bootstrap_discounts[b] *= discounts[b]
            steps[b] += 1
