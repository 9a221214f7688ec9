"""Generalized advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous
Control Using Generalized Advantage Estimation"), time-major ``[T, B]``."""
from __future__ import annotations

import numba
import numpy as np

from .vtrace import time_major_inputs


def gae(rewards, values, bootstrap_value, discounts, lambda_):
    r"""GAE(gamma, lambda) advantages and the matching value targets.

    With ``delta_t = r_t + discount_t V(x_{t+1}) - V(x_t)`` and ``V(x_T) = bootstrap_value``,

        A_t = sum_{k>=t} (prod_{i=t}^{k-1} discount_i lambda) delta_k
            = delta_t + discount_t lambda A_{t+1},   A_T = 0,

    and ``returns_t = A_t + V(x_t)`` (the lambda-return). ``discounts`` already hold
    ``gamma * (1 - terminated_t)``, so the sum stops at an episode end; with ``lambda_ = 1`` the
    returns are the bootstrapped Monte-Carlo returns, equal to on-policy V-trace targets.

    Args:
        rewards: ``[T, B]``.
        values: ``[T, B]`` V(x_t).
        bootstrap_value: ``[B]`` V(x_T), the value of the state after the last step.
        discounts: ``[T, B]`` gamma * (1 - terminated_t).
        lambda_: the GAE lambda in [0, 1], cast to the array dtype.

    All arrays share one dtype, float32 or float64, and any strides.

    Returns:
        ``(advantages, returns)``, both ``[T, B]`` C-contiguous arrays of the input dtype.

    Raises:
        ValueError: when shapes or dtypes disagree (the message names the arrays).
    """
    (rewards, values, discounts), bootstrap_value = time_major_inputs(
        "gae", bootstrap_value, rewards=rewards, values=values, discounts=discounts)
    return _gae_scan(rewards, values, bootstrap_value, discounts, rewards.dtype.type(lambda_))


@numba.njit(cache=True)
def _gae_scan(rewards, values, bootstrap_value, discounts, lambda_):
    advantages = np.empty_like(rewards)
    returns = np.empty_like(rewards)
    next_advantages = np.zeros_like(bootstrap_value)
    next_values = bootstrap_value
    for t in range(rewards.shape[0] - 1, -1, -1):
        _gae_step(rewards[t], values[t], discounts[t], next_values, next_advantages, advantages[t],
                  returns[t], lambda_)
        next_values = values[t]
        next_advantages = advantages[t]
    return advantages, returns


@numba.njit(cache=True)
def _gae_step(rewards, values, discounts, next_values, next_advantages, advantages, returns,
              lambda_):
    # A function of 1-D rows so that LLVM vectorizes it over B (see vtrace._vtrace_step).
    for b in range(rewards.shape[0]):
        delta = rewards[b] + discounts[b] * next_values[b] - values[b]
        advantages[b] = delta + discounts[b] * lambda_ * next_advantages[b]
        returns[b] = advantages[b] + values[b]
