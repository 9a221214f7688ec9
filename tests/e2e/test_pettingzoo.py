"""The tests of tests/unit/envs/test_pettingzoo.py's subject that start fastrl's commands or processes."""
import contextlib
import io
import json

import pytest

from fastrl.cli import eval_main
from fastrl.config import build_config
from fastrl.run.training import train

SPREAD = "pettingzoo:mpe2.simple_spread_v3"

@pytest.mark.parametrize("serial", [True, False], ids=["serial", "processes"])
def test_simple_spread_trains_and_evaluates(tmp_path, serial):
    cfg = build_config("cartpole-appo", {
        "env.id": SPREAD, "env.num_workers": 1 if serial else 2, "env.envs_per_worker": 6, "env.num_splits": 2,
        "learner.rollout": 8, "learner.batch_size": 48, "train_for_env_steps": 3_000, "report_every_s": 0.5,
        "serial": serial, "inference.in_workers": False, "device": "cpu"})
    result = train(cfg, run_dir=tmp_path, quiet=True)
    assert result.final["env_steps"] >= 3_000 and result.final["learner_updates"] > 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lengths = [r["episode_length_mean"] for r in records if r["episode_length_mean"] is not None]
    assert lengths and set(lengths) == {25}  # every agent plays each game's 25 steps: one episode each
    args = [str(tmp_path), "--episodes", "4"] + (["--video", str(tmp_path / "spread.mp4")] if serial else [])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert eval_main(args) == 0
    evaluated = json.loads(printed.getvalue())
    assert evaluated["episodes"] == 4 and evaluated["episode_length_mean"] == 25
    if serial:
        assert evaluated["video_frames"] == 2 * 26  # two games (four agent episodes of three a game)
        assert (tmp_path / "spread.mp4").stat().st_size > 0
