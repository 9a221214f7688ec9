"""The CPU inference batcher's path for a plain MLP policy over discrete actions: hidden layers
through numpy's BLAS, bias and activation in one compiled pass each, the output layer and the
categorical draw in numba (fastrl.kernels), with the torch model's own weights.

Why: on batches this small the torch forward pass is mostly per-op dispatch (~5 us an op,
a dozen ops), not arithmetic. One thread of numpy's OpenBLAS and one of torch's MKL multiply the
batcher's shapes equally fast here ([768, 64] x [64, 64]: 69 against 71 us); the "half speed"
once read off these hosts came from numpy using every core, which the batcher must not (each
child caps numpy's BLAS at one thread). Measured in one process, one thread, CartPole's policy
(4 -> 64 -> 64 -> 2, ReLU): infer() of 3 requests of 256 rows 250 -> 139 us.

One source of truth: this path reads the model's parameters in place (numpy views of the
tensors the batcher refreshes, so a weight refresh is seen at once), and only a model whose
maths it reproduces takes it: an :class:`~fastrl.models.ActorCritic` whose encoder is an
:class:`~fastrl.encoders.MLPEncoder`, float32 observations (no scaling, no normalizer, no
mask), no recurrent core and a Discrete action space. Everything else runs in torch. The value
head is not computed: acting does not use it.
"""
from __future__ import annotations

import gymnasium
import numpy as np
import torch
from torch import nn

from .encoders import MLPEncoder
from .kernels import sample_categorical
from .kernels.mlp import IDENTITY, RELU, TANH, bias_activation, narrow_dense
from .models import ActorCritic

ACTIVATIONS = {nn.ReLU: RELU, nn.Tanh: TANH}


def _layers(model: nn.Module) -> tuple[list[nn.Linear], int] | None:
    """The encoder's linear layers and its activation's code, or None when the model is not one
    this path reproduces (module docstring)."""
    if type(model) is not ActorCritic or model.core is not None or model.normalizer is not None:
        return None
    if model.obs_layout.packed or model.obs_scale != 1.0 or model.log_std is not None:
        return None
    if not isinstance(model.encoder, MLPEncoder) or not isinstance(model.action_space, gymnasium.spaces.Discrete):
        return None
    # Exactly what MLPEncoder builds: Flatten, then (Linear, activation) pairs of one activation.
    # Anything else (a subclass's extra module, a linear without its activation) runs in torch.
    modules = list(model.encoder.net)
    if not modules or not isinstance(modules[0], nn.Flatten) or len(modules) % 2 != 1:
        return None
    linears, activations = modules[1::2], {type(module) for module in modules[2::2]}
    if not all(type(layer) is nn.Linear for layer in linears) or len(activations) > 1:
        return None
    if activations and not activations <= set(ACTIVATIONS):
        return None
    return linears, ACTIVATIONS[activations.pop()] if activations else IDENTITY


class NumpyMLPPolicy:
    """Actions and their log-probabilities for a batch of observations (module docstring)."""

    @staticmethod
    def supports(model: nn.Module, observation_dtype) -> bool:
        return np.dtype(observation_dtype) == np.float32 and _layers(model) is not None

    def __init__(self, model: ActorCritic):
        linears, self.activation = _layers(model)
        # Views of the parameters: a weight refresh (an in-place copy) is seen here at once.
        self.hidden = [(layer.weight.detach().numpy(), layer.bias.detach().numpy()) for layer in linears]
        self.output = (model.policy.weight.detach().numpy(), model.policy.bias.detach().numpy())
        self.buffers: list[np.ndarray] = []  # one per hidden layer, then the logits; grown on demand

    def _buffers(self, rows: int) -> list[np.ndarray]:
        if not self.buffers or self.buffers[0].shape[0] < rows:
            widths = [w.shape[0] for w, _ in self.hidden] + [self.output[0].shape[0]]
            self.buffers = [np.empty((rows, width), np.float32) for width in widths]
        return [buffer[:rows] for buffer in self.buffers]

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``obs`` ``[n, *obs_shape]`` float32 -> (actions ``[n]`` int64, log-probs ``[n]`` float32);
        the uniforms come from torch's generator, as the torch path's draw."""
        n = obs.shape[0]
        *hidden_out, logits = self._buffers(n)
        h = obs.reshape(n, -1)
        for (weight, bias), out in zip(self.hidden, hidden_out):
            np.matmul(h, weight.T, out=out)
            bias_activation(out, bias, self.activation)
            h = out
        narrow_dense(h, *self.output, logits)
        return sample_categorical(logits, torch.rand(n).numpy())
