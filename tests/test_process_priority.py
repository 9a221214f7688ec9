"""The actors (rollout workers, batcher) run below the learner, the evaluator below them."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from fastrl.config import ConfigError, build_config


def thread_niceness(pid: int) -> set[int]:
    """The niceness of every thread of ``pid`` (Linux keeps one per thread)."""
    return {os.getpriority(os.PRIO_PROCESS, t.id) for t in psutil.Process(pid).threads()}


@pytest.mark.slow
def test_the_actors_yield_to_the_learner_and_the_evaluator_to_both(tmp_path):
    cmd = [sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(tmp_path), "--quiet",
           "--set", "device=cpu", "--set", "report_every_s=0.5", "--set", "inference.in_workers=false",
           "--set", "eval.every_s=0.5", "--set", "actor_niceness=4", "--train-for-seconds", "60"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        metrics = tmp_path / "metrics.jsonl"
        while not (metrics.exists() and any(json.loads(r)["learner_updates"] > 2 for r in metrics.read_text().splitlines())):
            assert time.time() < deadline and proc.poll() is None, "training did not start"
            time.sleep(0.2)
        roles = json.loads((tmp_path / "processes.json").read_text())
        base = os.getpriority(os.PRIO_PROCESS, proc.pid)
        seen = {role: set().union(*(thread_niceness(pid) for pid in roles[role]))
                for role in ("learner", "rollout", "inference", "evaluator")}
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    # Every thread, envpool's and torch's included, which the processes start after setting it.
    assert seen == {"learner": {base}, "rollout": {min(19, base + 4)}, "inference": {min(19, base + 4)},
                    "evaluator": {min(19, base + 14)}}, seen
    assert proc.returncode == 0, err


@pytest.mark.parametrize("value", [-1, 20])
def test_actor_niceness_outside_linux_range_is_refused(value):
    with pytest.raises(ConfigError, match="actor_niceness"):
        build_config("cartpole-appo", {"actor_niceness": value})
