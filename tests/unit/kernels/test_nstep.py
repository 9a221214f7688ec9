"""n-step targets against a plain Python loop over the definition, and the windows of trajectories
the DQN learner builds for its arrival priorities against a brute force over episodes."""
import numpy as np
import pytest
import torch

from fastrl.kernels import nstep_targets, nstep_windows
from tests.support.autoreset import autoreset_flags, nstep_episodes_reference
from tests.support.small_learners import reference_windows


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


@pytest.mark.parametrize("dtype,tolerance", [(np.float64, 1e-12), (np.float32, 1e-6)])
@pytest.mark.parametrize("num_steps,batch", [(1, 1), (9, 4), (40, 6)])
@pytest.mark.parametrize("n", [1, 3, 25])
def test_autoreset_steps_cut_the_windows_like_episode_ends(dtype, tolerance, num_steps, batch, n):
    gamma = 0.99
    rng = np.random.default_rng(num_steps * n + batch)
    rewards = rng.normal(size=(num_steps, batch)).astype(dtype)
    terminated, truncated, valid = autoreset_flags(rng, num_steps, batch)
    discounts = (gamma * ~terminated).astype(dtype)
    returns, bootstrap_discounts, bootstrap_indices = nstep_targets(rewards, discounts, n,
                                                                    valid=valid)
    assert returns.dtype == bootstrap_discounts.dtype == dtype
    assert bootstrap_indices.dtype == np.int64 and bootstrap_indices.shape == (num_steps, batch)
    ref_returns, ref_discounts, ref_indices = nstep_episodes_reference(
        rewards, terminated, truncated, valid, np.float64(dtype(gamma)), n)
    np.testing.assert_allclose(returns, ref_returns, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(bootstrap_discounts, ref_discounts, rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(bootstrap_indices, ref_indices)


def test_truncated_step_bootstraps_from_its_final_observation_only():
    # Step 1 is truncated, step 2 the autoreset step, step 3 the next episode's first step.
    rewards = np.array([[1.0], [2.0], [4.0], [8.0]])
    discounts = np.full((4, 1), 0.5)
    valid = np.array([[True], [True], [False], [True]])
    returns, bootstrap_discounts, bootstrap_indices = nstep_targets(rewards, discounts, 3,
                                                                    valid=valid)
    # q[2] holds Q of the final observation: steps 0 and 1 bootstrap from it and stop there.
    np.testing.assert_array_equal(returns[:, 0], [1.0 + 0.5 * 2.0, 2.0, 0.0, 8.0])
    np.testing.assert_array_equal(bootstrap_discounts[:, 0], [0.25, 0.5, 1.0, 0.5])
    np.testing.assert_array_equal(bootstrap_indices[:, 0], [2, 2, 2, 4])


def test_all_valid_matches_no_mask():
    rng = np.random.default_rng(7)
    rewards = rng.normal(size=(11, 3))
    discounts = 0.9 * (rng.random((11, 3)) > 0.3)
    expected = nstep_targets(rewards, discounts, 4)
    returns, bootstrap_discounts, bootstrap_indices = nstep_targets(
        rewards, discounts, 4, valid=np.ones((11, 3), np.float32))
    np.testing.assert_array_equal(returns, expected[0])
    np.testing.assert_array_equal(bootstrap_discounts, expected[1])
    np.testing.assert_array_equal(bootstrap_indices, np.repeat(expected[2][:, None], 3, axis=1))


def test_bad_valid_shape_raises_naming_it():
    with pytest.raises(ValueError, match=r"nstep_targets: valid has shape \(3,\) but rewards"):
        nstep_targets(np.zeros((3, 2)), np.ones((3, 2)), 2, valid=np.ones(3, bool))


def test_nstep_windows_stop_before_their_first_invalid_step():
    """The shared window rule on its own: B windows of n steps, arbitrary valid flags; the outputs
    are overwritten, not added to."""
    rng = np.random.default_rng(3)
    n, batch = 5, 64
    rewards = rng.normal(size=(n, batch))
    discounts = 0.9 * (rng.random((n, batch)) > 0.2)
    valid = rng.random((n, batch)) > 0.2
    returns, bootstrap_discounts = np.full(batch, np.nan), np.full(batch, np.nan)
    steps = np.full(batch, -7, np.int64)
    nstep_windows(rewards, discounts, valid, returns, bootstrap_discounts, steps)
    for b in range(batch):
        m = 0
        while m < n and valid[m, b]:
            m += 1
        assert steps[b] == m
        expected = sum(np.prod(discounts[:k, b]) * rewards[k, b] for k in range(m))
        assert returns[b] == pytest.approx(expected, rel=1e-12, abs=1e-12)
        assert bootstrap_discounts[b] == pytest.approx(np.prod(discounts[:m, b]), rel=1e-12)
    assert (steps == 0).any() and (steps == n).any()  # empty and full windows both occur


# The windows of trajectories the DQN learner builds for its arrival priorities.


def arrival_windows(rewards, terminated, truncated, gamma, n):
    """The n-step windows of trajectories ``[T, B]`` by the shared kernel, as the DQN learner
    builds them for its arrival priorities: the step after a done is the autoreset step."""
    valid = np.ones_like(terminated)
    valid[1:] = ~(terminated[:-1] | truncated[:-1])
    return nstep_targets(rewards, gamma * ~terminated, n, valid=valid)


@pytest.mark.parametrize("n", [1, 3, 5, 9])
def test_nstep_windows_of_trajectories_match_a_brute_force_loop(n):
    g = torch.Generator().manual_seed(n)
    steps, batch, gamma = 7, 5, 0.9
    rewards = torch.randn(steps, batch, generator=g, dtype=torch.float64).numpy()
    terminated = (torch.rand(steps, batch, generator=g) < 0.2).numpy()
    truncated = (torch.rand(steps, batch, generator=g) < 0.15).numpy()
    returns, discounts, ends = arrival_windows(rewards, terminated, truncated, gamma, n)
    ref_returns, ref_discounts, ref_ends = reference_windows(rewards, terminated, truncated, gamma, n)
    assert returns.dtype == discounts.dtype == np.float64 and ends.dtype == np.int64
    np.testing.assert_allclose(returns, ref_returns, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(discounts, ref_discounts, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(ends, ref_ends)
    assert ends.min() >= 0 and ends.max() <= steps


def test_nstep_windows_of_a_trajectory_by_hand():
    rewards = np.array([[1.0], [2.0], [4.0], [0.0], [16.0], [0.0], [64.0]])
    terminated = np.array([[False], [False], [True], [False], [False], [False], [False]])
    truncated = np.array([[False], [False], [False], [False], [True], [False], [False]])
    returns, discounts, ends = arrival_windows(rewards, terminated, truncated, 0.5, 3)
    # t=0: 1 + .5*2 + .25*4, terminated inside; t=1: 2 + .5*4 terminated; t=2: 4 terminated;
    # t=3 and t=5: autoreset steps, empty windows; t=4: truncated after one step, bootstraps from
    # the final observation obs[5]; t=6: cut by the trajectory's end, bootstraps from obs[T].
    np.testing.assert_allclose(returns[:, 0], [3.0, 4.0, 4.0, 0.0, 16.0, 0.0, 64.0])
    np.testing.assert_allclose(discounts[:, 0], [0.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.5])
    np.testing.assert_array_equal(ends[:, 0], [3, 3, 3, 3, 5, 5, 7])
