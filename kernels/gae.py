"""Generalized advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous
Control Using Generalized Advantage Estimation"), time-major ``[T, B]``."""
from __future__ import annotations

import numba
import numpy as np

from .vtrace import time_major_inputs, valid_mask


def gae(rewards, values, bootstrap_value, discounts, lambda_, valid=None):
    r"""GAE(gamma, lambda) advantages and the matching value targets.

    With ``delta_t = r_t + discount_t V(x_{t+1}) - V(x_t)`` and ``V(x_T) = bootstrap_value``,

        A_t = sum_{k>=t} (prod_{i=t}^{k-1} discount_i lambda) delta_k
            = delta_t + discount_t lambda A_{t+1},   A_T = 0,

    summed over valid steps only: an invalid step ``t`` gets ``A_t = 0`` and no sum runs across
    it. ``returns_t = A_t + V(x_t)`` (the lambda-return); with ``lambda_ = 1`` the returns are
    the bootstrapped Monte-Carlo returns, equal to on-policy V-trace targets.

    Episode ends under next-step autoreset (gymnasium 1.x, envpool), where ``x_{t+1}`` after a
    done step ``t`` is the final observation and step ``t + 1`` is the reset step:

    - terminated step ``t``: ``discount_t = 0``, so ``A_t = r_t - V(x_t)``, ``returns_t = r_t``,
      and nothing after ``t`` enters the sums of ``t`` and earlier steps.
    - truncated step ``t`` (time limit): ``discount_t = gamma``, so ``delta_t`` bootstraps from
      ``V(x_{t+1})``, the value of the final observation (``bootstrap_value`` when t = T - 1);
      the sum stops there only because step ``t + 1`` is marked invalid. Without ``valid`` it
      runs on into the next episode.
    - invalid step ``t`` (the autoreset step: its action was discarded, its "transition" goes
      from the final observation to the reset observation): ``A_t = 0`` and
      ``returns_t = V(x_t)``, the same as V-trace with ``rho_t = c_t = 0``; it must not be
      trained on (mask it out of the losses).

    Args:
        rewards: ``[T, B]``.
        values: ``[T, B]`` V(x_t).
        bootstrap_value: ``[B]`` V(x_T), the value of the state after the last step.
        discounts: ``[T, B]`` gamma * (1 - terminated_t).
        lambda_: the GAE lambda in [0, 1], cast to the array dtype.
        valid: ``[T, B]`` bool, or numbers with 0 for invalid: False on the autoreset step after
            a done (``Trajectories.valid``). None (the default) means every step is valid.

    The float arrays share one dtype, float32 or float64, and any strides.

    Returns:
        ``(advantages, returns)``, both ``[T, B]`` C-contiguous arrays of the input dtype.

    Raises:
        ValueError: when shapes or dtypes disagree (the message names the arrays).
    """
    (rewards, values, discounts), bootstrap_value = time_major_inputs(
        "gae", bootstrap_value, rewards=rewards, values=values, discounts=discounts)
    valid = valid_mask("gae", valid, rewards.shape, "rewards")
    return _gae_scan(rewards, values, bootstrap_value, discounts, valid, rewards.dtype.type(lambda_))


@numba.njit(cache=True)
def _gae_scan(rewards, values, bootstrap_value, discounts, valid, lambda_):
    advantages = np.empty_like(rewards)
    returns = np.empty_like(rewards)
    next_advantages = np.zeros_like(bootstrap_value)
    next_values = bootstrap_value
    for t in range(rewards.shape[0] - 1, -1, -1):
        _gae_step(rewards[t], values[t], discounts[t], valid[t], next_values, next_advantages,
                  advantages[t], returns[t], lambda_)
        next_values = values[t]
        next_advantages = advantages[t]
    return advantages, returns


@numba.njit(cache=True)
def _gae_step(rewards, values, discounts, valid, next_values, next_advantages, advantages,
              returns, lambda_):
    # A function of 1-D rows so that LLVM vectorizes it over B (see vtrace._vtrace_step).
    for b in range(rewards.shape[0]):
        if valid[b]:
            delta = rewards[b] + discounts[b] * next_values[b] - values[b]
            advantages[b] = delta + discounts[b] * lambda_ * next_advantages[b]
        else:
            # A zero advantage here is what cuts the sum of the step before.
            advantages[b] = 0.0
        returns[b] = advantages[b] + values[b]
