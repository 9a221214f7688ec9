"""The learner process's pieces: the timings every learner reports under the metrics' names."""
import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.learner import Learner, LearnerHost
from fastrl.metrics import read_learner_stats
from tests.test_dqn import make_dqn, stream_batches
from tests.test_learner import random_batch
from tests.test_learner_gather import B, OBS, random_arena


def test_every_learner_times_its_phases_under_the_metrics_names():
    torch.manual_seed(0)
    appo = Learner(build_config("cartpole-appo"), OBS, gymnasium.spaces.Discrete(2))
    appo.train(random_batch())
    timed = appo.timers.read()
    assert set(timed) == {"forward_backward_s", "vtrace_s", "optimizer_s"} and all(timed.values())

    dqn = make_dqn()
    for batch, env_ids in stream_batches(3):
        dqn.train(batch, env_ids=env_ids)
    assert dqn.updates > 0
    timed = dqn.timers.read()
    assert timed["vtrace_s"] == 0.0 and all(timed[name] > 0 for name in ("forward_backward_s", "optimizer_s",
                                                                          "replay_s"))


def test_the_host_writes_the_learners_timings_and_its_own_into_the_arena():
    arena = random_arena()
    cfg = build_config("cartpole-appo", {"learner.rollout": 5, "learner.batch_size": 5 * B})
    host = LearnerHost(cfg, arena, Learner(cfg, OBS, gymnasium.spaces.Discrete(2)))
    stats = host.train_on(np.array([0, 3, 6, 9]), lambda ids: None)
    written = read_learner_stats(arena)
    for name in ("forward_backward_s", "vtrace_s", "optimizer_s", "gather_s", "publish_s"):
        assert stats[name] > 0 and written[name] == pytest.approx(stats[name]), name
    assert stats["wait_s"] == written["wait_s"] == 0.0  # the process's wait, not timed here
