"""envpool's multi-player tasks, every player a row (fastrl/envs/multiagent/envpool_players.py): pgx's board
games as turn-based seats, highway's IntersectionMultiAgent as simultaneous players."""
import envpool
import numpy as np
import pytest

from fastrl.config import build_config
from fastrl.envs import make_episode_env, make_vec_env, probe_env
from fastrl.evaluation.video import record_frames
from fastrl.models.networks import build_model

TIC_TAC_TOE = "TicTacToe-v1"
INTERSECTION = "IntersectionMultiAgent-v1"


def tic_tac_toe_config(**overrides):
    settings = {"env.id": TIC_TAC_TOE, "env.num_workers": 1, "env.envs_per_worker": 16, "env.num_splits": 4,
                "learner.rollout": 6, "learner.batch_size": 48, "slots_per_env": 10, "learner.reward_scale": 1.0,
                "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def test_intersection_players_are_rows_whose_trajectories_hold_their_own_observations():
    """Brute force: each row equals its game's player in a pool stepped with the same actions."""
    num_envs, batch_size, players, games_per_split = 8, 4, 2, 2
    env = make_vec_env(INTERSECTION, num_envs=num_envs, batch_size=batch_size, seed=3)
    pools = [envpool.make(INTERSECTION, env_type="gymnasium", num_envs=games_per_split, batch_size=games_per_split,
                          seed=3 + games_per_split * s) for s in range(2)]
    assert env.agents == ("player_0", "player_1") and env.batches_in_flight == 2

    def in_game_order(obs, rewards, done, info):  # the pool's players, game 0's first
        order = np.argsort(info["players"]["env_id"], kind="stable")
        return obs[order], rewards[order], np.repeat(done[np.argsort(info["env_id"])], players)

    reference = {}
    for s, pool in enumerate(pools):
        obs, info = pool.reset()
        reference[s] = in_game_order(obs, np.zeros(batch_size), np.zeros(games_per_split, bool), info)
    rng = np.random.default_rng(0)
    env.async_reset()
    ends = 0
    for _ in range(40):
        obs, rewards, terminated, truncated, rows = env.recv()
        split = int(rows[0]) // batch_size
        local = rows - split * batch_size
        assert sorted(local.tolist()) == list(range(batch_size))
        ref_obs, ref_rewards, ref_done = reference[split]
        np.testing.assert_array_equal(obs, ref_obs[local])
        np.testing.assert_array_equal(rewards, ref_rewards[local])
        np.testing.assert_array_equal(terminated | truncated, ref_done[local])
        ends += int(ref_done.sum())
        actions = rng.integers(0, 3, batch_size)
        env.send(actions, rows)
        game_actions = np.empty(batch_size, np.int32)
        game_actions[local] = actions
        ref_obs, ref_rewards, ref_terminated, ref_truncated, info = pools[split].step(
            game_actions, np.arange(games_per_split))
        reference[split] = in_game_order(ref_obs, ref_rewards, ref_terminated | ref_truncated, info)
    env.close()
    for pool in pools:
        pool.close()
    assert ends > 0


def test_intersection_in_async_mode_returns_whole_games():
    env = make_vec_env(INTERSECTION, num_envs=8, batch_size=4, seed=0, async_mode=True)
    env.async_reset()
    seen = set()
    for _ in range(20):
        obs, rewards, terminated, truncated, rows = env.recv()
        games = rows.reshape(-1, 2)  # each game's two players, consecutive, with its game's flags
        np.testing.assert_array_equal(games % 2, [[0, 1]] * 2)
        np.testing.assert_array_equal(games[:, 0] // 2, games[:, 1] // 2)
        np.testing.assert_array_equal(terminated.reshape(-1, 2)[:, 0], terminated.reshape(-1, 2)[:, 1])
        assert obs.shape == (4, 5, 5)
        seen.update(rows.tolist())
        env.send(np.zeros(4, np.int64), rows)
    env.close()
    assert seen == set(range(8))


@pytest.mark.parametrize("env_id, splits, message", [
    (TIC_TAC_TOE, 3, r"'TicTacToe-v1' is a turn-based game of 2 seats: .* env.num_splits \(3\) must be a multiple "
                     r"of 2"),
    (INTERSECTION, 4, r"each game is 2 rows .* make env.envs_per_worker a multiple of 2 x env.num_splits"),
], ids=["turns", "simultaneous"])
def test_layouts_that_split_games_are_refused_in_one_line(env_id, splits, message):
    cfg = tic_tac_toe_config(**{"env.id": env_id, "env.envs_per_worker": 12, "env.num_splits": splits})
    with pytest.raises(ValueError, match=message) as error:
        probe_env(cfg)
    assert "\n" not in str(error.value)


def test_evaluation_plays_the_fewest_whole_games():
    env = make_episode_env(tic_tac_toe_config(), 3, seed=0)  # 2 games: 4 seats, a row of each game a batch
    assert (env.num_envs, env.batch_size) == (4, 2)
    env.close()
    env = make_episode_env(tic_tac_toe_config(**{"env.id": INTERSECTION}), 3, seed=0)
    assert (env.num_envs, env.batch_size) == (4, 4)
    env.close()


def test_a_video_shows_every_turn_and_final_step_of_one_game():
    cfg = tic_tac_toe_config()
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    frames, result = record_frames(cfg, model, episodes=2)  # one game: an episode per seat
    assert result["episodes"] == 2 and frames.dtype == np.uint8 and frames.shape[1:] == (192, 192, 3)
    assert len(frames) == 2 * result["episode_length_mean"] + 2 and frames.std() > 0
