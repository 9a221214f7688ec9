"""model.kind = board_cnn: a board game's planes through one convolution of line-sized windows."""
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.envs import probe_env
from fastrl.envs.spaces import ObsLayout
from fastrl.models.encoders import BoardCNN, MLPEncoder
from fastrl.models.networks import build_model


def board(*squares, shape=(6, 7, 2)):
    planes = torch.zeros(1, *shape)
    for r, c in squares:
        planes[0, r, c, 0] = 1.0
    return planes


def test_a_threat_reads_the_same_wherever_it_stands_on_the_board():
    torch.manual_seed(0)
    cnn = BoardCNN((6, 7, 2))
    assert cnn.out_features == 64 * 3 * 4  # 4 x 4 windows over 6 x 7 squares
    # Three in a row on the bottom row, then the same three one column to the right: the window
    # one column over sees exactly what the first window saw.
    left = cnn(board((5, 0), (5, 1), (5, 2))).reshape(64, 3, 4)
    right = cnn(board((5, 1), (5, 2), (5, 3))).reshape(64, 3, 4)
    torch.testing.assert_close(right[:, 2, 1], left[:, 2, 0])
    assert not torch.equal(right[:, 2, 0], left[:, 2, 0])
    # Planes last ([H, W, planes]) and planes first read the same board.
    first = BoardCNN((2, 6, 7))
    first.load_state_dict(cnn.state_dict())
    planes = board((5, 0), (4, 1), (3, 2))
    torch.testing.assert_close(first(planes.permute(0, 3, 1, 2)), cnn(planes))


def test_tic_tac_toe_is_one_window_over_the_whole_board():
    cnn = BoardCNN((3, 3, 2))  # planes last although the first axis is 3: the shortest axis is the planes'
    assert cnn.channels_last and cnn.out_features == 64
    assert cnn(board((0, 0), shape=(3, 3, 2))).shape == (1, 64)


def test_connect_four_with_board_cnn_reads_the_board_by_the_cnn_and_the_mlp_after_it():
    cfg = build_config("connect4-selfplay", {"model.kind": "board_cnn"})
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    encoder = model.encoder
    (cnn,) = encoder.images.values()
    assert isinstance(cnn, BoardCNN) and cnn.out_features == 768
    assert isinstance(encoder.trunk, MLPEncoder) and encoder.out_features == cfg.model.hidden_sizes[-1]
    layout = ObsLayout(spec.observation_space)
    obs = {"observation": np.zeros((5, 6, 7, 2), np.int8), "action_mask": np.ones((5, 7), np.int8)}
    obs["action_mask"][:, 3] = 0
    logits, values = model(torch.as_tensor(layout.pack(obs, 5)))
    assert logits.shape == (5, 7) and values.shape == (5,)
    assert (logits[:, 3] < -1e30).all()  # the mask still applies


def test_board_cnn_on_a_vector_observation_names_the_fix():
    cfg = build_config("cartpole-appo", {"model.kind": "board_cnn"})
    spec = probe_env(cfg)
    with pytest.raises(ValueError, match="model.kind=board_cnn needs image observations.*model.kind=mlp"):
        build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
