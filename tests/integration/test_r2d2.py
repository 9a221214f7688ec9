"""The tests of tests/unit/learner/test_r2d2.py's subject that train in this process."""
import numpy as np
import torch

from fastrl.learner import make_learner
from tests.unit.learner.test_r2d2 import ACTION_SPACE, OBS_SPACE, r2d2_config, state_batch


def test_the_training_loop_adds_sequences_with_states_and_takes_gradient_steps():
    cfg = r2d2_config(**{"replay.replay_ratio": 4.0})
    learner = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    T, B = cfg.learner.rollout, 4
    g = torch.Generator().manual_seed(0)
    before = [p.detach().clone() for p in learner.model.parameters()]
    for _ in range(6):
        batch = state_batch(T, B, learner.model.state_size, g, rewards=torch.ones(T, B))
        stats = learner.train(batch, env_ids=np.arange(B))
    assert stats["replay_size"] == 6 * T * B and learner.updates > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
