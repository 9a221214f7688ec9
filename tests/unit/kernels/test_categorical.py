"""fastrl.kernels.sample_categorical against a brute-force inverse-CDF reference, the compiled
log-prob / entropy kernels against a float64 reference and torch's autograd, and the
categorical head that uses them."""
from unittest import mock

import numpy as np
import pytest
import torch

from fastrl.kernels import sample_categorical
from fastrl.kernels.categorical import categorical_log_prob_entropy
from fastrl.models.networks import MASKED_LOGIT, CategoricalHead


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


def log_prob_entropy_reference(logits, actions):
    """log softmax of the taken action and -sum p log p, row by row in float64."""
    logp, entropy = [], []
    for row, action in zip(logits.astype(np.float64), actions):
        shifted = row - row.max()
        log_probs = shifted - np.log(np.exp(shifted).sum())
        probs = np.exp(log_probs)
        logp.append(log_probs[action])
        entropy.append(-(probs * log_probs)[probs > 0].sum())
    return np.array(logp), np.array(entropy)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("num_actions", [1, 2, 6, 18])
def test_log_prob_entropy_kernel_matches_the_reference(dtype, tol, num_actions):
    rng = np.random.default_rng(num_actions)
    logits = (rng.normal(size=(300, num_actions)) * 3).astype(dtype)
    if num_actions > 2:
        logits[::3, 1] = MASKED_LOGIT  # masked choices: probability exactly 0
    actions = rng.integers(0, num_actions, 300)
    logp, entropy, probs, log_probs = categorical_log_prob_entropy(logits, actions)
    want_logp, want_entropy = log_prob_entropy_reference(logits, actions)
    assert logp.dtype == entropy.dtype == dtype and probs.shape == (num_actions, 300)
    finite = want_logp > -1e30  # a masked action taken: log p is about float32's lowest
    np.testing.assert_allclose(logp[finite], want_logp[finite], rtol=tol, atol=tol)
    np.testing.assert_allclose(entropy, want_entropy, rtol=tol, atol=tol)
    assert np.isfinite(entropy).all()


def test_log_prob_entropy_kernel_names_bad_actions_and_shapes():
    logits = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"actions must lie in \[0, 3\), got 0..3"):
        categorical_log_prob_entropy(logits, np.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"got -1..2"):
        categorical_log_prob_entropy(logits, np.array([0, -1, 2, 1]))
    with pytest.raises(ValueError, match=r"logits \[N, A\] and actions \[N\]"):
        categorical_log_prob_entropy(logits, np.zeros(5, np.int64))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("shape", [(200, 2), (7, 9, 6)])
def test_compiled_head_equals_torch_ops_with_gradients(dtype, tol, shape):
    """CategoricalHead on CPU float tensors (the compiled kernels) against the same head by torch
    ops: values and the gradient of a weighted sum of log-probs and entropies, masked choices
    included (no gradient reaches them, nothing is NaN)."""
    g = torch.Generator().manual_seed(len(shape))
    logits = torch.randn(shape, generator=g, dtype=dtype) * 2
    logits[..., 0][logits[..., 1] > 1] = MASKED_LOGIT
    actions = torch.randint(0, shape[-1], shape[:-1], generator=g)
    actions[logits[..., 0] == MASKED_LOGIT] = 1
    d_logp, d_entropy = torch.randn(shape[:-1], generator=g, dtype=dtype), torch.randn(shape[:-1], generator=g,
                                                                                      dtype=dtype)
    head = CategoricalHead()
    results = []
    for compiled in (True, False):
        leaf = logits.clone().requires_grad_()
        with mock.patch("fastrl.models.heads.kernels_take", lambda params: compiled):
            logp, entropy = head.log_prob_and_entropy(leaf, actions)
            alone = head.log_prob(leaf, actions), head.entropy(leaf)
        (d_logp * logp + d_entropy * entropy).sum().backward()
        results.append((logp, entropy, alone, leaf.grad))
        assert logp.dtype == dtype and logp.shape == shape[:-1] and entropy.shape == shape[:-1]
    (logp, entropy, alone, grad), (want_logp, want_entropy, _, want_grad) = results
    torch.testing.assert_close(logp, want_logp, rtol=tol, atol=tol)
    torch.testing.assert_close(entropy, want_entropy, rtol=tol, atol=tol)
    torch.testing.assert_close(alone[0], logp)
    torch.testing.assert_close(alone[1], entropy)
    # torch's entropy backward multiplies p = 0 by d_entropy * log p, which can overflow float32
    # to -inf at a masked logit: NaN over that row. The kernel gives masked logits no gradient.
    finite_rows = torch.isfinite(want_grad).all(-1)
    assert finite_rows.float().mean() > 0.7
    torch.testing.assert_close(grad[finite_rows], want_grad[finite_rows], rtol=tol, atol=tol)
    assert torch.isfinite(grad).all() and not grad[logits == MASKED_LOGIT].any()


def test_compiled_head_passes_gradcheck():
    logits = torch.randn(12, 4, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(0, 4, (12,))
    torch.autograd.gradcheck(lambda z: CategoricalHead().log_prob_and_entropy(z, actions), (logits,))
