"""Grids of codes (fastrl.envs.spaces.CodeGrid) are read one-hot; uint8 vectors over 0-255 as bytes."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.envs.spaces import CodeGrid, ObsLayout
from fastrl.models.encoders import LeafEncoder


def _grid_space() -> spaces.Dict:
    return spaces.Dict({"image": CodeGrid((7, 7, 3), (11, 6, 3)),
                        "mission": spaces.Box(0, 255, (4,), np.uint8)})


def test_a_code_grid_under_model_kind_mlp_is_flattened_into_the_trunk():
    encoder = LeafEncoder(ObsLayout(_grid_space()), [16], "relu", kind="mlp")
    assert not encoder.images
    assert encoder.trunk.net[1].in_features == 3 * 11 * 7 * 7 + 4


def test_code_grid_declarations_are_checked():
    with pytest.raises(ValueError, match="levels"):
        CodeGrid((7, 7, 3), (11, 6))


def test_envpool_minigrid_declares_its_image_a_code_grid():
    from fastrl.envs.backends.envpool_backend import MINIGRID_LEVELS, make_envpool_vec_env

    env = make_envpool_vec_env("MiniGrid-MemoryS7-v0", 2, 2, 0)
    try:
        image = env.observation_space["image"]
        assert isinstance(image, CodeGrid) and image.levels == MINIGRID_LEVELS
        env.async_reset()
        obs = env.recv()[0]
        assert obs["image"].max() < max(MINIGRID_LEVELS)
    finally:
        env.close()


def test_a_code_grid_alone_is_read_one_hot_too():
    layout = ObsLayout(CodeGrid((7, 7, 3), (11, 6, 3)))
    assert layout.packed and [leaf.kind for leaf in layout.leaves] == ["codes"]
    image = np.full((1, 7, 7, 3), 2, np.uint8)
    floats = LeafEncoder(layout, [8], "relu").leaf_inputs(torch.as_tensor(layout.pack(image, 1)))
    assert floats["obs"].shape == (1, 33, 7, 7) and floats["obs"].sum().item() == 7 * 7 * 3


def test_a_code_grid_of_256_codes_declares_its_bounds():
    assert CodeGrid((2, 2, 1), (256,)).high.max() == 255


def test_image_preprocessing_leaves_a_code_grid_alone():
    from fastrl.envs.wrappers.image_preprocessing import _is_image

    assert not _is_image(CodeGrid((8, 8, 3), (11, 6, 3)))
    assert _is_image(spaces.Box(0, 255, (8, 8, 3), np.uint8))
