"""The tests of tests/unit/reporting/test_console.py's subject that start fastrl's commands or processes."""
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import psutil


def small_run(run_dir, budget: list[str], report_every_s: float) -> list[str]:
    """fastrl-train on a small CartPole layout for ``budget`` (a --train-for-... option and its value)."""
    return [sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(run_dir),
            *budget, "--set", "device=cpu", "--set", f"report_every_s={report_every_s}",
            "--set", "env.envs_per_worker=64", "--set", "learner.batch_size=2048"]

def test_a_run_whose_console_pipes_close_early_ends_at_its_budget_with_metrics_to_the_end(tmp_path):
    # A step budget, not seconds: on a loaded machine start-up can eat most of a short time budget.
    budget_steps = 600_000
    cmd = small_run(tmp_path, ["--train-for-env-steps", str(budget_steps)], report_every_s=0.25)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stderr.readline()  # the first status line: the run is reporting
        proc.stdout.close()  # the reader goes away, as with `| head -1`
        proc.stderr.close()
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # Reports and training go on after the pipes closed, up to the budget.
    assert records[-1]["env_steps"] >= budget_steps and records[-1]["learner_updates"] > 0
    log_lines = (tmp_path / "train.log").read_text().splitlines()
    assert len(log_lines) >= len(records) - 1 and log_lines[-1].startswith("[fastrl] steps")
    pids = [pid for group in json.loads((tmp_path / "processes.json").read_text()).values() for pid in group]
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

def test_a_terminal_hang_up_is_survived_by_every_process_of_the_run(tmp_path):
    budget_s = 3.0  # the hang-up comes ~1 s into training: the rest is trained after it
    cmd = small_run(tmp_path, ["--train-for-seconds", str(budget_s)], report_every_s=0.5)
    # Its own session and process group, as a terminal's foreground job: the hang-up reaches them all.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not (tmp_path / "metrics.jsonl").exists():
            time.sleep(0.2)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGHUP)
        rc = proc.wait(timeout=budget_s + 120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["wall_time"] >= budget_s and records[-1]["worker_restarts"] == 0
    assert "hung up" in (tmp_path / "train.log").read_text()

def test_a_reader_that_stops_reading_never_stalls_the_run(tmp_path):
    budget_s = 3.0
    cmd = small_run(tmp_path, ["--train-for-seconds", str(budget_s)], report_every_s=0.005)
    # stderr is a pipe nobody reads, shrunk to one page: ~90-byte lines at 200 a second fill it in
    # a fraction of a second, and the run goes on for seconds with it full.
    read_end, write_end = os.pipe()
    pipe_bytes = fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=write_end)
        try:
            rc = proc.wait(timeout=budget_s + 120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        os.close(write_end)
        os.close(read_end)
    assert rc == 0
    walls = [json.loads(line)["wall_time"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(b - a for a, b in zip(walls, walls[1:])) < 2.0  # reports never stopped
    assert (tmp_path / "train.log").stat().st_size > 4 * pipe_bytes  # lines went on long after it was full
