"""Action heads: how the network's action parameters become actions, log-probs and entropies.

``Discrete`` -> :class:`CategoricalHead` (logits), ``Box`` -> :class:`GaussianHead` (mean, log-std),
or for SAC :class:`SquashedGaussianHead` (tanh of a Gaussian, scaled to the Box's bounds),
``MultiBinary`` -> :class:`BernoulliHead` (one logit per bit), ``MultiDiscrete`` and ``Tuple`` ->
:class:`FactorizedHead`, independent parts whose log-probs and entropies add up. Masked choices
(an ``action_mask`` observation) reach a head as logits of :data:`MASKED_LOGIT`: probability
exactly 0 in sampling, log-probs and entropies, with no NaN (``-inf`` would give ``0 * -inf``).
Every head samples and scores actions as fastrl stores them (flat rows, categories from 0, see
fastrl.envs.spaces); the env backends give the env its declared shape and ``start``.
"""
from __future__ import annotations

import math

import gymnasium
import numpy as np
import torch
from torch.nn import functional as F

from ..envs.spaces import ActionLayout
from ..kernels import sample_categorical
from ..kernels.torch_ops import CategoricalLogProbEntropy, kernels_take

MASKED_LOGIT = torch.finfo(torch.float32).min


LOG_STD_RANGE = (-5.0, 2.0)


def bounded_log_std(raw: torch.Tensor) -> torch.Tensor:
    """Smooth bound of a raw log-std into ``LOG_STD_RANGE = (lo, hi)``:
    ``lo + softplus(raw - lo) - softplus(raw - hi)``.

    Within the range it is close to the identity (off by at most ``softplus(-distance to the
    nearer bound)``, e.g. -0.12 at 0), so a head's (mean, log_std) outputs keep their meaning; unlike
    a hard clamp, its gradient never vanishes outside the range (``sigmoid(raw - lo) -
    sigmoid(raw - hi) > 0``), so a log-std pushed past a bound can come back."""
    lo, hi = LOG_STD_RANGE
    return lo + F.softplus(raw - lo) - F.softplus(raw - hi)


def raw_log_std(log_std: float) -> float:
    """Inverse of :func:`bounded_log_std` for ``lo < log_std < hi``: the raw value bounded to
    ``log_std`` (with ``c = exp(log_std - lo)``: ``lo + log((c - 1) / (1 - c exp(lo - hi)))``)."""
    lo, hi = LOG_STD_RANGE
    c = math.exp(log_std - lo)
    return lo + math.log((c - 1.0) / (1.0 - c * math.exp(lo - hi)))


