"""End to end: real processes, real envs, files on disk, processes gone afterwards."""
import json

import psutil


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_all_exited(run_dir):
    roles = json.loads((run_dir / "processes.json").read_text())
    pids = [pid for role, group in roles.items() if role != "runner" for pid in group]  # evaluator too
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes still running: {alive}"
