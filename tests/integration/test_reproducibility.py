"""The tests of tests/unit/run/test_reproducibility.py's subject that train in this process."""
import json

import numpy as np
import pytest
import torch

from fastrl.config import ConfigError, build_config
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.reporting.console import Console
from fastrl.reporting.metrics import measures_the_clock
from fastrl.run.serial import InlineEvaluations
from fastrl.run.training import train
from tests.support.same_state import assert_same_state
from tests.support.seed_envs import recorded_resets

# Serial runs as a user starts them: reports every 10 learner batches (the default), and
# evaluations in line every report_every_s * 2 seconds' worth, i.e. at every second report.
SMALL = {"serial": True, "device": "cpu", "env.num_workers": 1, "env.envs_per_worker": 8,
         "train_for_env_steps": 3_000, "report_every_s": 1.0, "eval.every_s": 2.0, "eval.episodes": 2,
         "eval.num_envs": 2}

REPLAY = {"learner.rollout": 8, "learner.batch_size": 64, "replay.min_fill": 500, "replay.batch_size": 32,
          "model.hidden_sizes": [16]}

# One entry per learner or kind of run: a new learner adds its own (profile, overrides).
RUNS = [
    pytest.param("cartpole-appo", {"learner.rollout": 8, "learner.batch_size": 64}, id="appo"),
    pytest.param("cartpole-dqn", REPLAY, id="dqn"),
    pytest.param("cartpole-r2d2", {**REPLAY, "learner.rollout": 10, "learner.batch_size": 80, "replay.batch_size": 8,
                                   "model.core_size": 16}, id="r2d2"),
    pytest.param("cartpole-appo", {"learner.rollout": 8, "learner.batch_size": 64, "model.core": "lstm",
                                   "model.core_size": 16}, id="lstm"),
    # Self-play on envpool's two-player game: the league's snapshots and the seats' draws.
    pytest.param("cartpole-appo", {"env.id": "TicTacToe-v1", "env.num_splits": 4, "learner.rollout": 8,
                                   "learner.batch_size": 64, "slots_per_env": 10, "learner.reward_scale": 1.0,
                                   "inference.in_workers": False, "model.hidden_sizes": [16],
                                   "selfplay.enabled": True, "selfplay.snapshot_every": 5,
                                   "selfplay.max_snapshots": 3}, id="selfplay"),
    pytest.param("mujoco-sac", {"env.id": "Pendulum-v1", "learner.torch_threads": 1, "learner.rollout": 8,
                                "learner.batch_size": 64, "replay.min_fill": 500, "replay.batch_size": 32,
                                "replay.replay_ratio": 4.0, "model.hidden_sizes": [16]}, id="sac"),
]

def serial_run(run_dir, profile: str, overrides: dict, seed: int):
    """A serial run of ``profile`` with ``overrides``; its metrics.jsonl lines and final checkpoint."""
    cfg = build_config(profile, {**SMALL, **overrides, "seed": seed})
    assert cfg.serial_report_every_env_steps == 10 * cfg.learner.batch_size
    train(cfg, run_dir=run_dir, quiet=True)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return lines, load_checkpoint(list_checkpoints(run_dir)[-1])

def without_clock(line: dict) -> dict:
    return {key: value for key, value in line.items() if not measures_the_clock(key)}

def learned_state(checkpoint: dict) -> dict:
    """A checkpoint's learner (weights, optimizer, counters), RNG states and step counters: all
    but its clocks."""
    counters = {key: value for key, value in checkpoint["counters"].items()
                if key not in ("wall_time", "trained_seconds")}
    return {"learner": checkpoint["learner"], "rng": checkpoint["rng"], "counters": counters}

