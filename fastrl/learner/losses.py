"""Pure loss functions of the learner family: tensors in, ``(loss, stats)`` out.

They hold no state and read no config, so research code can call them on its own tensors; the
learners call them with exactly these arguments. Conventions: time-major ``[T, B]``; ``values``
has ``T + 1`` rows, the last one bootstrapping the trajectory's end; ``discounts`` is
``gamma * (1 - terminated)``; ``valid`` is False on the autoreset step after a done (gymnasium 1.x
and envpool reset on the step after it; that step's action is discarded), where rho = c = 0 cuts
the V-trace trace and no loss is taken. ``stats`` holds detached 0-d tensors, so that a caller
reads them (a host synchronisation on a GPU) only when it wants to. Each function checks its
inputs' shapes first (rlax's way) and names the argument, its shape and the one expected.

V-trace: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures"; APPO adds PPO's clipped surrogate (Schulman et al. 2017) on the
V-trace advantages.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..kernels.torch_ops import APPOLoss, kernels_take, vtrace_scan, vtrace_torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / count


def _shape_error(function: str, name: str, got: torch.Size, expected: str, shape: tuple[int, ...]) -> ValueError:
    return ValueError(f"{function}: {name} has shape {list(got)}, expected {expected} = {list(shape)}")


def _check_time_major(function: str, target_logp: torch.Tensor, values: torch.Tensor,
                      per_step: tuple[tuple[str, torch.Tensor | None], ...]) -> None:
    """Raise ValueError unless ``target_logp`` is ``[T, B]``, ``values`` ``[T + 1, B]`` and every
    ``(name, tensor)`` of ``per_step`` (None: not given) ``[T, B]``. A few size compares: nothing
    next to the loss, and torch.compile traces them as guards."""
    shape = target_logp.shape
    if len(shape) != 2:
        raise ValueError(f"{function}: target_logp has shape {list(shape)}, expected [T, B] "
                         f"(time-major: T steps of B trajectories)")
    bootstrapped = (shape[0] + 1, shape[1])
    if values.shape != bootstrapped:
        raise _shape_error(function, "values", values.shape, "[T + 1, B]", bootstrapped)
    for name, x in per_step:
        if x is not None and x.shape != shape:
            raise _shape_error(function, name, x.shape, "[T, B]", shape)


@torch.no_grad()
def vtrace_targets(target_logp: torch.Tensor, behaviour_logp: torch.Tensor, values: torch.Tensor,
                   rewards: torch.Tensor, discounts: torch.Tensor, valid: torch.Tensor, *, clip_rho: float = 1.0,
                   clip_c: float = 1.0, clip_pg_rho: float = 1.0, lambda_: float = 1.0,
                   torch_scan: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace value targets ``vs`` and policy-gradient advantages, both ``[T, B]``.

    log rho = target_logp - behaviour_logp, set to -inf where not ``valid`` (rho = c = 0: vs = V
    there and the trace is cut); see :func:`fastrl.kernels.vtrace` for the recursion.
    ``torch_scan``: compute on the tensors' device (:func:`~fastrl.kernels.torch_ops.vtrace_scan`)
    rather than by the numba kernel (:func:`~fastrl.kernels.torch_ops.vtrace_torch`, a round trip
    through the host). None: the scan off the CPU, the kernel on it, where it is faster."""
    _check_time_major("vtrace_targets", target_logp, values, (
        ("behaviour_logp", behaviour_logp), ("rewards", rewards), ("discounts", discounts), ("valid", valid)))
    T = rewards.shape[0]
    log_rhos = (target_logp - behaviour_logp).masked_fill(~valid, -math.inf)
    if torch_scan is None:
        torch_scan = rewards.device.type != "cpu"
    kernel = vtrace_scan if torch_scan else vtrace_torch
    return kernel(log_rhos, discounts, rewards, values[:T], values[T], clip_rho_threshold=clip_rho,
                  clip_pg_rho_threshold=clip_pg_rho, clip_c_threshold=clip_c, lambda_=lambda_)


