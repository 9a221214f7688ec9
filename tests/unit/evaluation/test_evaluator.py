"""Evaluation during training (fastrl.evaluation.evaluator): its own envs and counters, the newest
published weights, checkpoints/best.pt, the cadence, and the runner's metrics."""
import json
import re

import numpy as np
import pytest
import torch

from fastrl.cli import train_main
from fastrl.config import ConfigError, build_config
from fastrl.envs import probe_env
from fastrl.evaluation import evaluator as evaluator_module
from fastrl.evaluation.evaluator import OPPONENT_STATS, EvalResults, EvalStats, Evaluator
from fastrl.files.checkpoint import best_checkpoint_path, list_checkpoints, load_checkpoint
from fastrl.ipc.arena import Arena
from fastrl.ipc.weights import WeightBuffer
from fastrl.models.networks import build_model, num_state_values, state_to_flat
from fastrl.run.training import arena_layout
from tests.e2e.test_cli_errors import one_line_error
from tests.support import user_modules

COUNTDOWN = {"env.id": "fastrl.envs.toy:make_countdown", "env.kwargs": {"length": 7}, "device": "cpu",
             "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 2, "env.num_threads": 0,
             "learner.rollout": 8, "learner.batch_size": 64, "model.hidden_sizes": [16],
             "eval.episodes": 6, "eval.num_envs": 4}


def _countdown_setup(tmp_path, **overrides):
    cfg = build_config("cartpole-appo", {**COUNTDOWN, **overrides})
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    arena = Arena(arena_layout(cfg, spec, num_state_values(model)), shared=False)
    arena.weight_version[0] = -1
    return cfg, model, arena


def _publish(arena, model, version: int) -> None:
    flat = torch.empty(num_state_values(model))
    WeightBuffer(arena).publish(state_to_flat(model, flat).numpy(), version)


def test_an_evaluation_plays_its_own_episodes_and_leaves_the_training_counters_alone(tmp_path):
    cfg, model, arena = _countdown_setup(tmp_path)
    evaluator = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    row = EvalResults(arena)
    assert evaluator.evaluate() is None  # nothing published yet
    _publish(arena, model, version=3)
    result = evaluator.evaluate()
    # Countdown(7): every episode is 7 steps of reward 1, whatever the policy does.
    assert result["episodes"] == 6
    assert result["episode_return_mean"] == 7.0 and result["episode_length_mean"] == 7.0
    # Steps played, not steps counted: 4 envs in lockstep play two rounds of 7 steps (envs whose
    # quota of one episode is done keep stepping until the others finish).
    assert result["env_steps_played"] == 4 * 2 * 7
    assert arena.env_steps.sum() == 0 and arena.episode_count.sum() == 0  # not training steps or episodes
    metrics = row.new()
    assert metrics["eval_return_mean"] == 7.0 and metrics["eval_env_steps"] == 56
    assert metrics["eval_weights_version"] == 3 and metrics["eval_episodes"] == 6
    assert row.new() == {}  # each result is reported once
    evaluator.evaluate()
    assert row.new()["eval_env_steps"] == 112  # cumulative over the session


def test_an_evaluator_that_replaces_one_killed_mid_write_reports_its_results(tmp_path):
    cfg, model, arena = _countdown_setup(tmp_path)
    row = EvalResults(arena)
    arena.eval_stats[EvalStats.SEQ] += 1  # the killed evaluator's result, half written
    evaluator = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    assert row.new() == {}  # the half-written result is never read
    _publish(arena, model, version=1)
    evaluator.evaluate()
    assert row.new()["eval_weights_version"] == 1


def _spaces(cfg):
    spec = probe_env(cfg)
    return spec.observation_space, spec.action_space


def test_best_pt_keeps_the_weights_of_the_best_evaluation_only(tmp_path, monkeypatch):
    cfg, model, arena = _countdown_setup(tmp_path)
    scripted = iter([5.0, 3.0, 7.0])
    monkeypatch.setattr(evaluator_module, "evaluate_policy", lambda *a, **k: {
        "episode_return_mean": next(scripted), "episode_return_std": 0.0, "episode_length_mean": 7.0,
        "episodes": 6, "env_steps_played": 42})
    evaluator = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    published = []
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(version))
        _publish(arena, model, version)
        published.append({k: v.clone() for k, v in model.state_dict().items()})
        evaluator.evaluate()
        best = load_checkpoint(best_checkpoint_path(tmp_path))
        expected_version = {1: 1, 2: 1, 3: 3}[version]
        assert best["counters"]["weights_version"] == expected_version
        assert best["eval"]["eval_return_mean"] == {1: 5.0, 2: 5.0, 3: 7.0}[version]
        for key, value in published[expected_version - 1].items():
            assert torch.equal(best["learner"]["model"][key], value)
    assert list_checkpoints(tmp_path) == []  # best.pt is not a rolling checkpoint, never pruned with them
    # A resumed run's evaluator starts from the best so far: a worse result does not replace it.
    monkeypatch.setattr(evaluator_module, "evaluate_policy", lambda *a, **k: {
        "episode_return_mean": 6.0, "episode_return_std": 0.0, "episode_length_mean": 7.0,
        "episodes": 6, "env_steps_played": 42})
    again = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    assert again.best == 7.0
    again.evaluate()
    assert load_checkpoint(best_checkpoint_path(tmp_path))["counters"]["weights_version"] == 3


