"""The slot protocol (fastrl.ipc.slots): the request byte, the free and full queues in one process, and
the same protocol over the pipes of a run."""
import threading
import time
from multiprocessing import Pipe

import numpy as np
import pytest

from fastrl.config import ConfigError, build_config
from fastrl.ipc.arena import Arena, Control, learner_caught_up, trajectory_layout
from fastrl.ipc.child import ProcessExit, WorkerChannels
from fastrl.ipc.slots import (
    MAX_SPLITS,
    NOT_THIS_GENERATION,
    REQUEST_VALUES,
    RequestCodec,
    SlotsExhausted,
    WorkerSlots,
    request_ids,
    serial_slots,
    worker_slot_ids,
)
from fastrl.learner.process import FullSlots
from fastrl.reporting.timers import Timers
from fastrl.sampling.rollout_worker import worker_slots

WORKERS, ENVS, SLOTS_PER_ENV = 2, 2, 3
PER_WORKER = ENVS * SLOTS_PER_ENV


def small_arena() -> Arena:
    return Arena(trajectory_layout(num_slots=WORKERS * PER_WORKER, rollout=4, obs_shape=(1,), obs_dtype=np.float32,
                                   action_shape=(), action_dtype=np.int64, num_workers=WORKERS,
                                   envs_per_worker=ENVS, num_splits=1, num_weights=1), shared=False)


def test_every_request_of_every_generation_is_one_byte_read_back_as_itself():
    for splits in range(1, MAX_SPLITS + 1):
        tags = REQUEST_VALUES // splits
        assert tags >= 2
        seen = set()
        for generation in range(tags + 1):  # the last one wraps around to the first tag
            codec = RequestCodec(splits, generation)
            successor = RequestCodec(splits, generation + 1)
            assert codec.tag == generation % tags != successor.tag
            for request, message in enumerate(codec.messages):
                assert len(message) == 1
                value = message[0]
                assert request_ids(np.array([value]), splits).tolist() == [request]  # the batcher's reading
                assert codec.requests[value] == request
                assert successor.requests[value] == NOT_THIS_GENERATION  # a reply meant for the predecessor
                seen.add((generation % tags, value))
        assert len({value for _, value in seen}) == tags * splits  # no two (tag, request) share a byte
        assert sum(r != NOT_THIS_GENERATION for r in RequestCodec(splits).requests) == splits


@pytest.mark.parametrize("splits", [0, -1, MAX_SPLITS + 1, REQUEST_VALUES])
def test_a_split_count_one_byte_cannot_carry_is_refused(splits):
    with pytest.raises(ValueError, match=rf"num_splits must be in \[1, {MAX_SPLITS}\]"):
        RequestCodec(splits)


def test_the_config_allows_the_split_counts_the_encoding_allows():
    envs = 2 * MAX_SPLITS
    build_config("cartpole-appo", {"env.envs_per_worker": envs, "env.num_splits": MAX_SPLITS})
    with pytest.raises(ConfigError, match=rf"'env.num_splits' must be in \[1, {MAX_SPLITS}\]"):
        build_config("cartpole-appo", {"env.envs_per_worker": envs, "env.num_splits": MAX_SPLITS + 1})


def test_serial_take_emit_release_keep_every_free_queue_exact():
    arena = small_arena()
    waits = np.zeros((WORKERS, 1))
    workers, full = serial_slots(arena, WORKERS, PER_WORKER, batch_size=3, wait_seconds=lambda w: waits[w])
    assert [list(s.spare) for s in workers] == [worker_slot_ids(w, PER_WORKER).tolist() for w in range(WORKERS)]
    first = [s.take(ENVS) for s in workers]
    assert first[0].dtype == np.int32 and [f.tolist() for f in first] == [[0, 1], [6, 7]]
    assert [list(s.spare) for s in workers] == [[2, 3, 4, 5], [8, 9, 10, 11]]

    workers[1].emit(np.array([7], np.int32))
    workers[0].emit(np.array([1, 0], np.int32))
    assert arena.slot_queued.nonzero()[0].tolist() == [0, 1, 7]
    assert workers[0].take(2).tolist() == [2, 3] and workers[1].take(1).tolist() == [8]

    policy, batch = full.next_batch()
    assert policy == 0 and batch.dtype == np.int64 and batch.tolist() == [7, 1, 0]  # arrival order
    assert full.next_batch() is None
    full.release(batch)
    assert not arena.slot_queued.any()
    # Back at the end of each owner's queue, in the order the batch held them.
    assert [list(s.spare) for s in workers] == [[4, 5, 1, 0], [9, 10, 11, 7]]
    assert sorted([*workers[0].spare, *workers[0].held - set(workers[0].spare)]) == list(range(PER_WORKER))
    assert waits.min() > 0  # take adds its seconds to the worker's timing element

    workers[0].take(4)
    with pytest.raises(SlotsExhausted, match="raise slots_per_env"):
        workers[0].take(1)


