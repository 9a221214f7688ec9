"""learner.normalize_returns: rewards divided by the std of each env stream's discounted return."""
import math

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.learner.return_scale import ReturnScale
from fastrl.learner.vtrace import VTraceLearner


def episodes_of(steps: list) -> list:
    """One stream's (reward, end, valid, restart) steps cut into episodes of (reward, valid) steps:
    an episode ends at an end, and a restart (the worker restarted, or the learner missed the
    steps before it) begins a new one."""
    episodes, current = [], []
    for reward, end, valid, restart in steps:
        if restart and current:
            episodes.append(current)
            current = []
        current.append((reward, valid))
        if end:
            episodes.append(current)
            current = []
    return episodes + [current]


def brute_force_returns(episodes: list, gamma: float) -> np.ndarray:
    """Every valid step's discounted return ``G_t = sum_{k <= t} gamma^(t - k) r_k`` over the
    valid steps of its episode, episode by episode."""
    seen = []
    for episode in episodes:
        rewards = [reward for reward, valid in episode if valid]
        for t in range(len(rewards)):
            seen.append(sum(gamma ** (t - k) * rewards[k] for k in range(t + 1)))
    return np.array(seen)


def stream_episodes(streams: dict) -> list:
    return [episode for steps in streams.values() for episode in episodes_of(steps)]


def random_columns(rng, T: int, B: int):
    """(rewards, ends, valid) ``[T, B]``: the step after an end is an autoreset step."""
    rewards = rng.normal(size=(T, B))
    ends = rng.random((T, B)) < 0.2
    valid = np.ones((T, B), dtype=bool)
    valid[1:] = ~ends[:-1]
    return rewards, ends, valid


def record(streams: dict, env_ids, rewards, ends, valid, restart=None) -> None:
    """Append a batch's columns to each env's step log, in column order."""
    for b, env in enumerate(env_ids):
        starts = np.zeros(len(rewards), bool)
        starts[0] = restart is not None and restart[b]
        streams.setdefault(int(env), []).extend(zip(rewards[:, b], ends[:, b], valid[:, b], starts))


def assert_statistics_of(scale: ReturnScale, reference: np.ndarray) -> None:
    assert scale.count == reference.size
    assert scale.mean == pytest.approx(reference.mean(), rel=1e-9, abs=1e-12)
    assert scale.var == pytest.approx(reference.var(), rel=1e-9)
    assert scale.scale == pytest.approx(1 / math.sqrt(reference.var() + 1e-8), rel=1e-9)


def test_the_scale_is_the_std_of_every_streams_discounted_return_across_batches():
    rng = np.random.default_rng(0)
    gamma, T = 0.9, 5
    scale = ReturnScale(gamma)
    streams: dict = {}
    for _ in range(6):
        # Three envs, env 1 in two columns of each batch (its trajectories follow each other).
        env_ids = np.array([0, 1, 1, 2])
        rewards, ends, valid = random_columns(rng, T, 4)
        scale.update(rewards, ends, valid, env_ids)
        record(streams, env_ids, rewards, ends, valid)
    assert_statistics_of(scale, brute_force_returns(stream_episodes(streams), gamma))


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
    from tests.unit.learner.test_vtrace_learner import random_batch

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


def test_an_envs_old_slot_and_its_first_fresh_slot_in_one_batch_each_continue_their_own_episode():
    rng = np.random.default_rng(1)
    gamma, T = 0.9, 6
    scale = ReturnScale(gamma)
    streams: dict = {}
    no_ends = np.zeros((T, 2), bool)
    rewards = rng.normal(size=(T, 2))
    scale.update(rewards, no_ends, ~no_ends, np.array([0, 1]))
    record(streams, [0, 1], rewards, no_ends, ~no_ends)
    # Env 0's worker restarted: its last slot of the old episode and the new worker's first slot
    # arrive in one batch, old first.
    env_ids, fresh = np.array([0, 1, 0]), np.array([False, False, True])
    rewards, ends, valid = random_columns(rng, T, 3)
    ends[:, [0, 2]] = False  # the old episode runs through its slot into the restart; the new one goes on
    valid[:, [0, 2]] = True
    scale.update(rewards, ends, valid, env_ids, fresh)
    record(streams, env_ids, rewards, ends, valid, restart=fresh)
    assert_statistics_of(scale, brute_force_returns(stream_episodes(streams), gamma))
    new_episode = episodes_of(streams[0])[-1]
    assert scale.carry[0] == pytest.approx(brute_force_returns([new_episode], gamma)[-1])


def test_batches_without_env_ids_keep_no_state_and_start_every_column_at_zero():
    rng = np.random.default_rng(2)
    gamma, T, B = 0.9, 4, 8
    scale = ReturnScale(gamma)
    episodes = []
    for _ in range(200):
        rewards, ends, valid = random_columns(rng, T, B)
        scale.update(rewards, ends, valid)
        for b in range(B):
            episodes += episodes_of(list(zip(rewards[:, b], ends[:, b], valid[:, b], np.zeros(T, bool))))
    assert len(scale.state_dict()["carry"]) == 0
    assert_statistics_of(scale, brute_force_returns(episodes, gamma))


def normalizing_learner() -> VTraceLearner:
    cfg = build_config("cartpole-appo", {"learner.normalize_returns": True, "learner.reward_scale": 1.0,
                                         "learner.reward_clip": 0.0})
    obs_space = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    return VTraceLearner(cfg, obs_space, gymnasium.spaces.Discrete(2))


def learner_batch(seed: int, reward_unit: float = 1.0, finite: bool = True):
    from tests.unit.learner.test_vtrace_learner import random_batch

    batch = random_batch(T=6, B=4, seed=seed)
    batch.rewards.mul_(reward_unit)
    if not finite:
        batch.rewards[2, 1] = math.nan
    return batch


def record_batch(streams: dict, key, batch, restart=None) -> None:
    """``record`` for a learner batch, each column's env stream named ``(key, env)``."""
    ends = (batch.terminated | batch.truncated).numpy()
    keyed: dict = {}
    record(keyed, range(batch.rewards.shape[1]), batch.rewards.numpy().astype(np.float64), ends,
           batch.valid.numpy(), restart)
    for env, steps in keyed.items():
        streams.setdefault((key, env), []).extend(steps)


def test_a_skipped_non_finite_batch_restarts_the_streams_it_cut():
    learner = normalizing_learner()
    env_ids = np.arange(4)
    streams: dict = {}
    first, skipped, after = learner_batch(1), learner_batch(2, finite=False), learner_batch(3)
    learner.train(first, env_ids=env_ids)
    record_batch(streams, 0, first)
    learner.train(skipped, env_ids=env_ids)
    assert learner.skipped_updates == 1
    learner.train(after, env_ids=env_ids)
    record_batch(streams, 0, after, restart=np.ones(4, bool))  # the skipped steps are missing
    assert_statistics_of(learner.return_scale, brute_force_returns(stream_episodes(streams), learner.lcfg.gamma))
