"""The learner's batch gather: staging buffers filled straight from the arena, and the device
path's pipeline (each batch gathered while the previous one trains), run on the CPU."""
import threading

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.ipc.arena import Arena, trajectory_layout
from fastrl.learner import LearnerRuntime, VTraceLearner
from fastrl.learner.staging import BatchStaging, gather_trajectories
from fastrl.models.networks import num_state_values
from tests.support.device_copies import DeviceCopies

T, NUM_SLOTS, B = 5, 12, 4
OBS = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def random_arena(state_size=0, seed=0):
    """An arena whose trajectory arrays hold random data (flags 0/1)."""
    layout = trajectory_layout(num_slots=NUM_SLOTS, rollout=T, obs_shape=(4,), obs_dtype=np.float32, action_shape=(),
                               action_dtype=np.int64, num_workers=1, envs_per_worker=4, num_splits=1,
                               num_weights=num_state_values(VTraceLearner(build_config("cartpole-appo"), OBS,
                                                                     gymnasium.spaces.Discrete(2)).model),
                               state_size=state_size)
    arena = Arena(layout, shared=False)
    rng = np.random.default_rng(seed)
    for name in ("obs", "actions", "behaviour_logp", "rewards", "terminated", "truncated", "valid", "version",
                 "slot_env", "slot_fresh", *(["slot_state"] if state_size else [])):
        array = arena.arrays[name]
        high = 2 if array.dtype == np.uint8 or name == "actions" else 50
        array[...] = rng.integers(0, high, array.shape) if array.dtype.kind in "iu" else rng.normal(size=array.shape)
    return arena


def reference_gather(arena, slot_ids):
    """The gather as a broadcast fancy index, field by field (time-major)."""
    slots, steps = np.asarray(slot_ids)[None, :], np.arange(T + 1)[:, None]
    expect = {name: arena.arrays[name][slots, steps[:T + (name == "obs")]]
              for name in ("obs", "actions", "behaviour_logp", "rewards", "version")}
    expect.update({name: arena.arrays[name][slots, steps[:T]].astype(bool)
                   for name in ("terminated", "truncated", "valid")})
    if "slot_state" in arena.arrays:
        expect["initial_state"] = arena.slot_state[np.asarray(slot_ids)]
    return expect


def assert_batch_is(batch, expect):
    for name, values in expect.items():
        got = getattr(batch, name).numpy()
        assert got.dtype == values.dtype, name
        np.testing.assert_array_equal(got, values, err_msg=name)


@pytest.mark.parametrize("state_size", [0, 3])
def test_staging_gathers_what_fancy_indexing_does_into_the_same_buffers(state_size):
    arena = random_arena(state_size)
    staging = BatchStaging(arena, B)
    first = staging.gather(np.array([7, 0, 11, 3]))
    assert_batch_is(first, reference_gather(arena, [7, 0, 11, 3]))
    pointers = [getattr(first, name).data_ptr() for name in ("obs", "rewards", "valid")]
    second = staging.gather(np.array([2, 2, 9, 5]))
    assert_batch_is(second, reference_gather(arena, [2, 2, 9, 5]))
    assert [getattr(second, name).data_ptr() for name in ("obs", "rewards", "valid")] == pointers
    assert_batch_is(gather_trajectories(arena, [1, 4]), reference_gather(arena, [1, 4]))
    with pytest.raises(IndexError, match="slot ids"):
        staging.gather(np.array([0, 1, 2, NUM_SLOTS]))


@pytest.mark.parametrize("device_path", [False, True])
def test_each_batch_is_trained_once_as_gathered_its_slots_released_first(device_path):
    """The CPU trains each batch in its own call; the device path (forced here) trains it one
    call later, gathered on a background thread meanwhile, and its copy to the device is one
    copy per field."""
    torch.manual_seed(0)
    arena = random_arena()
    cfg = build_config("cartpole-appo", {"learner.rollout": T, "learner.batch_size": T * B})
    learner = VTraceLearner(cfg, OBS, gymnasium.spaces.Discrete(2), device_path=device_path)
    host = LearnerRuntime(cfg, arena, learner)
    trained, released, gather_threads = [], [], []
    train = learner.train

    def spy(batch, progress, env_ids, fresh):
        assert_batch_is(batch, reference_gather(arena, env_ids))  # not refilled before it is trained on
        trained.append((batch, fresh.copy()))
        with DeviceCopies() as counter:
            batch.to(torch.device("meta"))
        assert len(counter.shapes) == 8  # one per field
        return train(batch, progress, env_ids=env_ids, fresh=fresh)

    gather = BatchStaging.gather

    def record_thread(staging, slot_ids):
        gather_threads.append(threading.current_thread() is threading.main_thread())
        return gather(staging, slot_ids)

    learner.train = spy
    BatchStaging.gather = record_thread
    try:
        arena.slot_env[:] = np.arange(NUM_SLOTS)  # env ids name the slots: the spy can check its batch
        batches = [np.array(ids) for ids in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [3, 1, 7, 5])]
        for k, slot_ids in enumerate(batches):
            stats = host.train_on(slot_ids, released.append)
            assert released[-1] is slot_ids
            assert len(trained) == k + (not device_path) and (stats == {}) == (len(trained) == 0)
            if trained:
                np.testing.assert_array_equal(trained[-1][1], arena.slot_fresh[batches[len(trained) - 1]].astype(bool))
    finally:
        BatchStaging.gather = gather
    assert gather_threads == [not device_path] * len(batches)
    # Two staging sets in turn: batch k reuses batch k - 2's buffers.
    pointers = [batch.obs.data_ptr() for batch, _ in trained]
    assert pointers[0] != pointers[1] and pointers[2:] == pointers[:-2]
    assert host.trained_env_steps == len(trained) * T * B
    assert host.holds_batch() == device_path  # the learner waits as one that has caught up only without it
    host.flush()  # the run's end: the device path's last batch is trained on, not dropped
    assert len(trained) == len(batches) and host.trained_env_steps == len(batches) * T * B
    assert not host.holds_batch()
    assert host.flush() == {}