def test_clips_need_evaluation_on():
    from fastrl.config import ConfigError

    with pytest.raises(ConfigError, match="eval.every_s"):
        build_config("cartpole-appo", {"eval.video_every_s": 30.0})


TIC_TAC_TOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def first_legal_square(observation, agent):
    """A scripted tic-tac-toe opponent for eval.opponents: the first square its action_mask allows."""
    return int(np.flatnonzero(observation["action_mask"])[0])


def test_each_opponent_is_reported_under_its_own_name(tmp_path, monkeypatch):
    opponents = ["random", "tests.unit.evaluation.test_evaluator:first_legal_square", "connect_four_one_ply"]
    played = {"random": {"episodes": 6, "win_rate": 0.5, "draw_rate": 0.0, "loss_rate": 0.5,
                         "episode_return_mean": 0.0},
              opponents[1]: {"episodes": 4, "win_rate": 0.25, "draw_rate": 0.25, "loss_rate": 0.5,
                             "episode_return_mean": -0.25},
              "connect_four_one_ply": {"episodes": 0, "win_rate": None, "draw_rate": None, "loss_rate": None,
                                       "episode_return_mean": None}}
    seen = []

    def against(cfg, model, opponent, episodes, deterministic, device, seed, num_envs, keep_going, seats=()):
        seen.append((opponent, episodes, seed))
        return played[opponent]

    monkeypatch.setattr(evaluator_module, "evaluate_against", against)
    cfg, model, arena = _countdown_setup(tmp_path, **{"eval.opponents": opponents, "eval.every_s": 1.0})
    evaluator = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    results = EvalResults(arena, opponents)
    _publish(arena, model, version=1)
    assert arena.eval_opponent_stats.shape[1] == len(OPPONENT_STATS)  # a column per figure
    assert evaluator.evaluate()["opponents"] == dict(zip(opponents, played.values()))
    assert [(opponent, episodes) for opponent, episodes, _ in seen] == [(o, 6) for o in opponents]
    metrics = results.new()
    for opponent, rates in played.items():
        for key, value in rates.items():
            reported = metrics[f"eval/{opponent}/{key}"]
            assert reported == value if value is not None else np.isnan(reported)
    assert isinstance(metrics["eval/random/episodes"], int)


def test_with_opponents_best_pt_keeps_the_best_score_against_them_not_the_best_return(tmp_path, monkeypatch):
    """Self-play keeps a zero-sum game's return near 0: best.pt follows wins + draws / 2 against
    eval.opponents, averaged over them (an opponent without games left out)."""
    opponents = ["random", "tests.unit.evaluation.test_evaluator:first_legal_square"]
    rounds = iter([
        # (return, {opponent: (win, draw, loss)}): score 0.5, 0.25 (a higher return), 0.9, 0.75 (resumed)
        (0.0, {"random": (0.5, 0.0, 0.5), opponents[1]: (0.25, 0.5, 0.25)}),
        (0.6, {"random": (0.25, 0.0, 0.75), opponents[1]: (0.25, 0.0, 0.75)}),
        (-0.2, {"random": (1.0, 0.0, 0.0), opponents[1]: (0.6, 0.4, 0.0)}),
        (0.0, {"random": (0.75, 0.0, 0.25), opponents[1]: (0.75, 0.0, 0.25)}),
    ])
    current = {}

    def policy(*args, **kwargs):
        current["return"], current["against"] = next(rounds)
        return {"episode_return_mean": current["return"], "episode_return_std": 0.0, "episode_length_mean": 7.0,
                "episodes": 6, "env_steps_played": 42}

    def against(cfg, model, opponent, *args, **kwargs):
        win, draw, loss = current["against"][opponent]
        return {"episodes": 6, "win_rate": win, "draw_rate": draw, "loss_rate": loss, "episode_return_mean": win - loss}

    monkeypatch.setattr(evaluator_module, "evaluate_policy", policy)
    monkeypatch.setattr(evaluator_module, "evaluate_against", against)
    cfg, model, arena = _countdown_setup(tmp_path, **{"eval.opponents": opponents, "eval.every_s": 1.0})
    assert cfg.best_by_opponents  # eval.best_by = auto
    evaluator = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    results = EvalResults(arena, opponents, best_by_opponents=True)
    kept = []
    for version in (1, 2, 3):
        _publish(arena, model, version)
        evaluator.evaluate()
        metrics = results.new()
        best = load_checkpoint(best_checkpoint_path(tmp_path))
        kept.append((best["counters"]["weights_version"], metrics["eval_opponent_score"],
                     metrics["eval_best_opponent_score"]))
        assert "eval_best_return" not in metrics
    assert kept == [(1, 0.5, 0.5), (1, 0.25, 0.5), (3, pytest.approx(0.9), pytest.approx(0.9))]
    assert best["eval"]["best_by"] == "opponents" and best["eval"]["eval_opponent_score"] == pytest.approx(0.9)
    assert best["eval"]["opponents"]["random"]["win_rate"] == 1.0
    # A resumed run's evaluator starts from that score: 0.75 does not replace it.
    again = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    assert again.best == pytest.approx(0.9)
    _publish(arena, model, 4)
    again.evaluate()
    assert load_checkpoint(best_checkpoint_path(tmp_path))["counters"]["weights_version"] == 3
    # Kept by return before, best.pt is replaced by the first evaluation by score.
    by_return = build_config("cartpole-appo", {**COUNTDOWN, "eval.opponents": opponents, "eval.every_s": 1.0,
                                               "eval.best_by": "return"})
    assert not by_return.best_by_opponents
    assert Evaluator(by_return, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo),
                     tmp_path).best == -np.inf


