"""The slot protocol: what a rollout worker writes into its trajectory slots."""
from collections import deque

import numpy as np
import pytest

from fastrl.config import build_config
from fastrl.envs import probe_env
from fastrl.ipc.arena import Arena
from fastrl.ipc.slots import worker_slot_ids
from fastrl.reporting.metrics import read_timings
from fastrl.run.training import arena_layout
from fastrl.sampling.rollout_worker import RolloutWorker, make_worker_env


def countdown_config(**overrides):
    settings = {"env.id": "fastrl.envs.toy:make_countdown", "env.kwargs": {"length": 5, "time_limit": 3},
                "env.num_workers": 1, "env.envs_per_worker": 4, "env.num_splits": 2, "learner.rollout": 4,
                "learner.batch_size": 16, "slots_per_env": 3, "learner.reward_scale": 1.0, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def run_worker(cfg, steps_per_env: int, choose=None, version=lambda step: 7):
    """Step one worker by hand (the batcher's part: action 0, or ``choose(obs)`` for the stored
    observations ``[len(ids), ...]`` of a request, and ``version(step)``, 7). Returns the arena and
    the full slots in the order they were emitted."""
    arena = Arena(arena_layout(cfg, probe_env(cfg), num_weights=1), shared=False)
    owned = worker_slot_ids(0, cfg.slots_per_worker)
    spare = deque(owned[cfg.env.envs_per_worker:].tolist())

    def take(n):
        return np.array([spare.popleft() for _ in range(n)], dtype=np.int32)

    full = []
    worker = RolloutWorker(0, cfg, arena, make_worker_env(cfg, 0), owned[:cfg.env.envs_per_worker], take,
                           lambda slots: full.extend(slots.tolist()))
    worker.start()
    for step in range(steps_per_env + 1):
        requests = []
        while worker.can_recv():
            requests.append(worker.recv_batch())
        for request in requests:
            ids = arena.request_envs[0, request]
            at = arena.env_slot[0, ids], arena.env_t[0, ids]
            arena.actions[at] = 0 if choose is None else choose(arena.obs[at])
            arena.version[at] = version(step)
            worker.act(request)
    worker.env.close()
    return arena, full


def test_slots_hold_obs_rewards_flags_and_autoreset_mask():
    cfg = countdown_config()
    arena, full = run_worker(cfg, steps_per_env=8)
    assert len(full) == 2 * cfg.env.envs_per_worker  # 8 steps = two slots of T=4 per env
    # Time limit 3: obs 0,1,2,3 (truncated on the step into 3), then the autoreset step back to 0.
    for slot in full:
        np.testing.assert_array_equal(arena.obs[slot, :, 0], [0, 1, 2, 3, 0])
        np.testing.assert_array_equal(arena.rewards[slot], [1, 1, 1, 0])
        np.testing.assert_array_equal(arena.truncated[slot], [0, 0, 1, 0])
        np.testing.assert_array_equal(arena.terminated[slot], [0, 0, 0, 0])
        np.testing.assert_array_equal(arena.valid[slot], [1, 1, 1, 0])
        np.testing.assert_array_equal(arena.version[slot], [7, 7, 7, 7])


def test_next_slot_starts_with_the_last_observation_and_episodes_are_counted():
    cfg = countdown_config(**{"env.kwargs": {"length": 3}, "learner.rollout": 5, "learner.batch_size": 20})
    arena, full = run_worker(cfg, steps_per_env=5)
    E = cfg.env.envs_per_worker
    assert len(full) == E
    for env in range(E):
        first = full[env]
        current = arena.env_slot[0, env]
        assert current != first
        np.testing.assert_array_equal(arena.obs[current, 0], arena.obs[first, -1])
    # Termination at 3: obs 0,1,2,3(terminal),0(reset),1
    np.testing.assert_array_equal(arena.obs[full[0], :, 0], [0, 1, 2, 3, 0, 1])
    np.testing.assert_array_equal(arena.terminated[full[0]], [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(arena.valid[full[0]], [1, 1, 1, 0, 1])
    assert arena.env_steps[0] == 5 * E
    assert arena.episode_count[0] == E
    np.testing.assert_array_equal(arena.episode_return[0, :E], 3.0)
    np.testing.assert_array_equal(arena.episode_length[0, :E], 3)


def test_worker_blocks_for_free_slots_instead_of_overwriting():
    cfg = countdown_config(**{"slots_per_env": 2})
    with pytest.raises(IndexError):  # the hand-made take() pops an empty deque: no third slot exists
        run_worker(cfg, steps_per_env=12)


def test_worker_times_its_env_steps_and_copies_under_their_report_keys():
    arena, _ = run_worker(countdown_config(), steps_per_env=8)
    timings = read_timings(arena)
    assert timings["rollout/env_step_s"] > 0 and timings["rollout/obs_copy_s"] > 0
    # Driven by hand, the worker never blocks, and no batcher ran.
    assert timings["rollout/wait_actions_s"] == timings["rollout/wait_slots_s"] == 0
    assert all(value == 0 for key, value in timings.items() if key.startswith("inference/"))
