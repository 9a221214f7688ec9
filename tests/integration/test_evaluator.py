"""The tests of tests/unit/evaluation/test_evaluator.py's subject that train in this process."""
import errno
import json
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from fastrl.config import build_config
from fastrl.evaluation import evaluator as evaluator_module
from fastrl.evaluation.evaluator import Evaluator
from fastrl.files.checkpoint import BEST_CHECKPOINT, best_checkpoint_path, load_checkpoint
from fastrl.run import supervisor as supervisor_module
from fastrl.run.training import train
from tests.support.training import read_metrics
from tests.unit.evaluation.test_evaluator import COUNTDOWN, TIC_TAC_TOE


@pytest.mark.parametrize("serial", [False, True])
def test_a_run_reports_evaluations_at_its_cadence_and_best_pt_matches_them(tmp_path, serial):
    # A step budget, not a time budget: on a loaded machine start-up can take most of a short one.
    cfg = build_config("cartpole-appo", {"device": "cpu", "train_for_env_steps": 800_000, "train_for_seconds": 0.0,
                                         "report_every_s": 0.5, "eval.every_s": 0.75, "eval.episodes": 4,
                                         "serial": serial, "env.num_workers": 1, "env.envs_per_worker": 64,
                                         "learner.batch_size": 1024,
                                         **({"report_every_env_steps": 50_000} if serial else {})})
    run_dir = tmp_path / "run"
    train(cfg, run_dir=run_dir, quiet=True)
    rows = read_metrics(run_dir)
    evaluated = [r for r in rows if "eval_return_mean" in r]
    if serial:
        # In line at every round(eval.every_s / report_every_s) = 2nd report, whatever the clock.
        numbers = [k for k, r in enumerate(rows, start=1) if "eval_return_mean" in r]
        assert numbers[:3] == [2, 4, 6] and all(k % 2 == 0 for k in numbers)
    else:
        # The processes (acting in the workers) train this budget in a few seconds: a 0.75 s
        # cadence still gives several.
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
    named = [r["eval_video"] for r in read_metrics(run_dir) if "eval_video" in r]
    assert len(named) >= 2 and len(set(named)) == len(named)
    for name in named:
        clip = run_dir / name
        assert clip.stat().st_size > 0 and clip.read_bytes()[4:8] == b"ftyp"  # an MP4 container
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == sorted(n.split("/")[1] for n in named)

def _notices(run_dir, text):
    return [line for line in (run_dir / "train.log").read_text().splitlines() if text in line]

def _evaluated_after(rows, predicate):
    """Whether a report after the first one that satisfies ``predicate`` brings an evaluation."""
    first = next((i for i, r in enumerate(rows) if predicate(r)), len(rows))
    return any("eval_return_mean" in r for r in rows[first + 1:])

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
        return _evaluated_after(read_metrics(tmp_path), lambda r: r["evaluator_restarts"] == 1)

    result = train(cfg, run_dir=tmp_path, quiet=True, stop_when=kill_then_stop_after_the_replacement_evaluated)
    (victim,) = victims
    assert _evaluated_after(result.reports, lambda r: r["evaluator_restarts"] == 1)
    assert result.final["evaluator_restarts"] == 1 and read_metrics(tmp_path)[-1]["evaluator_restarts"] == 1
    (replacement,) = json.loads((tmp_path / "processes.json").read_text())["evaluator"]
    assert replacement != victim
    [notice] = _notices(tmp_path, "fastrl-evaluator")
    assert f"(pid {victim}) was killed by SIGKILL; restarted as pid {replacement} (restart 1 of 3)" in notice