def _targets_and_mask(function, target_logp, behaviour_logp, values, entropy, rewards, discounts, valid, mask,
                      targets, clips):
    """The inputs' shapes checked; (vs, advantages) given or computed, and the float loss mask."""
    vs, advantages = (None, None) if targets is None else targets
    _check_time_major(function, target_logp, values, (
        ("behaviour_logp", behaviour_logp), ("entropy", entropy), ("rewards", rewards), ("discounts", discounts),
        ("valid", valid), ("mask", mask), ("targets[0] (vs)", vs), ("targets[1] (advantages)", advantages)))
    if targets is None:
        if rewards is None or discounts is None:
            raise ValueError(f"{function}: rewards and discounts are needed to compute the V-trace targets; "
                             f"pass them, or targets=(vs, advantages)")
        vs, advantages = vtrace_targets(target_logp.detach(), behaviour_logp, values.detach(), rewards, discounts,
                                        valid, **clips)
    return vs, advantages, (valid if mask is None else mask).float()


def _mask_count(maskf: torch.Tensor) -> torch.Tensor:
    """The number of masked steps, at least 1 (an empty mask averages to 0, not NaN)."""
    return maskf.sum().clamp(min=1.0)


def _add_uniform_kl(loss, stats, uniform_kl, uniform_kl_coef, maskf, count):
    """``loss + uniform_kl_coef * mean(uniform_kl)`` over the mask, and the stats that report it."""
    if uniform_kl is None or uniform_kl_coef <= 0:
        return loss, stats
    mean_kl = masked_mean(uniform_kl, maskf, count)
    loss = loss + uniform_kl_coef * mean_kl
    return loss, {**stats, "loss": loss.detach(), "uniform_kl": mean_kl.detach()}


def _check_uniform_kl(function: str, uniform_kl: torch.Tensor | None, target_logp: torch.Tensor) -> None:
    if uniform_kl is not None and uniform_kl.shape != target_logp.shape:
        raise _shape_error(function, "uniform_kl", uniform_kl.shape, "target_logp's [T, B]", tuple(target_logp.shape))


def _actor_critic_loss(policy_loss, vs, values, entropy, maskf, count, value_coef, entropy_coef,
                       value_clip=0.0, old_values=None, uniform_kl=None, uniform_kl_coef=0.0):
    T = vs.shape[0]
    squared = (vs - values[:T]).square()
    if value_clip > 0:
        # PPO's value clipping: V may not gain by moving further than value_clip from where it was.
        moved = old_values[:T] + (values[:T] - old_values[:T]).clamp(-value_clip, value_clip)
        squared = torch.maximum(squared, (vs - moved).square())
    value_loss = 0.5 * masked_mean(squared, maskf, count)
    mean_entropy = masked_mean(entropy, maskf, count)
    loss = policy_loss + value_coef * value_loss - entropy_coef * mean_entropy
    return _add_uniform_kl(loss, {"loss": loss.detach(), "policy_loss": policy_loss.detach(),
                                  "value_loss": value_loss.detach(), "entropy": mean_entropy.detach()},
                           uniform_kl, uniform_kl_coef, maskf, count)


