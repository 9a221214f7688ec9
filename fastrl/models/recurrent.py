"""Recurrent cores (LSTM, GRU) between the encoder and the heads, with per-step episode resets.

A core's state is one flat float32 row per env, ``[B, state_size]`` (LSTM: ``h`` then ``c`` of
every layer; GRU: ``h`` of every layer), so that the arena stores it as one array, the batcher
gathers it with the observations and the replay stores it as one field. ``forward(x, state,
episode_start)`` unrolls ``T`` steps: where ``episode_start[t, b]`` is set the state of env ``b`` is
zeroed before step ``t``, so one unroll may cross episode boundaries without leaking memory from
one episode into the next.

The unroll runs layer by layer (layer ``i`` at step ``t`` needs only layer ``i - 1`` at ``t`` and
itself at ``t - 1``): each layer's input projection is one matmul over all ``T`` steps, and the loop
keeps only the ``h @ W_hh`` step. Steps are taken with ``unbind`` rather than indexing, whose
backward zero-fills a whole ``[T, B, F]`` gradient per step. The unroll stays a loop: running
each column's episode pieces as one packed sequence through ``nn.LSTM`` is 2x slower on a CPU,
as packing adds copies (see docs/results.md#recurrent).

On the CPU, an LSTM layer's recurrence over more than one step runs in a numba kernel
(:mod:`fastrl.kernels.lstm`, one call forward and one backward) instead of ~30 torch ops per step
whose dispatch dominated it; the input projection and the weight gradients stay torch matmuls over
all steps. The same maths (tested against ``nn.LSTMCell`` to float32 rounding); other devices and
dtypes use torch ops.

Gate biases start from chrono initialization (Tallec and Ollivier, "Can recurrent neural networks
warp time?", 2018): each unit's forget gate (LSTM; the input gate the opposite) or update gate
(GRU) bias is ``log u``, ``u ~ U(1, memory_steps - 1)``, so units keep a memory for 1 to
``memory_steps`` steps. With zero biases every gate starts at 0.5 and a cue's trace halves each
step: LSTM APPO then does not learn a cue 24 steps back on the memory toy env in 3M env steps,
and learns it in under 0.5M with biases near 3 (see docs/results.md#recurrent).
"""
from __future__ import annotations

import torch
from torch import nn

from ..kernels.torch_ops import LSTMRecurrence

CORES = ("none", "lstm", "gru")


@torch.no_grad()
def _chrono_gate_biases(cell: nn.Module, kind: str, size: int, memory_steps: int) -> None:
    keep = torch.log(torch.empty(size).uniform_(1.0, max(memory_steps - 1.0, 1.0)))
    if kind == "lstm":  # gates i, f, g, o
        cell.bias_ih[size:2 * size] = keep
        cell.bias_ih[:size] = -keep
    else:  # gates r, z, n; h' = (1 - z) n + z h
        cell.bias_ih[size:2 * size] = keep


