"""V-trace replay with a recurrent core: every replayed trajectory comes back with the state its
first step was acted with, and the learner trains on the mixed batch."""
import math

import gymnasium
import numpy as np
import torch

from fastrl.config import build_config
from fastrl.learner import Trajectories, VTraceLearner

OBS_SPACE = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = gymnasium.spaces.Discrete(2)
T, E = 8, 4


def test_replayed_trajectories_carry_their_stored_initial_states():
    cfg = build_config("cartpole-appo", {
        "replay.vtrace_fraction": 0.5, "replay.capacity": 64 * E, "replay.min_fill": 2 * T * E,
        "env.num_workers": 1, "env.envs_per_worker": E, "env.num_splits": 1, "learner.rollout": T,
        "learner.batch_size": T * E, "model.core": "gru", "model.core_size": 8})
    learner = VTraceLearner(cfg, OBS_SPACE, ACTION_SPACE)
    S = learner.model.state_size
    outputs = []
    original = learner.with_replayed
    learner.with_replayed = (lambda batch, env_ids, fresh=None:
                             outputs.append(original(batch, env_ids, fresh)) or outputs[-1])
    g = torch.Generator().manual_seed(0)
    first_obs_to_state = {}
    for k in range(5):
        obs = torch.randn(T + 1, E, 4, generator=g)
        state = torch.randn(E, S, generator=g)
        for b in range(E):
            first_obs_to_state[float(obs[0, b, 0])] = state[b]
        batch = Trajectories(obs=obs, actions=torch.randint(0, 2, (T, E), generator=g),
                             behaviour_logp=torch.full((T, E), -0.7),
                             rewards=torch.randn(T, E, generator=g), terminated=torch.zeros(T, E, dtype=torch.bool),
                             truncated=torch.zeros(T, E, dtype=torch.bool), valid=torch.ones(T, E, dtype=torch.bool),
                             version=torch.full((T, E), k, dtype=torch.int64), initial_state=state)
        stats = learner.train(batch, env_ids=np.arange(E))
        assert math.isfinite(stats["loss"])
    out = outputs[-1]
    assert out.rewards.shape[1] > E and out.initial_state.shape == (out.rewards.shape[1], S)
    for b in range(E, out.rewards.shape[1]):  # each replayed column: the state of its own slot
        torch.testing.assert_close(out.initial_state[b], first_obs_to_state[float(out.obs[0, b, 0])])
