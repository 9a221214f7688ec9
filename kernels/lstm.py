"""An LSTM layer's recurrence over ``T`` steps with per-step state resets, forward and backward,
for the CPU (Hochreiter & Schmidhuber 1997; the gate order and maths of ``torch.nn.LSTMCell``).

Why a kernel: on a CPU, one step of a small LSTM (``B = 128`` envs, 32-64 units) is ~30 torch ops
forward and backward whose cost is their dispatch, not their arithmetic. In torch ops the
recurrent core took about two thirds of a cartpole-appo learner step (see
docs/results.md#recurrent). Here each step is one pass over the batch.

Only the recurrence lives here. The input projection ``x @ W_ih^T + b_ih`` of all steps is one
matmul, and the weight gradients (``dW_hh = sum_t dgates_t^T h_{t-1}``, ``dW_ih``) are
matmuls over all ``T * B`` rows, all left to torch.

Shapes (float32, C-contiguous): ``x_gates [T, B, 4H]`` the input projection (gates i, f, g, o);
``h0, c0 [B, H]``; ``keep [T, B]`` 1.0, or 0.0 where the state is zeroed before step ``t`` (an
episode starts); ``w_hh [4H, H]``, ``b_hh [4H]``.
"""
from __future__ import annotations

import numba
import numpy as np

# exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln(2) / 2: ln 2 in two parts (Cody & Waite)
# keeps r exact, a degree-7 Taylor polynomial gives exp(r) to float32 precision (relative error
# < 1e-7 over [-87, 88], tested), and 2^n is built in the exponent bits. Unlike math.exp this
# loop vectorizes (AVX2: 8 lanes); LLVM has no vector exp in numba without Intel's SVML.
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # 9 significant bits: n * _LN2_HI is exact for |n| < 2**15
_LN2_LO = np.float32(-2.12194440e-4)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def exp_inplace(x, bits):
    """``x[j] = exp(x[j])`` for float32 ``x [n]``, clamped to [-87, 88] (float32's normal range);
    ``bits [n]`` int32 scratch."""
    one = np.float32(1.0)
    for j in range(x.shape[0]):
        v = min(max(x[j], np.float32(-87.0)), np.float32(88.0))
        n = np.floor(v * _LOG2E + np.float32(0.5))  # float32 (math.floor returns an int64)
        r = v - n * _LN2_HI - n * _LN2_LO
        x[j] = one + r * (one + r * (np.float32(1 / 2) + r * (np.float32(1 / 6) + r * (
            np.float32(1 / 24) + r * (np.float32(1 / 120) + r * (np.float32(1 / 720) + r * np.float32(1 / 5040)))))))
        bits[j] = (np.int32(n) + np.int32(127)) << 23
    scale = bits.view(np.float32)
    for j in range(x.shape[0]):
        x[j] *= scale[j]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def rows_times(a, w, out):
    """``out [B, N] = a [B, K] @ w [K, N]``, four rows of ``a`` at a time so that every load of a
    row of ``w`` feeds four vector multiply-adds. At B = 128, K = 64, N = 256 this nearly doubles
    the row-by-row loop's rate and comes close to torch's sgemm (see docs/results.md#kernels)."""
    B, K = a.shape
    N = w.shape[1]
    out[:] = 0.0
    b = 0
    while b + 4 <= B:
        o0, o1, o2, o3 = out[b], out[b + 1], out[b + 2], out[b + 3]
        for k in range(K):
            a0, a1, a2, a3 = a[b, k], a[b + 1, k], a[b + 2, k], a[b + 3, k]
            wk = w[k]
            for n in range(N):
                x = wk[n]
                o0[n] += a0 * x
                o1[n] += a1 * x
                o2[n] += a2 * x
                o3[n] += a3 * x
        b += 4
    for r in range(b, B):
        o = out[r]
        for k in range(K):
            ak = a[r, k]
            wk = w[k]
            for n in range(N):
                o[n] += ak * wk[n]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def lstm_forward(x_gates, h0, c0, keep, w_hh, b_hh, gates, cells, tanh_cells, hs):
    """Unrolls ``T`` steps; writes, per step: ``gates [T, B, 4H]`` the activated gates (i, f, o
    sigmoid, g tanh), ``cells [T, B, H]`` the cell state after the step, ``tanh_cells [T, B, H]``
    its tanh, ``hs [T, B, H]`` the output ``h_t = o * tanh(c_t)``; the backward reads the first three.

    With ``h, c`` zeroed where ``keep`` is 0: ``pre = x_gates_t + b_hh + W_hh h``,
    ``i, f, o = sigmoid(pre)``, ``g = tanh(pre)``, ``c_t = f * c + i * g``, ``h_t = o * tanh(c_t)``."""
    T, B, G = x_gates.shape
    H = G // 4
    one, two = np.float32(1.0), np.float32(2.0)
    w_t = np.ascontiguousarray(w_hh.T)  # [H, 4H]
    # tanh(x) = 2 sigmoid(2x) - 1, so every gate is 1 / (1 + exp(-scale * pre)): one exp pass.
    neg_scale = np.full(G, -one, np.float32)
    neg_scale[2 * H:3 * H] = -two
    h_prev = np.empty((B, H), np.float32)
    bits = np.empty(B * G, np.int32)
    for t in range(T):
        h_in = h0 if t == 0 else hs[t - 1]
        c_in = c0 if t == 0 else cells[t - 1]
        for b in range(B):
            k = keep[t, b]
            for u in range(H):
                h_prev[b, u] = h_in[b, u] * k
        pre = gates[t]
        rows_times(h_prev, w_t, pre)
        for b in range(B):
            for g in range(G):
                pre[b, g] = (pre[b, g] + x_gates[t, b, g] + b_hh[g]) * neg_scale[g]
        exp_inplace(pre.reshape(B * G), bits)
        cell = cells[t]
        tanh_cell = tanh_cells[t]
        for b in range(B):
            k = keep[t, b]
            for g in range(G):
                pre[b, g] = one / (one + pre[b, g])
            for u in range(2 * H, 3 * H):
                pre[b, u] = two * pre[b, u] - one
            for u in range(H):
                cell[b, u] = pre[b, H + u] * c_in[b, u] * k + pre[b, u] * pre[b, 2 * H + u]
                tanh_cell[b, u] = -two * cell[b, u]
        exp_inplace(tanh_cell.reshape(B * H), bits)
        h = hs[t]
        for b in range(B):
            for u in range(H):
                tanh_cell[b, u] = two / (one + tanh_cell[b, u]) - one
                h[b, u] = pre[b, 3 * H + u] * tanh_cell[b, u]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def lstm_backward(d_hs, d_c_last, gates, cells, tanh_cells, c0, keep, w_hh, d_gates, d_h0, d_c0):
    """Backpropagates through :func:`lstm_forward`'s recurrence.

    ``d_hs [T, B, H]`` the loss gradient of every output ``h_t`` (the last one included),
    ``d_c_last [B, H]`` that of the final cell state. Writes ``d_gates [T, B, 4H]`` the gradient of
    the pre-activation gates (= that of ``x_gates`` and, summed, of ``b_hh``), ``d_h0``, ``d_c0``
    ``[B, H]``. ``dW_hh = sum_t d_gates_t^T (h_{t-1} * keep_t)`` is left to one matmul."""
    T, B, G = gates.shape
    H = G // 4
    one = np.float32(1.0)
    dh, dc = d_h0, d_c0  # running gradients of h_t and c_t; after step 0 they are those of h0, c0
    dh[:] = 0.0
    dc[:] = d_c_last
    for t in range(T - 1, -1, -1):
        for b in range(B):
            k = keep[t, b]
            for u in range(H):
                i = gates[t, b, u]
                f = gates[t, b, H + u]
                gg = gates[t, b, 2 * H + u]
                o = gates[t, b, 3 * H + u]
                tc = tanh_cells[t, b, u]
                dh_u = dh[b, u] + d_hs[t, b, u]
                dc_u = dc[b, u] + dh_u * o * (one - tc * tc)
                c_prev = (c0[b, u] if t == 0 else cells[t - 1, b, u]) * k
                d_gates[t, b, u] = dc_u * gg * i * (one - i)
                d_gates[t, b, H + u] = dc_u * c_prev * f * (one - f)
                d_gates[t, b, 2 * H + u] = dc_u * i * (one - gg * gg)
                d_gates[t, b, 3 * H + u] = dh_u * tc * o * (one - o)
                dc[b, u] = dc_u * f * k
        rows_times(d_gates[t], w_hh, dh)
        for b in range(B):
            k = keep[t, b]
            for u in range(H):
                dh[b, u] *= k
