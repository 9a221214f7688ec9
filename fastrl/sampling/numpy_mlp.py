"""The CPU path of a plain MLP policy: hidden layers through numpy's BLAS, bias and activation in
one compiled pass each, the output layers in numba (fastrl.kernels), with the torch model's own
weights. The inference batcher acts through it (:class:`NumpyMLPPolicy`: the categorical draw, or
SAC's squashed Gaussian draw, too); the learner of a discrete actor-critic runs its forward and
backward passes through it (:class:`NumpyMLPActorCritic`, an autograd function with a
hand-written backward).

Why: on batches this small the torch forward pass is mostly per-op dispatch (~5 us an op,
a dozen ops), not arithmetic. One thread of numpy's OpenBLAS and one of torch's MKL multiply the
batcher's shapes equally fast, so the gain is the dispatch saved: infer() of 3 requests of 256
rows of CartPole's policy (4 -> 64 -> 64 -> 2, ReLU) took 139 us against 250 us in torch, one
process and one thread (see docs/results.md#cartpole-throughput). numpy must not use every core
in the batcher, so each child caps its BLAS at one thread.

One source of truth: this path reads the model's parameters in place (numpy views of the
tensors the batcher refreshes, so a weight refresh is seen at once), and only a model whose
maths it reproduces takes it: an :class:`~fastrl.models.networks.ActorCritic` over a Discrete
action space, or SAC's :class:`~fastrl.models.networks.SquashedGaussianActor` over a Box, whose
encoder is an :class:`~fastrl.models.encoders.MLPEncoder`, float32 observations (the batcher also
takes float64 ones, MuJoCo's, cast to float32 as the torch model's first step casts them; no
scaling, no normalizer, no mask) and no recurrent core (the learner's path takes the discrete actor-critic
only, and needs its critic to share the encoder). Everything else runs in torch. The batcher
does not compute the value head: acting does not use it.
"""
from __future__ import annotations

import gymnasium
import numpy as np
import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..kernels.categorical import sample_rows
from ..kernels.mlp import IDENTITY, RELU, TANH, activation_grad, bias_activation, narrow_dense, stack_output_grads
from ..kernels.squashed_gaussian import squashed_gaussian_rows
from ..models.encoders import MLPEncoder
from ..models.heads import LOG_STD_RANGE, SquashedGaussianHead
from ..models.networks import ActorCritic, SquashedGaussianActor

ACTIVATIONS = {nn.ReLU: RELU, nn.Tanh: TANH}


