"""GAE against a plain Python loop over the definition."""
import numpy as np
import pytest

from fastrl.kernels import gae


def gae_reference(rewards, values, bootstrap_value, discounts, lambda_):
    """A_t = sum_{k>=t} (prod_{i=t}^{k-1} discount_i lambda) delta_k (Schulman et al. 2016)."""
    num_steps, batch = rewards.shape
    v = np.concatenate([values, bootstrap_value[None]]).astype(np.float64)
    advantages = np.zeros((num_steps, batch))
    for b in range(batch):
        for s in range(num_steps):
            weight = 1.0
            for t in range(s, num_steps):
                delta = rewards[t, b] + discounts[t, b] * v[t + 1, b] - v[t, b]
                advantages[s, b] += weight * delta
                weight *= discounts[t, b] * lambda_
    return advantages, advantages + v[:-1]


def random_inputs(num_steps, batch, dtype, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(num_steps, batch))
    values = rng.normal(size=(num_steps, batch))
    bootstrap_value = rng.normal(size=batch)
    discounts = 0.99 * (rng.random((num_steps, batch)) > 0.2)
    return [a.astype(dtype) for a in (rewards, values, bootstrap_value, discounts)]


@pytest.mark.parametrize("dtype,tolerance", [(np.float64, 1e-10), (np.float32, 2e-6)])
@pytest.mark.parametrize("num_steps,batch", [(1, 1), (6, 3), (33, 7)])
@pytest.mark.parametrize("lambda_", [0.0, 0.95, 1.0])
def test_matches_reference(dtype, tolerance, num_steps, batch, lambda_):
    inputs = random_inputs(num_steps, batch, dtype, seed=num_steps + batch)
    advantages, returns = gae(*inputs, lambda_)
    assert advantages.dtype == returns.dtype == dtype
    for actual, expected in zip((advantages, returns), gae_reference(*inputs, lambda_)):
        scale = np.maximum(1.0, np.abs(expected))
        np.testing.assert_array_less(np.abs(actual - expected) / scale, tolerance)


def test_non_contiguous_inputs_give_the_same_result():
    rewards, values, bootstrap_value, discounts = random_inputs(7, 5, np.float64, seed=1)
    expected = gae(rewards, values, bootstrap_value, discounts, 0.9)
    actual = gae(np.asfortranarray(rewards), np.asfortranarray(values), bootstrap_value,
                 np.asfortranarray(discounts), 0.9)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)


def test_bad_shape_raises_naming_the_array():
    rewards, values, bootstrap_value, discounts = random_inputs(4, 3, np.float64, seed=2)
    message = r"gae: discounts has shape \(4, 2\) but rewards has \(4, 3\)"
    with pytest.raises(ValueError, match=message):
        gae(rewards, values, bootstrap_value, discounts[:, :2], 0.9)
