"""Spaces taken exactly as declared: inside fastrl every action and observation is flat and
zero-based (fastrl.envs.spaces), and the env gets its actions in the declared shape, dtype and
``start``. The toy envs of tests/support/space_envs.py raise on any other action, so the runs below show
that none reaches an env from the workers (batcher, in-worker and serial acting), DQN / R2D2's
epsilon-greedy or fastrl-eval; the learner trains on the stored rows and the checkpoint evaluates."""

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.envs.spaces import ActionLayout, ObsLayout
from fastrl.models.heads import action_head
from tests.support.space_envs import ACTION_SPACES, IllegalAction, check_exactly
from tests.unit.envs.test_spaces import one_torch_thread  # noqa: F401  (autouse: the serial runs train on one thread here)

# ---------------------------------------------------------------- the two conversions


def test_discrete_observations_are_stored_less_their_start():
    discrete = ObsLayout(spaces.Discrete(3, start=-1))
    rows = discrete.pack(np.array([-1, 0, 1, 0]), 4)
    assert discrete.unpack(torch.from_numpy(rows))["obs"].tolist() == [0, 1, 2, 1]
    components = ObsLayout(spaces.Dict({"keys": spaces.MultiDiscrete([[3, 2], [2, 4]], start=[[-1, 0], [5, -2]])}))
    rows = components.pack({"keys": np.array([[[-1, 1], [6, 1]], [[1, 0], [5, -2]]])}, 2)
    leaves = components.unpack(torch.from_numpy(rows))
    assert [leaves[f"keys[{i}]"].tolist() for i in range(4)] == [[0, 2], [1, 0], [1, 0], [3, 0]]


@pytest.mark.parametrize("kind", list(ACTION_SPACES))
def test_stored_actions_are_flat_and_zero_based_and_reach_the_env_as_declared(kind):
    torch.manual_seed(0)
    space = ACTION_SPACES[kind]()
    layout = ActionLayout(space)
    width = sum(part.action_slice.stop - part.action_slice.start for part in layout.parts)
    assert layout.shape == (() if isinstance(space, spaces.Discrete) else (width,))
    # What the heads sample (and the learner, the replay and the checkpoints hold): flat rows, each
    # categorical part in 0..n-1.
    stored = action_head(space).sample(3.0 * torch.randn(512, layout.num_params)).numpy()
    assert stored.shape == (512, *layout.shape)
    rows = stored.reshape(512, -1)
    for part in layout.parts:
        if part.kind == "categorical":
            assert set(np.unique(rows[:, part.action_slice])) == set(range(part.n))
    # What the env gets: every row a value of the space, in its declared shape and dtype.
    for_env = layout.to_env(stored)
    for action in (zip(*for_env) if isinstance(space, spaces.Tuple) else for_env):
        check_exactly(space, action)
    # The space's own values are stored and converted back exactly.
    space.seed(0)
    samples = [space.sample() for _ in range(64)]
    encoded = np.stack([layout.encode(a) for a in samples])
    assert encoded.shape == (64, *layout.shape) and encoded.dtype == layout.dtype
    round_trip = layout.to_env(encoded)
    for i, sample in enumerate(samples):
        if isinstance(space, spaces.Tuple):
            for want, got in zip(sample, round_trip):
                np.testing.assert_array_equal(got[i], want)
        else:
            np.testing.assert_array_equal(round_trip[i], sample)


def test_the_strict_env_refuses_what_fastrl_used_to_send():
    with pytest.raises(IllegalAction):
        check_exactly(spaces.Discrete(3, start=-1), np.int64(2))
    with pytest.raises(IllegalAction):
        check_exactly(spaces.MultiBinary((2, 3)), np.zeros(6, np.int8))
    with pytest.raises(IllegalAction):
        check_exactly(spaces.Box(-1, 1, (2, 3), np.float32), np.zeros((2, 3), np.float64))


# ---------------------------------------------------------------- end to end
