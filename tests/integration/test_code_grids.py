"""The tests of tests/unit/kernels/test_code_grids.py's subject that train in this process."""
import numpy as np
import torch

from fastrl.envs.spaces import ObsLayout
from fastrl.models.encoders import LeafEncoder
from tests.unit.kernels.test_code_grids import _grid_space


def test_a_code_grid_reaches_the_network_one_hot_and_bytes_scaled():
    layout = ObsLayout(_grid_space())
    kinds = {leaf.name: (leaf.kind, leaf.size) for leaf in layout.leaves}
    assert kinds == {"image": ("codes", 11), "mission": ("bytes", 0)}
    encoder = LeafEncoder(layout, [16], "relu")
    image = np.zeros((2, 7, 7, 3), np.uint8)
    image[0, 2, 3] = (5, 1, 0)  # a key
    image[1, 2, 3] = (6, 1, 0)  # a ball
    mission = np.array([[255, 0, 51, 102]] * 2, np.uint8)
    rows = torch.as_tensor(layout.pack({"image": image, "mission": mission}, 2))
    floats = encoder.leaf_inputs(rows)
    grid = floats["image"]
    assert grid.shape == (2, 3 * 11, 7, 7)
    # channel c's code k is input channel c * 11 + k
    assert grid[0, 5, 2, 3] == 1 and grid[0, 6, 2, 3] == 0
    assert grid[1, 5, 2, 3] == 0 and grid[1, 6, 2, 3] == 1
    assert grid[:, 11 + 1, 2, 3].tolist() == [1, 1] and grid[:, 22, 2, 3].tolist() == [1, 1]
    assert grid.sum().item() == 2 * 7 * 7 * 3  # one code per channel of every cell
    assert torch.allclose(floats["mission"], torch.tensor([[1.0, 0.0, 0.2, 0.4]] * 2))
    # The trunk after a CNN is one ReLU layer of its width (model.image_trunk), not the [16] MLP.
    assert encoder(rows).shape == (2, next(iter(encoder.images.values())).out_features)