def appo_loss(target_logp: torch.Tensor, behaviour_logp: torch.Tensor, values: torch.Tensor, entropy: torch.Tensor,
              rewards: torch.Tensor, discounts: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor | None = None,
              *, clip_rho: float = 1.0, clip_c: float = 1.0, clip_pg_rho: float = 1.0, lambda_: float = 1.0,
              ppo_clip: float = 0.2, value_coef: float = 0.5, entropy_coef: float = 0.01,
              normalize_advantages: bool = True, targets: tuple[torch.Tensor, torch.Tensor] | None = None,
              value_clip: float = 0.0, old_values: torch.Tensor | None = None,
              uniform_kl: torch.Tensor | None = None, uniform_kl_coef: float = 0.0,
              compiled: bool = True) -> tuple[torch.Tensor, dict]:
    """APPO: PPO's clipped surrogate on V-trace advantages, a value loss on V-trace targets and
    an entropy bonus.

    ``target_logp`` ``[T, B]`` (the current policy's log-probs of the taken actions) and
    ``values`` ``[T+1, B]`` carry gradients; ``entropy`` ``[T, B]`` is the current policy's;
    ``mask`` ``[T, B]`` bool (default ``valid``) selects the steps the loss averages over (the
    learner also drops steps acted by too old a policy). ``loss = policy_loss + value_coef *
    value_loss - entropy_coef * entropy`` with ``policy_loss = -mean(min(r A, clip(r, 1 - eps,
    1 + eps) A))``, ``r = exp(target_logp - behaviour_logp)``, ``A`` the V-trace advantage
    (normalized over the mask when ``normalize_advantages``), ``value_loss = mean((vs - V)^2) / 2``.
    ``targets``: ``(vs, advantages)`` computed already (by :func:`vtrace_targets` with the same
    arguments, or your own); by default they are computed here. ``value_clip`` > 0 clips the value
    loss as PPO does around ``old_values`` ``[T + 1, B]`` (the values before the batch's first
    gradient step): ``max((vs - V)^2, (vs - V_old - clip(V - V_old, +-value_clip))^2) / 2``.
    ``uniform_kl`` ``[T, B]`` (KL(uniform over the legal actions || policy) per step, with
    gradients: ``ActionHead.uniform_kl``) adds ``uniform_kl_coef`` times its mean over the mask,
    reported as the stat ``uniform_kl``.

    ``compiled``: compute the loss and its gradient in one compiled pass
    (:class:`~fastrl.kernels.torch_ops.APPOLoss`, same maths) where it takes the tensors (CPU
    float32 / float64, one dtype); torch ops elsewhere, and always when False. Measured on a
    CartPole-shaped batch (T = 32, B = 128, one thread): forward and backward of the
    loss, V-trace aside, 200 us against 350 us by torch ops."""
    vs, advantages, maskf = _targets_and_mask(
        "appo_loss", target_logp, behaviour_logp, values, entropy, rewards, discounts, valid, mask, targets,
        dict(clip_rho=clip_rho, clip_c=clip_c, clip_pg_rho=clip_pg_rho, lambda_=lambda_))
    if value_clip > 0 and (old_values is None or old_values.shape != values.shape):
        raise ValueError(f"appo_loss: value_clip={value_clip:g} needs old_values of values' shape "
                         f"{list(values.shape)}, got {None if old_values is None else list(old_values.shape)}")
    _check_uniform_kl("appo_loss", uniform_kl, target_logp)
    if compiled and not value_clip and kernels_take(target_logp, values, entropy, behaviour_logp, vs, advantages):
        loss, policy_loss, value_loss, mean_entropy = APPOLoss.apply(
            target_logp, values, entropy, behaviour_logp, vs, advantages, maskf, ppo_clip, normalize_advantages,
            value_coef, entropy_coef)
        stats = {"loss": loss.detach(), "policy_loss": policy_loss, "value_loss": value_loss, "entropy": mean_entropy}
        if uniform_kl is None:
            return loss, stats
        # The kernel counts the mask inside; the KL term, seldom on, pays for a count of its own.
        return _add_uniform_kl(loss, stats, uniform_kl, uniform_kl_coef, maskf, _mask_count(maskf))
    count = _mask_count(maskf)
    if normalize_advantages:
        mean = masked_mean(advantages, maskf, count)
        std = torch.sqrt(masked_mean((advantages - mean).square(), maskf, count) + 1e-8)
        advantages = (advantages - mean) / std
    ratio = torch.exp((target_logp - behaviour_logp).clamp(max=20.0))
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - ppo_clip, 1 + ppo_clip) * advantages)
    policy_loss = -masked_mean(surrogate, maskf, count)
    return _actor_critic_loss(policy_loss, vs, values, entropy, maskf, count, value_coef, entropy_coef,
                              value_clip, old_values, uniform_kl, uniform_kl_coef)


