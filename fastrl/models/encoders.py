"""Encoders: observations (already scaled to float) -> a feature vector per step.

MLP for vectors and matrices, Nature CNN (images from ~36 px), the smaller 2013 DQN CNN, Sample
Factory's ``convnet_simple`` (ViZDoom) and IMPALA-ResNet (on request), a small CNN for small
images (7 to 35 px: grid worlds), images in CHW or HWC; :class:`LeafEncoder`
combines one encoder per leaf of a Dict / Tuple observation (see :mod:`fastrl.envs.spaces`). Also the
input scaling and the running observation normalizer, which travel with the model's weights.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..envs.spaces import ObsLayout, image_hw, is_channels_last

BOARD_LINE = 4  # BoardCNN's window: connect four's line, the longest of the board games it reads
NATURE_MIN_SIDE = 36  # the Nature CNN's 8/4, 4/2, 3/1 convolutions (and convnet_simple's 8/4, 4/2, 3/2) need 36 px
ONE_HOT_MAX = 1024  # Discrete leaves up to this many values are one-hot; larger ones get an embedding
EMBEDDING_SIZE = 64


def _chw(shape: tuple, channels_last: bool) -> tuple:
    return (shape[2], shape[0], shape[1]) if channels_last else tuple(shape)


def _to_chw(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.permute(0, 3, 1, 2) if channels_last else x


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


class EnsembleMLP(nn.Module):
    """``members`` MLPs of one shape, applied to one input at once: each layer is one batched
    matmul (``baddbmm``) over ``[members, in, out]`` weights, not one ``Linear`` per member (SAC's
    twin critics: half the kernel launches and dispatches of two separate MLPs). Input
    ``[N, in_features]`` -> ``[members, N, out_features]``; the hidden layers are followed by
    ``activation``, the last layer is linear. Each member's layers start orthogonal, as
    :class:`MLPEncoder`'s (gain sqrt(2); the output layer gain 1)."""

    def __init__(self, members: int, in_features: int, hidden_sizes: list[int], out_features: int, activation: str):
        super().__init__()
        widths = [in_features, *hidden_sizes, out_features]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for k, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            gain = 1.0 if k == len(widths) - 2 else math.sqrt(2)
            weight = torch.empty(members, fan_in, fan_out)
            for member in weight:  # orthogonal_ on [out, in] rows, as nn.Linear stores them
                nn.init.orthogonal_(member.T, gain)
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.zeros(members, 1, fan_out)))
        self.activation = _activation(activation)()
        self.members = members

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(0).expand(self.members, *x.shape)
        last = len(self.weights) - 1
        for k, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(bias, h, weight)
            if k < last:
                h = self.activation(h)
        return h


class StridedCNN(nn.Module):
    """Strided convolutions, each followed by ReLU (or ``activation``), then one linear layer and
    the same activation: the DQN family of Atari encoders. ``convs`` lists ``(out_channels, kernel,
    stride)``; input ``[B, C, H, W]`` in [0, 1] (or ``[B, H, W, C]`` with ``channels_last``),
    output ``[B, features]``."""

    def __init__(self, obs_shape: tuple, convs: tuple, features: int, channels_last: bool = False,
                 activation: type[nn.Module] = nn.ReLU):
        super().__init__()
        self.channels_last = channels_last
        obs_shape = _chw(obs_shape, channels_last)
        layers, width = [], obs_shape[0]
        for out_channels, kernel, stride in convs:
            layers += [_orthogonal(nn.Conv2d(width, out_channels, kernel, stride=stride)), activation()]
            width = out_channels
        self.conv = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(_orthogonal(nn.Linear(flat, features)), activation())
        self.out_features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(_to_chw(x, self.channels_last)))