def test_an_env_that_fails_only_in_evaluation_does_not_stop_training(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor_module, "EVALUATOR_MAX_RESTARTS", 1)
    cfg = build_config("cartpole-appo", {**COUNTDOWN, "env.id": "tests.support.fault_envs:make_raises_in",
                                         "env.kwargs": {"process": "fastrl-evaluator", "length": 7},
                                         "train_for_env_steps": 0, "train_for_seconds": 300.0, "report_every_s": 0.5,
                                         "eval.every_s": 0.5})
    run_dir = tmp_path / "run"
    given_up = "training goes on without evaluation"

    given_up_at = {}  # env steps of the first report after giving up

    def reports_after_giving_up():
        log = run_dir / "train.log"
        records = read_metrics(run_dir) if log.exists() and given_up in log.read_text() else []
        if not records or records[-1].get("evaluator_restarts") != 1:
            return False
        # On a loaded machine a new xdist worker may still be compiling: wait for env steps after it.
        return records[-1]["env_steps"] > given_up_at.setdefault("env_steps", records[-1]["env_steps"])

    # Ctrl-C once the run has trained on after giving the evaluator up (the budget is a safety net).
    stopper = threading.Thread(target=_interrupt_when, args=(reports_after_giving_up, 240), daemon=True)
    stopper.start()
    result = train(cfg, run_dir=run_dir, quiet=True)
    stopper.join()
    assert result.final["evaluator_restarts"] == 1
    assert result.final["env_steps"] > given_up_at["env_steps"]  # training went on
    failed = "failed (RuntimeError: injected fault: RaisesAtEnv step 1)"
    [restarted] = _notices(run_dir, "restarted as pid")
    [gave_up] = _notices(run_dir, given_up)
    assert failed in restarted and "(restart 1 of 1)" in restarted
    assert failed in gave_up and "after 1 restarts" in gave_up
    assert json.loads((run_dir / "processes.json").read_text())["evaluator"] == []
    assert not any("eval_return_mean" in r for r in result.reports)

def _as_the_evaluator_process(evaluate):
    """Evaluator.evaluate run under the evaluator process's name: tests.support.fault_envs.make_raises_in
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

@pytest.mark.parametrize("fault", ["an env that fails only in evaluation", "no space for best.pt"])
def test_a_serial_run_restarts_a_failing_evaluator_then_trains_on_without_it(tmp_path, monkeypatch, fault):
    # A step budget, not a clock: a loaded machine once spent a 4 s budget before the first step.
    # A serial run reports every 10 batches (640 env steps) and evaluates at each report here, so
    # the evaluator is given up at the 4th report and 6 reports follow.
    overrides = {**COUNTDOWN, "serial": True, "train_for_env_steps": 6_400, "report_every_s": 0.5,
                 "eval.every_s": 0.2}
    if fault == "no space for best.pt":
        monkeypatch.setattr(tempfile, "mkstemp", _no_space_for_best_pt(tempfile.mkstemp))
        failed = "failed (cannot write checkpoint"
    else:
        overrides.update({"env.id": "tests.support.fault_envs:make_raises_in",
                          "env.kwargs": {"process": "fastrl-evaluator", "length": 7}})
        monkeypatch.setattr(Evaluator, "evaluate", _as_the_evaluator_process(Evaluator.evaluate))
        failed = "failed (RuntimeError: injected fault: RaisesAtEnv step 1)"
    run_dir = tmp_path / "run"
    result = train(build_config("cartpole-appo", overrides), run_dir=run_dir, quiet=True)
    assert result.final["env_steps"] >= 6_400
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

def _tic_tac_toe(**overrides):
    return build_config("cartpole-appo", {
        "env.id": TIC_TAC_TOE, "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 2,
        "learner.rollout": 8, "learner.batch_size": 32, "train_for_env_steps": 1500, "report_every_s": 0.3,
        "serial": True, "inference.in_workers": False, "device": "cpu", "model.hidden_sizes": [16],
        "eval.every_s": 0.1, "eval.episodes": 6, "eval.num_envs": 4, **overrides})

def test_a_serial_run_plays_each_of_eval_opponents_at_every_evaluation(tmp_path):
    opponents = ["random", "tests.unit.evaluation.test_evaluator:first_legal_square"]
    train(_tic_tac_toe(**{"eval.opponents": opponents}), run_dir=tmp_path / "run", quiet=True)
    evaluated = [r for r in read_metrics(tmp_path / "run") if "eval_return_mean" in r]
    assert evaluated
    for row in evaluated:
        for opponent in opponents:
            rates = [row[f"eval/{opponent}/{key}"] for key in ("win_rate", "draw_rate", "loss_rate")]
            assert all(0.0 <= rate <= 1.0 for rate in rates) and sum(rates) == pytest.approx(1.0)
            assert row[f"eval/{opponent}/episodes"] == 6  # eval.episodes, every seat in turn
    unevaluated = [r for r in read_metrics(tmp_path / "run") if "eval_return_mean" not in r]
    assert not [key for row in unevaluated for key in row if key.startswith("eval/")]  # each result once
