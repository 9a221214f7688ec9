"""End to end: real processes, real envs, files on disk, processes gone afterwards."""
import json

from tests.support.processes import still_running


def read_metrics(run_dir):
    """The run's metrics.jsonl records so far ([] before its first report)."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_all_exited(run_dir):
    roles = json.loads((run_dir / "processes.json").read_text())
    pids = [pid for role, group in roles.items() if role != "runner" for pid in group]  # evaluator too
    alive = still_running(pids)
    assert not alive, f"processes still running: {alive}"
