"""A multi-agent env stepped in numpy (fastrl.envs.toy.AgreementGames), given as ``--env module:Class``
of a VecEnv subclass: its rows against a per-game, per-agent reference, and the rollout keeping
every agent row its own."""
import collections

import numpy as np
import pytest

from fastrl.config import build_config
from fastrl.envs import make_episode_env, make_vec_env, probe_env
from fastrl.envs.toy import AgreementGames
from tests.unit.sampling.test_rollout_worker import run_worker

GAMES = "fastrl.envs.toy:AgreementGames"


class ReferenceGame:
    """One game of AgreementGames as its docstring states it, a loop over the agents: what every
    row of the vectorized games must equal."""

    def __init__(self, g: int, agents: int, length: int, stagger: int, num_actions: int):
        self.g, self.agents, self.num_actions = g, agents, num_actions
        self.lifetimes = [length - k * stagger for k in range(agents)]
        self.resets_next = True

    def step(self, actions: list[int]) -> list[tuple[list[float], float, bool]]:
        """(observation, reward, terminated) of each agent, in agent order."""
        if self.resets_next:
            self.resets_next, self.t = False, 0
            self.left = [False] * self.agents
            self.obs = [[0.0, k, self.g, -1.0, -1.0] for k in range(self.agents)]
            return [(list(obs), 0.0, False) for obs in self.obs]
        playing = [k for k in range(self.agents) if not self.left[k]]
        self.t += 1
        mean = sum(actions[k] for k in playing) / len(playing)
        out = []
        for k in range(self.agents):
            reward = 0.0
            if k in playing:
                reward = 1 - abs(actions[k] - mean) / (self.num_actions - 1)
                self.obs[k] = [self.t, k, self.g, actions[k], mean]
                self.left[k] = self.t == self.lifetimes[k]
            out.append((list(self.obs[k]), reward, self.left[k]))
        self.resets_next = all(self.left)
        return out


@pytest.mark.parametrize("agents,stagger", [(1, 0), (3, 0), (3, 2), (4, 1)])
def test_every_row_is_its_own_agent_of_its_own_game(agents, stagger):
    length, num_actions, games_per_split, splits = 7, 5, 2, 3
    B = agents * games_per_split
    env = make_vec_env(GAMES, B * splits, B, seed=0, env_kwargs={"agents": agents, "length": length,
                                                                 "stagger": stagger, "num_actions": num_actions})
    assert env.agents == (tuple(f"agent_{k}" for k in range(agents)) if agents > 1 else ())
    games = [ReferenceGame(g, agents, length, stagger, num_actions) for g in range(games_per_split * splits)]
    sent = np.zeros(B * splits, np.int64)
    rng = np.random.default_rng(1)
    env.async_reset()
    dones = 0
    for _ in range(splits * 3 * length):
        obs, rewards, terminated, truncated, ids = env.recv()
        assert not truncated.any()
        for i, row in enumerate(ids):
            if row % agents == 0:
                game = games[row // agents]
                expected = game.step(sent[row:row + agents].tolist())
            want_obs, want_reward, want_terminated = expected[row % agents]
            np.testing.assert_allclose(obs[i], want_obs, rtol=1e-6)
            assert rewards[i] == pytest.approx(want_reward, rel=1e-6) and terminated[i] == want_terminated
        dones += int(terminated.sum())
        sent[ids] = rng.integers(0, num_actions, len(ids))
        env.send(sent[ids], ids)
    assert dones > 0
    env.close()


def games_config(**overrides):
    settings = {"env.id": GAMES, "env.kwargs": {"agents": 3, "length": 4, "stagger": 1}, "env.num_workers": 1,
                "env.envs_per_worker": 12, "env.num_splits": 2, "learner.rollout": 5, "learner.batch_size": 60,
                "slots_per_env": 3, "learner.reward_scale": 1.0, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def test_the_rollout_keeps_each_agent_row_its_own_and_counts_its_episodes():
    cfg = games_config()
    arena, full = run_worker(cfg, steps_per_env=10)
    assert sorted(arena.slot_env[full].tolist()) == sorted(list(range(12)) * 2)
    steps = {0: [0, 1, 2, 3, 4, 0], 1: [0, 1, 2, 3, 3, 0], 2: [0, 1, 2, 2, 2, 0]}  # lifetimes 4, 3, 2
    for slot in full[:12]:
        row = int(arena.slot_env[slot])
        obs = arena.obs[slot]  # [T + 1, 5]: t, agent, game, own action, mean action
        np.testing.assert_array_equal(obs[:, 1], row % 3)
        np.testing.assert_array_equal(obs[:, 2], row // 3)
        np.testing.assert_array_equal(obs[:, 0], steps[row % 3])
        lifetime = 4 - row % 3
        # Every step after the one the agent left on, and the game's reset, is invalid.
        np.testing.assert_array_equal(arena.valid[slot], np.arange(5) < lifetime)
        np.testing.assert_array_equal(arena.terminated[slot], (np.arange(5) >= lifetime - 1) & (np.arange(5) < 4))
    # Two games played by each of the 12 agent rows, each agent's episode as long as its lifetime.
    assert arena.episode_count[0] == 24
    assert collections.Counter(arena.episode_length[0, :24].tolist()) == {4: 8, 3: 8, 2: 8}


def test_a_probe_makes_one_game_and_evaluation_whole_games():
    cfg = games_config()
    spec = probe_env(cfg)
    assert spec.observation_space.shape == (5,) and spec.action_space.n == 4
    with make_episode_env(cfg, 7, seed=3) as env:
        assert env.num_envs == env.batch_size == 9  # 3 games of 3 agents hold 7 rows


def test_a_split_that_does_not_hold_whole_games_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"splits of 3 or 6 rows") as err:
        make_vec_env(GAMES, 8, 4, seed=0, env_kwargs={"agents": 3})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"takes no argument 'players'"):
        make_vec_env(GAMES, 6, 6, seed=0, env_kwargs={"players": 3})
    with pytest.raises(ValueError, match=r"every agent playing a step"):
        AgreementGames(6, 6, 0, agents=3, length=4, stagger=2)
