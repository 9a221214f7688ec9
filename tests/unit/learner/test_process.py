"""The learner process's pieces: full slots taken a batch at a time and handed back to their
workers, and the timings every learner reports under the metrics' names."""
from multiprocessing import Pipe

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.ipc.arena import Arena, Control, trajectory_layout
from fastrl.ipc.child import ProcessExit
from fastrl.learner import LearnerRuntime, VTraceLearner
from fastrl.learner.process import FullSlots
from fastrl.reporting.metrics import read_learner_stats
from fastrl.reporting.timers import Timers
from tests.support.small_learners import make_dqn, stream_batches
from tests.unit.learner.test_staging import OBS, B, random_arena
from tests.unit.learner.test_vtrace_learner import random_batch


def two_workers():
    """FullSlots for 2 workers owning 4 slots each, 3 slots a batch; the workers' pipe ends."""
    cfg = build_config("cartpole-appo", {"env.num_workers": 2, "env.envs_per_worker": 2, "slots_per_env": 2,
                                         "learner.rollout": 4, "learner.batch_size": 12})
    arena = Arena(trajectory_layout(num_slots=8, rollout=4, obs_shape=(4,), obs_dtype=np.float32, action_shape=(),
                                    action_dtype=np.int64, num_workers=2, envs_per_worker=2, num_splits=1,
                                    num_weights=1), shared=False)
    full = [Pipe(duplex=False) for _ in range(2)]
    free = [Pipe(duplex=False) for _ in range(2)]
    slots = FullSlots(cfg, arena, ([r for r, _ in full], [w for _, w in free]), Timers("wait_s"))
    return slots, arena, [w for _, w in full], [r for r, _ in free]


def send(pipe, ids):
    pipe.send_bytes(np.array(ids, dtype=np.int32).tobytes())


def test_full_slots_come_a_batch_at_a_time_oldest_first_and_go_back_to_their_owners():
    slots, arena, workers_full, workers_free = two_workers()
    send(workers_full[0], [0, 1])
    assert slots.next_batch() is None  # two queued: short of a batch, and nothing more came
    send(workers_full[1], [4, 5])
    send(workers_full[0], [2])
    policy, batch = slots.next_batch()
    assert policy == 0 and batch.dtype == np.int64
    assert batch[:2].tolist() == [0, 1] and set(batch[2:].tolist()) <= {2, 4, 5}
    assert slots.next_batch() is None  # two left: the call waited out the pipes' timeout for more
    assert slots.timers.read()["wait_s"] >= 0.4
    send(workers_full[1], [6])
    _, second = slots.next_batch()
    assert second[-1] == 6 and sorted([*batch, *second]) == [0, 1, 2, 4, 5, 6]

    arena.slot_queued[:] = 1
    slots.release(np.array([5, 0, 4, 1], dtype=np.int64))
    assert arena.slot_queued.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert np.frombuffer(workers_free[0].recv_bytes(), np.int32).tolist() == [0, 1]
    assert np.frombuffer(workers_free[1].recv_bytes(), np.int32).tolist() == [5, 4]
    assert not workers_free[0].poll() and not workers_free[1].poll()


def test_waiting_for_full_slots_ends_when_the_run_stops():
    slots, arena, workers_full, _ = two_workers()
    send(workers_full[1], [4])
    arena.control[Control.STOP] = 1
    with pytest.raises(ProcessExit):
        slots.next_batch()


def test_every_learner_times_its_phases_under_the_metrics_names():
    torch.manual_seed(0)
    appo = VTraceLearner(build_config("cartpole-appo"), OBS, gymnasium.spaces.Discrete(2))
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
    host = LearnerRuntime(cfg, arena, VTraceLearner(cfg, OBS, gymnasium.spaces.Discrete(2)))
    stats = host.train_on(np.array([0, 3, 6, 9]), lambda ids: None)
    written = read_learner_stats(arena)
    for name in ("forward_backward_s", "vtrace_s", "optimizer_s", "gather_s", "publish_s"):
        assert stats[name] > 0 and written[name] == pytest.approx(stats[name]), name
    assert stats["wait_s"] == written["wait_s"] == 0.0  # the process's wait, not timed here
