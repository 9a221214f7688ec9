"""Shared-memory arena: trajectory slots, per-env cursors, counters, the published weights' arrays.

One POSIX shared-memory segment per run, named ``fastrl_<pid namespace>_<runner pid>_<token>``, carved into
named numpy arrays. The runner creates and unlinks it; children map it by name. If the runner is
killed outright, the resource tracker unlinks it, and the next run removes segments whose
creator is gone.

Trajectory slots are per env (as in Sample Factory): slot ``i`` holds one env's trajectory of
``T`` steps. ``obs[i, t]`` is the observation the policy acted on at step ``t``; ``obs[i, T]`` is
the observation after the last step; the learner bootstraps from its value. Behaviour values are
not stored: the learner recomputes every value with its current network.
"""
from __future__ import annotations

import mmap
import os
import re
import secrets
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from ..config.schema import MAX_EVAL_OPPONENTS

SEGMENT_PREFIX = "fastrl_"
SHM_DIR = "/dev/shm"
_ALIGN = 64
EPISODE_RING = 4096  # finished episodes remembered per worker between two reports
# eval.opponents' bound: each opponent evaluated during training has a row of eval_opponent_stats.


@dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple
    dtype: str


@dataclass(frozen=True)
class ArenaLayout:
    """What the arena holds; picklable, sent to every child so it can attach."""

    specs: tuple[ArraySpec, ...]

    def offsets(self) -> tuple[dict[str, int], int]:
        offsets, cursor = {}, 0
        for spec in self.specs:
            offsets[spec.name] = cursor
            nbytes = int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
            cursor += -(-nbytes // _ALIGN) * _ALIGN
        return offsets, max(cursor, _ALIGN)

    @property
    def nbytes(self) -> int:
        return self.offsets()[1]


def trajectory_layout(num_slots: int, rollout: int, obs_shape: tuple, obs_dtype, action_shape: tuple,
                      action_dtype, num_workers: int, envs_per_worker: int, num_splits: int,
                      num_weights: int, state_size: int = 0, num_policies: int = 1,
                      num_snapshots: int = 0, num_info_keys: int = 0) -> ArenaLayout:
    """The arena of one run. Shapes: ``N`` slots, ``T`` steps, ``W`` workers, ``E`` envs per worker,
    ``S`` splits (outstanding inference requests per worker), ``b = E / S``; with a recurrent
    core, ``state_size`` floats of state per env (see fastrl.models.recurrent).

    Weight sets: ``K = num_policies + num_snapshots``, the policies' weights (set ``p`` for policy
    ``p``), then the self-play league's snapshots (fastrl.multiagent.league); ``env_actor`` names the set
    that acts for each env row.

    ``num_info_keys`` (``I``): the env info numbers recorded with each finished episode
    (Config.info_keys, in their order; NaN where the env did not report one)."""
    T, N, W, E, S = rollout, num_slots, num_workers, envs_per_worker, num_splits
    K = num_policies + num_snapshots
    b = E // S
    specs = [
        ArraySpec("obs", (N, T + 1, *obs_shape), np.dtype(obs_dtype).str),
        ArraySpec("actions", (N, T, *action_shape), np.dtype(action_dtype).str),
        ArraySpec("behaviour_logp", (N, T), "<f4"),  # log-prob of the action under the policy that took it
        ArraySpec("rewards", (N, T), "<f4"),
        ArraySpec("terminated", (N, T), "|u1"),
        ArraySpec("truncated", (N, T), "|u1"),
        ArraySpec("valid", (N, T), "|u1"),  # 0 on the autoreset step after a done
        ArraySpec("version", (N, T), "<i8"),  # policy version that chose the action
        ArraySpec("slot_env", (N,), "<i4"),  # env (worker * E + env id) filling the slot: its replay stream
        ArraySpec("slot_fresh", (N,), "|u1"),  # 1: the env's first slot since its worker (re)started
        # 1 while a full slot waits for / is read by the learner (fastrl.ipc.slots)
        ArraySpec("slot_queued", (N,), "|u1"),
        ArraySpec("env_slot", (W, E), "<i4"),  # slot each env is filling
        ArraySpec("env_t", (W, E), "<i4"),  # step index within that slot
        # 1: the env's next acted step starts an episode (its first observation, or the reset
        # observation after an autoreset step); the batcher zeroes its recurrent state then.
        ArraySpec("env_start", (W, E), "|u1"),
        # 1: the env's next acted step is on an episode's final observation (its action is
        # discarded by the autoreset); an empty action mask is allowed there.
        ArraySpec("env_final", (W, E), "|u1"),
        ArraySpec("request_envs", (W, S, b), "<i4"),  # env ids of each outstanding request
        ArraySpec("env_actor", (W, E), "<i2"),  # the weight set acting for the env row (a policy or a snapshot)
        ArraySpec("env_steps", (W,), "<i8"),
        # 1: the worker stepped past the step budget and steps no more (Control.BUDGET_ENV_STEPS)
        ArraySpec("worker_parked", (W,), "|u1"),
        ArraySpec("episode_return", (W, EPISODE_RING), "<f8"),
        ArraySpec("episode_length", (W, EPISODE_RING), "<i8"),
        ArraySpec("episode_actor", (W, EPISODE_RING), "<i2"),  # the weight set that played the episode
        # the version of the snapshot the episode's policy played against, -1 without one (self-play)
        ArraySpec("episode_opponent", (W, EPISODE_RING), "<i8"),
        ArraySpec("episode_version", (W, EPISODE_RING), "<i8"),  # the policy version that chose its first action
        ArraySpec("episode_count", (W,), "<i8"),
        ArraySpec("weights", (K, 2, num_weights), "<f4"),  # a double buffer per weight set, see fastrl.ipc.weights
        ArraySpec("weight_seq", (K, 2), "<i8"),
        ArraySpec("weight_version", (K,), "<i8"),
        ArraySpec("league_weights", (max(num_snapshots, 1),), "<f8"),  # PFSP's draw weights (fastrl.multiagent.league)
        ArraySpec("control", (13,), "<i8"),  # see Control
        ArraySpec("error_text", (512,), "|u1"),  # why a child stopped the run (utf-8)
        ArraySpec("learner_stats", (num_policies, 48), "<f8"),  # per policy, see fastrl.reporting.metrics.LEARNER_STATS
        ArraySpec("timings", (W + 2, 8), "<f8"),  # seconds per component, see fastrl.reporting.metrics
        ArraySpec("eval_stats", (16,), "<f8"),  # the latest evaluation during training, see fastrl.evaluation.evaluator
        # Its games against each of eval.opponents: a column per fastrl.reporting.metrics.OPPONENT_STATS.
        ArraySpec("eval_opponent_stats", (MAX_EVAL_OPPONENTS, 5), "<f8"),
        # with a population, each member's part of that evaluation (fastrl.evaluation.evaluator.MemberEvalStats)
        ArraySpec("eval_member_stats", (num_policies, 4), "<f8"),
    ]
    if num_info_keys:
        specs.append(ArraySpec("episode_info", (W, EPISODE_RING, num_info_keys), "<f8"))
    if state_size:
        specs += [
            ArraySpec("env_state", (W, E, state_size), "<f4"),  # state after the env's last acted step
            ArraySpec("slot_state", (N, state_size), "<f4"),  # state the slot's first step was acted with
        ]
    return ArenaLayout(tuple(specs))


class Control:
    """Indices into ``arena.control``."""

    STOP = 0  # set by the runner: every process finishes its step and exits
    CHECKPOINT = 1  # set by the runner: the learner writes a checkpoint, then clears it
    ENV_STEPS_OFFSET = 2  # env steps done before a resume
    ERROR = 3  # set by a child that failed
    RUN_ENV_STEPS = 4  # env steps of the whole run at the last report (all ranks together)
    # The run's clocks, kept by the runner (fastrl.reporting.metrics.Reporter) so that checkpoints and the
    # learning-rate schedule read the same seconds as the budget and metrics.jsonl (milliseconds).
    WALL_MS = 5  # wall time since the run started, summed over resumes
    TRAINED_MS = 6  # seconds counted against train_for_seconds: from process start, over resumes
    # Stamped by the learner (time.time() in ms) as it writes a replay: a stopping runner waits past
    # its grace while the stamps keep coming (fastrl.run.supervisor.stop_processes).
    SAVE_BEAT_MS = 7
    # A single node's step budget (train_for_env_steps with the resumed steps; 0: none), set by the
    # runner. A worker that sees the run's env steps reach it steps no more (budget_spent; it
    # marks itself in arena.worker_parked), so a run takes the steps it was given, not as many
    # more as fit before the runner's next check (every 0.25 s: 216K CartPole steps past a budget
    # of 2,560, measured).
    BUDGET_ENV_STEPS = 8
    # The learner's waits for full slots (fastrl.learner.process.FullSlots.receive): how many began,
    # and while one lasts, 1 + the full slots it holds that make no batch (0: not waiting, or
    # holding a batch it has not trained on). Past the step budget the runner stops once every
    # worker is parked and the learner waits with every emitted slot in hand (learner_caught_up):
    # the budget's last batches are trained on, not dropped.
    LEARNER_WAITS = 9
    LEARNER_IDLE_QUEUED = 10
    LEARNER_SLOTS_IN = 11  # full slot ids the learner has received: its progress past the budget
    # This rank's env steps when its actors took up learner.epsilon_late (0: not yet), set by the
    # batcher and reported (epsilon_late_at_env_steps).
    EPSILON_LATE_AT = 12


def total_env_steps(arena) -> int:
    """Env steps of this rank's workers, with the steps done before a resume."""
    return steps_taken(arena.control, arena.env_steps)


def steps_taken(control: np.ndarray, env_steps: np.ndarray) -> int:
    """:func:`total_env_steps` from the arena's ``control`` and ``env_steps`` arrays, for callers
    that hold them (an Arena attribute is a dictionary lookup through ``__getattr__``)."""
    return int(env_steps.sum() + control[Control.ENV_STEPS_OFFSET])


def budget_spent(arena) -> bool:
    """Whether the run's env steps reached the step budget the runner set (Control.BUDGET_ENV_STEPS)."""
    return steps_past_budget(arena.control, arena.env_steps)


def steps_past_budget(control: np.ndarray, env_steps: np.ndarray) -> bool:
    """:func:`budget_spent` from the arena's ``control`` and ``env_steps`` arrays."""
    budget = control[Control.BUDGET_ENV_STEPS]
    return bool(budget) and steps_taken(control, env_steps) >= budget


def learner_caught_up(arena) -> bool:
    """Whether the learner waits for full slots while holding every slot the workers emitted: no
    batch is left for it to train on until workers step again (Control.LEARNER_WAITS). Read
    around the sum, so a wait that ended meanwhile never counts."""
    control = arena.control
    waits, idle = int(control[Control.LEARNER_WAITS]), int(control[Control.LEARNER_IDLE_QUEUED])
    queued = int(arena.slot_queued.sum())
    same_wait = waits == int(control[Control.LEARNER_WAITS]) and idle == int(control[Control.LEARNER_IDLE_QUEUED])
    return same_wait and idle > 0 and queued == idle - 1


def new_episodes(arena, seen: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The workers' episode counts now ``[W]``, and for each worker the ring indices of the
    episodes it finished since its count was ``seen[w]`` (the newest EPISODE_RING at most)."""
    counts = arena.episode_count.copy()
    indices = []
    for seen_w, now in zip(seen, counts):
        new = int(min(now - seen_w, EPISODE_RING))
        indices.append((now - new + np.arange(new)) % EPISODE_RING)
    return counts, indices


def set_error(arena, message: str) -> None:
    """Record why this process stops the run; the runner reports it."""
    data = message.encode()[: arena.error_text.shape[0] - 1]
    arena.error_text[:] = 0
    arena.error_text[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    arena.control[Control.ERROR] = 1


def get_error(arena) -> str:
    return bytes(arena.error_text).split(b"\0", 1)[0].decode(errors="replace")


class Arena:
    """Named numpy arrays over one shared-memory segment (or private memory when ``shared`` is
    False, for the serial mode)."""

    def __init__(self, layout: ArenaLayout, name: str | None = None, create: bool = True,
                 shared: bool = True):
        self.layout = layout
        offsets, nbytes = layout.offsets()
        self._owner_handle = None
        self._mapping = None
        if shared:
            if create:
                name = f"{SEGMENT_PREFIX}{pid_namespace()}_{os.getpid()}_{secrets.token_hex(4)}"
                # The handle only owns the name (and its resource-tracker registration, which
                # unlinks the segment if this process is killed outright); the data is mapped
                # below, by a plain mmap that unmaps silently even while numpy views remain.
                self._owner_handle = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
                self._owner_handle.close()
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
            try:
                self._mapping = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
            buffer = self._mapping
        else:
            buffer = bytearray(nbytes)
        self.name = name
        self.arrays: dict[str, np.ndarray] = {}
        for spec in layout.specs:
            count = int(np.prod(spec.shape, dtype=np.int64))
            array = np.frombuffer(buffer, dtype=spec.dtype, count=count, offset=offsets[spec.name])
            self.arrays[spec.name] = array.reshape(spec.shape)
        if create:
            for array in self.arrays.values():
                array.fill(0)

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def attach(cls, layout: ArenaLayout, name: str) -> "Arena":
        return cls(layout, name=name, create=False)

    def close(self) -> None:
        """Drop this process's mapping; the owner also unlinks the segment."""
        self.arrays.clear()
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:
                pass  # a view is still alive; the mapping goes with it or with the process
            self._mapping = None
        if self._owner_handle is not None:
            try:
                self._owner_handle.unlink()
            except FileNotFoundError:
                pass
            self._owner_handle = None


def pid_namespace() -> str:
    """Id of this process's pid namespace. /dev/shm can be shared by containers whose pids
    overlap; a segment name carries it so that cleanup only judges segments of our namespace."""
    try:
        return re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        return "0"


def segment_creator(name: str) -> int | None:
    """The pid that created segment ``name``, if it was created in this pid namespace."""
    match = re.fullmatch(rf"{SEGMENT_PREFIX}(\d+)_(\d+)_[0-9a-f]+", name)
    if match and match.group(1) == pid_namespace():
        return int(match.group(2))
    return None


def remove_stale_segments() -> list[str]:
    """Unlink fastrl segments of this pid namespace whose creator is gone (a run killed outright)."""
    removed = []
    for entry in os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else []:
        creator = segment_creator(entry)
        if creator is not None and not _pid_alive(creator):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
                removed.append(entry)
            except OSError:
                pass
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