class NatureCNN(StridedCNN):
    """Mnih et al. 2015: 32 8x8/4, 64 4x4/2, 64 3x3/1, 512 units; any image of at least 36 x 36."""

    def __init__(self, obs_shape: tuple, channels_last: bool = False):
        super().__init__(obs_shape, ((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512, channels_last)


class Mnih2013CNN(StridedCNN):
    """Mnih et al. 2013 (the first DQN): 16 8x8/4, 32 4x4/2, 256 units. About a third of the
    Nature CNN's arithmetic (3.0M against 9.4M multiply-adds per 84x84x4 frame): the encoder
    for learning Atari on a few CPU cores, where the learner's convolutions are the limit."""

    def __init__(self, obs_shape: tuple, channels_last: bool = False):
        super().__init__(obs_shape, ((16, 8, 4), (32, 4, 2)), 256, channels_last)


class SimpleConvNet(StridedCNN):
    """Sample Factory's ``convnet_simple``, its ViZDoom encoder: 32 8x8/4, 64 4x4/2, 128 3x3/2,
    512 units, ELU; any image of at least 36 x 36. On vizdoom-basic it reached a return of 50 in
    about a third of the env steps the 2013 encoder needed (docs/images.md)."""

    def __init__(self, obs_shape: tuple, channels_last: bool = False):
        super().__init__(obs_shape, ((32, 8, 4), (64, 4, 2), (128, 3, 2)), 512, channels_last, nn.ELU)


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

    def __init__(self, obs_shape: tuple, channels: tuple = (16, 32, 32), channels_last: bool = False):
        super().__init__()
        self.channels_last = channels_last
        obs_shape = _chw(obs_shape, channels_last)
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
        return self.fc(self.conv(_to_chw(x, self.channels_last)))


def scale_obs(obs: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32,
              channels_last: bool = False) -> torch.Tensor:
    """Observations in the env dtype -> float ``obs * scale`` (``[n, *obs_shape]`` either way).

    ``channels_last``: a 4-D image batch comes out NHWC in memory (the same values), for conv
    weights kept channels-last: converted in the scaling's own pass, where oneDNN would otherwise
    reorder the input for the first convolution, forward and backward. On a Pong
    minibatch (264 x 4 x 84 x 84, Nature CNN's first convolution, one thread): scaling plus that
    convolution's forward and backward 184 ms against 309 ms NCHW."""
    if channels_last and obs.dim() == 4 and not obs.is_contiguous(memory_format=torch.channels_last):
        out = torch.empty(obs.shape, dtype=dtype, device=obs.device, memory_format=torch.channels_last)
        return torch.mul(obs, scale, out=out) if scale != 1.0 else out.copy_(obs)
    if scale != 1.0 and not obs.is_floating_point():
        # One pass: uint8 * float promotes to the default float dtype and computes in it, giving
        # the numbers a cast then a scaling would give in two passes (a Pong batch: 15M pixels).
        x = obs * scale
        return x if x.dtype == dtype else x.to(dtype)
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


class SmallCNN(nn.Module):
    """Images of 7 to 35 px (grid worlds): two 3x3 convolutions (32, 64 channels, the second
    with stride 2 from 16 px up), then a 256-unit linear layer."""

    def __init__(self, obs_shape: tuple, channels_last: bool = False):
        super().__init__()
        self.channels_last = channels_last
        c, h, w = _chw(obs_shape, channels_last)
        stride = 2 if min(h, w) >= 16 else 1
        self.conv = nn.Sequential(
            _orthogonal(nn.Conv2d(c, 32, 3, padding=1)), nn.ReLU(),
            _orthogonal(nn.Conv2d(32, 64, 3, stride=stride, padding=1)), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(_orthogonal(nn.Linear(flat, 256)), nn.ReLU())
        self.out_features = 256

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(_to_chw(x, self.channels_last)))


class BoardCNN(nn.Module):
    """A board game's planes (tic-tac-toe [3, 3, 2], connect four [6, 7, 2]; planes last when the
    last axis is the shortest): one convolution of ``filters`` k x k windows without padding, k =
    min(BOARD_LINE, height, width), then ReLU. A k x k window holds every line of k squares in it
    (rows, columns, both diagonals), so each filter can read a threat wherever on the board it is,
    which a flat MLP has to learn square by square; the model's MLP (model.hidden_sizes) then
    combines the windows' features, 64 x (H - k + 1) x (W - k + 1) of them."""

    def __init__(self, obs_shape: tuple, filters: int = 64):
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"model.kind=board_cnn reads a board as planes [H, W, planes] or [planes, H, W], got "
                             f"shape {obs_shape}; use model.kind=mlp")
        self.channels_last = obs_shape[-1] < min(obs_shape[0], obs_shape[1])
        c, h, w = _chw(obs_shape, self.channels_last)
        k = min(BOARD_LINE, h, w)
        self.conv = nn.Sequential(_orthogonal(nn.Conv2d(c, filters, k)), nn.ReLU(), nn.Flatten())
        self.out_features = filters * (h - k + 1) * (w - k + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(_to_chw(x, self.channels_last))


# model.kind -> encoder; each needs images of at least NATURE_MIN_SIDE px.
STRIDED_CNNS = {"nature_cnn": NatureCNN, "mnih2013_cnn": Mnih2013CNN, "convnet_simple": SimpleConvNet}


def image_encoder(shape: tuple, kind: str = "auto") -> nn.Module:
    """The encoder of a 3-D image of ``shape`` (CHW or HWC, see :func:`fastrl.envs.spaces.is_channels_last`):
    ``kind`` impala_resnet, nature_cnn, mnih2013_cnn, convnet_simple, board_cnn (:class:`BoardCNN`), or
    auto (Nature CNN from 36 px, else :class:`SmallCNN`)."""
    if kind == "board_cnn":
        return BoardCNN(shape)
    channels_last = is_channels_last(shape)
    side = min(image_hw(shape))
    if kind == "impala_resnet":
        return ImpalaResNet(shape, channels_last=channels_last)
    if kind in STRIDED_CNNS or (kind == "auto" and side >= NATURE_MIN_SIDE):
        if side < NATURE_MIN_SIDE:
            raise ValueError(f"model.kind={kind} needs images of at least {NATURE_MIN_SIDE} px, got {shape}; "
                             f"use model.kind=auto (a small CNN) or impala_resnet")
        return STRIDED_CNNS.get(kind, NatureCNN)(shape, channels_last=channels_last)
    return SmallCNN(shape, channels_last=channels_last)


class LeafNormalizer(nn.Module):
    """Running statistics of each float leaf of a packed observation (others pass through):
    ``update(rows)`` takes packed rows, ``forward(leaves)`` normalizes a dict of float leaves."""

    def __init__(self, layout: ObsLayout, clip: float = 10.0):
        super().__init__()
        self.layout = layout
        self.stats = nn.ModuleDict({_key(i): ObsNormalizer(leaf.shape, 1.0, clip)
                                    for i, leaf in enumerate(layout.leaves) if _is_float_leaf(leaf)})

    @torch.no_grad()
    def update(self, rows: torch.Tensor) -> None:
        leaves = self.layout.unpack(rows)
        for i, leaf in enumerate(self.layout.leaves):
            if _key(i) in self.stats:
                self.stats[_key(i)].update(leaves[leaf.name])

    def forward(self, leaves: dict) -> dict:
        out = dict(leaves)
        for i, leaf in enumerate(self.layout.leaves):
            if _key(i) in self.stats:
                out[leaf.name] = self.stats[_key(i)](leaves[leaf.name])
        return out


def _key(i: int) -> str:
    return f"leaf{i}"


def _one_hot_chw(leaf) -> tuple:
    """The CHW shape a ``codes`` leaf [H, W, C] reads as: one channel per (channel, code)."""
    h, w, c = leaf.shape
    return (c * leaf.size, h, w)


def _is_float_leaf(leaf) -> bool:
    return leaf.kind != "mask" and leaf.dtype.kind == "f"


class LeafEncoder(nn.Module):
    """Packed observation rows -> features ``[B, out_features]`` in two halves, so that a
    :class:`LeafNormalizer` (the model's) can sit between them: ``leaf_inputs(rows)`` makes each
    leaf a float input (uint8 images and bytes scaled to [0, 1], code grids one-hot
    [C x codes, H, W], ``Discrete`` one-hot, or a learned embedding above ``ONE_HOT_MAX`` values,
    integers and flags as floats); ``encode_leaves`` sends image leaves through an image encoder
    (``kind``), flattens the rest, concatenates everything and applies the trunk: an MLP
    (``hidden_sizes``, ``activation``), or where image encoders are and ``image_trunk`` is "relu",
    one ReLU layer as wide as their features together. ``forward`` is both, unnormalized. The
    ``action_mask`` leaf is left out unless ``encode_action_mask``."""
    def __init__(self, layout: ObsLayout, hidden_sizes: list[int], activation: str, kind: str = "auto",
                 encode_action_mask: bool = False, image_trunk: str = "relu"):
        super().__init__()
        self.layout = layout
        self.inputs = [leaf for leaf in layout.leaves if leaf.kind != "mask" or encode_action_mask]
        if not self.inputs:
            raise ValueError("the observation has no leaf to encode besides the action_mask; "
                             "set model.encode_action_mask=true")
        self.images = nn.ModuleDict()
        self.embeddings = nn.ModuleDict()
        width = 0
        for i, leaf in enumerate(layout.leaves):
            if leaf not in self.inputs:
                continue
            if leaf.kind == "codes" and kind != "mlp":
                self.images[_key(i)] = image_encoder(_one_hot_chw(leaf), kind)
                width += self.images[_key(i)].out_features
            elif leaf.kind == "codes":
                width += int(np.prod(_one_hot_chw(leaf)))
            elif (leaf.kind == "image" and kind != "mlp") or (kind == "board_cnn" and len(leaf.shape) == 3):
                self.images[_key(i)] = image_encoder(leaf.shape, kind)
                width += self.images[_key(i)].out_features
            elif leaf.kind == "discrete" and leaf.size > ONE_HOT_MAX:
                self.embeddings[_key(i)] = nn.Embedding(leaf.size, EMBEDDING_SIZE)
                width += EMBEDDING_SIZE
            elif leaf.kind == "discrete":
                width += leaf.size
            else:
                width += int(np.prod(leaf.shape, dtype=np.int64))
        if self.images and image_trunk == "relu" and kind != "board_cnn":
            # As a Box image's CNN features reach the heads: a small tanh MLP after them learns an
            # image cue far slower (docs/images.md).
            image_features = sum(encoder.out_features for encoder in self.images.values())
            self.trunk = MLPEncoder(width, [image_features], "relu")
        else:
            self.trunk = MLPEncoder(width, hidden_sizes, activation)
        self.out_features = self.trunk.out_features

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.encode_leaves(self.leaf_inputs(rows))

    def leaf_inputs(self, rows: torch.Tensor) -> dict:
        """Each encoded leaf of ``rows`` as a float tensor, by leaf name."""
        leaves = self.layout.unpack(rows)
        floats = {}
        for i, leaf in enumerate(self.layout.leaves):
            if leaf not in self.inputs:
                continue
            x = leaves[leaf.name]
            if leaf.kind == "discrete" and _key(i) in self.embeddings:
                x = self.embeddings[_key(i)](x.long().clamp(0, leaf.size - 1))
            elif leaf.kind == "discrete":
                x = F.one_hot(x.long().clamp(0, leaf.size - 1), leaf.size).float()
            elif leaf.kind == "codes":
                hot = F.one_hot(x.long().clamp(0, leaf.size - 1), leaf.size)  # [B, H, W, C, size]
                x = hot.flatten(3).permute(0, 3, 1, 2).float()
            else:
                pixels = leaf.kind == "bytes" or (leaf.kind == "image" and leaf.dtype == np.uint8)
                x = scale_obs(x, 1.0 / 255.0 if pixels else 1.0)
            floats[leaf.name] = x
        return floats

    def encode_leaves(self, floats: dict) -> torch.Tensor:
        parts = []
        for i, leaf in enumerate(self.layout.leaves):
            if leaf not in self.inputs:
                continue
            x = floats[leaf.name]
            parts.append(self.images[_key(i)](x) if _key(i) in self.images else x.reshape(x.shape[0], -1))
        return self.trunk(torch.cat(parts, dim=-1))
