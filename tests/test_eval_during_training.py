"""Evaluation during training (fastrl.evaluation.evaluator): its own envs and counters, the newest
published weights, checkpoints/best.pt, the cadence, and the runner's metrics."""
import errno
import json
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from fastrl.cli import train_main
from fastrl.config import ConfigError, build_config
from fastrl.envs import probe_env
from fastrl.evaluation import evaluator as evaluator_module
from fastrl.evaluation.evaluator import EvalResults, EvalStats, Evaluator
from fastrl.files.checkpoint import BEST_CHECKPOINT, best_checkpoint_path, list_checkpoints, load_checkpoint
from fastrl.ipc.arena import Arena, WeightBuffer
from fastrl.models.networks import build_model, num_state_values, state_to_flat
from fastrl.run import supervisor as supervisor_module
from fastrl.run.training import arena_layout, train
from tests import user_modules
from tests.test_cli_errors import one_line_error
from tests.test_reliability import metrics

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


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("serial", [False, True])
def test_a_run_reports_evaluations_at_its_cadence_and_best_pt_matches_them(tmp_path, serial):
    # A step budget, not a time budget: on a loaded machine start-up can take most of a short one.
    cfg = build_config("cartpole-appo", {"device": "cpu", "train_for_env_steps": 800_000, "train_for_seconds": 0.0,
                                         "report_every_s": 0.5, "eval.every_s": 0.75, "eval.episodes": 4,
                                         "serial": serial, "env.num_workers": 1, "env.envs_per_worker": 64,
                                         "learner.batch_size": 1024})
    run_dir = tmp_path / "run"
    train(cfg, run_dir=run_dir, quiet=True)
    rows = _rows(run_dir)
    evaluated = [r for r in rows if "eval_return_mean" in r]
    # Serial mode with the numpy policy trains this budget in about 8 s here, the processes (acting in the
    # workers) in a few: a 0.75 s cadence still gives several.
    assert 2 <= len(evaluated) <= rows[-1]["trained_seconds"] / 0.75 + 1
    # Weights only move forward; the evaluation's env steps only grow and are not in env_steps.
    versions = [r["eval_weights_version"] for r in evaluated]
    assert versions == sorted(versions)
    played = [r["eval_env_steps"] for r in evaluated]
    assert played == sorted(played) and played[0] > 0
    assert all(r["eval_episodes"] == 4 for r in evaluated)
    assert all(r["eval_at_env_steps"] <= r["env_steps"] for r in evaluated)
    # best.pt holds the weights of the best evaluation reported.
    best_row = max(evaluated, key=lambda r: r["eval_return_mean"])
    best = load_checkpoint(best_checkpoint_path(run_dir))
    assert best["eval"]["eval_return_mean"] == pytest.approx(best_row["eval_return_mean"])
    assert evaluated[-1]["eval_best_return"] == pytest.approx(best_row["eval_return_mean"])
    if not serial:
        pids = json.loads((run_dir / "processes.json").read_text())
        assert len(pids["evaluator"]) == 1
        (evaluator_pid,) = pids["evaluator"]
        assert not psutil.pid_exists(evaluator_pid) or psutil.Process(evaluator_pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_clips_of_evaluations_land_in_the_run_dir_and_the_metrics_name_them(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    cfg = build_config("cartpole-appo", {
        "env.id": "fastrl.envs.toy:make_painted_countdown", "env.kwargs": {"length": 6}, "device": "cpu",
        "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 2, "env.num_threads": 0,
        "learner.rollout": 8, "learner.batch_size": 64, "model.hidden_sizes": [16], "serial": True,
        # 7 s for clips every 1.5 s: in a loaded full-suite run (2026-11-25) 4 s gave one clip only.
        "train_for_env_steps": 0, "train_for_seconds": 7.0, "report_every_s": 0.5,
        "eval.every_s": 0.5, "eval.episodes": 2, "eval.video_every_s": 1.5})
    run_dir = tmp_path / "run"
    train(cfg, run_dir=run_dir, quiet=True)
    named = [r["eval_video"] for r in _rows(run_dir) if "eval_video" in r]
    assert len(named) >= 2 and len(set(named)) == len(named)
    for name in named:
        clip = run_dir / name
        assert clip.stat().st_size > 0 and clip.read_bytes()[4:8] == b"ftyp"  # an MP4 container
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == sorted(n.split("/")[1] for n in named)


def test_clips_need_evaluation_on():
    from fastrl.config import ConfigError

    with pytest.raises(ConfigError, match="eval.every_s"):
        build_config("cartpole-appo", {"eval.video_every_s": 30.0})


def _notices(run_dir, text):
    return [line for line in (run_dir / "train.log").read_text().splitlines() if text in line]


def _evaluated_after(rows, predicate):
    """Whether a report after the first one that satisfies ``predicate`` brings an evaluation."""
    first = next((i for i, r in enumerate(rows) if predicate(r)), len(rows))
    return any("eval_return_mean" in r for r in rows[first + 1:])


@pytest.mark.slow
def test_a_killed_evaluator_is_restarted_and_the_run_finishes(tmp_path):
    cfg = build_config("cartpole-appo", {**COUNTDOWN, "report_every_s": 0.5, "eval.every_s": 0.5,
                                         "train_for_env_steps": 0, "train_for_seconds": 240.0})
    victims = []

    def kill_then_stop_after_the_replacement_evaluated(report):
        """The evaluator is killed at the first report with an evaluation; the run stops once a
        report after its restart brings one (the budget is a safety net: on a loaded machine a
        process takes seconds to start)."""
        if not victims and "eval_return_mean" in report:
            (victim,) = json.loads((tmp_path / "processes.json").read_text())["evaluator"]
            os.kill(victim, signal.SIGKILL)
            victims.append(victim)
        return _evaluated_after(metrics(tmp_path), lambda r: r["evaluator_restarts"] == 1)

    result = train(cfg, run_dir=tmp_path, quiet=True, stop_when=kill_then_stop_after_the_replacement_evaluated)
    (victim,) = victims
    assert _evaluated_after(result.reports, lambda r: r["evaluator_restarts"] == 1)
    assert result.final["evaluator_restarts"] == 1 and metrics(tmp_path)[-1]["evaluator_restarts"] == 1
    (replacement,) = json.loads((tmp_path / "processes.json").read_text())["evaluator"]
    assert replacement != victim
    [notice] = _notices(tmp_path, "fastrl-evaluator")
    assert f"(pid {victim}) was killed by SIGKILL; restarted as pid {replacement} (restart 1 of 3)" in notice


@pytest.mark.slow
def test_an_env_that_fails_only_in_evaluation_does_not_stop_training(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor_module, "EVALUATOR_MAX_RESTARTS", 1)
    cfg = build_config("cartpole-appo", {**COUNTDOWN, "env.id": "tests.fault_envs:make_raises_in",
                                         "env.kwargs": {"process": "fastrl-evaluator", "length": 7},
                                         "train_for_env_steps": 0, "train_for_seconds": 300.0, "report_every_s": 0.5,
                                         "eval.every_s": 0.5})
    run_dir = tmp_path / "run"
    given_up = "training goes on without evaluation"

    def reports_after_giving_up():
        log = run_dir / "train.log"
        return log.exists() and given_up in log.read_text() and len(metrics(run_dir)) >= 3 and \
            metrics(run_dir)[-3].get("evaluator_restarts") == 1 and metrics(run_dir)[-3]["env_steps"] > 0

    # Ctrl-C once the run has trained on after giving the evaluator up (the budget is a safety net).
    stopper = threading.Thread(target=_interrupt_when, args=(reports_after_giving_up, 240), daemon=True)
    stopper.start()
    result = train(cfg, run_dir=run_dir, quiet=True)
    stopper.join()
    assert result.final["evaluator_restarts"] == 1
    assert result.final["env_steps"] > result.reports[-3]["env_steps"]  # training went on
    failed = "failed (RuntimeError: injected fault: RaisesAtEnv step 1)"
    [restarted] = _notices(run_dir, "restarted as pid")
    [gave_up] = _notices(run_dir, given_up)
    assert failed in restarted and "(restart 1 of 1)" in restarted
    assert failed in gave_up and "after 1 restarts" in gave_up
    assert json.loads((run_dir / "processes.json").read_text())["evaluator"] == []
    assert not any("eval_return_mean" in r for r in result.reports)


def _as_the_evaluator_process(evaluate):
    """Evaluator.evaluate run under the evaluator process's name: tests.fault_envs.make_raises_in
    then fails in the serial run's evaluation only, as it does in the parallel run's evaluator."""
    def evaluate_as_the_evaluator(self):
        process = multiprocessing.current_process()
        name, process.name = process.name, "fastrl-evaluator"
        try:
            return evaluate(self)
        finally:
            process.name = name
    return evaluate_as_the_evaluator


def _no_space_for_best_pt(mkstemp):
    def mkstemp_unless_best(*args, prefix="", **kwargs):
        if prefix.startswith(f".{Path(BEST_CHECKPOINT).stem}."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return mkstemp(*args, prefix=prefix, **kwargs)
    return mkstemp_unless_best


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["an env that fails only in evaluation", "no space for best.pt"])
def test_a_serial_run_restarts_a_failing_evaluator_then_trains_on_without_it(tmp_path, monkeypatch, fault):
    overrides = {**COUNTDOWN, "serial": True, "train_for_env_steps": 0, "train_for_seconds": 4.0,
                 "report_every_s": 0.5, "eval.every_s": 0.2}
    if fault == "no space for best.pt":
        monkeypatch.setattr(tempfile, "mkstemp", _no_space_for_best_pt(tempfile.mkstemp))
        failed = "failed (cannot write checkpoint"
    else:
        overrides.update({"env.id": "tests.fault_envs:make_raises_in",
                          "env.kwargs": {"process": "fastrl-evaluator", "length": 7}})
        monkeypatch.setattr(Evaluator, "evaluate", _as_the_evaluator_process(Evaluator.evaluate))
        failed = "failed (RuntimeError: injected fault: RaisesAtEnv step 1)"
    run_dir = tmp_path / "run"
    result = train(build_config("cartpole-appo", overrides), run_dir=run_dir, quiet=True)
    assert result.final["trained_seconds"] >= 4.0 and result.final["env_steps"] > 0
    limit = evaluator_module.MAX_RESTARTS
    assert result.final["evaluator_restarts"] == limit
    restarted = _notices(run_dir, "restarted as a new evaluator with new envs")
    assert len(restarted) == limit and all(failed in line for line in restarted)
    assert [f"(restart {n} of {limit})" in line for n, line in enumerate(restarted, 1)] == [True] * limit
    [gave_up] = _notices(run_dir, "training goes on without evaluation")
    assert failed in gave_up and f"after {limit} restarts" in gave_up
    # Training went on after the evaluator was given up: reports came after its last restart.
    given_up_at = next(i for i, r in enumerate(result.reports) if r["evaluator_restarts"] == limit)
    assert result.final["env_steps"] > result.reports[given_up_at]["env_steps"]
    assert not any("eval_return_mean" in r for r in result.reports)


def _interrupt_when(predicate, timeout: float) -> None:
    """Send this process SIGINT (as Ctrl-C) once ``predicate()`` holds, or after ``timeout``."""
    deadline = time.time() + timeout
    while not predicate() and time.time() < deadline:
        time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGINT)


TIC_TAC_TOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def first_legal_square(observation, agent):
    """A scripted tic-tac-toe opponent for eval.opponents: the first square its action_mask allows."""
    return int(np.flatnonzero(observation["action_mask"])[0])


def _tic_tac_toe(**overrides):
    return build_config("cartpole-appo", {
        "env.id": TIC_TAC_TOE, "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 2,
        "learner.rollout": 8, "learner.batch_size": 32, "train_for_env_steps": 1500, "report_every_s": 0.3,
        "serial": True, "inference.in_workers": False, "device": "cpu", "model.hidden_sizes": [16],
        "eval.every_s": 0.1, "eval.episodes": 6, "eval.num_envs": 4, **overrides})


def test_a_serial_run_plays_each_of_eval_opponents_at_every_evaluation(tmp_path):
    opponents = ["random", "tests.test_eval_during_training:first_legal_square"]
    train(_tic_tac_toe(**{"eval.opponents": opponents}), run_dir=tmp_path / "run", quiet=True)
    evaluated = [r for r in _rows(tmp_path / "run") if "eval_return_mean" in r]
    assert evaluated
    for row in evaluated:
        for opponent in opponents:
            rates = [row[f"eval/{opponent}/{key}"] for key in ("win_rate", "draw_rate", "loss_rate")]
            assert all(0.0 <= rate <= 1.0 for rate in rates) and sum(rates) == pytest.approx(1.0)
            assert row[f"eval/{opponent}/episodes"] == 6  # eval.episodes, every seat in turn
    unevaluated = [r for r in _rows(tmp_path / "run") if "eval_return_mean" not in r]
    assert not [key for row in unevaluated for key in row if key.startswith("eval/")]  # each result once


def test_each_opponent_is_reported_under_its_own_name(tmp_path, monkeypatch):
    opponents = ["random", "tests.test_eval_during_training:first_legal_square", "connect_four_one_ply"]
    played = {"random": {"episodes": 6, "win_rate": 0.5, "draw_rate": 0.0, "loss_rate": 0.5},
              opponents[1]: {"episodes": 4, "win_rate": 0.25, "draw_rate": 0.25, "loss_rate": 0.5},
              "connect_four_one_ply": {"episodes": 0, "win_rate": None, "draw_rate": None, "loss_rate": None}}
    seen = []

    def against(cfg, model, opponent, episodes, deterministic, device, seed, num_envs, keep_going):
        seen.append((opponent, episodes, seed))
        return played[opponent]

    monkeypatch.setattr(evaluator_module, "evaluate_against", against)
    cfg, model, arena = _countdown_setup(tmp_path, **{"eval.opponents": opponents, "eval.every_s": 1.0})
    evaluator = Evaluator(cfg, arena, build_model(*_spaces(cfg), cfg.model, algo=cfg.learner.algo), tmp_path)
    results = EvalResults(arena, opponents)
    _publish(arena, model, version=1)
    assert evaluator.evaluate()["opponents"] == dict(zip(opponents, played.values()))
    assert [(opponent, episodes) for opponent, episodes, _ in seen] == [(o, 6) for o in opponents]
    metrics = results.new()
    for opponent, rates in played.items():
        for key, value in rates.items():
            reported = metrics[f"eval/{opponent}/{key}"]
            assert reported == value if value is not None else np.isnan(reported)
    assert isinstance(metrics["eval/random/episodes"], int)


def plays_without_the_agent(observation):
    return 0


@pytest.mark.parametrize("env_id, kwargs, opponents, message", [
    (TIC_TAC_TOE, "{}", ["nope"], "eval.opponents entry 'nope' is neither a built-in opponent (random, "
                                "connect_four_one_ply, tictactoe_minimax) nor MODULE:CALLABLE"),
    (TIC_TAC_TOE, "{}", ["random", "no_such_module_x:fn"], "eval.opponents entry 'no_such_module_x:fn': cannot "
                                                          "import 'no_such_module_x'"),
    (TIC_TAC_TOE, "{}", ["tests.test_eval_during_training:nothing"], "has no 'nothing'"),
    *((TIC_TAC_TOE, "{}", [f"{module}:fn"], f"eval.opponents entry '{module}:fn': {message}")
      for module, message in user_modules.BROKEN),
    (TIC_TAC_TOE, "{}", ["tests.test_eval_during_training:plays_without_the_agent"],
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
