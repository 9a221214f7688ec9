"""The tests of tests/unit/run/test_training.py's subject that train in this process."""
import json
import os
import signal
import threading

import pytest
import torch
from torch import nn

from fastrl.config import build_config
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.run.training import train
from tests.support.training import assert_all_exited, read_metrics

REQUIRED_METRICS = {"env_steps", "frames", "env_steps_per_s", "fps", "episode_return_mean", "episode_length_mean",
                    "policy_lag_mean", "policy_lag_max", "learner_updates", "wall_time"}

def train_until_reported(cfg, run_dir, reached):
    """``train()`` stopped by Ctrl-C (SIGINT to this process) once a report in metrics.jsonl is
    ``reached``: a learning test's bar met, the rest of the budget is not needed. ``reached`` keeps
    the budget's end well away, so that no signal comes as the run ends by itself."""
    done = threading.Event()

    def interrupt_when_reached():
        metrics = run_dir / "metrics.jsonl"
        while not done.wait(0.2):
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            if any(reached(json.loads(line)) for line in lines if line.endswith("}")):
                os.kill(os.getpid(), signal.SIGINT)
                return

    stopper = threading.Thread(target=interrupt_when_reached, daemon=True)
    stopper.start()
    try:
        return train(cfg, run_dir=run_dir, quiet=True)
    finally:
        done.set()
        stopper.join()

def test_cartpole_learns_and_writes_its_run_dir(cartpole_run):
    run_dir, result = cartpole_run
    records = read_metrics(run_dir)
    assert REQUIRED_METRICS <= set(records[-1])
    assert records[-1]["env_steps"] >= 2_400_000
    # Random play scores ~22; the run must be far above that.
    assert max(r["episode_return_mean"] or 0 for r in records) > 200
    assert records[-1]["learner_updates"] > 50
    roles = json.loads((run_dir / "processes.json").read_text())
    # The profile acts in the workers (inference.in_workers): no batcher process; each worker acts
    # for its own batches, and the time it spends acting is its rollout/inference_s.
    assert len(roles["rollout"]) == 2 and len(roles["inference"]) == 0 and len(roles["learner"]) == 1
    final = result.final
    assert final["rollout/inference_s"] > 0 and final["inference/inference_batches"] == 0
    assert final["rollout/wait_actions_s"] == 0
    assert (run_dir / "config.toml").read_text().count("CartPole-v1") == 1
    assert list_checkpoints(run_dir)
    assert_all_exited(run_dir)

def test_stop_when_ends_the_run_at_the_first_report_it_accepts(tmp_path):
    cfg = build_config("cartpole-appo", {"env.id": "fastrl.envs.toy:make_countdown", "serial": True, "device": "cpu",
                                         "env.num_workers": 1, "env.envs_per_worker": 8, "learner.batch_size": 64,
                                         "train_for_env_steps": 0, "train_for_seconds": 120.0,
                                         "report_every_s": 0.2})
    result = train(cfg, run_dir=tmp_path, quiet=True, stop_when=lambda report: report["env_steps"] >= 2_000)
    rows = read_metrics(tmp_path)
    accepted = next(i for i, row in enumerate(rows) if row["env_steps"] >= 2_000)
    assert accepted == len(rows) - 2  # then the final report, as at the budget
    assert result.final["env_steps"] == rows[-1]["env_steps"] and rows[-1]["trained_seconds"] < 60
    assert list_checkpoints(tmp_path)

class TinyPolicy(nn.Module):
    """A user's own network: the (params, value) contract with a Gaussian head for Box actions."""

    def __init__(self, obs_dim=1, action_dim=1):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh())
        self.mean = nn.Linear(32, action_dim)
        self.log_std = nn.Parameter(torch.full((action_dim,), -0.5))
        self.value = nn.Linear(32, 1)

    def forward(self, obs):
        h = self.body(obs.float())
        mean = self.mean(h)
        return torch.cat([mean, self.log_std.expand_as(mean)], -1), self.value(h).squeeze(-1)

def target_env_config(**overrides):
    settings = {"env.id": "fastrl.envs.toy:make_target", "env.kwargs": {"length": 10}, "env.num_workers": 1,
                "env.envs_per_worker": 16, "learner.rollout": 10, "learner.batch_size": 320, "learner.lr": 3e-3,
                "learner.reward_scale": 1.0, "learner.entropy_coef": 0.0, "train_for_env_steps": 60_000,
                "slots_per_env": 3,
                "device": "cpu", "report_every_s": 1.0}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def test_sample_only_mode_steps_envs_without_training(tmp_path):
    cfg = build_config("cartpole-appo", {"sample_only": True, "train_for_env_steps": 200_000, "device": "cpu"})
    result = train(cfg, run_dir=tmp_path, quiet=True)
    assert result.final["env_steps"] >= 200_000
    assert result.final["learner_updates"] == 0

def test_a_step_budget_ends_with_its_steps_and_their_full_batches_trained(tmp_path):
    """Workers stop stepping at the budget, not a quarter of a second of budget checks later, and
    the run ends once the learner has trained on the full slots they sent: CartPole spends the
    budget in a fraction of the time the learner takes to load."""
    workers, envs, rollout, batch = 2, 16, 8, 256
    budget = 10 * workers * envs * rollout
    cfg = build_config("cartpole-appo", {"device": "cpu", "env.num_workers": workers, "env.envs_per_worker": envs,
                                         "env.num_splits": 2, "learner.rollout": rollout, "learner.batch_size": batch,
                                         "train_for_env_steps": budget, "report_every_s": 0.2})
    result = train(cfg, run_dir=tmp_path, quiet=True)
    steps = result.final["env_steps"]
    assert budget <= steps < budget + workers * envs  # a worker records at most one batch past it
    trained = load_checkpoint(list_checkpoints(tmp_path)[-1])["counters"]["trained_env_steps"]
    # Left untrained: the slots the envs were filling, and full ones short of a batch.
    assert steps - workers * envs * rollout - batch < trained <= steps
    assert result.final["learner_updates"] == trained // batch
    assert_all_exited(tmp_path)