class ActionHead:
    """What every head offers beyond its own ``sample``, ``log_prob``, ``sample_with_log_prob``
    and ``entropy``."""

    def log_prob_and_entropy(self, params: torch.Tensor, actions: torch.Tensor, compiled: bool = True
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs of ``actions``, entropies) under ``params``: what a policy-gradient loss
        needs. ``compiled``: through the head's compiled kernels where it has them and they take
        the tensors; False: torch ops only (an accelerator's path, whose host reads they avoid)."""
        return self.log_prob(params, actions), self.entropy(params)

    def uniform_kl(self, params: torch.Tensor) -> torch.Tensor:
        """KL(uniform over the legal actions || policy) per row of ``params`` (``[..., P]`` ->
        ``[...]``): ``-log k - mean over the k legal actions of log pi(a)``, 0 for the uniform policy.
        Unlike the entropy, whose gradient vanishes as an action's probability goes to 0 (so an
        action the policy stopped trying stays untried), its gradient on a logit is ``pi(a) -
        1/k``, never smaller than ``1/k`` in size for an action the policy all but ruled out.
        Defined for discrete heads (categorical, Bernoulli, and factorized heads of them)."""
        raise TypeError(f"{type(self).__name__} has no uniform_kl: KL to a uniform policy is defined for discrete "
                        f"actions only")


class CategoricalHead(ActionHead):
    """Discrete actions; ``params`` are logits ``[B, n]``; actions ``[B]`` int64. On CPU float
    tensors, log-probs and entropies come from one compiled pass each way
    (:class:`~fastrl.kernels.torch_ops.CategoricalLogProbEntropy`)."""

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return params.argmax(-1)
        # Gumbel-max: one fused op, cheaper than torch.distributions.Categorical per call.
        u = torch.rand_like(params).clamp_(1e-20, 1.0)
        return (params - torch.log(-torch.log(u))).argmax(-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        if kernels_take(params):
            return _log_prob_entropy(params, actions)[0]
        return _taken(F.log_softmax(params, -1), actions)

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions, their log-probs) of one draw: what the inference batcher needs per batch."""
        if not kernels_take(params) or params.ndim != 2:
            actions = self.sample(params)
            return actions, self.log_prob(params, actions)
        # One compiled pass instead of ~10 torch ops: 28 against 42 us for [640, 2].
        actions, logp = sample_categorical(params.detach().numpy(), torch.rand(params.shape[0]).numpy())
        return torch.from_numpy(actions), torch.from_numpy(logp)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        if kernels_take(params):
            # The kernel computes log-probs too (of action 0 here, dropped): unlike torch's ops it
            # keeps masked rows finite, so entropy() agrees with log_prob_and_entropy().
            return _log_prob_entropy(params, torch.zeros(params.shape[:-1], dtype=torch.int64))[1]
        return _entropy(F.log_softmax(params, -1))

    def log_prob_and_entropy(self, params: torch.Tensor, actions: torch.Tensor, compiled: bool = True
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        if compiled and kernels_take(params):
            return _log_prob_entropy(params, actions)
        log_probs = F.log_softmax(params, -1)
        return _taken(log_probs, actions), _entropy(log_probs)

    def uniform_kl(self, params: torch.Tensor) -> torch.Tensor:
        legal = params > MASKED_LOGIT
        count = legal.sum(-1).clamp(min=1)
        log_probs = torch.where(legal, F.log_softmax(params, -1), 0.0)
        return -torch.log(count.to(params.dtype)) - log_probs.sum(-1) / count


def _taken(log_probs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def _entropy(log_probs: torch.Tensor) -> torch.Tensor:
    return -(log_probs.exp() * log_probs).sum(-1)


def _log_prob_entropy(params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of ``actions``, entropies) of logits ``[..., n]`` in one compiled pass each way."""
    lead = params.shape[:-1]
    logp, entropy = CategoricalLogProbEntropy.apply(params.reshape(-1, params.shape[-1]), actions.reshape(-1))
    return logp.reshape(lead), entropy.reshape(lead)


class GaussianHead(ActionHead):
    """Box actions; ``params`` are ``[B, 2d]`` = (mean, raw log_std), the std being
    ``exp(bounded_log_std(raw))``; actions ``[B, d]`` float32, unclipped (the env backend clips to
    the bounds), so their log-probs are exact."""

    def _split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = params.chunk(2, dim=-1)
        return mean, bounded_log_std(log_std)

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        mean, log_std = self._split(params)
        return mean if deterministic else mean + log_std.exp() * torch.randn_like(mean)

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actions = self.sample(params)
        return actions, self.log_prob(params, actions)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self._split(params)
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        _, log_std = self._split(params)
        return (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)


LOG_2 = math.log(2.0)


def squashed_gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, pre_tanh: torch.Tensor) -> torch.Tensor:
    """``log pi(a)`` of ``a = tanh(u)``, ``u ~ N(mean, exp(log_std)^2)`` per dimension, all ``[N, d]``
    -> ``[N]``: the Gaussian log-density of ``u`` minus ``sum log(1 - tanh(u)^2)`` (the change of
    variables). The correction is computed exactly as ``2 (log 2 - u - softplus(-2u))``, finite for
    every ``u``, where ``log(1 - a^2 + eps)`` would bias it near the bounds."""
    z = (pre_tanh - mean) * torch.exp(-log_std)
    gaussian = (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    correction = (2.0 * (LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))).sum(-1)
    return gaussian - correction


def check_squashable(action_space: gymnasium.spaces.Box) -> None:
    """ValueError (one line) for a Box that :class:`SquashedGaussianHead` cannot map ``[-1, 1]`` onto:
    an infinite bound (no affine map), or a dimension with ``low >= high`` (its half-width 0 would
    turn every stored action into NaN on the way back)."""
    low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(f"learner.algo=sac scales actions to the Box's bounds, and {action_space} has infinite "
                         f"ones: wrap the env so that its action space has finite bounds")
    flat = np.flatnonzero((high <= low).reshape(-1))
    if flat.size:
        where = [tuple(int(i) for i in np.unravel_index(k, low.shape)) if low.ndim > 1 else int(k) for k in flat[:4]]
        raise ValueError(f"learner.algo=sac scales actions to the Box's bounds, and {action_space} has no room "
                         f"between low and high at {', '.join(map(str, where))}: wrap the env to drop that "
                         f"dimension or give it a range")


