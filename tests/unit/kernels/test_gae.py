"""GAE against a plain Python loop over the definition."""
import numpy as np
import pytest

from fastrl.kernels import gae
from tests.support.autoreset import autoreset_flags


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


def gae_episodes_reference(rewards, values, bootstrap_value, terminated, truncated, valid, gamma,
                           lambda_):
    """GAE walking each env's episodes: A_s sums the deltas of the steps of its own episode,
    from s up to and including the step that terminates or truncates it (a truncated step
    bootstraps from V of the final observation, which next-step autoreset keeps at t + 1). The
    autoreset step after a done belongs to no episode: A = 0 and return = V there."""
    num_steps, batch = rewards.shape
    v = np.concatenate([values, bootstrap_value[None]]).astype(np.float64)
    advantages = np.zeros((num_steps, batch))
    for b in range(batch):
        for s in range(num_steps):
            if not valid[s, b]:
                continue
            weight = 1.0
            for t in range(s, num_steps):
                discount = 0.0 if terminated[t, b] else gamma
                advantages[s, b] += weight * (rewards[t, b] + discount * v[t + 1, b] - v[t, b])
                if terminated[t, b] or truncated[t, b]:
                    break
                weight *= discount * lambda_
    return advantages, advantages + v[:-1]


def autoreset_inputs(num_steps, batch, dtype, seed, gamma=0.99):
    rng = np.random.default_rng(seed)
    rewards, values, bootstrap_value, _ = random_inputs(num_steps, batch, dtype, seed)
    terminated, truncated, valid = autoreset_flags(rng, num_steps, batch)
    discounts = (gamma * ~terminated).astype(dtype)
    return rewards, values, bootstrap_value, discounts, terminated, truncated, valid


@pytest.mark.parametrize("dtype,tolerance", [(np.float64, 1e-10), (np.float32, 2e-6)])
@pytest.mark.parametrize("num_steps,batch", [(1, 1), (6, 3), (33, 7)])
@pytest.mark.parametrize("lambda_", [0.0, 0.95, 1.0])
def test_autoreset_steps_cut_the_sums_like_episode_ends(dtype, tolerance, num_steps, batch,
                                                        lambda_):
    gamma = 0.99
    rewards, values, bootstrap_value, discounts, terminated, truncated, valid = autoreset_inputs(
        num_steps, batch, dtype, seed=10 * num_steps + batch, gamma=gamma)
    advantages, returns = gae(rewards, values, bootstrap_value, discounts, lambda_, valid=valid)
    assert advantages.dtype == returns.dtype == dtype
    expected = gae_episodes_reference(rewards, values, bootstrap_value, terminated, truncated,
                                      valid, np.float64(dtype(gamma)), lambda_)
    for actual, reference in zip((advantages, returns), expected):
        np.testing.assert_allclose(actual, reference, rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(advantages[~valid], 0.0)
    np.testing.assert_array_equal(returns[~valid], values[~valid])


def test_truncated_step_bootstraps_from_its_final_observation_only():
    # Step 0 is truncated, step 1 the autoreset step, step 2 the next episode's first step.
    rewards = np.array([[1.0], [5.0], [7.0]])
    values = np.array([[0.5], [2.0], [3.0]])  # V(x_1) = 2.0 is the final observation's value
    bootstrap_value = np.array([4.0])
    discounts = np.full((3, 1), 0.9)
    valid = np.array([[True], [False], [True]])
    advantages, returns = gae(rewards, values, bootstrap_value, discounts, 0.95, valid=valid)
    np.testing.assert_allclose(advantages[:, 0], [1.0 + 0.9 * 2.0 - 0.5, 0.0, 7.0 + 0.9 * 4.0 - 3.0])
    np.testing.assert_allclose(returns[:, 0], [1.0 + 0.9 * 2.0, 2.0, 7.0 + 0.9 * 4.0])


def test_valid_defaults_to_all_steps_and_accepts_numbers():
    rewards, values, bootstrap_value, discounts, _, _, valid = autoreset_inputs(9, 4, np.float64,
                                                                                seed=3)
    expected = gae(rewards, values, bootstrap_value, discounts, 0.9)
    all_valid = gae(rewards, values, bootstrap_value, discounts, 0.9,
                    valid=np.ones_like(valid))
    for a, e in zip(all_valid, expected):
        np.testing.assert_array_equal(a, e)
    as_bool = gae(rewards, values, bootstrap_value, discounts, 0.9, valid=valid)
    as_float = gae(rewards, values, bootstrap_value, discounts, 0.9, valid=valid.astype(np.float32))
    for a, e in zip(as_float, as_bool):
        np.testing.assert_array_equal(a, e)


def test_bad_valid_shape_raises_naming_it():
    rewards, values, bootstrap_value, discounts = random_inputs(4, 3, np.float64, seed=2)
    with pytest.raises(ValueError, match=r"gae: valid has shape \(4, 2\) but rewards has \(4, 3\)"):
        gae(rewards, values, bootstrap_value, discounts, 0.9, valid=np.ones((4, 2), bool))


def test_torch_front_end_passes_valid():
    torch = pytest.importorskip("torch")
    from fastrl.kernels.torch_ops import gae_torch

    inputs = autoreset_inputs(8, 5, np.float32, seed=4)
    rewards, values, bootstrap_value, discounts, _, _, valid = inputs
    expected = gae(rewards, values, bootstrap_value, discounts, 0.95, valid=valid)
    actual = gae_torch(*(torch.from_numpy(a) for a in (rewards, values, bootstrap_value, discounts)),
                       0.95, valid=torch.from_numpy(valid))
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a.numpy(), e)
