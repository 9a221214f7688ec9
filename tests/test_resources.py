"""Resource checks: a run that cannot fit stops with the sizes and the fix, before any process starts."""
from collections import namedtuple

import pytest

from fastrl import resources
from fastrl.config import build_config
from fastrl.resources import ResourceError, check_memmap_dir, check_shared_memory, replay_ram_bytes
from fastrl.runner import RunError, train

Usage = namedtuple("Usage", "total used free")


def test_an_arena_larger_than_dev_shm_names_both_sizes_and_the_docker_fix(monkeypatch):
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda path: Usage(64 * 2**20, 0, 64 * 2**20))
    with pytest.raises(ResourceError, match=r"needs 910 MiB .* has 64 MiB free: .*--shm-size=2g.*envs_per_worker"):
        check_shared_memory(910 * 2**20, shm_dir="/")


def test_train_checks_dev_shm_before_starting_a_process(monkeypatch, tmp_path):
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda path: Usage(2**10, 0, 2**10))
    started = []
    monkeypatch.setattr("fastrl.runner.run_parallel", lambda *a, **k: started.append(1))
    cfg = build_config("cartpole-appo", {"device": "cpu", "env.num_workers": 1, "env.envs_per_worker": 64,
                                              "learner.batch_size": 2048})
    with pytest.raises(RunError, match="shared memory"):
        train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert not started and not (tmp_path / "run" / "config.toml").exists()


def test_the_replay_counts_against_ram_unless_compressed_or_memory_mapped():
    import gymnasium as gym
    import numpy as np

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    n = 100_000
    cfg = build_config("atari-apex", {"replay.capacity": n})
    overhead = n * resources.REPLAY_RECORD_OVERHEAD_BYTES
    assert replay_ram_bytes(cfg, space) == n * 84 * 84 + overhead  # one frame per record, stacks rebuilt
    cfg.replay.compress = "lz4"
    assert replay_ram_bytes(cfg, space) == overhead
    assert replay_ram_bytes(build_config("cartpole-appo"), space) == 0  # no replay


def test_a_replay_larger_than_ram_names_the_replay_fix(monkeypatch):
    class Memory:
        available = 2**30

    monkeypatch.setattr("psutil.virtual_memory", lambda: Memory)
    with pytest.raises(ResourceError, match=r"replay 6\.00 GiB .* replay\.compress=lz4 or replay\.memmap_dir"):
        resources.check_memory(2**20, 6 * 2**30)


def test_memmap_dir_must_exist_and_have_room(tmp_path, monkeypatch):
    with pytest.raises(ResourceError, match="is not a directory"):
        check_memmap_dir(str(tmp_path / "missing"), 10)
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda path: Usage(2**30, 0, 2**20))
    with pytest.raises(ResourceError, match=r"need 2\.00 GiB .* has 1 MiB free"):
        check_memmap_dir(str(tmp_path), 2 * 2**30)
