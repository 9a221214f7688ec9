"""Networks: the actor-critic of the V-trace learners, the dueling Q-network of the dqn learner and
SAC's squashed Gaussian actor and twin critics, built from an encoder
(:mod:`fastrl.models.encoders`), an optional recurrent core (:mod:`fastrl.models.recurrent`) and
heads (:mod:`fastrl.models.heads`).

Feed-forward: ``model(obs)`` with ``obs`` ``[B, *storage_shape]`` returns ``(params, value)``:
action parameters ``[B, P]`` (logits for Discrete, (mean, log_std) for Box, their concatenation
per part for MultiDiscrete / MultiBinary / Tuple; see :class:`fastrl.envs.spaces.ActionLayout`) and
values ``[B]``. Recurrent (``model.core = lstm | gru``): ``model(obs, state, episode_start)`` with
``obs`` ``[T, B, *storage_shape]``, ``state`` ``[B, state_size]`` and ``episode_start`` ``[T, B]``
returns ``(params [T, B, P], value [T, B], new_state)``; ``model.initial_state(B)`` is a new
episode's state. Observations arrive as stored (:class:`fastrl.envs.spaces.ObsLayout`): packed rows,
or their typed leaves ``{leaf name: tensor}`` (how fastrl.evaluation.export feeds the model, without byte
views); an ``action_mask`` leaf sets the logits of illegal actions to :data:`fastrl.models.heads.MASKED_LOGIT`.

A user's own ``nn.Module`` can replace the actor-critic if it keeps the feed-forward contract
(:func:`check_user_model` tries it on a sample batch before any process starts).
"""
from __future__ import annotations

import contextlib
import itertools

import gymnasium
import numpy as np
import torch
from torch import nn

from ..config import ModelConfig
from ..envs.spaces import ActionLayout, ObsLayout, check_action_mask, image_hw, is_channels_last
from .encoders import (  # noqa: F401
    NATURE_MIN_SIDE,
    EnsembleMLP,
    ImpalaResNet,
    LeafEncoder,
    LeafNormalizer,
    MLPEncoder,
    NatureCNN,
    ObsNormalizer,
    SmallCNN,
    _orthogonal,
    image_encoder,
    scale_obs,
)
from .heads import (  # noqa: F401
    LOG_STD_RANGE,
    MASKED_LOGIT,
    BernoulliHead,
    CategoricalHead,
    FactorizedHead,
    GaussianHead,
    action_head,
    bounded_log_std,
    check_squashable,
    raw_log_std,
)
from .recurrent import RecurrentCore


def is_image(obs_space: gymnasium.spaces.Box) -> bool:
    """A 3-D Box of uint8 pixels, or any 3-D Box of at least 7 x 7 (CHW or HWC)."""
    shape = tuple(obs_space.shape)
    return len(shape) == 3 and (obs_space.dtype == np.uint8 or min(image_hw(shape)) >= 7)


@contextlib.contextmanager
def float32_heads(*features: torch.Tensor):
    """Under an autocast (the learner's bf16, fastrl.learner.precision) yields the tuple of
    ``features`` as float32 with autocast off, so the policy and value layers run in float32;
    otherwise yields them unchanged. The encoder is where bf16 pays; the heads cost nothing beside
    it, and their outputs are what V-trace reads: logits, whose ratios to the float32 actor's it
    clips, and the values it bootstraps from, where bf16's 8-bit mantissa would add rounding noise.
    (On Pong this did not close bf16's gap to float32 in learning: README, Benchmarks.)"""
    device_type = features[0].device.type
    if not torch.is_autocast_enabled(device_type):
        yield features
        return
    with torch.autocast(device_type, enabled=False):
        yield tuple(f.float() for f in features)


