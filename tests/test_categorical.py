"""fastrl.kernels.sample_categorical against a brute-force inverse-CDF reference, and the
categorical head that uses it."""
import numpy as np
import pytest
import torch

from fastrl.kernels import sample_categorical
from fastrl.models import CategoricalHead


def reference(logits, uniforms):
    """First action whose cumulative softmax probability exceeds u, and log_softmax of it."""
    actions, logp = [], []
    for row, u in zip(logits.astype(np.float64), uniforms):
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        action = int(np.argmax(np.cumsum(probs) > u))
        actions.append(action)
        logp.append(np.log(probs[action]))
    return np.array(actions), np.array(logp)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("num_actions", [1, 2, 6, 18])
def test_matches_inverse_cdf_reference(dtype, tol, num_actions):
    rng = np.random.default_rng(num_actions)
    logits = (rng.normal(size=(300, num_actions)) * 3).astype(dtype)
    uniforms = rng.random(300)
    actions, logp = sample_categorical(logits, uniforms)
    want_actions, want_logp = reference(logits, uniforms)
    assert actions.dtype == np.int64 and logp.dtype == dtype
    np.testing.assert_array_equal(actions, want_actions)
    error = np.abs(logp - want_logp) / np.maximum(1, np.abs(want_logp))
    assert error.max() <= tol, error.max()


def test_frequencies_follow_softmax():
    rng = np.random.default_rng(0)
    row = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    n = 200_000
    actions, _ = sample_categorical(np.tile(row, (n, 1)), rng.random(n))
    probs = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    counts = np.bincount(actions, minlength=4)
    chi2 = (((counts - n * probs) ** 2) / (n * probs)).sum()
    assert chi2 < 16.27  # chi-square, 3 degrees of freedom, p = 0.001


def test_zero_probability_actions_never_drawn():
    logits = np.array([[-np.inf, 0.0, -np.inf, 3.0, -np.inf]] * 4, np.float32)
    uniforms = np.array([0.0, 0.5, np.nextafter(1.0, 0.0), 0.999999])
    actions, logp = sample_categorical(logits, uniforms)
    assert set(actions.tolist()) <= {1, 3}
    assert actions[2] == 3 and np.isfinite(logp).all()


def test_shape_errors_name_the_arrays():
    with pytest.raises(ValueError, match=r"logits \[B, A\] and uniforms \[B\]"):
        sample_categorical(np.zeros((4, 2), np.float32), np.zeros(3))
    with pytest.raises(ValueError, match="logits"):
        sample_categorical(np.zeros(4, np.float32), np.zeros(4))


@pytest.mark.parametrize("shape, dtype, requires_grad", [
    ((64, 5), torch.float32, False),   # the batcher's case: the compiled sampler
    ((64, 5), torch.float32, True),    # a caller's model output, still attached to the graph
    ((64, 5), torch.bfloat16, False),  # a dtype the sampler does not take: torch's path
    ((4, 16, 5), torch.float32, False),
])
def test_head_sample_with_log_prob_agrees_with_log_prob(shape, dtype, requires_grad):
    head = CategoricalHead()
    params = torch.randn(shape, dtype=dtype).requires_grad_(requires_grad)
    actions, logp = head.sample_with_log_prob(params)
    assert actions.shape == shape[:-1] and logp.shape == shape[:-1]
    assert int(actions.min()) >= 0 and int(actions.max()) < shape[-1]
    torch.testing.assert_close(logp.float(), head.log_prob(params, actions).detach().float(), rtol=1e-2, atol=1e-2)
