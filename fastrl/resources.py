"""Checks that the machine can hold a run, made before any process starts.

Without them a run that does not fit dies late and mutely: an arena larger than /dev/shm (a
container's default is 64 MiB; ``atari-appo`` needs ~910 MiB) kills the first process that
touches the missing pages with SIGBUS, and a replay larger than RAM is killed by the OOM killer
minutes in.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import psutil

from .config import Q_LEARNERS, Config
from .shm import SHM_DIR
from .spaces import ObsLayout

# Per replay record besides its frame: action, reward, flags, generation, arrival priority and
# the sum tree's two float64 nodes (fastrl.replay).
REPLAY_RECORD_OVERHEAD_BYTES = 48
# Share of the available RAM a run may plan to take: the OS, the page cache and torch need the rest.
RAM_SHARE = 0.8


class ResourceError(RuntimeError):
    """The machine cannot hold the run as configured; the message gives the sizes and the fix."""


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def uses_replay(cfg: Config) -> bool:
    return cfg.learner.algo in Q_LEARNERS or cfg.replay.vtrace_fraction > 0


def replay_frame_bytes(cfg: Config, observation_space) -> int:
    """Bytes of the replay's uncompressed frames: one frame per record (stacks are rebuilt at
    sample time, so a stacked observation stores only its newest frame)."""
    layout = ObsLayout(observation_space)
    shape = layout.storage_shape
    if cfg.replay.frame_stack > 1:
        shape = shape[1:]
    itemsize = layout.storage_dtype.itemsize
    return cfg.replay.capacity * int(np.prod(shape, dtype=np.int64)) * itemsize


def replay_ram_bytes(cfg: Config, observation_space) -> int:
    """The replay's RAM: frames unless they are compressed (size unknown up front) or memory-mapped."""
    if not uses_replay(cfg):
        return 0
    frames = replay_frame_bytes(cfg, observation_space)
    if cfg.replay.compress or cfg.replay.memmap_dir:
        frames = 0
    return frames + cfg.replay.capacity * REPLAY_RECORD_OVERHEAD_BYTES


def check_resources(cfg: Config, arena_bytes: int, observation_space, ranks_on_node: int = 1,
                    shared: bool = True) -> None:
    """Raise ResourceError if the arena does not fit /dev/shm (``shared``: the serial mode keeps it
    in private memory), the run does not fit RAM, or the replay's memory-mapped frames do not fit
    their directory's disk. Every rank on this node holds an arena and a replay of its own."""
    if shared:
        check_shared_memory(arena_bytes * ranks_on_node)
    replay = replay_ram_bytes(cfg, observation_space)
    check_memory(arena_bytes * ranks_on_node, replay * ranks_on_node)
    if uses_replay(cfg) and cfg.replay.memmap_dir:
        check_memmap_dir(cfg.replay.memmap_dir, replay_frame_bytes(cfg, observation_space))


def check_shared_memory(arena_bytes: int, shm_dir: str = SHM_DIR) -> None:
    if not os.path.isdir(shm_dir):
        return  # not Linux: the segment lives elsewhere and the RAM check covers it
    free = shutil.disk_usage(shm_dir).free
    if arena_bytes > free:
        raise ResourceError(
            f"the trajectory arena needs {_gib(arena_bytes)} of shared memory but {shm_dir} has {_gib(free)} free: "
            f"give it more (Docker: --shm-size={max(1, int(np.ceil(arena_bytes * 1.25 / 2**30)))}g), or lower "
            f"env.envs_per_worker, learner.rollout or slots_per_env")


def check_memory(arena_bytes: int, replay_bytes: int) -> None:
    available = psutil.virtual_memory().available
    if arena_bytes + replay_bytes > RAM_SHARE * available:
        parts = f"trajectory slots {_gib(arena_bytes)}" + (f" + replay {_gib(replay_bytes)}" if replay_bytes else "")
        fix = ("lower replay.capacity, or set replay.compress=lz4 or replay.memmap_dir" if replay_bytes > arena_bytes
               else "lower slots_per_env, env.envs_per_worker or learner.rollout")
        raise ResourceError(f"the run needs {parts} of RAM but only {_gib(available)} is available; {fix}")


def check_memmap_dir(directory: str, frame_bytes: int) -> None:
    if not os.path.isdir(directory):
        raise ResourceError(f"replay.memmap_dir '{directory}' is not a directory; create it or pass another")
    free = shutil.disk_usage(directory).free
    if frame_bytes > free:
        raise ResourceError(f"the replay's frames need {_gib(frame_bytes)} in replay.memmap_dir '{directory}' but "
                            f"it has {_gib(free)} free; free space there, pick another directory, or lower "
                            f"replay.capacity")