def test_corrupt_checkpoint_falls_back_to_the_previous_one(cartpole_run, tmp_path):
    import shutil

    run_dir, _ = cartpole_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    # A newer checkpoint truncated mid-write beside the run's own (the run may have only one).
    previous = list_checkpoints(copy)[-1]
    newest = previous.with_name(f"ckpt_{int(previous.stem.split('_')[1]) + 1:012d}.pt")
    newest.write_bytes(previous.read_bytes()[:1000])
    from fastrl.files.checkpoint import load_latest_checkpoint

    warnings = []
    path, state = load_latest_checkpoint(copy, warn=warnings.append)
    assert path == previous and "counters" in state
    assert any("corrupt or truncated" in w for w in warnings)


def test_atari_apex_runs_on_stacked_frames(tmp_path):
    # The image path of the dqn learner (frame stack 4, each frame stored once), small enough for a CPU.
    cfg = build_config("atari-apex", {
        "train_for_env_steps": 3_000, "device": "cpu", "env.num_workers": 1, "env.envs_per_worker": 4,
        "env.num_threads": 1, "learner.rollout": 16, "learner.batch_size": 64, "replay.capacity": 4_000,
        "replay.min_fill": 500, "replay.batch_size": 32, "replay.replay_ratio": 0.5, "report_every_s": 1.0})
    train(cfg, run_dir=tmp_path, quiet=True)
    last = read_metrics(tmp_path)[-1]
    assert last["env_steps"] >= 3_000
    assert last["learner/replayed_batches"] > 10 and last["learner_updates"] > 10
    # envpool's reset stacks repeat the reset frame, so no history records: one record per env step.
    assert last["learner/replay_size"] == min(4_000, last["learner/trained_env_steps"])
    assert list_checkpoints(tmp_path)
    assert_all_exited(tmp_path)

def test_stop_when_is_refused_for_a_run_of_several_ranks_before_anything_is_written(tmp_path, monkeypatch):
    from fastrl.distributed.process_group import DistInfo
    from fastrl.run import training as runner

    monkeypatch.setattr(runner, "check_request", lambda cfg, run_dir, resume: DistInfo(rank=0, world_size=2))
    with pytest.raises(runner.RunError, match="stop_when stops a single node's run: with several ranks, end the "
                                              "run by its budget"):
        runner.train(build_config("cartpole-appo"), run_dir=tmp_path / "run", stop_when=lambda record: True)
    assert not (tmp_path / "run").exists()

def test_breakout_with_episodic_life_reports_whole_games_beside_its_lives(tmp_path):
    # A lost life ends the learner's episode; info/game_return is the score of the five lives.
    cfg = build_config("atari-appo-cpu", {
        # No training: the games are what is checked, and the CNN's updates would triple the time.
        "serial": True, "sample_only": True, "train_for_env_steps": 1_200, "env.id": "Breakout-v5",
        "env.kwargs": {"episodic_life": True},
        "env.num_workers": 1, "env.envs_per_worker": 4, "env.num_splits": 1, "env.num_threads": 1,
        "learner.batch_size": 64, "report_every_env_steps": 600})
    train(cfg, run_dir=tmp_path, quiet=True)
    records = read_metrics(tmp_path)
    games = [r["info/game_return"] for r in records if r["info/game_return"] == r["info/game_return"]]  # not NaN
    # Whole games end in the budget (about 150 agent steps each, at random), and some score.
    assert games and max(games) >= 1.0, [r["info/game_return"] for r in records]
    assert records[-1]["episode_length_mean"] < 60  # lives of about 30 agent steps, not games


def test_auto_precision_is_timed_once_before_the_run_and_said_in_train_log(tmp_path, monkeypatch):
    from fastrl.learner import precision
    from fastrl.run import training

    measured = []
    monkeypatch.setattr(precision, "native_bf16", lambda flags=None: True)

    def measure_once(cfg, model, space):
        if measured:
            raise AssertionError("bf16 was timed again")
        measured.append(cfg.learner.torch_threads)
        return "bfloat16", "bf16 took 0.62x float32's time for the learner's network on this CPU"

    monkeypatch.setattr(training, "measured_precision", measure_once)
    monkeypatch.setattr(precision, "measured_precision", measure_once)
    cfg = build_config("cartpole-appo", {"env.id": "fastrl.envs.toy:make_countdown", "serial": True, "device": "cpu",
                                         "env.num_workers": 1, "env.envs_per_worker": 8, "learner.batch_size": 64,
                                         "learner.precision": "auto", "learner.torch_threads": 1,
                                         "train_for_env_steps": 2_000})
    train(cfg, run_dir=tmp_path, quiet=True)
    assert measured == [1]
    line = ("[fastrl] learner.precision=auto: bfloat16 on cpu (bf16 took 0.62x float32's time for the learner's "
            "network on this CPU)")
    assert (tmp_path / "train.log").read_text().splitlines().count(line) == 1
    assert 'precision = "auto"' in (tmp_path / "config.toml").read_text()  # a resume times it again
    assert load_checkpoint(list_checkpoints(tmp_path)[-1])["config"]["learner"]["precision"] == "bfloat16"
    assert cfg.learner.precision == "auto"  # the caller's config is not changed