def test_a_restarted_worker_takes_back_its_unqueued_slots_and_holds_each_once():
    arena = small_arena()
    arena.slot_queued[[1, 4, 7]] = 1  # 1 and 4 wait for the learner; 7 is another worker's
    returns = []
    slots = WorkerSlots(arena, worker_slot_ids(0, PER_WORKER), send_full=None,
                        receive=lambda s, block: s.returned(returns.pop()) if returns else None,
                        wait_seconds=np.zeros(1))
    assert list(slots.spare) == [0, 2, 3, 5]
    returns.append(np.array([4, 2, 1], np.int32))  # 2 came back both ways: reclaimed and released
    assert slots.take(6).tolist() == [0, 2, 3, 5, 4, 1]


def test_slots_go_round_over_the_pipes_of_a_run():
    """A worker's WorkerSlots and the learner's FullSlots joined by pipes, as rollout_process and
    learner_process join them: full slots reach the learner a batch at a time and come back to their
    owner's free queue, where a worker that waits for one gets it."""
    cfg = build_config("cartpole-appo", {"env.num_workers": WORKERS, "env.envs_per_worker": ENVS,
                                         "slots_per_env": SLOTS_PER_ENV, "learner.rollout": 4,
                                         "learner.batch_size": 8})
    arena = small_arena()
    full = [Pipe(duplex=False) for _ in range(WORKERS)]
    free = [Pipe(duplex=False) for _ in range(WORKERS)]
    learner = FullSlots(cfg, arena, ([r for r, _ in full], [w for _, w in free]), Timers("wait_s"))
    workers = [worker_slots(cfg, arena, w, WorkerChannels(None, None, full[w][1], free[w][0]))
               for w in range(WORKERS)]
    assert workers[1].take(PER_WORKER).tolist() == list(range(PER_WORKER, 2 * PER_WORKER))
    workers[1].emit(np.array([8, 6], np.int32))
    assert arena.slot_queued.nonzero()[0].tolist() == [6, 8]
    policy, batch = learner.next_batch()
    assert policy == 0 and batch.tolist() == [8, 6]
    learner.release(batch)
    assert not arena.slot_queued.any()
    assert workers[1].take(2).tolist() == [8, 6]  # it had none spare: the release came through its free pipe
    assert workers[0].take(PER_WORKER).tolist() == list(range(PER_WORKER))  # nothing of worker 1's came to 0


def slots_config():
    return build_config("cartpole-appo", {"env.num_workers": WORKERS, "env.envs_per_worker": ENVS,
                                          "slots_per_env": SLOTS_PER_ENV, "learner.rollout": 4,
                                          "learner.batch_size": 8})


def learner_and_worker(worker_id: int):
    """The learner's FullSlots and worker ``worker_id``'s WorkerSlots over pipes, as in a run."""
    cfg = slots_config()
    arena = small_arena()
    full = [Pipe(duplex=False) for _ in range(WORKERS)]
    free = [Pipe(duplex=False) for _ in range(WORKERS)]
    learner = FullSlots(cfg, arena, ([r for r, _ in full], [w for _, w in free]), Timers("wait_s"))
    worker = worker_slots(cfg, arena, worker_id, WorkerChannels(None, None, full[worker_id][1], free[worker_id][0]))
    return arena, learner, worker, (full, free)  # every end kept open: a closed one reads as EOF


