"""Actor-critic networks: MLP, Nature CNN, IMPALA-ResNet encoders; categorical and Gaussian heads;
the dueling Q-network of the dqn learner.

``ActorCritic(obs)`` returns ``(dist_params, value)``: logits ``[B, n]`` for a Discrete action
space, ``[B, 2 * d]`` (mean, log_std) for a Box. A user's own ``nn.Module`` can replace it if it
keeps that contract and has ``observation_space`` and ``action_space`` attributes or is wrapped
by :func:`wrap_user_model`.
"""
from __future__ import annotations

import math

import gymnasium
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .config import ModelConfig
from .kernels import sample_categorical

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


def _activation(name: str) -> type[nn.Module]:
    return {"tanh": nn.Tanh, "relu": nn.ReLU}[name]


def _orthogonal(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    # Orthogonal init (as in CleanRL/baselines PPO): the small-gain heads keep the first policy
    # near uniform and the first values near zero.
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class MLPEncoder(nn.Module):
    def __init__(self, in_features: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        layers, width = [], in_features
        for size in hidden_sizes:
            layers += [_orthogonal(nn.Linear(width, size)), _activation(activation)()]
            width = size
        self.net = nn.Sequential(nn.Flatten(), *layers)
        self.out_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class NatureCNN(nn.Module):
    """Mnih et al. 2015 encoder: input ``[B, C, 84, 84]`` in [0, 1], output ``[B, 512]``."""

    def __init__(self, obs_shape: tuple):
        super().__init__()
        self.conv = nn.Sequential(
            _orthogonal(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
            _orthogonal(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            _orthogonal(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(_orthogonal(nn.Linear(flat, 512)), nn.ReLU())
        self.out_features = 512

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaResNet(nn.Module):
    """Espeholt et al. 2018 (IMPALA) deep encoder: three conv + max-pool + 2 residual blocks
    stages (16, 32, 32 channels), then a 256-unit linear layer."""

    def __init__(self, obs_shape: tuple, channels: tuple = (16, 32, 32)):
        super().__init__()
        stages, in_ch = [], obs_shape[0]
        for out_ch in channels:
            stages += [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       _ResidualBlock(out_ch), _ResidualBlock(out_ch)]
            in_ch = out_ch
        self.conv = nn.Sequential(*stages, nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, 256), nn.ReLU())
        self.out_features = 256

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


def scale_obs(obs: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Observations in the env dtype -> float ``obs * scale`` (``[n, *obs_shape]`` either way)."""
    x = obs.to(dtype)
    return x * scale if scale != 1.0 else x


class ObsNormalizer(nn.Module):
    """Running mean/variance of observations (parallel-variance update of Chan et al.); kept as
    buffers so that they travel with the published weights and the checkpoints.

    Both :meth:`update` and :meth:`forward` take observations in the env dtype and scale them by
    ``scale`` first (the model's input scaling, 1/255 for uint8 images), so the statistics
    describe exactly the tensor they normalize: statistics of raw 0-255 pixels applied to pixels
    in [0, 1] would shift every input by about -mean/std."""

    def __init__(self, shape: tuple, scale: float = 1.0, clip: float = 10.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.full((), 1e-4))
        self.scale = scale
        self.clip = clip

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """``obs``: ``[n, *shape]`` observations, env dtype."""
        x = scale_obs(obs, self.scale, self.mean.dtype)
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var.copy_((self.var * self.count + batch_var * n + delta.square() * self.count * n / total) / total)
        self.count.copy_(total)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` ``[B, *shape]``, env dtype -> normalized float ``[B, *shape]``, clipped to +-clip."""
        x = scale_obs(obs, self.scale, self.mean.dtype)
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)


class CategoricalHead:
    """Discrete actions; ``params`` are logits ``[B, n]``; actions ``[B]`` int64."""

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return params.argmax(-1)
        # Gumbel-max: one fused op, cheaper than torch.distributions.Categorical per call.
        u = torch.rand_like(params).clamp_(1e-20, 1.0)
        return (params - torch.log(-torch.log(u))).argmax(-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(params, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions, their log-probs) of one draw: what the inference batcher needs per batch."""
        if params.device.type != "cpu" or params.dtype not in (torch.float32, torch.float64) or params.ndim != 2:
            actions = self.sample(params)
            return actions, self.log_prob(params, actions)
        # One compiled pass instead of ~10 torch ops: measured 42 -> 28 us for [640, 2] here.
        actions, logp = sample_categorical(params.detach().numpy(), torch.rand(params.shape[0]).numpy())
        return torch.from_numpy(actions), torch.from_numpy(logp)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(params, -1)
        return -(logp.exp() * logp).sum(-1)


class GaussianHead:
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


def action_head(action_space: gymnasium.Space):
    if isinstance(action_space, gymnasium.spaces.Discrete):
        return CategoricalHead()
    if isinstance(action_space, gymnasium.spaces.Box):
        return GaussianHead()
    raise ValueError(f"action space {action_space} is not supported: use Discrete or Box")


def is_image(obs_space: gymnasium.spaces.Box) -> bool:
    return obs_space.dtype == np.uint8 and len(obs_space.shape) == 3


class ActorCritic(nn.Module):
    """Encoder + policy head + value head. ``forward(obs)``: obs ``[B, *obs_shape]`` in the env's
    dtype (uint8 images are scaled to [0, 1] here, on the model's device) -> (params, value ``[B]``)."""

    def __init__(self, observation_space: gymnasium.spaces.Box, action_space: gymnasium.Space,
                 cfg: ModelConfig | None = None):
        super().__init__()
        cfg = cfg or ModelConfig()
        self.observation_space, self.action_space = observation_space, action_space
        obs_shape = tuple(observation_space.shape)
        kind = cfg.kind
        if kind == "auto":
            kind = "nature_cnn" if is_image(observation_space) else "mlp"
        if kind in ("nature_cnn", "impala_resnet") and len(obs_shape) != 3:
            raise ValueError(f"model.kind={kind} needs image observations [C, H, W], got shape {obs_shape}; "
                             f"use model.kind=mlp")
        self.obs_scale = 1.0 / 255.0 if observation_space.dtype == np.uint8 else 1.0
        self.normalizer = ObsNormalizer(obs_shape, self.obs_scale) if cfg.normalize_obs else None
        if kind == "mlp":
            self.encoder = MLPEncoder(int(np.prod(obs_shape)), cfg.hidden_sizes, cfg.activation)
        elif kind == "nature_cnn":
            self.encoder = NatureCNN(obs_shape)
        else:
            self.encoder = ImpalaResNet(obs_shape)
        features = self.encoder.out_features
        if isinstance(action_space, gymnasium.spaces.Discrete):
            self.policy = _orthogonal(nn.Linear(features, int(action_space.n)), gain=0.01)
            self.log_std = None
        else:
            dim = int(np.prod(action_space.shape))
            self.policy = _orthogonal(nn.Linear(features, dim), gain=0.01)
            self.log_std = nn.Parameter(torch.full((dim,), raw_log_std(0.0)))  # initial std 1
        self.value = _orthogonal(nn.Linear(features, 1), gain=1.0)

    def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        """The encoder's float input: ``obs`` scaled (uint8 to [0, 1]), then normalized with
        ``model.normalize_obs`` (the normalizer scales first: its statistics are in that space)."""
        if self.normalizer is not None:
            return self.normalizer(obs)
        return scale_obs(obs, self.obs_scale)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(self.preprocess(obs))
        params = self.policy(features)
        if self.log_std is not None:
            params = torch.cat([params, self.log_std.expand_as(params)], dim=-1)
        return params, self.value(features).squeeze(-1)


class DuelingQNetwork(ActorCritic):
    """Dueling Q-network (Wang et al. 2016) on the same encoders: ``Q = V + A - mean_a A``.

    ``forward(obs)`` returns ``(q_values [B, n], max_a q [B])``, the ``(params, value)`` contract
    of :class:`ActorCritic`, so the batcher, the weight buffer and checkpoints treat it alike; the
    batcher acts epsilon-greedily on ``params`` (fastrl.inference)."""

    def __init__(self, observation_space, action_space, cfg: ModelConfig | None = None):
        if not isinstance(action_space, gymnasium.spaces.Discrete):
            raise ValueError(f"learner.algo=dqn needs a Discrete action space, got {action_space}; "
                             f"use learner.algo=appo for continuous actions")
        super().__init__(observation_space, action_space, cfg)
        # policy -> advantage stream, value -> state-value stream.

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(self.preprocess(obs))
        advantages = self.policy(features)
        q = self.value(features) + advantages - advantages.mean(-1, keepdim=True)
        return q, q.max(-1).values


def state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Parameters then floating-point buffers, in a fixed order: what the actors need."""
    return list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]


def num_state_values(model: nn.Module) -> int:
    return sum(t.numel() for t in state_tensors(model))


@torch.no_grad()
def state_to_flat(model: nn.Module, out: torch.Tensor) -> torch.Tensor:
    """Write the model's state into the 1-D float32 ``out`` (CPU)."""
    offset = 0
    for tensor in state_tensors(model):
        n = tensor.numel()
        out[offset:offset + n].copy_(tensor.reshape(-1))
        offset += n
    return out


@torch.no_grad()
def load_flat_state(model: nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    for tensor in state_tensors(model):
        n = tensor.numel()
        tensor.copy_(flat[offset:offset + n].view_as(tensor))
        offset += n


def build_model(observation_space, action_space, cfg: ModelConfig, user_model: nn.Module | None = None,
                algo: str = "appo") -> nn.Module:
    """The network for ``algo``: an actor-critic, or a dueling Q-network for dqn."""
    if user_model is None:
        network = DuelingQNetwork if algo == "dqn" else ActorCritic
        return network(observation_space, action_space, cfg)
    check_user_model(user_model, observation_space, action_space)
    return user_model


@torch.no_grad()
def check_user_model(model: nn.Module, observation_space, action_space) -> None:
    """Fail early, in the user's terms, if a custom model breaks the (params, value) contract."""
    sample = torch.as_tensor(np.stack([observation_space.sample() for _ in range(2)]))
    try:
        out = model(sample)
        params, value = out
    except Exception as exc:
        raise ValueError(f"custom model must map obs [B, *obs_shape] to (params, value): {exc}") from None
    if isinstance(action_space, gymnasium.spaces.Discrete):
        want = (2, int(action_space.n))
    else:
        want = (2, 2 * int(np.prod(action_space.shape)))
    if tuple(params.shape) != want or tuple(value.shape) != (2,):
        raise ValueError(f"custom model returned params {tuple(params.shape)} and value {tuple(value.shape)}; "
                         f"expected params {want} and value (2,) for a batch of 2")
