"""The batcher's MLP kernel (fastrl.kernels.mlp) against a float64 numpy reference: every row
count around the four-row blocks, each activation, hidden layers of different widths."""
import numpy as np
import pytest
from numba.typed import List

from fastrl.kernels.mlp import IDENTITY, RELU, TANH, dense, mlp_forward

REFERENCE = {IDENTITY: lambda x: x, RELU: lambda x: np.maximum(x, 0.0), TANH: np.tanh}


@pytest.mark.parametrize("activation", [IDENTITY, RELU, TANH])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])
def test_dense_is_the_affine_map_then_the_activation(activation, rows):
    rng = np.random.default_rng(rows)
    h, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((rows, 7), (5, 7), (5,)))
    out = np.full((rows, 5), np.nan, np.float32)
    dense(h, w, b, out, activation)
    expected = REFERENCE[activation](h.astype(np.float64) @ w.T.astype(np.float64) + b)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", [RELU, TANH])
def test_mlp_forward_applies_the_layers_in_turn_without_activating_the_last(activation):
    rng = np.random.default_rng(0)
    sizes = [4, 32, 16, 3]
    weights = [rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k) for k, n in zip(sizes, sizes[1:])]
    biases = [rng.standard_normal(n).astype(np.float32) for n in sizes[1:]]
    x = rng.standard_normal((11, 4)).astype(np.float32)
    scratch = np.empty((11, 32), np.float32), np.empty((11, 32), np.float32)
    out = np.empty((11, 3), np.float32)
    mlp_forward(x, List(weights), List(biases), activation, *scratch, out)
    h = x.astype(np.float64)
    for k, (w, b) in enumerate(zip(weights, biases)):
        h = h @ w.T.astype(np.float64) + b
        if k < len(weights) - 1:
            h = REFERENCE[activation](h)
    np.testing.assert_allclose(out, h, rtol=1e-5, atol=1e-5)
