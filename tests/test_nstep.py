"""n-step targets against a plain Python loop over the definition."""
import numpy as np
import pytest

from fastrl.kernels import nstep_targets


def nstep_reference(rewards, discounts, n):
    num_steps, batch = rewards.shape
    returns = np.zeros((num_steps, batch))
    bootstrap_discounts = np.ones((num_steps, batch))
    bootstrap_indices = np.zeros(num_steps, dtype=np.int64)
    for t in range(num_steps):
        m = min(n, num_steps - t)
        bootstrap_indices[t] = t + m
        for b in range(batch):
            for k in range(m):
                returns[t, b] += np.prod(discounts[t:t + k, b]) * rewards[t + k, b]
            bootstrap_discounts[t, b] = np.prod(discounts[t:t + m, b])
    return returns, bootstrap_discounts, bootstrap_indices


@pytest.mark.parametrize("dtype,tolerance", [(np.float64, 1e-12), (np.float32, 1e-6)])
@pytest.mark.parametrize("num_steps,batch", [(1, 1), (9, 4), (20, 3)])
@pytest.mark.parametrize("n", [1, 3, 25])
def test_matches_reference(dtype, tolerance, num_steps, batch, n):
    rng = np.random.default_rng(num_steps * n)
    rewards = rng.normal(size=(num_steps, batch)).astype(dtype)
    discounts = (0.99 * (rng.random((num_steps, batch)) > 0.25)).astype(dtype)
    returns, bootstrap_discounts, bootstrap_indices = nstep_targets(rewards, discounts, n)
    assert returns.dtype == bootstrap_discounts.dtype == dtype
    ref_returns, ref_discounts, ref_indices = nstep_reference(rewards, discounts, n)
    np.testing.assert_allclose(returns, ref_returns, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(bootstrap_discounts, ref_discounts, rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(bootstrap_indices, ref_indices)


def test_episode_end_cuts_the_return_and_the_bootstrap():
    rewards = np.array([[1.0], [2.0], [4.0], [8.0]])
    discounts = np.array([[0.5], [0.0], [0.5], [0.5]])
    returns, bootstrap_discounts, bootstrap_indices = nstep_targets(rewards, discounts, 3)
    # From t=0 the window [0, 3) ends with the episode at t=1: reward 4 is never reached.
    np.testing.assert_array_equal(returns[:, 0], [1.0 + 0.5 * 2.0, 2.0, 4.0 + 0.5 * 8.0, 8.0])
    np.testing.assert_array_equal(bootstrap_discounts[:, 0], [0.0, 0.0, 0.25, 0.5])
    np.testing.assert_array_equal(bootstrap_indices, [3, 4, 4, 4])


def test_n_must_be_positive():
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        nstep_targets(np.zeros((3, 2)), np.ones((3, 2)), 0)
