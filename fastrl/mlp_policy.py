"""The CPU inference batcher's fused path for a plain MLP policy over discrete actions: the
encoder's layers and the policy layer in one numba call (fastrl.kernels.mlp), then the
categorical draw (fastrl.kernels.sample_categorical), with the torch model's own weights.

One source of truth: the kernel reads the model's parameters in place (numpy views of the
tensors the batcher refreshes), and only a model whose maths it reproduces takes this path: an
:class:`~fastrl.models.ActorCritic` whose encoder is an :class:`~fastrl.encoders.MLPEncoder`,
float32 observations (no scaling, no normalizer, no mask), no recurrent core and a Discrete
action space. Everything else runs in torch. The value head is not computed: the batcher does
not use it.
"""
from __future__ import annotations

import gymnasium
import numpy as np
import torch
from numba.typed import List
from torch import nn

from .encoders import MLPEncoder
from .kernels import sample_categorical
from .kernels.mlp import RELU, TANH, mlp_forward
from .models import ActorCritic

ACTIVATIONS = {nn.ReLU: RELU, nn.Tanh: TANH}


def _layers(model: nn.Module) -> tuple[list[nn.Linear], int] | None:
    """The linear layers from observation to logits and the hidden activation's code, or None
    when the model is not one the kernel reproduces (module docstring)."""
    if type(model) is not ActorCritic or model.core is not None or model.normalizer is not None:
        return None
    if model.obs_layout.packed or model.obs_scale != 1.0 or model.log_std is not None:
        return None
    if type(model.encoder) is not MLPEncoder or type(model.policy) is not nn.Linear:
        return None
    if not isinstance(model.action_space, gymnasium.spaces.Discrete):
        return None
    linears, activations = [], set()
    for module in model.encoder.net:
        if type(module) is nn.Linear:
            linears.append(module)
        elif type(module) in ACTIVATIONS:
            activations.add(ACTIVATIONS[type(module)])
        elif type(module) is not nn.Flatten:
            return None
    linears.append(model.policy)
    if len(activations) != 1 or any(p.dtype != torch.float32 for layer in linears for p in layer.parameters()):
        return None  # an MLP without hidden layers, mixed activations, or not float32
    return linears, activations.pop()


class FusedMLPPolicy:
    """Actions and their log-probabilities for a batch of observations, through the kernel."""

    @staticmethod
    def supports(model: nn.Module, observation_dtype) -> bool:
        return np.dtype(observation_dtype) == np.float32 and _layers(model) is not None

    def __init__(self, model: ActorCritic):
        linears, self.activation = _layers(model)
        # Views of the parameters: a weight refresh (an in-place copy) is seen here at once.
        self.weights = List([layer.weight.detach().numpy() for layer in linears])
        self.biases = List([layer.bias.detach().numpy() for layer in linears])
        self.width = max(layer.out_features for layer in linears[:-1])
        self.actions = linears[-1].out_features
        self.scratch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``obs`` ``[n, *obs_shape]`` float32 -> (actions ``[n]`` int64, log-probs ``[n]`` float32);
        the uniforms come from torch's generator, as the torch path's draw."""
        n = obs.shape[0]
        if self.scratch is None or self.scratch[0].shape[0] < n:
            self.scratch = (np.empty((n, self.width), np.float32), np.empty((n, self.width), np.float32),
                            np.empty((n, self.actions), np.float32))
        a, b, logits = self.scratch
        mlp_forward(obs.reshape(n, -1), self.weights, self.biases, self.activation, a, b, logits[:n])
        return sample_categorical(logits[:n], torch.rand(n).numpy())
