"""The tests of tests/unit/run/test_resources.py's subject that train in this process."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.models.networks import build_model, state_bytes
from fastrl.run import resources
from tests.unit.run.test_resources import _train_refusing_starts


@pytest.mark.parametrize("overrides, kind", [
    ({}, "mlp"), ({"model.core": "lstm", "model.core_layers": 2}, "mlp"), ({"model.core": "gru"}, "mlp"),
    ({"learner.algo": "r2d2", "model.core": "lstm"}, "mlp"), ({"learner.algo": "dqn"}, "mlp"),
    ({"model.separate_critic": True, "model.normalize_obs": True}, "mlp"),
    ({}, "nature_cnn"), ({}, "impala_resnet"), ({"model.core": "lstm"}, "dict"),
])
def test_a_model_on_the_meta_device_has_the_bytes_of_the_one_built(overrides, kind):
    observation = {"mlp": gym.spaces.Box(-1, 1, (4,), np.float32), "dict": gym.spaces.Dict(
        {"position": gym.spaces.Box(-1, 1, (3,), np.float32), "cell": gym.spaces.Discrete(5)})}.get(
        kind, gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
    settings = {"model.kind": kind} if kind in ("nature_cnn", "impala_resnet") else {}
    cfg = build_config("cartpole-appo", {**settings, **overrides})
    args = (observation, gym.spaces.Discrete(3), cfg.model, None, cfg.learner.algo)
    with torch.device("meta"):
        shape = build_model(*args)
    assert all(p.is_meta for p in shape.parameters())
    assert state_bytes(shape) == state_bytes(build_model(*args)) > 0

def test_a_model_that_fits_passes_the_check_and_is_counted(tmp_path, capsys, monkeypatch):
    code, started, built = _train_refusing_starts(monkeypatch, ["--profile", "cartpole-r2d2", "--run-dir",
                                                                str(tmp_path / "run")])
    assert code == 0 and started == ["parallel"] and built == ["meta", "cpu"], capsys.readouterr().err
    cfg = build_config("cartpole-r2d2")
    # The learner's weights, gradients, Adam's moments, published copy and target network; the
    # batcher's and the evaluator's model and loaded copy.
    copies = 6 + 2 * (1 + (cfg.eval.every_s > 0))
    assert resources.model_ram_bytes(cfg, 1000) == 1000 * copies
