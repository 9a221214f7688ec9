"""Atari's game score beside the learner's episodes (fastrl.envs.game_return): the running totals
on scripted batches, the key Config records under episodic_life, and both Atari backends on
Breakout, where a game is five lives."""
import numpy as np
import pytest

from fastrl.config import build_config
from fastrl.envs import make_vec_env
from fastrl.envs.game_return import GAME_RETURN_KEY, GameReturns

MASK = "_" + GAME_RETURN_KEY


def test_a_game_sums_its_lives_raw_rewards_and_reports_at_its_end_only():
    games = GameReturns(3)
    ids = np.array([2, 0])
    # Env 2 scores 4 (raw) over two steps whose clipped rewards the learner would see as 1 each.
    info = games.batch_info(ids, np.array([4.0, 1.0]), np.array([0, 0]), np.array([False, False]))
    assert not info[MASK].any() and np.isnan(info[GAME_RETURN_KEY]).all()
    info = games.batch_info(ids, np.array([3.0, 0.0]), np.array([1, 0]), np.array([False, False]))
    assert info[MASK].tolist() == [True, False] and info[GAME_RETURN_KEY][0] == 7.0
    assert np.isnan(info[GAME_RETURN_KEY][1])
    # The next game of env 2 starts from zero; env 0's time limit ends its game too; env 1 untouched.
    info = games.batch_info(np.array([0, 2]), np.array([2.0, 5.0]), np.array([0, 0]), np.array([True, False]))
    assert info[MASK].tolist() == [True, False] and info[GAME_RETURN_KEY][0] == 3.0
    assert games.totals.tolist() == [0.0, 0.0, 5.0]


def test_episodic_life_records_the_game_score_with_every_episode():
    assert build_config("atari-appo-cpu").info_keys == ()
    lives = build_config("atari-appo-cpu", {"env.kwargs": {"episodic_life": True}, "env.info_keys": ["lives"]})
    assert lives.info_keys == ("lives", GAME_RETURN_KEY)


@pytest.mark.parametrize("env_id,async_mode", [("Breakout-v5", False), ("Breakout-v5", True),
                                               ("ALE/Breakout-v5", False)])
def test_both_atari_backends_end_a_game_after_its_last_life_with_its_whole_score(env_id, async_mode):
    if env_id.startswith("ALE/"):
        pytest.importorskip("cv2", reason="Atari on gymnasium needs opencv-python-headless")
    rng = np.random.default_rng(0)
    with make_vec_env(env_id, 4, 2, seed=3, async_mode=async_mode, env_kwargs={"episodic_life": True}) as env:
        running = np.zeros(env.num_envs)  # each env's rewards since its last game ended
        lives_ended = games_ended = 0
        env.async_reset()
        for _ in range(1200):
            _, rewards, terminated, truncated, ids = env.recv()
            running[ids] += rewards
            info = env.last_info
            ended = np.asarray(info.get(MASK, np.zeros(len(ids), dtype=bool)), dtype=bool)
            assert not (ended & ~(terminated | truncated)).any()  # a game ends only with an episode
            for row in np.flatnonzero(ended):
                assert info[GAME_RETURN_KEY][row] == running[ids[row]]
                running[ids[row]] = 0.0
            games_ended += int(ended.sum())
            lives_ended += int((terminated & ~ended).sum())
            env.send(rng.integers(env.action_space.n, size=len(ids)), ids)
    # Breakout's five lives: a lost life ends an episode and the game goes on.
    assert games_ended >= 2 and lives_ended >= 4 * games_ended


@pytest.mark.parametrize("episodic_life", [True, False])
def test_an_evaluation_under_episodic_life_counts_whole_games_at_their_score(episodic_life):
    from fastrl.envs import probe_env
    from fastrl.evaluation.episodes import evaluate_policy
    from fastrl.models.networks import build_model
    cfg = build_config("cartpole-appo", {"env.id": "tests.support.info_envs:Lives", "device": "cpu",
                                         "env.kwargs": {"lives": 3, "life_length": 4, "episodic_life": episodic_life}})
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    result = evaluate_policy(cfg, model, episodes=4, num_envs=2)
    # A game: 3 lives of 4 steps, its score 10 a step. Without episodic_life a game is one episode
    # and its return the rewards'; with it, the evaluation joins the lives and reads the score.
    assert result["episodes"] == 4 and result["episode_length_mean"] == 12
    assert result["episode_return_mean"] == (120.0 if episodic_life else 12.0)


def test_an_env_that_takes_episodic_life_but_reports_no_games_is_refused_not_evaluated_forever(monkeypatch):
    from fastrl.config import ConfigError
    from fastrl.envs import probe_env
    from fastrl.evaluation import episodes
    from fastrl.models.networks import build_model
    monkeypatch.setattr(episodes, "MAX_LIVES_PER_GAME", 5)
    monkeypatch.setattr(episodes, "game_ends", lambda info, rows: np.zeros(rows, dtype=bool))
    cfg = build_config("cartpole-appo", {"env.id": "tests.support.info_envs:Lives", "device": "cpu",
                                         "env.kwargs": {"lives": 3, "life_length": 2, "episodic_life": True}})
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    with pytest.raises(ConfigError, match="ended 5 episodes without a game's end"):
        episodes.evaluate_policy(cfg, model, episodes=2, num_envs=1)
