"""Checks that the machine can hold a run, made before any process starts.

Without them a run that does not fit dies late and mutely: an arena larger than /dev/shm (a
container's default is 64 MiB; ``atari-appo`` needs ~910 MiB) kills the first process that
touches the missing pages with SIGBUS, and a replay larger than RAM is killed by the OOM killer
minutes in. A network too wide for RAM (``model.core_size=65536``: 64 GiB of parameters) is
sized on torch's meta device and refused here, before a byte of it is allocated.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import psutil

from ..config import REPLAY_LEARNERS, Config
from ..envs.spaces import ObsLayout
from ..ipc.arena import SHM_DIR

# Per replay record besides its frame: action, reward, flags, generation, arrival priority and
# the sum tree's two float64 nodes (fastrl.replay.buffer).
REPLAY_RECORD_OVERHEAD_BYTES = 48
# Share of the available RAM a run may plan to take: the OS, the page cache and torch need the rest.
RAM_SHARE = 0.8
# Copies of the model's parameters and buffers in host memory. The learner on the CPU: its weights,
# their gradients, Adam's two moments and the flat copy it publishes from (fastrl.learner.runtime);
# the dqn/r2d2 target network is one more. On a GPU only the published copy stays on the host.
# Every process that reads the published weights (the batcher, or each worker with
# inference.in_workers; the evaluator): its model and the copy it loads them into
# (fastrl.ipc.weights).
LEARNER_COPIES_ON_CPU = 5
LEARNER_COPIES_ON_GPU = 1
READER_COPIES = 2
ARENA_COPIES = 2  # the arena's double-buffered published weights (fastrl.ipc.weights.WeightBuffer)


class ResourceError(RuntimeError):
    """The machine cannot hold the run as configured; the message gives the sizes and the fix."""


def _gib(nbytes: float) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.2f} GiB"
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def uses_replay(cfg: Config) -> bool:
    return cfg.learner.algo in REPLAY_LEARNERS or cfg.replay.vtrace_fraction > 0


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


def model_ram_bytes(cfg: Config, model_bytes: int, learner_on_cpu: bool = True) -> int:
    """Host memory of the model's copies outside the arena, one copy being ``model_bytes``."""
    learner = LEARNER_COPIES_ON_CPU + (cfg.learner.algo in REPLAY_LEARNERS) if learner_on_cpu else LEARNER_COPIES_ON_GPU
    actors = cfg.env.num_workers if cfg.inference.in_workers and not cfg.serial else 1
    evaluators = 1 if cfg.eval.every_s else 0
    return model_bytes * (learner + READER_COPIES * (actors + evaluators))


def model_keys(cfg: Config) -> str:
    """The config keys that size the model, for the fix of an error."""
    return "model.hidden_sizes, model.core_size or model.core_layers" if cfg.model.core != "none" else \
        "model.hidden_sizes"


def check_resources(cfg: Config, arena_bytes: int, observation_space, ranks_on_node: int = 1,
                    shared: bool = True, model_bytes: int = 0, learner_on_cpu: bool = True,
                    num_policies: int = 1) -> None:
    """Raise ResourceError if the arena does not fit /dev/shm (``shared``: the serial mode keeps it
    in private memory), the run does not fit RAM, or the replay's memory-mapped frames do not fit
    their directory's disk. Every rank on this node holds an arena, a replay and the model's copies
    (``model_bytes`` each, model_ram_bytes; ARENA_COPIES of them in the arena) of its own; each of
    its ``num_policies`` policies (PBT's members) a learner with a replay of its own."""
    replay = replay_ram_bytes(cfg, observation_space) * num_policies
    arena_weights = min(arena_bytes, ARENA_COPIES * model_bytes)
    model = model_ram_bytes(cfg, model_bytes, learner_on_cpu) + arena_weights
    # RAM first: more /dev/shm cannot help a run that does not fit RAM.
    check_memory((arena_bytes - arena_weights) * ranks_on_node, replay * ranks_on_node, model * ranks_on_node,
                 model_keys(cfg))
    if shared:
        weights_fix = model_keys(cfg) if 2 * arena_weights > arena_bytes else None
        check_shared_memory(arena_bytes * ranks_on_node, fix=weights_fix)
    if uses_replay(cfg) and cfg.replay.memmap_dir:
        check_memmap_dir(cfg.replay.memmap_dir, replay_frame_bytes(cfg, observation_space))


def check_shared_memory(arena_bytes: int, shm_dir: str = SHM_DIR, fix: str | None = None) -> None:
    """``fix``: the keys to lower when the arena is mostly the model's weights."""
    if not os.path.isdir(shm_dir):
        return  # not Linux: the segment lives elsewhere and the RAM check covers it
    free = shutil.disk_usage(shm_dir).free
    if arena_bytes > free:
        raise ResourceError(
            f"the trajectory arena needs {_gib(arena_bytes)} of shared memory but {shm_dir} has {_gib(free)} free: "
            f"give it more (Docker: --shm-size={max(1, int(np.ceil(arena_bytes * 1.25 / 2**30)))}g), or lower "
            f"{fix or 'env.envs_per_worker, learner.rollout or slots_per_env'}")


def check_memory(arena_bytes: int, replay_bytes: int, model_bytes: int = 0,
                 model_fix: str = "model.hidden_sizes") -> None:
    """``model_bytes``: the model's copies outside the arena (model_ram_bytes); ``model_fix``: the
    keys that size it (model_keys)."""
    available = psutil.virtual_memory().available
    if arena_bytes + replay_bytes + model_bytes > RAM_SHARE * available:
        parts = {"trajectory slots": arena_bytes, "replay": replay_bytes, "model": model_bytes}
        needed = " + ".join(f"{name} {_gib(nbytes)}" for name, nbytes in parts.items() if nbytes)
        fixes = {"trajectory slots": "lower slots_per_env, env.envs_per_worker or learner.rollout",
                 "replay": "lower replay.capacity, or set replay.compress=lz4 or replay.memmap_dir",
                 "model": f"lower {model_fix}"}
        raise ResourceError(f"the run needs {needed} of RAM but only {_gib(available)} is available; "
                            f"{fixes[max(parts, key=parts.get)]}")


def model_memory_error(cfg: Config, exc: BaseException) -> ResourceError:
    """An allocation that failed while the model was built, in the same terms as check_memory."""
    said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ResourceError(f"building the model ran out of memory ({said[:200]}) with "
                         f"{_gib(psutil.virtual_memory().available)} available; lower {model_keys(cfg)}")


def check_memmap_dir(directory: str, frame_bytes: int) -> None:
    if not os.path.isdir(directory):
        raise ResourceError(f"replay.memmap_dir '{directory}' is not a directory; create it or pass another")
    free = shutil.disk_usage(directory).free
    if frame_bytes > free:
        raise ResourceError(f"the replay's frames need {_gib(frame_bytes)} in replay.memmap_dir '{directory}' but "
                            f"it has {_gib(free)} free; free space there, pick another directory, or lower "
                            f"replay.capacity")
