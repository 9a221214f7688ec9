"""The tests of tests/unit/learner/test_r2d2.py's subject that start fastrl's commands or processes."""
import json

import numpy as np

from fastrl.cli import train_main
from fastrl.evaluation.episodes import evaluate_run


def test_cartpole_r2d2_trains_checkpoints_and_evaluates(tmp_path):
    assert train_main(["--profile", "cartpole-r2d2", "--run-dir", str(tmp_path / "run"), "--train-for-env-steps",
                       "12000", "--set", "device=cpu", "--set", "replay.min_fill=2000",
                       "--set", "report_every_s=1"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["env_steps"] >= 12000 and records[-1]["learner_updates"] > 0
    assert list((tmp_path / "run" / "checkpoints").glob("*.pt"))
    result = evaluate_run(tmp_path / "run", episodes=4)
    assert result["episodes"] == 4 and np.isfinite(result["episode_return_mean"])