def test_confirm_best_keeps_weights_only_when_a_second_round_on_other_seeds_beats_the_best(tmp_path, monkeypatch):
    """eval.confirm_best: the round that beats best.pt is the luckiest of many, so a second round on
    other seeds decides, and its figure is the one best.pt keeps. The first round is reported."""
    opponents = ["random", "tests.unit.evaluation.test_evaluator:first_legal_square"]
    # Each opponent's win rate, round after round (no draws); a round's score is their mean.
    rounds = iter([0.5, 0.4,  # eval 1: 0.5 beats nothing yet; confirmed at 0.4
                   0.6, 0.3,  # eval 2: 0.6 beats 0.4, the second round does not
                   0.35,  # eval 3: below 0.4, no second round
                   0.9, 0.8])  # eval 4: confirmed at 0.8
    seeds = []

    def against(cfg, model, opponent, episodes, deterministic, device, seed, **kwargs):
        if opponent == "random":
            seeds.append(seed)
            against.win = next(rounds)
        return {"episodes": 6, "win_rate": against.win, "draw_rate": 0.0, "loss_rate": 1 - against.win,
                "episode_return_mean": 2 * against.win - 1}

    monkeypatch.setattr(evaluator_module, "evaluate_policy", lambda *a, **k: {
        "episode_return_mean": 0.0, "episode_return_std": 0.0, "episode_length_mean": 7.0, "episodes": 6,
        "env_steps_played": 42})
    monkeypatch.setattr(evaluator_module, "evaluate_against", against)
    cfg, model, arena = _countdown_setup(tmp_path, **{"eval.opponents": opponents, "eval.every_s": 1.0,
                                                      "eval.confirm_best": True})
    evaluator = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    results = EvalResults(arena, opponents, best_by_opponents=True)
    kept = []
    for version in (1, 2, 3, 4):
        _publish(arena, model, version)
        evaluator.evaluate()
        metrics = results.new()
        best = load_checkpoint(best_checkpoint_path(tmp_path))
        kept.append((metrics["eval_opponent_score"], best["counters"]["weights_version"],
                     metrics["eval_best_opponent_score"], best["eval"]["eval_opponent_score"],
                     best["eval"]["opponents"]["random"]["win_rate"]))
    assert kept == [(0.5, 1, 0.4, 0.4, 0.4), (0.6, 1, 0.4, 0.4, 0.4), (0.35, 1, 0.4, 0.4, 0.4),
                    (0.9, 4, 0.8, 0.8, 0.8)]
    first_rounds = [seeds[0], seeds[2], seeds[4], seeds[5]]
    assert len(seeds) == 7 and len(set(first_rounds)) == 4
    for first, second in ((seeds[0], seeds[1]), (seeds[2], seeds[3]), (seeds[5], seeds[6])):
        assert second == first + evaluator_module.CONFIRM_SEED_OFFSET
    # By return alike: the second round's return decides.
    returns = iter([5.0, 4.0, 6.0, 3.0])
    monkeypatch.setattr(evaluator_module, "evaluate_policy", lambda *a, **k: {
        "episode_return_mean": next(returns), "episode_return_std": 0.0, "episode_length_mean": 7.0,
        "episodes": 6, "env_steps_played": 42})
    run = tmp_path / "by_return"
    cfg, model, arena = _countdown_setup(run, **{"eval.confirm_best": True})
    evaluator = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), run)
    for version in (1, 2):
        _publish(arena, model, version)
        evaluator.evaluate()
    best = load_checkpoint(best_checkpoint_path(run))
    assert (evaluator.best, best["counters"]["weights_version"], best["eval"]["eval_return_mean"]) == (4.0, 1, 4.0)


