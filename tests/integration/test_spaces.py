"""The tests of tests/unit/envs/test_spaces.py's subject that train in this process."""

import pytest

from fastrl.config import build_config
from fastrl.envs.toy import MaskedCueEnv
from fastrl.evaluation.episodes import evaluate_run
from fastrl.files.checkpoint import list_checkpoints
from fastrl.run.training import RunError, train
from tests.support.training import assert_all_exited
from tests.unit.envs.test_spaces import TOY


def test_an_empty_mask_on_the_final_observation_trains(tmp_path):
    env = MaskedCueEnv()
    cfg = small_config("make_masked_cue", {"empty_mask_at": env.length}, train_for_env_steps=3_000)
    result = train(cfg, run_dir=tmp_path, quiet=True)
    assert result.final["env_steps"] >= 3_000

@pytest.mark.parametrize("serial", [True, False], ids=["serial", "processes"])
def test_training_on_an_env_whose_mask_allows_nothing_stops_with_that_message(tmp_path, serial):
    cfg = small_config("make_masked_cue", {"empty_mask_at": 3}, serial=serial, train_for_env_steps=50_000)
    # Serial: the model's own error; processes: the runner's RunError, with the batcher's message
    # (here a worker's: the profile acts in the workers).
    with pytest.raises(ValueError if serial else RunError, match="action_mask allows no action") as info:
        train(cfg, run_dir=tmp_path, quiet=True)
    assert "\n" not in str(info.value)
    if not serial:
        assert_all_exited(tmp_path)

def small_config(factory: str, kwargs: dict, algo: str = "appo", **overrides):
    """A few envs, small batches, one process unless ``serial=False``: a run of a few seconds."""
    settings = {"env.id": TOY + factory, "env.kwargs": kwargs, "env.num_workers": 1, "env.envs_per_worker": 8,
                "env.num_splits": 2, "learner.rollout": 8, "learner.batch_size": 64, "slots_per_env": 3,
                "train_for_env_steps": 3_000, "device": "cpu", "report_every_s": 1.0, "serial": True,
                "model.kind": "mlp", "model.hidden_sizes": [32]}
    if algo == "dqn":
        settings.update({"replay.capacity": 4_000, "replay.min_fill": 500, "replay.batch_size": 32,
                         "replay.replay_ratio": 0.5, "learner.target_update_every": 20})
    settings.update(overrides)
    return build_config("cartpole-dqn" if algo == "dqn" else "cartpole-appo", settings)

# kind: (factory, its kwargs, algo, config overrides, the lowest and highest return of an episode).
# The toy envs raise IllegalAction on an action outside their space or masked: these runs also
# show that none reaches an env.
SPACE_KINDS = {
    "dict-image-discrete-mask": ("make_dict_grid", {}, "appo", {"model.kind": "auto"}, (0.0, 1.0)),
    "discrete-obs": ("make_cue", {"form": "discrete"}, "appo", {}, (0.0, 8.0)),
    "tuple-obs": ("make_cue", {"form": "tuple"}, "appo", {}, (0.0, 8.0)),
    "float64-dict-obs": ("make_cue", {"form": "float64"}, "appo", {"model.normalize_obs": True}, (0.0, 8.0)),
    "multidiscrete-masked": ("make_match_components", {"masked": True}, "appo", {}, (0.0, 8.0)),
    "multibinary": ("make_match_bits", {}, "appo", {}, (0.0, 8.0)),
    "tuple-discrete-box-actions": ("make_tuple_action", {}, "appo", {}, (-8.0 * 2.25, 8.0)),
    "masked-discrete-dqn": ("make_masked_cue", {}, "dqn", {}, (0.0, 8.0)),
}

@pytest.mark.parametrize("kind", list(SPACE_KINDS))
def test_every_space_kind_trains_checkpoints_and_evaluates(tmp_path, kind):
    factory, kwargs, algo, overrides, (low, high) = SPACE_KINDS[kind]
    cfg = small_config(factory, kwargs, algo, **overrides)
    result = train(cfg, run_dir=tmp_path, quiet=True)
    assert result.final["env_steps"] >= 3_000
    assert result.final["learner_updates"] > 0
    assert list_checkpoints(tmp_path)
    evaluation = evaluate_run(tmp_path, episodes=4)
    assert evaluation["episodes"] == 4 and evaluation["env_steps"] >= 3_000
    assert low <= evaluation["episode_return_mean"] <= high
