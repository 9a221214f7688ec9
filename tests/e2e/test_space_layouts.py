"""The tests of tests/unit/envs/test_space_layouts.py's subject that start fastrl's commands or processes."""
import json

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.cli import eval_main
from fastrl.config import build_config
from fastrl.envs.spaces import ObsLayout
from fastrl.evaluation.episodes import load_run_model
from fastrl.files.checkpoint import list_checkpoints
from fastrl.run.training import train
from tests.support.space_envs import ACTION_SPACES, BOX_HIGH, BOX_LOW
from tests.support.training import assert_all_exited
from tests.unit.envs.test_spaces import one_torch_thread  # noqa: F401  (autouse: the serial runs train on one thread here)
from tests.unit.learner.test_sac import PROFILE

FACTORY = "tests.support.space_envs:make_strict_space_env"

LENGTH = 8  # steps per episode of the toy envs

# Lowest return of an episode: Box actions score minus the squared distance to a target inside
# the bounds; the others the fraction they match.
LOWEST_RETURN = {"box-2d": -LENGTH * float(np.sum((BOX_HIGH - BOX_LOW) ** 2))}

MODES = {
    "serial": {"serial": True},
    "batcher": {"serial": False, "inference.in_workers": False},
    "in-workers": {"serial": False, "inference.in_workers": True},
}

def run_config(kind: str, algo: str, mode: str):
    """A run of a few seconds: one worker of 8 envs, a few train() calls."""
    settings = {"env.id": FACTORY, "env.kwargs": {"kind": kind, "length": LENGTH}, "env.num_workers": 1,
                "env.envs_per_worker": 8, "env.num_splits": 2, "learner.rollout": 8, "slots_per_env": 3,
                "device": "cpu", "report_every_s": 1.0, "model.kind": "mlp", "model.hidden_sizes": [32],
                **MODES[mode]}
    if algo == "appo":
        settings.update({"learner.batch_size": 64, "train_for_env_steps": 1_500})
        return build_config("cartpole-appo", settings)
    if algo == "sac":  # a quarter of an update per env step; observations normalized on the way in
        settings.update({"replay.capacity": 2_000, "replay.min_fill": 300, "train_for_env_steps": 1_200,
                         "learner.batch_size": 64, "replay.batch_size": 32, "replay.replay_ratio": 8.0,
                         "learner.torch_threads": 1, "model.normalize_obs": True, "eval.every_s": 0.0})
        return build_config(PROFILE, settings)
    settings.update({"replay.capacity": 2_000, "replay.min_fill": 300, "learner.target_update_every": 20,
                     "train_for_env_steps": 1_200})
    if algo == "dqn":
        settings.update({"learner.batch_size": 64, "replay.batch_size": 32, "replay.replay_ratio": 0.25})
        return build_config("cartpole-dqn", settings)
    settings.update({"learner.batch_size": 64, "replay.sequence_length": 8, "replay.burn_in": 2,
                     "replay.batch_size": 4, "replay.replay_ratio": 0.25, "model.core_size": 16})
    return build_config("cartpole-r2d2", settings)

def train_and_evaluate(run_dir, kind: str, algo: str, mode: str, capsys) -> dict:
    """Train, check the run stopped cleanly and checkpointed, and return fastrl-eval's result."""
    result = train(run_config(kind, algo, mode), run_dir=run_dir, quiet=True)
    assert result.final["learner_updates"] > 0
    assert list_checkpoints(run_dir)
    if mode != "serial":
        assert_all_exited(run_dir)
    capsys.readouterr()
    assert eval_main([str(run_dir), "--episodes", "4"]) == 0
    evaluation = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluation["episodes"] == 4
    assert LOWEST_RETURN.get(kind, 0.0) <= evaluation["episode_return_mean"] <= LENGTH
    return evaluation

# Every kind in serial mode; with processes (each run costs their start-up), the batcher and the
# in-worker acting take the top-level Discrete (and its observation) and the Tuple that holds every
# other kind: the actions reach the env through the same VecEnv.send in every mode.
APPO_RUNS = [(kind, "serial") for kind in ACTION_SPACES] + [
    (kind, mode) for kind in ("discrete", "tuple") for mode in ("batcher", "in-workers")]

@pytest.mark.parametrize("kind, mode", APPO_RUNS)
def test_appo_acts_trains_and_evaluates_in_the_declared_spaces(tmp_path, capsys, kind, mode):
    train_and_evaluate(tmp_path, kind, "appo", mode, capsys)
    if kind == "discrete":  # the observation is a Discrete(3, start=-1): -1, 0 and 1 must read apart
        _, model, _ = load_run_model(tmp_path)
        cues = torch.from_numpy(ObsLayout(spaces.Discrete(3, start=-1)).pack(np.array([-1, 0, 1]), 3))
        with torch.no_grad():
            params, _ = model(cues)
        assert all(not torch.equal(params[i], params[j]) for i, j in ((0, 1), (1, 2), (0, 2)))

@pytest.mark.parametrize("algo, mode", [("dqn", "serial"), ("dqn", "batcher"), ("r2d2", "serial"),
                                        ("r2d2", "in-workers")])
def test_q_learners_act_in_a_discrete_space_with_a_start(tmp_path, capsys, algo, mode):
    train_and_evaluate(tmp_path, "discrete", algo, mode, capsys)


@pytest.mark.parametrize("mode", ["serial", "batcher"])
def test_sac_acts_trains_and_evaluates_in_a_2d_box_with_offsets(tmp_path, capsys, mode):
    """A [2, 3] Box whose dimensions have their own bounds, none centred on 0, which the env checks
    exactly (shape, dtype, bounds) at every step, in training and in fastrl-eval's mean actions;
    the [2, 3] observations through the actor's and the critics' normalizer."""
    evaluation = train_and_evaluate(tmp_path, "box-2d", "sac", mode, capsys)
    assert evaluation["episode_return_mean"] < 0  # minus a squared distance: never exactly on target
    _, model, _ = load_run_model(tmp_path)
    # The normalizer saw the env's targets, uniform in the Box: its mean is the Box's centre.
    assert model.normalizer is not None and model.normalizer.count.item() > 500
    np.testing.assert_allclose(model.normalizer.mean.numpy(), (BOX_LOW + BOX_HIGH) / 2,
                               atol=0.1 * (BOX_HIGH - BOX_LOW).max())
