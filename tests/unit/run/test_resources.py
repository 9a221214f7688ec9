"""Resource checks: a run that cannot fit stops with the sizes and the fix, before any process starts."""
from collections import namedtuple

import pytest
import torch

from fastrl.cli import train_main
from fastrl.config import build_config
from fastrl.models.networks import build_model
from fastrl.run import preflight, resources
from fastrl.run.resources import ResourceError, check_memmap_dir, check_shared_memory, replay_ram_bytes
from fastrl.run.training import RunError, RunResult, train
from tests.e2e.test_cli_errors import one_line_error

Usage = namedtuple("Usage", "total used free")


def test_an_arena_larger_than_dev_shm_names_both_sizes_and_the_docker_fix(monkeypatch):
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda path: Usage(64 * 2**20, 0, 64 * 2**20))
    with pytest.raises(ResourceError, match=r"needs 910 MiB .* has 64 MiB free: .*--shm-size=2g.*envs_per_worker"):
        check_shared_memory(910 * 2**20, shm_dir="/")


def test_train_checks_dev_shm_before_starting_a_process(monkeypatch, tmp_path):
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda path: Usage(2**10, 0, 2**10))
    started = []
    monkeypatch.setattr("fastrl.run.training.run_parallel", lambda *a, **k: started.append(1))
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


class SixtyFourGiB:
    available = 64 * 2**30


def _train_refusing_starts(monkeypatch, args, build=build_model):
    """fastrl-train's exit code with ``args`` on a machine with 64 GiB available, the runs it
    started and, for every model the checks built (with ``build``), its parameters' device."""
    started, built = [], []
    monkeypatch.setattr("psutil.virtual_memory", lambda: SixtyFourGiB)
    for mode in ("parallel", "serial"):
        monkeypatch.setattr(f"fastrl.run.training.run_{mode}",
                            lambda plan, console, mode=mode: started.append(mode) or RunResult(plan.run_dir))

    def recorded_build(*a, **k):
        model = build(*a, **k)
        built.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(preflight, "build_model", recorded_build)
    return train_main(args), started, built


@pytest.mark.parametrize("setting", ["model.core_size=65536", "model.hidden_sizes=[65536,65536]"])
@pytest.mark.parametrize("serial", [False, True])
def test_a_model_too_large_for_ram_is_refused_in_one_line_before_it_is_built(tmp_path, capsys, monkeypatch, setting,
                                                                            serial):
    run_dir = tmp_path / "run"
    args = ["--profile", "cartpole-r2d2", "--set", setting, "--run-dir", str(run_dir),
            *(["--serial"] if serial else [])]
    code, started, built = _train_refusing_starts(monkeypatch, args)
    one_line_error(capsys, code, 2, "fastrl-train", "of RAM but only 64.00 GiB is available; lower model.hidden_sizes, "
                                                    "model.core_size or model.core_layers")
    assert built == ["meta"] and not started and not (run_dir / "config.toml").exists()


def test_an_allocation_that_fails_while_the_model_is_built_is_one_line(tmp_path, capsys, monkeypatch):
    def build_in_memory_fails(*args, **kwargs):
        if torch.get_default_device().type == "meta":
            return build_model(*args, **kwargs)
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)")

    code, started, _ = _train_refusing_starts(monkeypatch, ["--profile", "cartpole-r2d2", "--run-dir",
                                                            str(tmp_path / "run")], build_in_memory_fails)
    one_line_error(capsys, code, 2, "fastrl-train", "building the model ran out of memory ([enforce fail at "
                   "alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                   "68719476736 bytes. Error code 12 (Cannot allocate memory)) with 64.00 GiB available; lower "
                   "model.hidden_sizes, model.core_size or model.core_layers")
    assert not started