class ActorCritic(nn.Module):
    """Encoder (+ recurrent core) + policy head + value head; see the module docstring for the
    forward contract. uint8 images are scaled to [0, 1] on the model's device."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 cfg: ModelConfig | None = None):
        super().__init__()
        cfg = cfg or ModelConfig()
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_layout = ObsLayout(observation_space)
        self.action_layout = ActionLayout(action_space)
        check_action_mask(self.obs_layout, self.action_layout)
        if self.obs_layout.packed:
            self.obs_scale = 1.0
            float_leaves = any(leaf.dtype.kind == "f" and leaf.kind != "mask" for leaf in self.obs_layout.leaves)
            self.normalizer = LeafNormalizer(self.obs_layout) if cfg.normalize_obs and float_leaves else None
            self.encoder = self._leaf_encoder(cfg)
        else:
            self.encoder = self._box_encoder(observation_space, cfg)
            self.obs_scale = 1.0 / 255.0 if observation_space.dtype == np.uint8 else 1.0
            shape = tuple(observation_space.shape)
            self.normalizer = ObsNormalizer(shape, self.obs_scale) if cfg.normalize_obs else None
        # CHW images go to the encoder in NHWC memory when its convolutions keep NHWC weights (the
        # learner's choice, fastrl.learner.base): scaled straight into that layout, see scale_obs.
        # (HWC images are NHWC already.) A plain list: not registered as submodules again.
        self.chw_images = (not self.obs_layout.packed and is_image(observation_space)
                           and not is_channels_last(tuple(observation_space.shape)))
        # The critic's own encoder, built like the policy's (model.separate_critic; feed-forward only).
        self.value_encoder = None
        if cfg.separate_critic:
            if cfg.core != "none":
                raise ValueError("model.separate_critic needs model.core=none")
            self.value_encoder = (self._leaf_encoder(cfg) if self.obs_layout.packed
                                  else self._box_encoder(observation_space, cfg))
        self.convs = [m for m in self.modules() if isinstance(m, nn.Conv2d)]
        features = self.encoder.out_features
        self.core = None
        if cfg.core != "none":
            self.core = RecurrentCore(cfg.core, features, cfg.core_size, cfg.core_layers, cfg.core_memory_steps)
            features = self.core.out_features
        parts = self.action_layout.parts
        self.gaussian_dims = sum(p.n for p in parts if p.kind == "gaussian")
        outputs = sum(p.n for p in parts)  # logits, bits, or means
        self.policy = _orthogonal(nn.Linear(features, outputs), gain=0.01)
        self.log_std = (nn.Parameter(torch.full((self.gaussian_dims,), raw_log_std(cfg.initial_log_std)))
                        if self.gaussian_dims else None)
        self.value = _orthogonal(nn.Linear(features, 1), gain=1.0)

    def _leaf_encoder(self, cfg: ModelConfig) -> LeafEncoder:
        return LeafEncoder(self.obs_layout, cfg.hidden_sizes, cfg.activation, cfg.kind, cfg.encode_action_mask,
                           cfg.image_trunk)

    @staticmethod
    def _box_encoder(space: gymnasium.spaces.Box, cfg: ModelConfig) -> nn.Module:
        shape = tuple(space.shape)
        kind = cfg.kind
        if kind == "auto":
            kind = "image" if is_image(space) else "mlp"
        if kind != "mlp":
            if len(shape) != 3:
                raise ValueError(f"model.kind={cfg.kind} needs image observations (CHW or HWC), got shape {shape}; "
                                 f"use model.kind=mlp")
            return image_encoder(shape, "auto" if kind == "image" else kind)
        return MLPEncoder(int(np.prod(shape)), cfg.hidden_sizes, cfg.activation)

    @property
    def is_recurrent(self) -> bool:
        return self.core is not None

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        """A new episode's recurrent state ``[batch_size, state_size]`` (zeros)."""
        if self.core is None:
            raise ValueError("this model has no recurrent core (model.core=none)")
        return self.core.initial_state(batch_size, device or self.value.weight.device)

    @property
    def state_size(self) -> int:
        return 0 if self.core is None else self.core.state_size

    def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        """The encoder's input: a plain Box scaled (uint8 to [0, 1]), then normalized with
        ``model.normalize_obs`` (the normalizer scales first: its statistics are in that space);
        packed rows pass through (``encode`` has the leaf encoder unpack and scale each leaf and
        normalizes the float leaves between its two halves)."""
        if self.obs_layout.packed:
            return obs
        if self.normalizer is not None:
            return self.normalizer(obs)
        channels_last = (self.chw_images and bool(self.convs)
                         and self.convs[0].weight.is_contiguous(memory_format=torch.channels_last))
        return scale_obs(obs, self.obs_scale, channels_last=channels_last)

    def encode(self, obs: torch.Tensor, encoder: nn.Module | None = None) -> torch.Tensor:
        """Features of ``obs`` from ``encoder`` (the policy's by default)."""
        encoder = self.encoder if encoder is None else encoder
        if self.obs_layout.packed:
            leaves = encoder.leaf_inputs(obs)
            if self.normalizer is not None:
                leaves = self.normalizer(leaves)
            return encoder.encode_leaves(leaves)
        return encoder(self.preprocess(obs))

    def action_params(self, features: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Policy outputs -> the heads' params (log-stds added per Gaussian part, illegal
        actions masked); ``features`` ``[B, F]``, ``obs`` the ``[B, ...]`` rows they came from."""
        out = self.policy(features)
        if self.log_std is not None:
            out = self._with_log_std(out)
        return self.masked(out, obs)

    def _with_log_std(self, out: torch.Tensor) -> torch.Tensor:
        parts = self.action_layout.parts
        if len(parts) == 1:
            return torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        chunks, cursor, std_cursor = [], 0, 0
        for part in parts:
            chunks.append(out[:, cursor:cursor + part.n])
            if part.kind == "gaussian":
                chunks.append(self.log_std[std_cursor:std_cursor + part.n].expand(out.shape[0], part.n))
                std_cursor += part.n
            cursor += part.n
        return torch.cat(chunks, dim=-1)

    def legal_actions(self, obs: torch.Tensor) -> torch.Tensor | None:
        """The observations' action masks as bool ``[B, num_logits]``; None without a mask."""
        leaf = self.obs_layout.mask
        if leaf is None:
            return None
        mask = self.obs_layout.unpack(obs)[leaf.name]
        return mask.reshape(mask.shape[0], -1) != 0

    def choiceless_steps(self, obs: torch.Tensor) -> torch.Tensor | None:
        """bool ``[B]``: steps whose mask leaves some action component nothing to choose."""
        legal = self.legal_actions(obs)
        if legal is None:
            return None
        return torch.stack([~legal[:, p.param_slice].any(-1) for p in self.action_layout.parts]).any(0)

    def check_mask(self, obs: torch.Tensor, final: torch.Tensor | None = None) -> None:
        """Raise ValueError if a step's mask allows no action, unless that step acts on an
        episode's final observation (``final`` ``[B]`` bool): under next-step autoreset that
        action is discarded, and envs may well show an empty mask there."""
        empty = self.choiceless_steps(obs)
        if empty is None:
            return
        if final is not None:
            empty = empty & ~final.to(empty.device)
        if bool(empty.any()):
            raise ValueError("an action_mask allows no action in a step that is not an episode's end: every "
                             "step must leave at least one legal action (per component for MultiDiscrete)")

    def masked(self, logits: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """``logits`` with the observation's illegal actions set to MASKED_LOGIT (no mask: unchanged).
        A component whose mask allows nothing stays unmasked: that is an episode's final
        observation, whose action is discarded (the batcher refuses any other, see check_mask)."""
        legal = self.legal_actions(obs)
        if legal is None:
            return logits
        for part in self.action_layout.parts:
            chunk = legal[:, part.param_slice]
            legal[:, part.param_slice] = chunk | ~chunk.any(-1, keepdim=True)
        return logits.masked_fill(~legal, MASKED_LOGIT)

    def heads(self, features: torch.Tensor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with float32_heads(features) as (features,):
            return self.action_params(features, obs), self.value(features).squeeze(-1)

    def policy_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Feed-forward: the action parameters ``[B, P]`` alone, what acting needs (a separate
        critic's encoder is not run)."""
        if self.core is not None:
            raise ValueError("policy_params is feed-forward; a recurrent model acts through "
                             "forward(obs, state, episode_start)")
        if self.value_encoder is None:
            return self(obs)[0]
        return self.action_params(self.encode(obs), obs)

    def _with_separate_critic(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.obs_layout.packed:  # each leaf encoder unpacks (and embeds) the row its own way
            features, value_features = self.encode(obs), self.encode(obs, self.value_encoder)
        else:  # scaled and normalized once for both
            x = self.preprocess(obs)
            features, value_features = self.encoder(x), self.value_encoder(x)
        with float32_heads(features, value_features) as (features, value_features):
            return self.action_params(features, obs), self.value(value_features).squeeze(-1)

    def forward(self, obs: torch.Tensor, state: torch.Tensor | None = None, episode_start: torch.Tensor | None = None):
        if self.core is None and self.value_encoder is not None:
            return self._with_separate_critic(obs)
        if self.core is None:
            return self.heads(self.encode(obs), obs)
        T, B = leading_shape(obs, 2)
        flat_obs = map_leaves(obs, lambda x: x.reshape(T * B, *x.shape[2:]))
        features = self.encode(flat_obs).reshape(T, B, -1)
        if state is None:
            state = self.initial_state(B, features.device)
        if episode_start is None:
            episode_start = torch.zeros(T, B, dtype=torch.bool, device=features.device)
        out, new_state = self.core(features, state, episode_start)
        params, value = self.heads(out.reshape(T * B, -1), flat_obs)
        return params.reshape(T, B, -1), value.reshape(T, B), new_state


class DuelingQNetwork(ActorCritic):
    """Dueling Q-network (Wang et al. 2016) on the same encoders and cores: ``Q = V + A - mean_a A``.

    Returns ``(q_values [B, n], max_a q [B])`` (recurrent: ``[T, B, n]``, ``[T, B]`` and the new
    state), the ``(params, value)`` contract of :class:`ActorCritic`, so the batcher, the weight
    buffer and checkpoints treat it alike; the batcher acts epsilon-greedily on ``params``
    (fastrl.sampling.batcher). Illegal actions (an ``action_mask``) get Q = MASKED_LOGIT."""

    def __init__(self, observation_space, action_space, cfg: ModelConfig | None = None, algo: str = "dqn"):
        if not isinstance(action_space, gymnasium.spaces.Discrete):
            raise ValueError(f"learner.algo={algo} needs a Discrete action space, got {action_space}; "
                             f"use learner.algo=appo for other action spaces")
        super().__init__(observation_space, action_space, cfg)
        # policy -> advantage stream, value -> state-value stream.

    def heads(self, features: torch.Tensor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with float32_heads(features) as (features,):
            advantages = self.policy(features)
            q = self.masked(self.value(features) + advantages - advantages.mean(-1, keepdim=True), obs)
            return q, q.max(-1).values


def map_leaves(obs, fn):
    """``fn`` applied to ``obs``: a tensor (rows as stored), or each leaf of typed leaves
    ``{leaf name: tensor}`` (what ObsLayout.unpack and ObsLayout.leaf_values give)."""
    return {name: fn(x) for name, x in obs.items()} if isinstance(obs, dict) else fn(obs)


def leading_shape(obs, dims: int) -> tuple:
    """The first ``dims`` axes of ``obs`` (rows, or typed leaves: those of any leaf)."""
    first = next(iter(obs.values())) if isinstance(obs, dict) else obs
    return tuple(first.shape[:dims])


class SquashedGaussianActor(ActorCritic):
    """SAC's policy on the actor-critic's encoders: one linear layer from the features to the
    (mean, raw log-std) of a Gaussian per action dimension, which
    :class:`fastrl.models.heads.SquashedGaussianHead` squashes and scales to the env's bounds. It has no
    state value: the second output of the ``(params, value)`` contract is 0. Feed-forward, over a
    flat Box observation (the twin critics read the same preprocessed vector)."""

    def __init__(self, observation_space, action_space, cfg: ModelConfig | None = None):
        if not isinstance(action_space, gymnasium.spaces.Box) or action_space.dtype.kind != "f":
            raise ValueError(f"learner.algo=sac needs a continuous Box action space, got {action_space}; use "
                             f"learner.algo=dqn or appo for discrete actions")
        check_squashable(action_space)  # here, so that the run is refused before its directory is made
        if not isinstance(observation_space, gymnasium.spaces.Box) or is_image(observation_space):
            raise ValueError(f"learner.algo=sac reads vector observations (a Box that is not an image), got "
                             f"{observation_space}; use learner.algo=appo for images and Dict observations")
        super().__init__(observation_space, action_space, cfg)
        self.policy = nn.Linear(self.encoder.out_features, 2 * int(np.prod(action_space.shape)))
        self.log_std = None  # state-dependent: half of the policy's outputs
        self.value = None

    def heads(self, features: torch.Tensor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with float32_heads(features) as (features,):
            params = self.policy(features)
            return params, params.new_zeros(params.shape[0])


class TwinQCritic(nn.Module):
    """SAC's two soft Q-functions ``Q_k(s, a)`` (Fujimoto et al. 2018's clipped double Q: the
    targets take their minimum), one :class:`~fastrl.models.encoders.EnsembleMLP` over the concatenated
    observation vector ``[N, obs]`` (as the actor preprocesses it) and squashed action ``[N, d]`` in
    ``[-1, 1]``; returns ``[2, N]``."""

    def __init__(self, obs_features: int, action_dims: int, cfg: ModelConfig):
        super().__init__()
        self.net = EnsembleMLP(2, obs_features + action_dims, cfg.hidden_sizes, 1, cfg.activation)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs.flatten(1), actions], dim=-1)).squeeze(-1)


def state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Parameters then floating-point buffers, in a fixed order: what the actors need."""
    return list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]


def num_state_values(model: nn.Module) -> int:
    return sum(t.numel() for t in state_tensors(model))


def state_bytes(model: nn.Module) -> int:
    """Bytes of one copy of the model's state (on the meta device too, where nothing is allocated)."""
    return sum(t.numel() * t.element_size() for t in state_tensors(model))


@torch.no_grad()
def state_to_flat(model: nn.Module, out: torch.Tensor) -> torch.Tensor:
    """Write the model's state into the 1-D float32 ``out`` (CPU)."""
    offset = 0
    for tensor in state_tensors(model):
        n = tensor.numel()
        out[offset:offset + n].copy_(tensor.reshape(-1))
        offset += n
    return out


def model_device(model: nn.Module) -> torch.device:
    """Where the model's first parameter (or buffer) lives; the CPU for a model with neither."""
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


def keys_it_ignores(model: nn.Module) -> tuple[str, ...]:
    """Model config keys that did not shape ``model``'s weights: model.image_trunk without a CNN
    beside other leaves. A checkpoint compared with a config leaves them out (config.weights_mismatch)."""
    joins_images = any(isinstance(m, LeafEncoder) and len(m.images) for m in model.modules())
    return () if joins_images else ("model.image_trunk",)


def learner_layout(model: nn.Module) -> nn.Module:
    """``model`` in the memory layout a learner trains it in: NHWC weights where it has
    convolutions (in place, returned), which put oneDNN (CPU) and cuDNN on their channels-last
    kernels: a Pong batch's train() (Nature CNN, 528 frames, one thread) takes 633 against 733 ms
    NCHW."""
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        model = model.to(memory_format=torch.channels_last)
    return model


def build_model(observation_space, action_space, cfg: ModelConfig, user_model: nn.Module | None = None,
                algo: str = "appo") -> nn.Module:
    """The network for ``algo``: an actor-critic, a dueling Q-network for dqn and r2d2, SAC's
    actor for sac (its critics are the learner's own)."""
    if user_model is None:
        if algo in ("dqn", "r2d2"):
            return DuelingQNetwork(observation_space, action_space, cfg, algo)
        if algo == "sac":
            return SquashedGaussianActor(observation_space, action_space, cfg)
        return ActorCritic(observation_space, action_space, cfg)
    check_user_model(user_model, observation_space, action_space)
    return user_model


@torch.no_grad()
def check_user_model(model: nn.Module, observation_space, action_space) -> None:
    """Fail early, in the user's terms, if a custom model breaks the (params, value) contract.
    The sample goes where the model is (a model already on a GPU would otherwise fail on the
    device mismatch, not on its contract)."""
    sample = torch.as_tensor(ObsLayout(observation_space).sample(2)).to(model_device(model))
    try:
        out = model(sample)
        params, value = out
    except Exception as exc:
        raise ValueError(f"custom model must map obs [B, *obs_shape] to (params, value): {exc}") from None
    want = (2, ActionLayout(action_space).num_params)
    if tuple(params.shape) != want or tuple(value.shape) != (2,):
        raise ValueError(f"custom model returned params {tuple(params.shape)} and value {tuple(value.shape)}; "
                         f"expected params {want} and value (2,) for a batch of 2")
