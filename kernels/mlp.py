"""The elementwise and small-matrix parts of a small MLP's forward pass, for the CPU inference
batcher and the learner, and of its backward pass, for the learner (fastrl/sampling/numpy_mlp.py); the
hidden layers' products go to numpy's BLAS.

Why kernels: on a batch of a few hundred rows each torch op costs ~5 us of dispatch, and a
bias add plus activation is two of them; here it is one pass over rows still in cache. The
output layer is narrow (one unit per action): BLAS tiles a product that narrow poorly
([768, 64] x [64, 2]: 9.9 us through numpy against 5.2 us as a loop).
"""
from __future__ import annotations

import numba
import numpy as np

IDENTITY, RELU, TANH = 0, 1, 2  # activation codes


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=True)
def bias_activation(h, b, activation):
    """In place: ``h [B, N] = act(h + b [N])``; ``activation`` IDENTITY, RELU or TANH."""
    B, N = h.shape
    zero = np.float32(0.0)
    for r in range(B):
        for o in range(N):
            v = h[r, o] + b[o]
            if activation == RELU:
                v = max(v, zero)
            elif activation == TANH:
                v = np.tanh(v)
            h[r, o] = v


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=True)
def narrow_dense(h, w, b, out):
    """``out [B, N] = h [B, K] @ w [N, K]^T + b [N]`` for a small ``N`` (an output layer);
    ``fastmath`` lets LLVM vectorize each dot product, which reorders its sum: results differ
    from a BLAS product's in the last bits."""
    B, K = h.shape
    N = w.shape[0]
    for r in range(B):
        for o in range(N):
            total = np.float32(0.0)
            for i in range(K):
                total += h[r, i] * w[o, i]
            out[r, o] = total + b[o]


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=True)
def activation_grad(d, h, activation):
    """In place: ``d [B, N] *= act'`` at a layer whose output (after the activation) is ``h [B, N]``
    (ReLU passes where ``h > 0``, as torch's ``threshold_backward`` on the result; tanh scales by
    ``1 - h^2``; IDENTITY leaves ``d`` as it is). Returns the column sums of the result ``[N]``:
    the gradient of the layer's bias."""
    B, N = d.shape
    sums = np.zeros(N, d.dtype)
    for r in range(B):
        for o in range(N):
            if activation == RELU:
                if h[r, o] <= 0:
                    d[r, o] = 0
            elif activation == TANH:
                d[r, o] *= 1 - h[r, o] * h[r, o]
            sums[o] += d[r, o]
    return sums


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=True)
def stack_output_grads(d_policy, d_value, out):
    """``out [B, N + 1] = [d_policy [B, N] | d_value [B]]``, the two output layers' gradients side
    by side (so that BLAS takes both layers' products at once); returns their column sums
    ``[N + 1]``, the gradients of the two biases."""
    B, N = d_policy.shape
    sums = np.zeros(N + 1, out.dtype)
    for r in range(B):
        for o in range(N):
            out[r, o] = d_policy[r, o]
            sums[o] += d_policy[r, o]
        out[r, N] = d_value[r]
        sums[N] += d_value[r]
    return sums