def impala_loss(target_logp: torch.Tensor, behaviour_logp: torch.Tensor, values: torch.Tensor, entropy: torch.Tensor,
                rewards: torch.Tensor, discounts: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor | None = None,
                *, clip_rho: float = 1.0, clip_c: float = 1.0, clip_pg_rho: float = 1.0, lambda_: float = 1.0,
                value_coef: float = 0.5, entropy_coef: float = 0.01,
                targets: tuple[torch.Tensor, torch.Tensor] | None = None,
                uniform_kl: torch.Tensor | None = None, uniform_kl_coef: float = 0.0) -> tuple[torch.Tensor, dict]:
    """IMPALA: the V-trace policy gradient ``-mean(A * target_logp)``, the value loss on V-trace
    targets and an entropy bonus; arguments as :func:`appo_loss`."""
    _check_uniform_kl("impala_loss", uniform_kl, target_logp)
    vs, advantages, maskf = _targets_and_mask(
        "impala_loss", target_logp, behaviour_logp, values, entropy, rewards, discounts, valid, mask, targets,
        dict(clip_rho=clip_rho, clip_c=clip_c, clip_pg_rho=clip_pg_rho, lambda_=lambda_))
    count = _mask_count(maskf)
    policy_loss = -masked_mean(advantages * target_logp, maskf, count)
    return _actor_critic_loss(policy_loss, vs, values, entropy, maskf, count, value_coef, entropy_coef,
                              uniform_kl=uniform_kl, uniform_kl_coef=uniform_kl_coef)


def td_loss(q_taken: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None,
            mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """DQN's loss: the importance-weighted Huber (smooth L1) loss between ``q_taken`` ``[N]``
    (Q of the taken actions, with gradients) and fixed ``targets`` ``[N]`` (e.g. n-step double-Q
    returns), ``weights`` ``[N]`` the prioritized replay's importance weights (default 1).
    ``stats["td"]`` ``[N]`` holds the TD errors ``targets - q_taken``, the new priorities' source.
    ``N`` may be several axes (R2D2's ``[T, B]``): every argument has ``q_taken``'s shape.

    ``mask`` (the shape of ``q_taken``; nonzero = trained): the loss and ``q_mean`` average over
    the masked items only and ``td`` is 0 elsewhere, as a boolean selection of them would give
    (NaN for an empty mask, so that the step is skipped; what lies outside the mask, NaN
    included, never counts). Computed in place: a selection would make the host wait for the device."""
    shape = q_taken.shape
    for name, x in (("targets", targets), ("weights", weights), ("mask", mask)):
        if x is not None and x.shape != shape:
            raise _shape_error("td_loss", name, x.shape, "q_taken's shape", shape)
    per_item = F.smooth_l1_loss(q_taken, targets.detach(), reduction="none")
    if weights is not None:
        per_item = weights * per_item
    td, q = (targets - q_taken).detach(), q_taken.detach()
    if mask is None:
        loss = per_item.mean()
        return loss, {"loss": loss.detach(), "td": td, "q_mean": q.mean()}
    keep = mask != 0
    count = keep.sum()
    loss = torch.where(keep, per_item, 0.0).sum() / count
    return loss, {"loss": loss.detach(), "td": torch.where(keep, td, 0.0),
                  "q_mean": torch.where(keep, q, 0.0).sum() / count}


VALUE_RESCALE_EPS = 1e-3  # R2D2 (Kapturowski et al. 2019), after Pohlen et al. 2018


def value_rescale(x: torch.Tensor, eps: float = VALUE_RESCALE_EPS) -> torch.Tensor:
    """R2D2's invertible value rescaling ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = VALUE_RESCALE_EPS) -> torch.Tensor:
    """``h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root.square() - 1.0)