@pytest.mark.parametrize("overrides, message", [
    ({"eval.best_by": "opponents"}, "eval.best_by=opponents keeps best.pt by the score against eval.opponents, and "
                                    "none are set"),
    ({"eval.best_by": "opponents", "eval.opponents": ["random"], "eval.every_s": 1.0, "pbt.population": 2},
     "cannot rank its members for best.pt: set eval.best_by=return"),
])
def test_best_by_opponents_needs_opponents_and_one_policy(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config("cartpole-appo", {**COUNTDOWN, **overrides})


def test_best_by_auto_ranks_a_population_by_return():
    cfg = build_config("cartpole-appo", {**COUNTDOWN, "eval.opponents": ["random"], "eval.every_s": 1.0,
                                         "pbt.population": 2})
    assert not cfg.best_by_opponents


def plays_without_the_agent(observation):
    return 0


@pytest.mark.parametrize("env_id, kwargs, opponents, message", [
    (TIC_TAC_TOE, "{}", ["nope"], "eval.opponents entry 'nope' is neither a built-in opponent (random, "
                                "connect_four_one_ply, tictactoe_minimax) nor MODULE:CALLABLE"),
    (TIC_TAC_TOE, "{}", ["random", "no_such_module_x:fn"], "eval.opponents entry 'no_such_module_x:fn': cannot "
                                                          "import 'no_such_module_x'"),
    (TIC_TAC_TOE, "{}", ["tests.unit.evaluation.test_evaluator:nothing"], "has no 'nothing'"),
    *((TIC_TAC_TOE, "{}", [f"{module}:fn"], f"eval.opponents entry '{module}:fn': {message}")
      for module, message in user_modules.BROKEN),
    (TIC_TAC_TOE, "{}", ["tests.unit.evaluation.test_evaluator:plays_without_the_agent"],
     "takes (observation), not (observation, agent)"),
    (TIC_TAC_TOE, "{}", ["connect_four_one_ply"], "connect_four_one_ply plays PettingZoo's connect_four_v3"),
    ("fastrl.envs.toy:make_countdown", "{}", ["random"],
     "eval.opponents plays the other seats of a multi-agent game, and 'fastrl.envs.toy:make_countdown' has one "
     "agent: set eval.opponents=[]"),
    ("fastrl.envs.toy:AgreementGames", "{agents = 2}", ["random"],
     "eval.opponents plays PettingZoo games (--env pettingzoo:MODULE), handing the opponent each agent's "
     "observation as the game gives it, and 'fastrl.envs.toy:AgreementGames' is not one: set eval.opponents=[]"),
])
def test_opponents_that_cannot_play_the_run_are_refused_before_it_starts(tmp_path, monkeypatch, capsys, env_id,
                                                                            kwargs, opponents, message):
    user_modules.install(tmp_path, monkeypatch)
    args = ["--env", env_id, "--set", f"env.kwargs={kwargs}", "--serial",
            "--set", "eval.every_s=1", "--set", f"eval.opponents={json.dumps(opponents)}",
            "--set", "env.num_workers=1", "--set", "env.envs_per_worker=8", "--set", "learner.batch_size=64",
            "--run-dir", str(tmp_path / "run"), "--train-for-seconds", "1"]
    one_line_error(capsys, train_main(args), 2, "fastrl-train", message)
    assert not (tmp_path / "run" / "config.toml").exists()  # refused before the run began


@pytest.mark.parametrize("overrides, message", [
    ({"eval.opponents": ["random"]}, "eval.opponents are played in the evaluations during training: set "
                                     "eval.every_s > 0 too"),
    ({"eval.opponents": ["random", "random"], "eval.every_s": 1.0}, "eval.opponents lists an opponent twice"),
    ({"eval.opponents": [f"m:fn{k}" for k in range(9)], "eval.every_s": 1.0},
     "eval.opponents lists 9 opponents and an evaluation plays at most 8: drop some"),
])
def test_eval_opponents_that_cannot_be_reported_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        build_config("cartpole-appo", overrides)
    assert message in str(refused.value) and "\n" not in str(refused.value)
