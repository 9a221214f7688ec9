"""env.actions: the policy chooses among some of a Discrete env's actions (fastrl/envs/wrappers/action_subset.py)."""
import numpy as np
import pytest

from fastrl.config import build_config
from fastrl.envs import make_episode_env, make_vec_env, probe_env
from fastrl.evaluation.video import open_rendered_env

# Discrete(3, start=-1); the observation is a target in the same space, the reward 1 when the
# action the env receives equals it (and IllegalAction on a value outside the space).
STRICT = "tests.support.space_envs:make_strict_space_env"


def test_each_chosen_action_reaches_the_env_as_the_action_it_names():
    subset = [1, -1]  # the env's own values, out of order and skipping 0
    rng = np.random.default_rng(0)
    with make_vec_env(STRICT, num_envs=64, batch_size=64, seed=0, env_kwargs={"length": 100},
                      actions=subset) as env:
        assert env.action_space.n == 2
        env.async_reset()
        targets, _, _, _, ids = env.recv()
        matched = 0
        for _ in range(16):
            stored = rng.integers(0, 2, len(ids))
            env.send(stored, ids)
            expected = (np.asarray(subset)[stored] == targets).astype(np.float32)
            targets, rewards, _, _, ids = env.recv()
            np.testing.assert_array_equal(rewards, expected)
            matched += int(expected.sum())
        assert 0 < matched < 16 * 64  # both outcomes seen: the mapping, not luck, decided them


def test_every_way_a_run_makes_envs_chooses_among_the_same_actions():
    cfg = build_config(overrides={"env.id": STRICT, "env.actions": [0, 1]})
    assert probe_env(cfg).action_space.n == 2
    with make_episode_env(cfg, 4, seed=0) as env:
        assert env.action_space.n == 2
    video_cfg = build_config(overrides={"env.id": "fastrl.envs.toy:make_painted_countdown", "env.actions": [1]})
    env, render = open_rendered_env(video_cfg, seed=0)
    with env:
        assert env.action_space.n == 1 and render is not None


@pytest.mark.parametrize("actions, says", [
    ([0, 2], r"names \[2\], outside the env's actions -1\.\.1"),
    ([0, 0], "names an action twice"),
])
def test_a_bad_subset_is_refused_in_one_line(actions, says):
    with pytest.raises(ValueError, match=says) as info:
        make_vec_env(STRICT, num_envs=2, batch_size=2, seed=0, actions=actions)
    assert "\n" not in str(info.value)


def test_a_subset_of_a_space_that_is_not_discrete_is_refused():
    with pytest.raises(ValueError, match=r"Discrete space's actions.*set env.actions = \[\]"):
        make_vec_env("Pendulum-v1", num_envs=2, batch_size=2, seed=0, actions=[0])


def test_a_pettingzoo_game_is_evaluated_with_the_actions_it_trains_with():
    cfg = build_config(overrides={"env.id": "pettingzoo:tests.support.pettingzoo_envs", "env.actions": [2, 0]})
    with make_episode_env(cfg, 2, seed=0) as env:
        assert env.action_space.n == 2 and len(env.agents) > 1


def test_an_opponent_is_refused_beside_a_subset_of_actions():
    from fastrl.config import ConfigError
    from fastrl.evaluation.episodes import evaluate_against

    settings = {"env.id": "pettingzoo:tests.support.pettingzoo_envs", "env.actions": [0, 1], "eval.every_s": 10.0}
    with pytest.raises(ConfigError, match=r"^eval.opponents plays the game's own actions.*set env.actions = \[\]"):
        build_config(overrides={**settings, "eval.opponents": ["random"]})
    with pytest.raises(ConfigError, match=r"^--opponent plays the game's own actions"):
        evaluate_against(build_config(overrides=settings), None, "random", episodes=1)