class SquashedGaussianHead(ActionHead):
    """SAC's Box actions: ``a = tanh(u)``, ``u ~ N(mean, std^2)`` per dimension, then the affine
    map of ``[-1, 1]^d`` onto the Box's bounds ``[low, high]`` (finite bounds only): actions are
    inside the bounds by construction, never clipped. ``params`` ``[B, 2d]`` = (mean, raw log_std),
    the std being ``exp(bounded_log_std(raw))``; the deterministic action is ``tanh(mean)``.
    Log-probabilities are of the squashed action in ``[-1, 1]^d``
    (:func:`squashed_gaussian_log_prob`): the affine map adds the constant
    ``-sum log((high - low) / 2)``, left out, as the target entropy is stated in that space."""

    def __init__(self, action_space: gymnasium.spaces.Box):
        check_squashable(action_space)
        low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
        self.dims = int(low.size)
        self.shape = tuple(action_space.shape)
        self.center = torch.as_tensor((high + low) / 2, dtype=torch.float32).reshape(-1)
        self.half_width = torch.as_tensor((high - low) / 2, dtype=torch.float32).reshape(-1)

    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_std), each ``[B, d]``, of ``params`` ``[B, 2d]``."""
        mean, raw = params.chunk(2, dim=-1)
        return mean, bounded_log_std(raw)

    def to_env(self, squashed: torch.Tensor) -> torch.Tensor:
        """Actions ``[B, d]`` in ``[-1, 1]`` -> the env's bounds."""
        return self.center.to(squashed.device) + self.half_width.to(squashed.device) * squashed

    def from_env(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions ``[B, d]`` -> ``[-1, 1]`` (the inverse of :meth:`to_env`)."""
        return (actions - self.center.to(actions.device)) / self.half_width.to(actions.device)

    def rsample(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized draw: (squashed actions ``[B, d]`` in ``[-1, 1]``, their log-probs
        ``[B]``), differentiable in ``params``."""
        mean, log_std = self.split(params)
        pre_tanh = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(pre_tanh), squashed_gaussian_log_prob(mean, log_std, pre_tanh)

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return self.to_env(torch.tanh(self.split(params)[0]))
        return self.to_env(self.rsample(params)[0])

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        squashed, logp = self.rsample(params)
        return self.to_env(squashed), logp

    def sample_uniform(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows`` actions uniform over the bounds and their log-density in ``[-1, 1]^d``
        (``-d log 2``): SAC's random actions before learning starts."""
        squashed = torch.rand(rows, self.dims) * 2.0 - 1.0
        return self.to_env(squashed), torch.full((rows,), -self.dims * math.log(2.0))


class BernoulliHead(ActionHead):
    """MultiBinary actions; ``params`` ``[B, n]`` one logit per bit; actions ``[B, n]`` int64 in {0, 1}."""

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return (params > 0).long()
        return (torch.rand_like(params) < torch.sigmoid(params)).long()

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        # log sigmoid(l) for a 1, log sigmoid(-l) for a 0: a * l - softplus(l).
        return (actions.to(params.dtype) * params - F.softplus(params)).sum(-1)

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actions = self.sample(params)
        return actions, self.log_prob(params, actions)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return (F.softplus(params) - params * torch.sigmoid(params)).sum(-1)

    def uniform_kl(self, params: torch.Tensor) -> torch.Tensor:
        # Per bit -log 2 - (log p + log(1 - p)) / 2, with -log p = softplus(-l), -log(1 - p) = softplus(l).
        return (0.5 * (F.softplus(params) + F.softplus(-params)) - math.log(2.0)).sum(-1)


class FactorizedHead(ActionHead):
    """Independent parts (:class:`fastrl.envs.spaces.ActionPart`), each a categorical, Gaussian or
    Bernoulli head over its slice of the params and of the action row. Log-probs and entropies
    sum over the parts. Actions ``[B, width]`` in the layout's dtype (int64 for MultiDiscrete /
    MultiBinary, float32 for a Tuple)."""

    def __init__(self, layout: ActionLayout):
        self.layout = layout
        kinds = {"categorical": CategoricalHead(), "gaussian": GaussianHead(), "bernoulli": BernoulliHead()}
        self.parts = [(part, kinds[part.kind]) for part in layout.parts]
        self.dtype = {"int64": torch.int64, "float32": torch.float32}[str(layout.dtype)]

    def _part_actions(self, part, actions: torch.Tensor) -> torch.Tensor:
        chunk = actions[..., part.action_slice]
        return chunk[..., 0].long() if part.kind == "categorical" else chunk

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        chunks = []
        for part, head in self.parts:
            action = head.sample(params[..., part.param_slice], deterministic)
            chunks.append(action.unsqueeze(-1) if part.kind == "categorical" else action)
        return torch.cat([c.to(self.dtype) for c in chunks], dim=-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return sum(head.log_prob(params[..., part.param_slice], self._part_actions(part, actions))
                   for part, head in self.parts)

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actions = self.sample(params)
        return actions, self.log_prob(params, actions)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return sum(head.entropy(params[..., part.param_slice]) for part, head in self.parts)

    def uniform_kl(self, params: torch.Tensor) -> torch.Tensor:
        return sum(head.uniform_kl(params[..., part.param_slice]) for part, head in self.parts)


def discrete_actions(action_space: gymnasium.Space) -> bool:
    """Whether every part of ``action_space`` is discrete (what :meth:`ActionHead.uniform_kl` needs)."""
    if isinstance(action_space, (gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete,
                                 gymnasium.spaces.MultiBinary)):
        return True
    if isinstance(action_space, gymnasium.spaces.Box):
        return False
    return all(part.kind != "gaussian" for part in ActionLayout(action_space).parts)


def action_head(action_space: gymnasium.Space, algo: str = "appo"):
    """The head of ``action_space`` for ``algo`` (see the module docstring); raises
    :class:`fastrl.envs.spaces.UnsupportedSpace` for a space fastrl cannot act in."""
    if algo == "sac":
        return SquashedGaussianHead(action_space)
    if isinstance(action_space, gymnasium.spaces.Discrete):
        return CategoricalHead()
    if isinstance(action_space, gymnasium.spaces.Box):
        return GaussianHead()
    layout = ActionLayout(action_space)
    if isinstance(action_space, gymnasium.spaces.MultiBinary):
        return BernoulliHead()
    return FactorizedHead(layout)
