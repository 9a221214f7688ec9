"""APPO's loss and its gradient in one compiled pass (the CPU path of fastrl.learner.losses.appo_loss).

The loss is :func:`fastrl.learner.losses.appo_loss`'s, given its V-trace targets: PPO's clipped
surrogate on the (optionally normalized) advantages, half the squared error of the values
against ``vs``, and the entropy, each averaged over the masked steps. Since the targets and the
advantages carry no gradient, the gradient of each term with respect to the log-probs, the
values and the entropies is elementwise and is written in the same pass; autograd then only
scales it (:class:`fastrl.kernels.torch_ops.APPOLoss`).
"""
from __future__ import annotations

import math

import numba
import numpy as np


def appo_loss_and_grads(target_logp, behaviour_logp, values, entropy, vs, advantages, mask, ppo_clip: float,
                        normalize_advantages: bool):
    r"""APPO's loss terms and their gradients.

    With ``m`` the mask, ``n = max(sum m, 1)``, ``A`` the advantages (normalized over the mask to
    zero mean and unit variance, ``+ 1e-8`` under the root, when ``normalize_advantages``),
    ``r = exp(min(target_logp - behaviour_logp, 20))`` and ``eps = ppo_clip``:

    - ``policy_loss = -sum(m min(r A, clip(r, 1 - eps, 1 + eps) A)) / n``;
    - ``value_loss = sum(m (vs - values[:T])^2) / (2 n)``;
    - ``entropy_mean = sum(m entropy) / n``.

    The gradients follow torch's conventions for the same expression, so that they agree with
    autograd on :func:`~fastrl.learner.losses.appo_loss`: ``d min(x, y)`` goes to the smaller
    argument (half to each on a tie), ``clip`` and ``min(., 20)`` pass the gradient at their
    bounds. Inside the clip range both arguments are equal, so the surrogate's gradient with
    respect to the log-ratio is ``A r``; outside it, ``A r`` where the unclipped term is the
    smaller and 0 where it is not.

    Args:
        target_logp, behaviour_logp, entropy, vs, advantages, mask: ``[T, B]``, one float dtype
        (float32 or float64; ``mask`` 0/1 of that dtype).
        values: ``[T + 1, B]``; its last row (the bootstrap) gets no gradient.

    Returns:
        ``(policy_loss, value_loss, entropy_mean, d_target_logp, d_values, d_entropy)``: three
        floats and the gradients of ``policy_loss`` ``[T, B]``, of ``value_loss`` ``[T + 1, B]``
        and of ``entropy_mean`` ``[T, B]``, in the inputs' dtype. NaN or infinity in a term's
        inputs, even where the mask is 0, makes that term NaN (``x * 0``), as in torch.
    """
    return _appo_loss_and_grads(target_logp, behaviour_logp, values, entropy, vs, advantages, mask,
                                float(ppo_clip), bool(normalize_advantages))


@numba.njit(cache=True, nogil=True)
def _appo_loss_and_grads(target_logp, behaviour_logp, values, entropy, vs, advantages, mask, ppo_clip,
                         normalize_advantages):
    T, B = target_logp.shape
    count = 0.0
    for t in range(T):
        for b in range(B):
            count += mask[t, b]
    count = max(count, 1.0)
    shift, scale = 0.0, 1.0
    if normalize_advantages:
        total = 0.0
        for t in range(T):
            for b in range(B):
                total += advantages[t, b] * mask[t, b]
        shift = total / count
        spread = 0.0
        for t in range(T):
            for b in range(B):
                centred = advantages[t, b] - shift
                spread += centred * centred * mask[t, b]
        scale = 1.0 / math.sqrt(spread / count + 1e-8)
    d_target_logp = np.empty_like(target_logp)
    d_values = np.zeros_like(values)
    d_entropy = np.empty_like(entropy)
    surrogate_sum, squared_error_sum, entropy_sum = 0.0, 0.0, 0.0
    low, high = 1.0 - ppo_clip, 1.0 + ppo_clip
    for t in range(T):
        for b in range(B):
            weight = mask[t, b] / count
            advantage = (advantages[t, b] - shift) * scale
            log_ratio = np.float64(target_logp[t, b]) - behaviour_logp[t, b]
            ratio = math.exp(min(log_ratio, 20.0))
            clipped = min(max(ratio, low), high)
            unclipped_term, clipped_term = ratio * advantage, clipped * advantage
            surrogate_sum += min(unclipped_term, clipped_term) * mask[t, b]
            # In range the two terms are equal (half the gradient each, both A r); out of it the
            # clipped term has none, and a tie means A = 0.
            passes = unclipped_term < clipped_term or low <= ratio <= high
            d_ratio = advantage if passes else 0.0
            d_target_logp[t, b] = -weight * d_ratio * (ratio if log_ratio <= 20.0 else 0.0)
            error = vs[t, b] - values[t, b]
            squared_error_sum += error * error * mask[t, b]
            d_values[t, b] = -weight * error
            entropy_sum += entropy[t, b] * mask[t, b]
            d_entropy[t, b] = weight
    return (-surrogate_sum / count, 0.5 * squared_error_sum / count, entropy_sum / count,
            d_target_logp, d_values, d_entropy)
