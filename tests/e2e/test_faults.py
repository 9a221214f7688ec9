"""Fault injection: killed workers, crashing and NaN envs, Ctrl-C, a killed runner."""
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from fastrl.cli import train_main
from fastrl.config import build_config
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.ipc.arena import remove_stale_segments
from fastrl.run.training import RunError, train
from tests.support.processes import segments_of, still_running, wait_for
from tests.support.training import read_metrics


def start_cli(run_dir, *args, env=None):
    cmd = [sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(run_dir), "--quiet",
           "--set", "device=cpu", "--set", "report_every_s=0.5", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


# Loaded by the interpreter at start-up (sitecustomize): metrics.jsonl opens /dev/full, where every write fails
# with ENOSPC. A link to /dev/full would be refused: fastrl never writes through one.
FULL_DISK_UNDER_METRICS = """
import os
_open = os.open
def _open_full(path, flags, *args, **kwargs):
    if os.fspath(path).endswith("metrics.jsonl"):
        return _open("/dev/full", os.O_WRONLY | os.O_CLOEXEC)
    return _open(path, flags, *args, **kwargs)
os.open = _open_full
"""


def children_of(run_dir):
    roles = json.loads((run_dir / "processes.json").read_text())
    return [pid for role, group in roles.items() if role != "runner" for pid in group]


def test_killed_rollout_worker_is_restarted_and_the_run_finishes(tmp_path):
    cfg = build_config("cartpole-appo", {"device": "cpu", "report_every_s": 0.5, "train_for_env_steps": 1_500_000})
    victims = []

    def kill_a_worker_once_training(report):
        """Called with every report (stop_when); the run itself goes on to its budget."""
        if not victims and report["learner_updates"] > 5:
            victims.append(json.loads((tmp_path / "processes.json").read_text())["rollout"][0])
            os.kill(victims[0], signal.SIGKILL)
        return False

    result = train(cfg, run_dir=tmp_path, quiet=True, stop_when=kill_a_worker_once_training)
    (victim,) = victims
    final = read_metrics(tmp_path)[-1]
    assert result.final["env_steps"] == final["env_steps"]
    assert final["worker_restarts"] >= 1
    assert final["env_steps"] >= 1_500_000
    assert victim not in json.loads((tmp_path / "processes.json").read_text())["rollout"]
    assert not still_running(children_of(tmp_path))


def fault_env_config(factory: str, env_kwargs: dict, **overrides):
    """One worker of 8 fault-injection envs; ``factory`` names a tests.support.fault_envs maker."""
    settings = {"env.id": f"tests.support.fault_envs:{factory}", "env.kwargs": env_kwargs, "env.num_workers": 1,
                "env.envs_per_worker": 8, "learner.batch_size": 256, "train_for_env_steps": 10**7, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def test_env_that_raises_is_survived_by_restarting_its_worker(tmp_path):
    # The worker's 8 envs raise once, on their 1000th step (at ~8K env steps); its replacement
    # trains the rest of the 12K.
    marker = tmp_path / "raised"
    cfg = fault_env_config("make_raises_at", {"step": 1000, "length": 50, "once_marker": str(marker)},
                           train_for_env_steps=12_000, report_every_s=0.5)
    result = train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert marker.exists()
    assert result.final["worker_restarts"] == 1
    assert result.final["env_steps"] >= 12_000


def test_too_many_crashes_stop_the_run_with_a_clear_error(tmp_path):
    cfg = fault_env_config("make_raises_at", {"step": 20, "length": 50}, max_worker_restarts=1)
    with pytest.raises(RunError, match="crashed 2 times"):
        train(cfg, run_dir=tmp_path, quiet=True)


def test_nan_observations_never_reach_the_published_weights(tmp_path):
    cfg = fault_env_config("make_nan_obs", {"every": 7, "length": 20}, **{"learner.max_consecutive_skips": 5})
    with pytest.raises(RunError, match="non-finite loss or gradient: check the env's observations"):
        train(cfg, run_dir=tmp_path, quiet=True)
    state = load_checkpoint(list_checkpoints(tmp_path)[-1])
    assert state["learner"]["skipped_updates"] >= 5
    assert all(torch.isfinite(t).all() for t in state["learner"]["model"].values())


def interrupt_training(run_dir, min_updates: int, stop) -> tuple[subprocess.Popen, list[int]]:
    """Start an endless CLI run, wait until it has made ``min_updates`` updates, then call
    ``stop(proc)``; returns the trainer and its children's pids."""
    proc = start_cli(run_dir, "--train-for-env-steps", "100000000")
    try:
        wait_for(lambda: any(r["learner_updates"] > min_updates for r in read_metrics(run_dir)), 90,
                 "training to start")
        pids = children_of(run_dir)
        stop(proc)
    finally:
        proc.kill()
    return proc, pids


def test_sigint_writes_a_final_checkpoint_and_leaves_nothing_behind(tmp_path):
    def sigint(proc):
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)

    proc, pids = interrupt_training(tmp_path, 5, sigint)
    assert proc.returncode == 0
    assert list_checkpoints(tmp_path)
    state = load_checkpoint(list_checkpoints(tmp_path)[-1])
    assert state["learner"]["updates"] > 5
    wait_for(lambda: not still_running(pids), 15, "children to exit")
    assert not segments_of(proc.pid, *pids)


def test_killed_runner_takes_its_children_along_and_the_next_start_cleans_up(tmp_path):
    def sigkill(proc):
        proc.kill()  # SIGKILL: no chance to clean up
        proc.wait(10)

    proc, pids = interrupt_training(tmp_path, 2, sigkill)
    wait_for(lambda: not still_running(pids), 15, "orphaned children to exit")
    remove_stale_segments()
    assert not segments_of(proc.pid, *pids)


def test_a_full_disk_under_metrics_stops_the_run_with_one_line_and_leaves_nothing_behind(tmp_path):
    assert train_main(["--profile", "cartpole-appo", "--run-dir", str(tmp_path), "--quiet", "--set", "device=cpu",
                       "--train-for-env-steps", "100000"]) == 0
    assert list_checkpoints(tmp_path)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FULL_DISK_UNDER_METRICS)
    path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    proc = start_cli(tmp_path, "--resume", "--train-for-env-steps", "100000000", env={**os.environ, "PYTHONPATH": path})
    try:
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 2
    # One error line. On a loaded machine a child still starting up when the run stops may also
    # get the runner's "[fastrl] ... killed" notice: a notice, not a second error.
    errors = [line for line in err.strip().splitlines() if not line.startswith("[fastrl] ")]
    assert len(errors) == 1 and "metrics.jsonl: No space left on device" in errors[0], err
    assert "--resume" in errors[0]
    wait_for(lambda: not still_running(children_of(tmp_path)), 15, "children to exit")
    assert not segments_of(os.getpid(), proc.pid, *children_of(tmp_path))
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_a_checkpoint_that_cannot_be_written_stops_the_run_with_one_line(tmp_path):
    proc = start_cli(tmp_path, "--train-for-env-steps", "100000")
    wait_for(lambda: (tmp_path / "config.toml").exists(), 90, "the run to start")
    (tmp_path / "checkpoints").write_text("a file where the checkpoint folder should be")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 2
    assert err.strip().count("\n") == 0 and "cannot write checkpoint" in err, err
    assert "the run stopped: cannot write checkpoint" in (tmp_path / "train.log").read_text()
    assert not still_running(children_of(tmp_path))
    assert not segments_of(proc.pid, *children_of(tmp_path))