def _layers(model: nn.Module) -> tuple[list[nn.Linear], int] | None:
    """The encoder's linear layers and its activation's code, or None when the model is not one
    this path reproduces (module docstring)."""
    discrete = type(model) is ActorCritic and isinstance(model.action_space, gymnasium.spaces.Discrete)
    squashed = type(model) is SquashedGaussianActor and isinstance(model.action_space, gymnasium.spaces.Box)
    if not (discrete or squashed) or model.core is not None or model.normalizer is not None:
        return None
    if model.obs_layout.packed or model.obs_scale != 1.0 or model.log_std is not None:
        return None
    if not isinstance(model.encoder, MLPEncoder):
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
        return np.dtype(observation_dtype) in (np.float32, np.float64) and _layers(model) is not None

    def __init__(self, model: ActorCritic):
        linears, self.activation = _layers(model)
        # Views of the parameters: a weight refresh (an in-place copy) is seen here at once.
        self.hidden = [(layer.weight.detach().numpy(), layer.bias.detach().numpy()) for layer in linears]
        self.output = (model.policy.weight.detach().numpy(), model.policy.bias.detach().numpy())
        self.buffers: list[np.ndarray] = []  # one per hidden layer, then the logits; grown on demand
        self.squash = None  # SAC: the bounds' (center, half-width) [d]
        if isinstance(model, SquashedGaussianActor):
            head = SquashedGaussianHead(model.action_space)
            self.squash = (head.center.numpy(), head.half_width.numpy())

    def _buffers(self, rows: int) -> list[np.ndarray]:
        if not self.buffers or self.buffers[0].shape[0] < rows:
            widths = [w.shape[0] for w, _ in self.hidden] + [self.output[0].shape[0]]
            self.buffers = [np.empty((rows, width), np.float32) for width in widths]
        return [buffer[:rows] for buffer in self.buffers]

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``obs`` ``[n, *obs_shape]`` float32 -> (actions, log-probs ``[n]`` float32): actions ``[n]``
        int64, or ``[n, d]`` float32 in the Box's bounds for SAC. The uniforms (normals for SAC) come
        from torch's generator, as the torch path's draw."""
        n = obs.shape[0]
        *hidden_out, logits = self._buffers(n)
        h = obs.reshape(n, -1).astype(np.float32, copy=False)  # the torch model's first step (scale_obs)
        for (weight, bias), out in zip(self.hidden, hidden_out):
            np.matmul(h, weight.T, out=out)
            bias_activation(out, bias, self.activation)
            h = out
        narrow_dense(h, *self.output, logits)
        if self.squash is None:
            return sample_rows(logits, torch.rand(n).numpy())  # the shapes are right by construction
        center, half_width = self.squash
        actions, logp = np.empty((n, len(center)), np.float32), np.empty(n, np.float32)
        squashed_gaussian_rows(logits, torch.randn(n, len(center)).numpy(), center, half_width, *LOG_STD_RANGE,
                               actions, logp)
        return actions, logp


class NumpyMLPActorCritic:
    """The learner's ``(params [n, A], values [n])`` of the model for float32 observations
    ``[n, *obs_shape]``, differentiable in the model's parameters: the same maths as the model's
    torch forward, with a backward pass written out (:class:`_MLPActorCriticFunction`).

    Why: a CartPole learner batch (4,224 rows, 4 -> 32 -> 32 -> 2 + 1) is ~20 torch ops each way,
    mostly dispatch and autograd bookkeeping; BLAS does the products at the same speed either way.
    This path brings train() of that batch to 1.8 ms against 2.5 ms with torch ops, one thread
    (see docs/results.md#cartpole-throughput)."""

    @staticmethod
    def supports(model: nn.Module, observation_dtype) -> bool:
        return (type(model) is ActorCritic and np.dtype(observation_dtype) == np.float32
                and NumpyMLPPolicy.supports(model, observation_dtype) and model.value_encoder is None)

    def __init__(self, model: ActorCritic):
        linears, self.activation = _layers(model)
        self.parameters = [p for layer in (*linears, model.policy, model.value) for p in (layer.weight, layer.bias)]

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _MLPActorCriticFunction.apply(obs.reshape(obs.shape[0], -1), self.activation, *self.parameters)


class _MLPActorCriticFunction(torch.autograd.Function):
    """``(x [n, d], activation, W_1, b_1, ..., W_L, b_L, W_policy, b_policy, W_value, b_value) ->
    (logits [n, A], values [n])`` with ``h_i = act(h_{i-1} W_i^T + b_i)``, ``h_0 = x``; gradients
    for the weights and biases (not for ``x``)."""

    @staticmethod
    def forward(ctx, x, activation, *weights):
        arrays = [w.detach().numpy() for w in weights]
        layer_inputs = [np.ascontiguousarray(x.detach().numpy(), dtype=np.float32)]
        for weight, bias in zip(arrays[0:-4:2], arrays[1:-4:2]):
            out = np.matmul(layer_inputs[-1], weight.T)
            bias_activation(out, bias, activation)
            layer_inputs.append(out)
        features, n = layer_inputs[-1], len(x)
        w_policy, b_policy, w_value, b_value = arrays[-4:]
        logits, values = np.empty((n, len(w_policy)), np.float32), np.empty((n, 1), np.float32)
        narrow_dense(features, w_policy, b_policy, logits)
        narrow_dense(features, w_value, b_value, values)
        ctx.save_for_backward(*weights)  # autograd then refuses a backward after an in-place weight edit
        ctx.layer_inputs, ctx.activation = layer_inputs, activation
        return torch.from_numpy(logits), torch.from_numpy(values.reshape(n))

    @staticmethod
    @once_differentiable
    def backward(ctx, d_logits, d_values):
        arrays = [w.detach().numpy() for w in ctx.saved_tensors]
        layer_inputs, activation = ctx.layer_inputs, ctx.activation
        d_policy = np.ascontiguousarray(d_logits.numpy(), dtype=np.float32)
        n, A = d_policy.shape
        # Both output layers at once: [d_logits | d_values] against their stacked weights.
        d_outputs = np.empty((n, A + 1), np.float32)
        d_output_biases = stack_output_grads(d_policy, np.ascontiguousarray(d_values.numpy()), d_outputs)
        d_output_weights = d_outputs.T @ layer_inputs[-1]
        grads = [d_output_weights[:A], d_output_biases[:A], d_output_weights[A:], d_output_biases[A:]]
        d = d_outputs @ np.concatenate([arrays[-4], arrays[-2]])  # d loss / d h_L
        for layer in range(len(layer_inputs) - 1, 0, -1):
            d_bias = activation_grad(d, layer_inputs[layer], activation)  # now d loss / d (pre-activation)
            grads[:0] = [d.T @ layer_inputs[layer - 1], d_bias]
            if layer > 1:
                d = d @ arrays[2 * (layer - 1)]
        return (None, None, *map(torch.from_numpy, grads))
