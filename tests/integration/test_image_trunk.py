"""The tests of tests/unit/models/test_image_trunk.py's subject that train in this process."""

import numpy as np
import torch
from gymnasium import spaces

from fastrl.config import build_config, load_run_config, to_toml, weights_mismatch
from fastrl.envs import probe_env
from fastrl.envs.spaces import ObsLayout
from fastrl.evaluation.episodes import load_run_model
from fastrl.files.checkpoint import save_checkpoint
from fastrl.models.encoders import LeafEncoder
from fastrl.models.networks import build_model, keys_it_ignores
from tests.unit.models.test_image_trunk import without_the_key

SCREEN_AND_STEP = spaces.Dict({"screen": spaces.Box(0, 255, (16, 32, 3), np.uint8),
                               "step": spaces.Box(-np.inf, np.inf, (1,), np.float32)})

def linear_widths(encoder: LeafEncoder) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in encoder.trunk.modules() if isinstance(m, torch.nn.Linear)]

def test_image_leaves_meet_the_others_in_one_relu_layer_as_wide_as_the_cnn():
    encoder = LeafEncoder(ObsLayout(SCREEN_AND_STEP), [64, 64], "tanh")
    cnn = next(iter(encoder.images.values())).out_features
    assert linear_widths(encoder) == [(cnn + 1, cnn)] and encoder.out_features == cnn
    assert any(isinstance(m, torch.nn.ReLU) for m in encoder.trunk.modules())
    assert not any(isinstance(m, torch.nn.Tanh) for m in encoder.trunk.modules())
    # mlp: the MLP of hidden_sizes and activation, as before the key; so too without an image encoder.
    assert linear_widths(LeafEncoder(ObsLayout(SCREEN_AND_STEP), [64, 64], "tanh", image_trunk="mlp")) == [
        (cnn + 1, 64), (64, 64)]
    flat = LeafEncoder(ObsLayout(SCREEN_AND_STEP), [64, 64], "tanh", kind="mlp")
    assert linear_widths(flat) == [(16 * 32 * 3 + 1, 64), (64, 64)]

IMAGE_CUE = {"env.id": "fastrl.envs.toy:make_cue", "env.kwargs": {"num_actions": 4, "length": 20, "form": "image"},
             "model.kind": "auto", "device": "cpu"}

def test_a_run_saved_before_the_key_resumes_and_evaluates_with_its_mlp_trunk(tmp_path):
    cfg = build_config("cartpole-appo", {**IMAGE_CUE, "model.image_trunk": "mlp"})
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    text, saved = without_the_key(cfg)
    (tmp_path / "config.toml").write_text(text)
    save_checkpoint(tmp_path, {"learner": {"model": model.state_dict()}, "counters": {"env_steps": 100},
                               "config": saved}, 100, keep=3)
    assert load_run_config(tmp_path).model.image_trunk == "mlp"
    _, loaded, _ = load_run_model(tmp_path)  # fastrl-eval's path: weights checked and loaded
    assert linear_widths(loaded.encoder) == linear_widths(model.encoder)
    resumed = load_run_config(tmp_path)
    assert weights_mismatch(saved, resumed, keys_it_ignores(loaded)) == ""  # --resume's check
    resumed.model.image_trunk = "relu"
    assert weights_mismatch(saved, resumed, keys_it_ignores(loaded)) == "model.image_trunk: 'mlp' -> 'relu'"
    # A run of today's default writes the key: it reads back as it trained.
    (tmp_path / "config.toml").write_text(to_toml(resumed))
    assert load_run_config(tmp_path).model.image_trunk == "relu"