class WatchedPipes:
    """The learner's pipes, recording at each wait whether the runner would find it caught up."""

    def __init__(self, arena, pipes):
        self.arena, self.pipes, self.seen = arena, pipes, []

    def wait(self, control):
        self.seen.append(learner_caught_up(self.arena))
        return self.pipes.ready()

    def ready(self):
        return self.pipes.ready()


def test_the_learner_is_caught_up_only_while_it_waits_holding_every_emitted_slot():
    """What the runner waits for past the step budget (fastrl.run.parallel): the learner blocked for
    more full slots, with none left in a pipe and no batch held untrained."""
    arena, learner, worker, _pipes = learner_and_worker(1)
    learner.pipes = watched = WatchedPipes(arena, learner.pipes)
    worker.take(PER_WORKER)
    worker.emit(np.array([8], np.int32))
    assert not learner_caught_up(arena)  # not waiting
    assert learner.next_batch() is None  # waited while slot 8 was in the pipe, took it in: half a batch
    assert learner.next_batch() is None  # waited holding every emitted slot
    assert learner.next_batch(idle=False) is None  # waited holding a batch it has not trained on
    worker.emit(np.array([6], np.int32))
    assert learner.next_batch()[1].tolist() == [8, 6]  # waited while slot 6 was in the pipe
    assert watched.seen == [False, True, False, False]
    assert not learner_caught_up(arena) and arena.control[Control.LEARNER_IDLE_QUEUED] == 0
    assert arena.control[Control.LEARNER_SLOTS_IN] == 2 and arena.control[Control.LEARNER_WAITS] == 4


def wait_for(condition, stop_control, seconds: float = 10.0) -> None:
    """Poll ``condition`` from a helper thread; past ``seconds`` stop the worker (so that the test
    fails on its asserts instead of hanging)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            stop_control[Control.STOP] = 1
            return
        time.sleep(0.01)


def test_a_worker_waiting_for_a_free_slot_past_the_budget_parks_and_takes_releases_until_the_stop():
    """Its slots may all sit in the learner's unfinished batch: no release would ever come."""
    arena, learner, worker, _pipes = learner_and_worker(1)
    arena.control[Control.BUDGET_ENV_STEPS] = 100
    worker.take(PER_WORKER)
    worker.emit(np.array([6, 7], np.int32))
    arena.env_steps[0] = 100

    def release_then_stop():
        wait_for(lambda: arena.worker_parked[1], arena.control)
        learner.receive()
        learner.release(np.array([6], np.int64))  # a release while parked is taken in, not left in the pipe
        wait_for(lambda: 6 in worker.spare, arena.control)
        arena.control[Control.STOP] = 1

    stopper = threading.Thread(target=release_then_stop)
    stopper.start()
    with pytest.raises(ProcessExit):
        worker.take(1)
    stopper.join()
    assert arena.worker_parked.tolist() == [0, 1] and list(worker.spare) == [6]
    restarted = Pipe(duplex=False)
    worker_slots(slots_config(), arena, 1, WorkerChannels(None, None, None, restarted[0]))
    assert arena.worker_parked[1] == 0  # a restarted worker steps again until it sees the budget itself


def test_a_worker_waiting_for_a_free_slot_before_the_budget_keeps_waiting():
    arena, learner, worker, _pipes = learner_and_worker(1)
    arena.control[Control.BUDGET_ENV_STEPS] = 100
    arena.env_steps[0] = 99
    worker.take(PER_WORKER)
    worker.emit(np.array([6], np.int32))

    took = threading.Event()

    def release_after_a_timed_out_wait():
        time.sleep(0.8)  # past one of the worker's 0.5 s waits
        learner.receive()
        learner.release(np.array([6], np.int64))
        wait_for(took.is_set, arena.control)  # a parked worker would wait for the stop

    releaser = threading.Thread(target=release_after_a_timed_out_wait)
    releaser.start()
    try:
        assert worker.take(1).tolist() == [6]
    finally:
        took.set()
        releaser.join()
    assert not arena.worker_parked.any()
