"""The tests of tests/unit/files/test_run_dir.py's subject that start fastrl's commands or processes."""
import contextlib
import io
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fastrl.cli import train_main
from fastrl.files.checkpoint import list_checkpoints
from fastrl.files.run_dir import RunDirError, check_run_dir


def keep_lock_for(lock, seconds):
    """A spawned child given the run directory's lock (as the learner is)."""
    time.sleep(seconds)

def test_a_child_given_the_lock_holds_it_after_the_runner_lets_go_and_is_named(tmp_path):
    lock = check_run_dir(tmp_path, resume=False, overwrite=False)
    child = mp.get_context("spawn").Process(target=keep_lock_for, args=(lock, 60))
    child.start()
    try:
        lock.release()  # the runner is gone; its learner is still writing
        with pytest.raises(RunDirError, match=f"in use by pid {child.pid}, left running by a fastrl-train that has "
                                              f"exited \\(pid {os.getpid()}\\)"):
            check_run_dir(tmp_path, resume=True, overwrite=False)
    finally:
        child.kill()
        child.join()
    check_run_dir(tmp_path, resume=True, overwrite=False).release()

def metrics_lines(run_dir):
    path = run_dir / "metrics.jsonl"
    return path.read_text().splitlines(keepends=True) if path.exists() else []

def has_trained(run_dir):
    return any(json.loads(line)["learner_updates"] > 0 for line in metrics_lines(run_dir) if line.endswith("\n"))

def start_run(run_dir):
    cmd = [sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(run_dir), "--quiet",
           "--train-for-seconds", "60", "--set", "device=cpu", "--set", "env.num_workers=1", "--set",
           "report_every_s=0.2"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

def test_two_runs_started_on_one_run_dir_one_is_refused_in_one_line_and_the_other_goes_on(tmp_path):
    runs = [start_run(tmp_path), start_run(tmp_path)]
    try:
        deadline = time.time() + 120
        while all(run.poll() is None for run in runs) and time.time() < deadline:
            time.sleep(0.05)
        refused = next(run for run in runs if run.poll() is not None)
        first = next(run for run in runs if run is not refused)
        assert first.poll() is None
        _, err = refused.communicate()
        assert refused.returncode == 2 and err.count("\n") == 1, err
        assert f"in use by a running fastrl-train (pid {first.pid}); stop it first" in err
        deadline = time.time() + 60
        while not (tmp_path / "config.toml").exists() and time.time() < deadline:
            time.sleep(0.05)
        config = (tmp_path / "config.toml").read_text()
        for flags in (["--overwrite"], ["--resume"]):  # in this process, so that it cannot outrun the first
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = train_main(["--profile", "cartpole-appo", "--run-dir", str(tmp_path), "--quiet", "--set",
                                   "device=cpu", "--set", "serial=true", "--train-for-env-steps", "2048", *flags])
            assert code == 2 and err.getvalue().count("\n") == 1, err.getvalue()
            assert f"in use by a running fastrl-train (pid {first.pid})" in err.getvalue()
        assert (tmp_path / "config.toml").read_text() == config
        deadline = time.time() + 90
        while time.time() < deadline and first.poll() is None and not has_trained(tmp_path):
            time.sleep(0.1)
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=90)
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.communicate()
    assert first.returncode == 0, err
    assert json.loads(out)["run_dir"] == str(tmp_path)
    steps = [json.loads(line)["env_steps"] for line in metrics_lines(tmp_path)]
    assert steps and steps == sorted(steps)  # one run's reports, in order
    assert (tmp_path / "config.toml").read_text() == config and list_checkpoints(tmp_path)
    check_run_dir(tmp_path, resume=True, overwrite=False).release()  # free once the first run ended

def test_overwrite_with_a_symlinked_checkpoints_folder_deletes_nothing(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    outside = tmp_path / "elsewhere"
    shutil.move(run_dir / "checkpoints", outside)
    (run_dir / "checkpoints").symlink_to(outside, target_is_directory=True)
    kept = sorted(p.name for p in outside.iterdir())
    before = sorted(p.name for p in run_dir.iterdir())
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = train_main(["--profile", "cartpole-appo", "--run-dir", str(run_dir), "--overwrite", "--set",
                           "device=cpu"])
    assert code == 2 and err.getvalue().count("\n") == 1 and "checkpoints' is a symbolic link" in err.getvalue()
    assert sorted(p.name for p in run_dir.iterdir()) == before and sorted(p.name for p in outside.iterdir()) == kept