@pytest.mark.parametrize("profile, overrides", RUNS)
def test_a_serial_run_repeated_writes_the_same_metrics_and_weights(tmp_path, profile, overrides):
    first_lines, first = serial_run(tmp_path / "first", profile, overrides, seed=7)
    second_lines, second = serial_run(tmp_path / "second", profile, overrides, seed=7)
    # Reports at the first step at or past each multiple of 10 learner batches, then the final one;
    # an evaluation at every second report.
    every = 10 * {**SMALL, **overrides}["learner.batch_size"]
    steps = [line["env_steps"] for line in first_lines]
    assert len(steps) >= 3_000 // every
    assert all(k * every <= s < k * every + 100 for k, s in enumerate(steps[:-1], start=1))
    assert first_lines[-1]["learner_updates"] > 0
    evaluated = [k for k, line in enumerate(first_lines, start=1) if "eval_return_mean" in line]
    assert evaluated[0] == 2 and all(k % 2 == 0 for k in evaluated)
    assert [without_clock(line) for line in first_lines] == [without_clock(line) for line in second_lines]
    assert_same_state(learned_state(first), learned_state(second))

def test_another_seed_gives_another_run(tmp_path):
    overrides = {"learner.rollout": 8, "learner.batch_size": 64}
    lines, first = serial_run(tmp_path / "first", "cartpole-appo", overrides, seed=7)
    other_lines, other = serial_run(tmp_path / "other", "cartpole-appo", overrides, seed=8)
    assert [without_clock(line) for line in lines] != [without_clock(line) for line in other_lines]
    weights, other_weights = first["learner"]["model"], other["learner"]["model"]
    assert any(not torch.equal(weights[name], other_weights[name]) for name in weights)

def test_a_serial_run_s_evaluations_leave_its_torch_draws_alone():
    """A serial run evaluates at every n-th report: its own draws must not shift the training's."""
    drawn = []

    class DrawingEvaluator:
        def evaluate(self):
            drawn.append(torch.rand(3))

    evaluations = InlineEvaluations(2, DrawingEvaluator, Console(None, quiet=True))
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    evaluations.evaluate_if_due()  # the first report: not yet
    assert not drawn
    evaluations.evaluate_if_due()
    assert len(drawn) == 1 and torch.equal(torch.rand(3), expected)

def test_clock_figures_are_the_timers_and_rates():
    clock = ["fps", "env_steps_per_s", "wall_time", "trained_seconds", "eval_seconds", "learner/optimizer_s",
             "rollout/env_step_s", "inference/weight_refresh_s", "policy/a/learner/gather_s", "restart_lost_s"]
    training = ["env_steps", "frames", "episode_return_mean", "learner/loss", "inference/inference_batches",
                "league/rating", "eval_return_mean", "policy/a/episodes_recent"]
    assert all(measures_the_clock(key) for key in clock)
    assert not any(measures_the_clock(key) for key in training)

def test_parallel_runs_with_one_seed_start_from_the_same_weights_and_observations(tmp_path):
    """The learner hands the slots back untrained (sample_only), so the final checkpoint holds the
    weights the run started from; every env saves its seeded first observation. Two parallel runs
    start alike, and from the weights and observations of the serial run with that seed."""
    starts = []
    for name, serial in (("first", False), ("second", False), ("serial", True)):
        resets = tmp_path / f"{name}-resets"
        resets.mkdir()
        cfg = build_config("cartpole-appo", {
            "env.id": "tests.support.seed_envs:make_recorded_cartpole", "env.kwargs": {"out_dir": str(resets)},
            "env.num_workers": 2, "env.envs_per_worker": 4, "env.num_splits": 2, "learner.rollout": 8,
            "learner.batch_size": 64, "train_for_env_steps": 1_000, "sample_only": True, "device": "cpu",
            "seed": 7, "eval.every_s": 0.0, "serial": serial})
        train(cfg, run_dir=tmp_path / name, quiet=True)
        starts.append((load_checkpoint(list_checkpoints(tmp_path / name)[-1])["learner"], recorded_resets(resets)))
    (first, first_obs), *others = starts
    assert first["version"] == 0
    assert len(first_obs) >= 8  # a seed per row of both workers (and the main process's probe)
    for learner, observations in others:
        assert_same_state(first["model"], learner["model"])
        assert first_obs.keys() == observations.keys()
        for seed, obs in first_obs.items():
            np.testing.assert_array_equal(obs, observations[seed])

def test_reports_by_env_steps_are_for_serial_runs():
    with pytest.raises(ConfigError, match=r"report_every_env_steps is for serial runs.*set serial=true"):
        build_config("cartpole-appo", {"report_every_env_steps": 1_000})
