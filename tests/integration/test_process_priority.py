"""The tests of tests/unit/run/test_process_priority.py's subject that train in this process."""
import json
import os

import psutil

from fastrl.config import build_config
from fastrl.run.training import train


def thread_niceness(pid: int) -> set[int]:
    """The niceness of every thread of ``pid`` (Linux keeps one per thread)."""
    return {os.getpriority(os.PRIO_PROCESS, t.id) for t in psutil.Process(pid).threads()}

def test_the_actors_yield_to_the_learner_and_the_evaluator_to_both(tmp_path):
    cfg = build_config("cartpole-appo", {"device": "cpu", "report_every_s": 0.5, "inference.in_workers": False,
                                         "eval.every_s": 0.5, "actor_niceness": 4, "train_for_seconds": 60.0,
                                         "train_for_env_steps": 0})
    seen = {}

    def niceness_once_trained(report):
        if report["learner_updates"] <= 2:
            return False
        roles = json.loads((tmp_path / "processes.json").read_text())
        seen.update({role: set().union(*(thread_niceness(pid) for pid in roles[role]))
                     for role in ("learner", "rollout", "inference", "evaluator")})
        return True

    train(cfg, run_dir=tmp_path, quiet=True, stop_when=niceness_once_trained)
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the runner's: this process
    # Every thread, envpool's and torch's included, which the processes start after setting it.
    assert seen == {"learner": {base}, "rollout": {min(19, base + 4)}, "inference": {min(19, base + 4)},
                    "evaluator": {min(19, base + 14)}}, seen
