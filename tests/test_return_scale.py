"""learner.normalize_returns: rewards divided by the std of each env stream's discounted return."""
import math

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.learner.return_scale import ReturnScale
from fastrl.learner.vtrace import VTraceLearner


def brute_force_returns(streams: dict, gamma: float) -> list:
    """Every valid step's discounted return, stream by stream, from (reward, end, valid) lists."""
    seen = []
    for steps in streams.values():
        g = 0.0
        for reward, end, valid in steps:
            if valid:
                g = gamma * g + reward
                seen.append(g)
            if end:
                g = 0.0
    return seen


def test_the_scale_is_the_std_of_every_streams_discounted_return_across_batches():
    rng = np.random.default_rng(0)
    gamma, T = 0.9, 5
    scale = ReturnScale(gamma)
    streams: dict = {}
    for _ in range(6):
        # Three columns, env 1 twice in one batch (its trajectories follow each other).
        env_ids = np.array([0, 1, 1, 2])
        rewards = rng.normal(size=(T, 4))
        ends = rng.random((T, 4)) < 0.2
        valid = np.ones((T, 4), dtype=bool)
        valid[1:] = ~ends[:-1]  # the step after an end is an autoreset step
        scale.update(rewards, ends, valid, env_ids)
        for b, env in enumerate(env_ids):
            streams.setdefault(env, []).extend(zip(rewards[:, b], ends[:, b], valid[:, b]))
    reference = np.array(brute_force_returns(streams, gamma))
    assert scale.count == reference.size
    assert scale.var == pytest.approx(reference.var(), rel=1e-9)
    assert scale.scale == pytest.approx(1 / math.sqrt(reference.var() + 1e-8), rel=1e-9)


def test_a_restarted_workers_env_starts_its_return_from_zero():
    scale = ReturnScale(0.5)
    ones = np.ones((2, 1))
    scale.update(ones, np.zeros((2, 1), bool), np.ones((2, 1), bool), np.array([3]))
    assert scale.carry[3] == pytest.approx(1.5)
    scale.update(ones, np.zeros((2, 1), bool), np.ones((2, 1), bool), np.array([3]), fresh=np.array([True]))
    assert scale.carry[3] == pytest.approx(1.5)  # 0 -> 1 -> 1.5, not 1.5 -> 1.75 -> 1.875


def test_the_learner_scales_its_rewards_and_keeps_the_statistics_in_its_state_dict():
    cfg = build_config("cartpole-appo", {"learner.normalize_returns": True, "learner.reward_scale": 1.0})
    obs_space = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    learner = VTraceLearner(cfg, obs_space, gymnasium.spaces.Discrete(2))
    from tests.test_learner import random_batch

    batch = random_batch(T=8, B=16)
    batch.rewards.mul_(100.0)
    learner.train(batch, env_ids=np.arange(16))
    rewards, _ = learner.rewards_and_discounts(batch)
    expected = batch.rewards * learner.return_scale.scale
    torch.testing.assert_close(rewards, expected)
    assert learner.return_scale.scale < 0.1  # returns of rewards ~100 have a std far above 1
    restored = VTraceLearner(cfg, obs_space, gymnasium.spaces.Discrete(2))
    restored.load_state_dict(learner.state_dict())
    assert restored.return_scale.scale == learner.return_scale.scale
    np.testing.assert_array_equal(restored.return_scale.carry, learner.return_scale.carry)
