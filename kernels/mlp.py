"""A small MLP's forward pass for the CPU inference batcher: dense layers with ReLU or tanh,
then a linear output layer, on float32 rows.

Why a kernel: the batcher runs the policy once per batch of a few hundred rows, and on a CPU a
small network such as CartPole's (4 -> 64 -> 64 -> 2) costs torch about as much in dispatch and
per-op overhead as in arithmetic; here the layers run as one call. The weights are read where
they are (numpy views of the torch model's parameters): the kernel holds no copy of them.

Each output row is a dot product of a weight row with an input row, four input rows at a time
so that each load of a weight row feeds four multiply-adds (``fastmath`` lets LLVM vectorize the
sums, which reorders them: results differ from torch's in the last bits).
"""
from __future__ import annotations

import numba
import numpy as np

IDENTITY, RELU, TANH = 0, 1, 2  # activation codes


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=True)
def dense(h, w, b, out, activation):
    """``out [B, N] = act(h [B, K] @ w [N, K]^T + b [N])``; ``activation`` IDENTITY, RELU or TANH."""
    B, K = h.shape
    N = w.shape[0]
    zero = np.float32(0.0)
    r = 0
    while r < B:
        rows = min(4, B - r)
        h0 = h[r]
        h1 = h[r + 1] if rows > 1 else h0
        h2 = h[r + 2] if rows > 2 else h0
        h3 = h[r + 3] if rows > 3 else h0
        for o in range(N):
            wo = w[o]
            a0 = a1 = a2 = a3 = zero
            for i in range(K):
                x = wo[i]
                a0 += x * h0[i]
                a1 += x * h1[i]
                a2 += x * h2[i]
                a3 += x * h3[i]
            acc = (a0, a1, a2, a3)
            for j in range(rows):
                v = acc[j] + b[o]
                if activation == RELU:
                    v = max(v, zero)
                elif activation == TANH:
                    v = np.tanh(v)
                out[r + j, o] = v
        r += 4


@numba.njit(cache=True, nogil=True)
def mlp_forward(x, weights, biases, activation, scratch_a, scratch_b, out):
    """``out [B, N]``: the layers ``(weights[k] [N_k, K_k], biases[k])`` applied to ``x [B, K_0]``
    in turn, ``activation`` after every layer but the last. ``scratch_a`` / ``scratch_b`` are
    ``[B, >= widest hidden layer]`` float32 buffers the hidden layers alternate between."""
    B = x.shape[0]
    h = x
    last = len(weights) - 1
    for k in range(last):
        width = weights[k].shape[0]
        buffer = scratch_a if k % 2 == 0 else scratch_b
        dense(h, weights[k], biases[k], buffer[:B, :width], activation)
        h = buffer[:B, :width]
    dense(h, weights[last], biases[last], out, IDENTITY)
