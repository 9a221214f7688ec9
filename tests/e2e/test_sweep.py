"""The tests of tests/unit/tuning/test_sweep.py's subject that start fastrl's commands or processes."""
import json
import math
import os
import signal
import subprocess
import sys

import optuna

from fastrl.cli import sweep_main, train_main
from fastrl.config import build_config
from fastrl.tuning.search_space import objective_keys
from fastrl.tuning.sweep import BEST_PROFILE, PRUNE_RUNGS, open_study
from fastrl.tuning.trial import Rungs, group_members
from tests.support.processes import segments_of, wait_for
from tests.unit.learner.test_sac import PROFILE
from tests.unit.tuning.test_sweep import REPO, TINY, completed, spec_of, study_trials, sweep_args

SWEEP = [sys.executable, "-c", "import sys; from fastrl.cli import sweep_main; sys.exit(sweep_main())"]

def test_a_study_is_continued_only_by_the_sweep_that_started_it(tmp_path, capsys):
    open_study(spec_of(tmp_path))
    code = sweep_main(sweep_args(tmp_path, "--trials", "3", "--budget-env-steps", "20000", "--param",
                                 "learner.lr=loguniform:1e-5:1e-2", "--objective", "episode_length_mean"))
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert ("study 'sweep' in sqlite:///" in err and "objective: 'episode_return_mean' there, 'episode_length_mean' "
            "here" in err and "pass another --study" in err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.db"]  # the study's folder is not left behind

def test_two_trials_end_to_end_table_and_a_best_profile_fastrl_train_runs(tmp_path, capsys):
    code = sweep_main(sweep_args(tmp_path, "--trials", "2", "--budget-env-steps", "20000", "--seed", "1",
                                 "--param", "learner.lr=loguniform:1e-4:1e-2",
                                 "--param", "learner.entropy_coef=uniform:0:0.05", sets=[*TINY, "serial=true"]))
    out, err = capsys.readouterr()
    assert code == 0, err
    trials = study_trials(tmp_path)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["trial", "state", "episode_return_mean", "learner.lr", "learner.entropy_coef"]
    best = max(trials, key=lambda t: t.value)
    for t, line in zip(trials, lines[1:3]):
        run_dir = tmp_path / "sweep" / f"trial-{t.number:04d}"
        assert line.split()[:3] == [str(t.number), "complete", f"{t.value:.4g}"] and str(run_dir) in line
        config = (run_dir / "config.toml").read_text()
        assert "train_for_env_steps = 20000" in config and f"lr = {t.params['learner.lr']!r}" in config
        last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        assert last["env_steps"] >= 20_000 and math.isclose(last["episode_return_mean"], t.value)
    assert lines[1 + best.number].endswith("  best") and lines[3].startswith(f"best: trial {best.number}, ")
    # Every number a run reports is an objective the sweep accepts.
    cfg = build_config("cartpole-appo")
    reported = {k for line in (tmp_path / "sweep/trial-0000/metrics.jsonl").read_text().splitlines()
                for k, v in json.loads(line).items() if isinstance(v, (int, float))}
    assert reported <= objective_keys(cfg), reported - objective_keys(cfg)
    profile = tmp_path / "sweep" / BEST_PROFILE
    assert train_main(["--profile", str(profile), "--run-dir", str(tmp_path / "best-run"), "--quiet",
                       "--train-for-env-steps", "2000"]) == 0
    trained = (tmp_path / "best-run" / "config.toml").read_text()
    assert f"lr = {best.params['learner.lr']!r}" in trained
    assert f"entropy_coef = {best.params['learner.entropy_coef']!r}" in trained

def test_a_sac_sweep_runs_its_trials_and_every_number_they_report_is_an_objective(tmp_path, capsys):
    """fastrl-sweep over mujoco-sac (Pendulum, serial, small networks): SAC's own keys are searched,
    and SAC's metrics (critic loss, temperature, achieved replay ratio) can be objectives."""
    sets = ["device=cpu", "serial=true", "env.id=Pendulum-v1", "env.num_workers=1", "env.envs_per_worker=2",
            "env.num_splits=1", "learner.rollout=8", "learner.batch_size=16", "learner.torch_threads=1",
            "report_every_s=0.5", "eval.every_s=0", "model.hidden_sizes=[16,16]", "replay.min_fill=200",
            "replay.batch_size=16", "replay.replay_ratio=4", "replay.checkpoint=false"]
    args = ["--profile", PROFILE, "--trials", "2", "--budget-env-steps", "900",
            "--seed", "2", "--param", "learner.tau=uniform:0.001:0.02",
            "--param", "learner.temperature=loguniform:0.01:1"]
    assert sweep_main(sweep_args(tmp_path, *args, sets=sets)) == 0, capsys.readouterr().err
    trials = study_trials(tmp_path)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    for t in trials:
        config = (tmp_path / "sweep" / f"trial-{t.number:04d}" / "config.toml").read_text()
        assert 'algo = "sac"' in config and f"tau = {t.params['learner.tau']!r}" in config
    reported = {k for line in (tmp_path / "sweep/trial-0000/metrics.jsonl").read_text().splitlines()
                for k, v in json.loads(line).items() if isinstance(v, (int, float))}
    cfg = build_config(PROFILE)
    assert {"learner/critic_loss", "learner/temperature", "learner/replay_ratio_achieved"} <= reported
    assert reported <= objective_keys(cfg), reported - objective_keys(cfg)


def test_a_sweep_killed_mid_trial_resumes_to_exactly_n_trials_retrying_the_cut_off_one(tmp_path, capsys):
    args = sweep_args(tmp_path, "--trials", "2", "--budget-env-steps", "60000", "--seed", "3",
                      "--param", "learner.lr=loguniform:1e-4:1e-2", "--prune-after-trials", "5")
    cut = tmp_path / "sweep" / "trial-0001"
    proc = subprocess.Popen([*SWEEP, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (cut / "metrics.jsonl").is_file() and (cut / "processes.json").is_file(), 180,
                 "the second trial to train")
        runner = json.loads((cut / "processes.json").read_text())["runner"][0]
        proc.kill()  # SIGKILL: the sweep gets no chance to stop its trial
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()
    # The trial's runner is told (SIGTERM when its parent dies), stops its children and unlinks its arena.
    wait_for(lambda: not group_members(runner), 60, "the cut-off trial's processes to stop")
    assert "SIGTERM: stopping" in (cut / "train.log").read_text()
    assert not segments_of(runner)
    first = study_trials(tmp_path)
    assert [t.state.name for t in first] == ["COMPLETE", "RUNNING"]

    assert sweep_main(args) == 0
    out = capsys.readouterr().out
    trials = study_trials(tmp_path)
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[0].datetime_start == first[0].datetime_start  # kept, not run again
    assert trials[2].params == trials[1].params and trials[2].system_attrs["failed_trial"] == 1
    assert sorted(p.name for p in (tmp_path / "sweep").glob("trial-*")) == ["trial-0000", "trial-0001", "trial-0002"]
    assert "cut off; retried as 2" in out.splitlines()[2]
    # Run again once done, the study is left as it is.
    assert sweep_main(args) == 0
    assert len(study_trials(tmp_path)) == 3

def test_a_sweep_stopped_by_sigterm_stops_its_trial_and_queues_it_again(tmp_path):
    args = sweep_args(tmp_path, "--trials", "2", "--budget-env-steps", "5000000",
                      "--param", "learner.lr=loguniform:1e-4:1e-2")
    run_dir = tmp_path / "sweep" / "trial-0000"
    proc = subprocess.Popen([*SWEEP, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").is_file() and (run_dir / "processes.json").is_file(), 180,
                 "the first trial to train")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM and out == ""
    assert err.splitlines()[-1] == ("fastrl-sweep: stopped by SIGTERM; the trials it was running will run again: run "
                                    "the same command to continue"), err
    runner = json.loads((run_dir / "processes.json").read_text())["runner"][0]
    assert not group_members(runner) and not segments_of(runner)  # stopped before the sweep exits
    trials = study_trials(tmp_path)
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"] and trials[1].params == trials[0].params

def test_a_pruned_trial_stops_its_processes_and_leaves_no_shared_memory(tmp_path, capsys):
    budget = 2_000_000
    spec = spec_of(tmp_path, trials=2, budget_env_steps=budget, objective="learner/lr", prune_after_trials=1,
                   prune_warmup=0.0)
    study = open_study(spec)
    # A completed trial far ahead at every step, and the next trial far behind: learner/lr is the
    # trial's learning rate, so the curves are known before they run.
    steps = Rungs(budget, PRUNE_RUNGS).steps
    study.add_trial(completed({"learner.lr": 1e-2}, 1e-2, intermediate_values={s: 1e-2 for s in steps}))
    study.enqueue_trial({"learner.lr": 1e-5})
    code = sweep_main(sweep_args(tmp_path, "--trials", "2", "--budget-env-steps", str(budget), "--param",
                                 "learner.lr=loguniform:1e-5:1e-2", "--objective", "learner/lr",
                                 "--prune-after-trials", "1", "--prune-warmup", "0"))
    out, err = capsys.readouterr()
    assert code == 0, err
    pruned = study_trials(tmp_path)[1]
    assert pruned.state == optuna.trial.TrialState.PRUNED and set(pruned.intermediate_values) <= set(steps)
    run_dir = tmp_path / "sweep" / "trial-0001"
    reports = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert reports[-1]["env_steps"] < budget / 2  # stopped early, not run to its budget
    roles = json.loads((run_dir / "processes.json").read_text())
    runner = roles["runner"][0]
    assert not group_members(runner)
    assert not [pid for group in roles.values() for pid in group if os.path.exists(f"/proc/{pid}")]
    assert not segments_of(runner)
    assert out.splitlines()[2].split()[:2] == ["1", "pruned"] and "trial 1 pruned at " in err