def sequence_priorities(td: torch.Tensor, mask: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """R2D2's sequence priority ``eta * max_t |td| + (1 - eta) * mean_t |td|`` over the trained
    steps (``mask`` ``[T, B]``) of each sequence; ``td`` ``[T, B]`` -> ``[B]`` (0 where no step is trained)."""
    if td.dim() != 2:
        raise ValueError(f"sequence_priorities: td has shape {list(td.shape)}, expected [T, B] (time-major)")
    if mask.shape != td.shape:
        raise _shape_error("sequence_priorities", "mask", mask.shape, "[T, B]", td.shape)
    error = td.abs() * mask
    count = mask.sum(0)
    mean = error.sum(0) / count.clamp(min=1)
    return torch.where(count > 0, eta * error.max(0).values + (1.0 - eta) * mean, torch.zeros_like(mean))


# ---------------------------------------------------------------------------------------------
# SAC (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"): twin critics with
# Polyak-averaged targets, a tanh-squashed Gaussian policy, a learned entropy temperature. The
# policy acts in [-1, 1]^d; scaling to the env's bounds is an affine map outside these functions,
# and log-probabilities are of the squashed action in [-1, 1]^d, the space where the target
# entropy -d is stated (fastrl.models.heads.squashed_gaussian_log_prob).

def sac_critic_targets(returns: torch.Tensor, discounts: torch.Tensor, next_q1: torch.Tensor, next_q2: torch.Tensor,
                       next_logp: torch.Tensor, temperature: torch.Tensor | float) -> torch.Tensor:
    """The soft n-step target ``returns + discounts * (min(Q1', Q2') - alpha log pi(a'|s'))``, all
    ``[N]``: ``returns`` the discounted sum of the window's rewards, ``discounts`` ``gamma^m`` (0 when
    the episode terminated in the window), ``Q'`` the target critics at the window's last state and
    an action ``a'`` drawn there from the current policy, ``next_logp`` its log-probability,
    ``temperature`` alpha. Returned detached: no gradient flows into a target."""
    return (returns + discounts * (torch.minimum(next_q1, next_q2) - temperature * next_logp)).detach()


def sac_critic_loss(q1: torch.Tensor, q2: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict]:
    """Both critics' importance-weighted squared errors, ``mean(w (Q1 - y)^2 + w (Q2 - y)^2) / 2``,
    all ``[N]`` (``weights`` default 1). ``stats["td"]`` ``[N]`` holds ``y - (Q1 + Q2) / 2``, the
    prioritized replay's new priorities' source."""
    for name, x in (("q2", q2), ("targets", targets), ("weights", weights)):
        if x is not None and x.shape != q1.shape:
            raise _shape_error("sac_critic_loss", name, x.shape, "q1's shape", q1.shape)
    per_item = (q1 - targets).square() + (q2 - targets).square()
    if weights is not None:
        per_item = weights * per_item
    loss = 0.5 * per_item.mean()
    q = (0.5 * (q1 + q2)).detach()
    return loss, {"critic_loss": loss.detach(), "td": targets - q, "q_mean": q.mean()}


def sac_actor_loss(q1: torch.Tensor, q2: torch.Tensor, logp: torch.Tensor, temperature: torch.Tensor | float
                   ) -> tuple[torch.Tensor, dict]:
    """The policy's loss ``mean(alpha log pi(a|s) - min(Q1, Q2)(s, a))`` over ``[N]`` actions ``a``
    drawn by reparameterization (gradients reach the policy through ``a`` and ``logp``);
    ``temperature`` alpha is a constant here. ``stats["entropy"]``: ``-mean(logp)``."""
    loss = (temperature * logp - torch.minimum(q1, q2)).mean()
    return loss, {"actor_loss": loss.detach(), "entropy": -logp.detach().mean()}


def sac_temperature_loss(log_temperature: torch.Tensor, logp: torch.Tensor, target_entropy: float
                         ) -> tuple[torch.Tensor, dict]:
    """``-mean(log alpha * (log pi(a|s) + target_entropy))`` with ``logp`` ``[N]`` constant: its
    gradient raises alpha while the policy's entropy ``-mean(logp)`` is below the target and lowers
    it above (the temperature objective of Haarnoja et al. 2018, on log alpha as softlearning and
    Stable-Baselines3 do)."""
    loss = -(log_temperature * (logp.detach() + target_entropy)).mean()
    return loss, {"temperature_loss": loss.detach(), "temperature": log_temperature.detach().exp()}


@torch.no_grad()
def polyak_update(targets: list[torch.Tensor], sources: list[torch.Tensor], tau: float) -> None:
    """In place, every ``target <- (1 - tau) target + tau source`` (same shapes, pairwise): one
    fused foreach kernel for all tensors."""
    if len(targets) != len(sources):
        raise ValueError(f"polyak_update: {len(targets)} targets for {len(sources)} sources")
    torch._foreach_lerp_(targets, sources, tau)