class RecurrentCore(nn.Module):
    """``kind`` lstm | gru, ``layers`` stacked cells of ``size`` units over ``in_features`` inputs,
    initialized to keep memories for up to ``memory_steps`` steps (1: zero gate biases)."""

    def __init__(self, kind: str, in_features: int, size: int, layers: int = 1, memory_steps: int = 64):
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"model.core must be one of {', '.join(CORES)}; got {kind!r}")
        cell = nn.LSTMCell if kind == "lstm" else nn.GRUCell
        self.kind, self.size, self.layers = kind, size, layers
        self.cells = nn.ModuleList(cell(in_features if i == 0 else size, size) for i in range(layers))
        for c in self.cells:
            nn.init.orthogonal_(c.weight_hh)
            nn.init.zeros_(c.bias_hh)
            nn.init.zeros_(c.bias_ih)
            if memory_steps > 1:
                _chrono_gate_biases(c, kind, size, memory_steps)
        self.parts = 2 if kind == "lstm" else 1  # (h, c) or h
        self.state_size = self.parts * size * layers
        self.out_features = size
        # The numba LSTM recurrence for float32 CPU tensors; False keeps torch's ops (tests compare).
        self.use_kernel = kind == "lstm"

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The state of a new episode: zeros ``[batch_size, state_size]``."""
        return torch.zeros(batch_size, self.state_size, device=device)

    def forward(self, x: torch.Tensor, state: torch.Tensor, episode_start: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[T, B, in_features]``, ``state`` ``[B, state_size]`` (the state before step 0),
        ``episode_start`` ``[T, B]`` bool -> (outputs ``[T, B, size]``, state after step ``T - 1``)."""
        B = state.shape[0]
        keep = (~episode_start.bool()).to(x.dtype)  # [T, B]
        layer_states = state.view(B, self.layers, self.parts, self.size).unbind(1)
        # One step (the batcher's) runs ~10% faster in torch ops: the kernel's gain is over many
        # steps, its fixed cost is per call. A trace (fastrl-export) takes torch's ops: it cannot
        # record numba, and reading T as a bool there would print a TracerWarning to the user.
        if (self.use_kernel and not torch.jit.is_tracing() and x.shape[0] > 1 and x.device.type == "cpu"
                and x.dtype == torch.float32):
            unroll = _lstm_unroll_kernel
        else:
            unroll = _lstm_unroll if self.kind == "lstm" else _gru_unroll
            keep = keep.unsqueeze(-1).unbind(0)  # T x [B, 1]
        final = []
        for cell, layer_state in zip(self.cells, layer_states):
            x, last = unroll(cell, x, layer_state.unbind(1), keep)
            final += last
        return x, torch.stack(final, dim=1).reshape(B, self.state_size)


def _input_projection(cell, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``x @ W_ih^T + b_ih`` for every step at once: ``T`` x ``[B, gates * size]``."""
    T, B, F = x.shape
    return torch.addmm(cell.bias_ih, x.reshape(T * B, F), cell.weight_ih.t()).view(T, B, -1).unbind(0)


def _lstm_unroll(cell: nn.LSTMCell, x, parts, keep):
    """nn.LSTMCell's maths (gates i, f, g, o) over ``T`` steps, the state zeroed where ``keep`` is 0."""
    h, c = parts
    w_hh, b_hh = cell.weight_hh.t(), cell.bias_hh
    outputs = []
    for x_gates, k in zip(_input_projection(cell, x), keep):
        gates = torch.addmm(b_hh, h * k, w_hh).add_(x_gates)
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * (c * k) + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs), [h, c]


def _gru_unroll(cell: nn.GRUCell, x, parts, keep):
    """nn.GRUCell's maths (gates r, z, n) over ``T`` steps, the state zeroed where ``keep`` is 0."""
    (h,) = parts
    w_hh, b_hh = cell.weight_hh.t(), cell.bias_hh
    outputs = []
    for x_gates, k in zip(_input_projection(cell, x), keep):
        h = h * k
        x_r, x_z, x_n = x_gates.chunk(3, 1)
        h_r, h_z, h_n = torch.addmm(b_hh, h, w_hh).chunk(3, 1)
        r = torch.sigmoid(x_r + h_r)
        z = torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        h = n + z * (h - n)
        outputs.append(h)
    return torch.stack(outputs), [h]


def _lstm_unroll_kernel(cell: nn.LSTMCell, x, parts, keep):
    """:func:`_lstm_unroll` with the recurrence in :mod:`fastrl.kernels.lstm`; ``keep [T, B]``."""
    h, c = parts
    T, B, F = x.shape
    x_gates = torch.addmm(cell.bias_ih, x.reshape(T * B, F), cell.weight_ih.t()).view(T, B, -1)
    outputs, c_last = LSTMRecurrence.apply(x_gates, h, c, keep, cell.weight_hh, cell.bias_hh)
    return outputs, [outputs[-1], c_last]
