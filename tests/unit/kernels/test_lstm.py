"""The numba LSTM recurrence (fastrl.kernels.lstm) against a brute-force float64 reference."""
import numpy as np
import pytest

from fastrl.kernels.lstm import exp_inplace, lstm_backward, lstm_forward, rows_times


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def reference_forward(x_gates, h0, c0, keep, w_hh, b_hh):
    """nn.LSTMCell's maths step by step in float64: (outputs [T, B, H], cells [T, B, H])."""
    T, B, G = x_gates.shape
    H = G // 4
    h, c = h0.astype(np.float64), c0.astype(np.float64)
    outputs, cells = [], []
    for t in range(T):
        h, c = h * keep[t, :, None], c * keep[t, :, None]
        pre = x_gates[t] + b_hh + h @ w_hh.T
        i, f = sigmoid(pre[:, :H]), sigmoid(pre[:, H:2 * H])
        g, o = np.tanh(pre[:, 2 * H:3 * H]), sigmoid(pre[:, 3 * H:])
        c = f * c + i * g
        h = o * np.tanh(c)
        outputs.append(h)
        cells.append(c)
    return np.stack(outputs), np.stack(cells)


def problem(T=5, B=7, H=3, scale=1.0, seed=0):
    """B = 7: the kernel's matmul takes rows four at a time, so a remainder row is covered."""
    r = np.random.default_rng(seed)
    f32 = np.float32
    x_gates = (r.standard_normal((T, B, 4 * H)) * scale).astype(f32)
    h0, c0 = r.standard_normal((B, H)).astype(f32), r.standard_normal((B, H)).astype(f32)
    keep = (r.random((T, B)) > 0.3).astype(f32)
    w_hh, b_hh = r.standard_normal((4 * H, H)).astype(f32), r.standard_normal(4 * H).astype(f32)
    return x_gates, h0, c0, keep, w_hh, b_hh


def run_forward(x_gates, h0, c0, keep, w_hh, b_hh):
    T, B, G = x_gates.shape
    out = {name: np.empty((T, B, n), np.float32) for name, n in
           (("gates", G), ("cells", G // 4), ("tanh_cells", G // 4), ("hs", G // 4))}
    lstm_forward(x_gates, h0, c0, keep, w_hh, b_hh, out["gates"], out["cells"], out["tanh_cells"], out["hs"])
    return out


def test_exp_matches_numpy_to_float32_precision_and_saturates():
    x = np.linspace(-87.0, 88.0, 400_001, dtype=np.float32)
    got = x.copy()
    exp_inplace(got, np.empty(x.shape, np.int32))
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - exact) / exact) < 2e-7
    far = np.array([-1e4, -100.0, 100.0, 1e4, np.inf, -np.inf], np.float32)
    exp_inplace(far, np.empty(far.shape, np.int32))
    assert np.all(np.isfinite(far)) and far[0] < 1e-37 and far[3] > 1e38


def test_rows_times_is_a_matmul_for_any_row_count():
    r = np.random.default_rng(1)
    for rows in (1, 4, 7, 9):
        a, w = r.standard_normal((rows, 5)).astype(np.float32), r.standard_normal((5, 6)).astype(np.float32)
        out = np.full((rows, 6), np.nan, np.float32)
        rows_times(a, w, out)
        np.testing.assert_allclose(out, a.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 50.0])
def test_forward_matches_the_step_by_step_reference_with_resets(scale):
    """scale 50 saturates every gate (pre-activations far beyond exp's range included)."""
    args = problem(scale=scale)
    out = run_forward(*args)
    hs, cells = reference_forward(*args)
    np.testing.assert_allclose(out["hs"], hs, atol=2e-6)
    np.testing.assert_allclose(out["cells"], cells, atol=2e-6 * scale)
    np.testing.assert_allclose(out["tanh_cells"], np.tanh(cells), atol=2e-6)


def test_backward_matches_finite_differences_of_the_reference():
    x_gates, h0, c0, keep, w_hh, b_hh = problem(T=3, B=5, H=2, seed=3)  # B = 5: a remainder row
    T, B, G = x_gates.shape
    r = np.random.default_rng(4)
    d_hs = r.standard_normal((T, B, G // 4)).astype(np.float32)
    d_c = r.standard_normal((B, G // 4)).astype(np.float32)

    def loss(xg, h, c):
        hs, cells = reference_forward(xg, h, c, keep, w_hh.astype(np.float64), b_hh.astype(np.float64))
        return float((hs * d_hs).sum() + (cells[-1] * d_c).sum())

    out = run_forward(x_gates, h0, c0, keep, w_hh, b_hh)
    d_gates = np.empty_like(out["gates"])
    d_h0, d_c0 = np.empty_like(h0), np.empty_like(c0)
    lstm_backward(d_hs, d_c, out["gates"], out["cells"], out["tanh_cells"], c0, keep, w_hh, d_gates, d_h0, d_c0)
    inputs = [x_gates.astype(np.float64), h0.astype(np.float64), c0.astype(np.float64)]
    for which, grad in enumerate((d_gates, d_h0, d_c0)):
        numeric = np.zeros(grad.shape)
        for index in np.ndindex(grad.shape):
            up, down = [a.copy() for a in inputs], [a.copy() for a in inputs]
            up[which][index] += 1e-6
            down[which][index] -= 1e-6
            numeric[index] = (loss(*up) - loss(*down)) / 2e-6
        np.testing.assert_allclose(grad, numeric, atol=1e-4)
