"""Rollout worker: steps one group of envs and writes their trajectories into shared slots.

Each env owns a cursor ``(env_slot, env_t)`` into the arena. A worker keeps up to ``S`` inference
requests outstanding (double buffering): while the inference batcher computes actions for one
batch of envs, the worker steps the next. Only small integers leave the process: request ids to
the batcher, full slot ids to the learner.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

import numba
import numpy as np

from ..config import Config
from ..envs import ImageOptions, make_vec_env
from ..envs.spaces import ObsLayout
from ..ipc.arena import Arena, budget_spent, set_error, steps_past_budget
from ..ipc.child import ProcessExit, ReadablePipes, WorkerChannels, check_alive, configure_child
from ..ipc.slots import RequestCodec, WorkerSlots, slot_bytes, slot_ids_from, worker_slot_ids
from ..multiagent.league import SelfPlaySeats
from ..multiagent.opponents import OpponentError, find_opponent, make_opponent
from ..multiagent.policy_map import PolicyMap
from ..reporting.metrics import WorkerTiming


class RolloutWorker:
    """The env-side half of the slot protocol (fastrl.ipc.slots), independent of how messages travel.

    ``first_slots`` ``[E]`` are the slots the envs fill first; ``take_free_slots(n)`` returns
    ``n`` more free slot ids of this worker (blocking if it must); ``emit_full(slot_ids)`` hands
    full slots to the learner (in a run, a WorkerSlots' ``take`` and ``emit``); ``recv_batch()``
    steps the env and returns a request id; ``act(request_id)`` sends the actions the batcher
    wrote for that request to the envs. ``park()``, called once a batch brings the run's env steps
    to the step budget (fastrl.ipc.arena.budget_spent), waits for the run's stop (None: the serial
    run, which has no budget in the arena).
    """

    def __init__(self, worker_id: int, cfg: Config, arena: Arena, env, first_slots: np.ndarray,
                 take_free_slots: Callable[[int], np.ndarray], emit_full: Callable[[np.ndarray], None],
                 row_policies: np.ndarray | None = None, seats: SelfPlaySeats | None = None,
                 park: Callable[[], None] | None = None):
        self.worker_id = worker_id
        self.env = env
        self.arena = arena
        self.park = park
        self.budget_arrays = (arena.control, arena.env_steps)  # read after every batch
        self.rollout = cfg.learner.rollout
        E = cfg.env.envs_per_worker
        self.take_free_slots = take_free_slots
        self.emit_full = emit_full
        self.env_slot = arena.env_slot[worker_id]
        self.env_t = arena.env_t[worker_id]
        self.env_start = arena.env_start[worker_id]
        self.env_final = arena.env_final[worker_id]
        self.obs_layout = ObsLayout(env.observation_space)
        self.request_envs = arena.request_envs[worker_id]
        self.free_requests = deque(range(cfg.env.num_splits))
        self.batches_in_env = 0
        self.started = np.zeros(E, dtype=bool)
        self.prev_done = np.zeros(E, dtype=bool)  # the next step of this env is an autoreset step
        self.episode_return = np.zeros(E, dtype=np.float64)
        self.episode_length = np.zeros(E, dtype=np.int64)
        self.episode_version = np.zeros(E, dtype=np.int64)
        self.env_slot[:] = first_slots
        self.stream_base = worker_id * E
        arena.slot_env[first_slots] = self.stream_base + np.arange(E, dtype=np.int32)
        arena.slot_fresh[first_slots] = 1
        self.env_t[:] = 0
        self.slot_obs = arena.obs.reshape(arena.obs.shape[0], arena.obs.shape[1], -1)  # [N, T + 1, D] view
        # The arena's arrays the hot path touches, looked up once: record() and act() run once per
        # batch, and each Arena attribute costs a dictionary lookup through __getattr__.
        self.slot_arrays = (arena.rewards, arena.terminated, arena.truncated, arena.valid, arena.version)
        self.episode_ring = (arena.episode_return[worker_id], arena.episode_length[worker_id],
                             arena.episode_count[worker_id:worker_id + 1])
        self.steps_counter = arena.env_steps[worker_id:worker_id + 1]
        self.action_shape = arena.actions.shape[2:]
        self.slot_actions = arena.actions.reshape(arena.actions.shape[0], arena.actions.shape[1], -1)  # [N, T, A]
        self.full_rows = np.empty(E, dtype=np.int64)  # batch rows whose slot filled, see _record_steps
        self.timings = WorkerTiming.row(arena, worker_id)
        # Who acts for each row (a weight set: its policy, or with self-play a snapshot), whether
        # its steps are trained on, and the snapshot its policy plays against (-1: none).
        self.row_actor = arena.env_actor[worker_id]
        self.row_actor[:] = 0 if row_policies is None else row_policies
        self.row_trained = np.ones(E, dtype=np.uint8)
        self.row_opponent = np.full(E, -1, dtype=np.int64)
        self.seats = seats
        self.episode_tags = (arena.episode_actor[worker_id], arena.episode_opponent[worker_id],
                             arena.episode_version[worker_id])
        self.info_keys = cfg.info_keys
        self.episode_info = arena.episode_info[worker_id] if self.info_keys else None

    def start(self) -> None:
        self.env.async_reset()
        # A turn-based game has fewer batches in flight than requests: one per group of games.
        self.batches_in_env = min(len(self.free_requests), self.env.batches_in_flight)

    def can_recv(self) -> bool:
        return bool(self.free_requests) and self.batches_in_env > 0

    def recv_batch(self) -> int:
        timings = self.timings
        start = time.perf_counter()
        obs, rewards, terminated, truncated, env_ids = self.env.recv()
        stepped = time.perf_counter()
        timings[WorkerTiming.ENV_STEP] += stepped - start
        self.batches_in_env -= 1
        slot_wait_before = timings[WorkerTiming.WAIT_SLOTS]
        self.record(np.asarray(env_ids), obs, rewards, terminated, truncated)
        # record() blocks in take_free_slots when a slot fills and no free one is left. That wait is
        # WAIT_SLOTS, not copying: counted in both, the breakdown would blame the copy for the
        # learner's backpressure.
        slot_wait = timings[WorkerTiming.WAIT_SLOTS] - slot_wait_before
        timings[WorkerTiming.OBS_COPY] += time.perf_counter() - stepped - slot_wait
        if self.park is not None and steps_past_budget(*self.budget_arrays):
            # The run's steps are spent and this worker's full slots sent: it steps no more and
            # waits for the stop, which the runner gives once the learner has trained on them.
            self.park()
        request = self.free_requests.popleft()
        self.request_envs[request] = env_ids
        return request

    def record(self, ids: np.ndarray, obs, rewards, terminated, truncated) -> None:
        """Write one env batch into the slots; slots that become full go to ``emit_full``."""
        # Dict / Tuple / Discrete observations become one packed row per env (fastrl.envs.spaces).
        obs = np.ascontiguousarray(self.obs_layout.pack(obs, len(ids)))
        flat_obs = obs.reshape(len(ids), -1)
        if self.info_keys:
            self.record_episode_info(ids, terminated, truncated)
        # One compiled pass instead of ~15 numpy scatters, which take 93 us of worker CPU per batch
        # of 256 CartPole envs (recv and send take ~50 us each; docs/results.md#per-batch-costs).
        num_full = _record_steps(
            ids, flat_obs, rewards, terminated, truncated, self.rollout,
            self.env_slot, self.env_t, self.started, self.prev_done, self.env_start, self.env_final,
            self.episode_return, self.episode_length, self.episode_version, self.slot_obs, *self.slot_arrays,
            *self.episode_ring,
            self.steps_counter, self.full_rows, self.row_actor, self.row_trained, self.row_opponent, *self.episode_tags)
        unplayed, unplayed_returns = self.env.last_unplayed
        if self.seats is not None:
            # A row starts an episode on its reset observation (an absent agent's repeated final
            # step is no start): its game's opponent and seats are drawn then, before it acts. A
            # seat whose game ended before its first turn is tagged as its game was drawn.
            starting = ids[(self.env_start[ids] == 1) & (self.env_final[ids] == 0)]
            tagged = np.concatenate([starting, unplayed])
            if len(tagged):
                self.seats.start_rows(tagged, self.env.episodes_begun, self.row_actor, self.row_trained,
                                      self.row_opponent)
        if len(unplayed):
            self.record_unplayed(unplayed, unplayed_returns)
        if num_full == 0:
            return
        arena = self.arena
        rows = self.full_rows[:num_full]
        full_ids = ids[rows]
        # Hand the full slots on before waiting for free ones: a worker that held them while
        # blocked could leave the learner one trajectory short of a batch, forever.
        self.emit_full(self.env_slot[full_ids])
        new_slots = self.take_free_slots(num_full)
        arena.obs[new_slots, 0] = obs[rows]
        self.env_slot[full_ids] = new_slots
        arena.slot_env[new_slots] = self.stream_base + full_ids
        arena.slot_fresh[new_slots] = 0

    def record_unplayed(self, rows: np.ndarray, returns: np.ndarray) -> None:
        """Episodes of no step (VecEnv.last_unplayed: seats whose game ended before their first
        turn) into the finished-episode ring, tagged with the rows' players; no info numbers."""
        ring_return, ring_length, ring_count = self.episode_ring
        ring_actor, ring_opponent, ring_version = self.episode_tags
        entries = (ring_count[0] + np.arange(len(rows))) % ring_return.shape[0]
        ring_return[entries] = returns
        ring_length[entries] = 0
        ring_actor[entries] = self.row_actor[rows]
        ring_opponent[entries] = self.row_opponent[rows]
        # No action began it: the version that began the row's last episode stands in, so a PBT
        # copy's objective window leaves it out until the new weights have acted for that row.
        ring_version[entries] = self.episode_version[rows]
        if self.info_keys:
            self.episode_info[entries] = np.nan
        ring_count[0] += len(rows)  # last: readers take the entries below the count

    def record_episode_info(self, ids: np.ndarray, terminated, truncated) -> None:
        """The env info numbers (Config.info_keys) of the episodes this batch ends, written into the
        ring entries _record_steps gives those episodes next: before the count that shows readers
        the entries moves. A step ends an episode as _record_steps judges it: done, and not the
        autoreset step (``prev_done`` as it was before this batch)."""
        done = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        ended = np.flatnonzero(done & ~self.prev_done[ids] & self.started[ids])
        if not len(ended):
            return
        ring_count = self.episode_ring[2]
        entries = (ring_count[0] + np.arange(len(ended))) % self.episode_info.shape[0]
        for column, key in enumerate(self.info_keys):
            self.episode_info[entries, column] = info_numbers(self.env.last_info, key, ended)

    def act(self, request: int) -> None:
        ids = self.request_envs[request]
        actions = np.empty((len(ids), *self.action_shape), self.slot_actions.dtype)
        # Compiled: the two-level fancy gather costs ~12 us of a 256-env CartPole batch.
        _gather_actions(ids, self.env_slot, self.env_t, self.slot_actions, actions.reshape(len(ids), -1))
        if self.seats is not None and self.seats.scripted:
            try:
                self.seats.play_scripted(self.env, ids, actions, self.prev_done[ids])
            except OpponentError as exc:  # the same move would fail a restarted worker: the run stops
                set_error(self.arena, f"selfplay.scripted_opponents: {exc}")
                raise
        self.env.send(actions, ids)
        self.batches_in_env += 1
        self.free_requests.append(request)


def info_numbers(info, key: str, rows: np.ndarray) -> np.ndarray:
    """float64 ``[len(rows)]``: ``info[key]`` (an env's vector info, VecEnv.last_info) at batch
    ``rows``; NaN where a row lacks the key (gymnasium's ``_key`` mask) or its value is no number."""
    out = np.full(len(rows), np.nan)
    values = info.get(key)
    if values is None:
        return out
    try:
        numbers = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return out
    if numbers.ndim != 1 or numbers.shape[0] <= rows.max():
        return out  # one number per env is what the ring holds
    mask = info.get("_" + key)
    out[:] = numbers[rows]
    if mask is not None:
        out[~np.asarray(mask, dtype=bool)[rows]] = np.nan
    return out


@numba.njit(cache=True, nogil=True)
def _record_steps(ids, obs, rewards, terminated, truncated, rollout,
                  env_slot, env_t, started, prev_done, env_start, env_final, episode_return, episode_length,
                  episode_version, slot_obs, slot_rewards, slot_terminated, slot_truncated, slot_valid, slot_version,
                  ring_return, ring_length, ring_count, steps_counter, full_rows,
                  row_actor, row_trained, row_opponent, ring_actor, ring_opponent, ring_version):
    """Write the batch row i of env ``ids[i]`` at its cursor ``(env_slot, env_t)``.

    Batch: ``ids`` ``[B]``, ``obs`` ``[B, D]`` (flattened), ``rewards``/``terminated``/``truncated``
    ``[B]``. Per env of the worker ``[E]``: cursors, ``started`` (first observation written),
    ``prev_done`` (this step is the autoreset step: not valid), ``env_start`` (set: the env's next
    acted step starts an episode), ``env_final`` (set: it acts on an episode's final observation),
    running episode return and length, and the policy version of the episode's first action.
    Arena: ``slot_obs`` ``[N, T + 1, D]``, step arrays ``[N, T]`` (``slot_version``: the version
    that chose each step's action), the worker's finished-episode ring ``[R]`` and its count
    ``[1]``, the worker's env-step counter ``[1]``. Per env: the weight set acting for it, whether
    its steps are trained on (0: a self-play snapshot's row, every step invalid) and the snapshot
    its policy plays (-1: none), recorded with each finished episode and its first action's
    version in the ring's ``ring_actor`` / ``ring_opponent`` / ``ring_version`` ``[R]``.

    An env's first row after the initial reset only stores its first observation. Otherwise the
    step's reward and flags go to ``t`` and the new observation to ``t + 1``; when ``t + 1 == T``
    the slot is full: its row index is appended to ``full_rows``, the cursor goes back to 0 and the
    caller moves the env to a new slot. Adds the env steps recorded to ``steps_counter[0]``;
    returns the number of rows in ``full_rows``.
    """
    stepped = 0
    num_full = 0
    ring_size = ring_return.shape[0]
    for i in range(ids.shape[0]):
        env = ids[i]
        slot = env_slot[env]
        if not started[env]:
            for d in range(obs.shape[1]):
                slot_obs[slot, 0, d] = obs[i, d]
            started[env] = True
            env_start[env] = 1
            env_final[env] = 0
            continue
        stepped += 1
        t = env_t[env]
        autoreset = prev_done[env]
        done = terminated[i] or truncated[i]
        slot_rewards[slot, t] = rewards[i]
        slot_terminated[slot, t] = terminated[i]
        slot_truncated[slot, t] = truncated[i]
        slot_valid[slot, t] = not autoreset and row_trained[env]
        prev_done[env] = done
        # After the autoreset step the observation is a reset one: a new episode acts next.
        env_start[env] = autoreset
        env_final[env] = done
        if not autoreset:
            if episode_length[env] == 0:
                episode_version[env] = slot_version[slot, t]
            episode_return[env] += rewards[i]
            episode_length[env] += 1
        # Only a step past the autoreset ends an episode. A done on an autoreset step is a
        # multi-agent row whose agent has left its game: it reports the flags it left with until
        # the game resets (fastrl/envs/multiagent/pettingzoo_backend.py), and its episode was counted when it left.
        if done and not autoreset:
            k = ring_count[0] % ring_size
            ring_return[k] = episode_return[env]
            ring_length[k] = episode_length[env]
            ring_actor[k] = row_actor[env]
            ring_opponent[k] = row_opponent[env]
            ring_version[k] = episode_version[env]
            ring_count[0] += 1
            episode_return[env] = 0.0
            episode_length[env] = 0
        # Element loops, not slice assignments: a slice builds two array views per row, which
        # was most of this kernel's time on CartPole's 4-float rows.
        for d in range(obs.shape[1]):
            slot_obs[slot, t + 1, d] = obs[i, d]
        if t + 1 == rollout:
            env_t[env] = 0
            full_rows[num_full] = i
            num_full += 1
        else:
            env_t[env] = t + 1
    steps_counter[0] += stepped
    return num_full


@numba.njit(cache=True, nogil=True)
def _gather_actions(ids, env_slot, env_t, slot_actions, out):
    """Row i of ``out`` ``[B, A]`` = the action the batcher wrote at env ``ids[i]``'s cursor
    (``slot_actions`` ``[N, T, A]``, cursors ``env_slot``/``env_t`` ``[E]``)."""
    for i in range(ids.shape[0]):
        env = ids[i]
        slot, t = env_slot[env], env_t[env]
        for a in range(out.shape[1]):
            out[i, a] = slot_actions[slot, t, a]


def run_acting_itself(worker: RolloutWorker, cfg: Config, arena: Arena, spaces, model,
                      rank: int) -> None:
    """The worker's loop with ``inference.in_workers``: step a batch, run the policy on it here,
    send its actions; until the run stops (ProcessExit).

    The other splits keep stepping in envpool's threads while this thread computes, as they do
    while a batcher answers, but no pipe, no other process and no wake-up sit between a batch and
    its actions. The policy, its weights (the learner's published ones) and the slot rows written
    are the batcher's own code (fastrl.sampling.batcher.InferenceBatcher), called with this worker's
    requests only."""
    # Imported here: a worker served by the batcher process never loads torch's model code.
    import torch

    from .batcher import make_batcher

    # A stream of draws per worker (and rank), apart from the batcher's seed + 7919.
    torch.manual_seed(cfg.seed + 7919 + 1 + rank * 4096 + worker.worker_id)
    batcher = make_batcher(cfg, arena, spaces, model, "cpu", timings=np.zeros(arena.timings.shape[1]))
    batcher.wait_for_weights(arena.control)
    timings, control = worker.timings, arena.control
    this_worker = np.array([worker.worker_id])
    this_request = np.zeros(1, dtype=np.int64)  # reused: infer() takes arrays, one request a batch here
    while True:
        request = worker.recv_batch()
        start = time.perf_counter()
        batcher.refresh_weights()
        this_request[0] = request
        try:
            batcher.infer(this_worker, this_request)
        except Exception as exc:
            # As the batcher process does: the run stops with this line (an action mask that allows
            # nothing, a model that fails on the observations) instead of restarting the worker
            # into the same error. An env's own error, in recv_batch, still restarts the worker.
            set_error(arena, f"the policy stopped in rollout worker {worker.worker_id}: {exc}")
            raise
        timings[WorkerTiming.INFERENCE] += time.perf_counter() - start
        worker.act(request)
        # No pipe wakes this loop to look: once per batch is cheap (a shared-memory read and
        # getppid).
        check_alive(control)


def run_with_batcher(worker: RolloutWorker, channels: WorkerChannels, control,
                     codec: RequestCodec) -> None:
    """The worker's loop with the batcher process: step every batch it can, send each one's request
    byte, act on the answers meant for this generation (``codec``); until the run stops (ProcessExit)."""
    requests_out, actions_in = channels.requests_out, channels.actions_in
    actions_pipe = ReadablePipes([actions_in])
    timings = worker.timings
    messages, requests = codec.messages, codec.requests
    while True:
        while worker.can_recv():
            requests_out.send_bytes(messages[worker.recv_batch()])
        waited = time.perf_counter()
        while not actions_pipe.wait(control):
            pass
        timings[WorkerTiming.WAIT_ACTIONS] += time.perf_counter() - waited
        while actions_pipe.ready():
            for message in actions_in.recv_bytes():
                request = requests[message]
                if request >= 0:
                    worker.act(request)


def worker_slots(cfg: Config, arena: Arena, worker_id: int, channels: WorkerChannels) -> WorkerSlots:
    """Worker ``worker_id``'s side of the slot protocol over its pipes: full slots out on the full
    pipe, released ones in from the free pipe (waits end when the run stops: ProcessExit)."""
    full_out, free_in = channels.full_out, channels.free_in
    free_pipe = ReadablePipes([free_in])
    control = arena.control

    parked = arena.worker_parked[worker_id:worker_id + 1]
    parked[0] = 0  # a restarted worker steps until it sees the budget spent itself

    def receive(slots: WorkerSlots, block: bool) -> None:
        # Blocks until the learner returns slots: this is the backpressure that bounds lag.
        if block and not free_pipe.wait(control):
            if budget_spent(arena) and not parked[0]:
                slots.park(parked)
            return
        while free_pipe.ready():
            slots.returned(slot_ids_from(free_in.recv_bytes()))

    def send_full(slot_ids: np.ndarray) -> None:
        full_out.send_bytes(slot_bytes(slot_ids))

    return WorkerSlots(arena, worker_slot_ids(worker_id, cfg.slots_per_worker), send_full, receive,
                       WorkerTiming.cell(arena, worker_id, WorkerTiming.WAIT_SLOTS))


def worker_policies(cfg: Config, arena: Arena, policies: PolicyMap | None, env, worker_id: int, rank: int = 0,
                    generation: int = 0) -> tuple[np.ndarray | None, SelfPlaySeats | None]:
    """A worker's rows' policies, and with self-play its seat draws (seeded per worker, rank and
    restart) and the scripted opponents it plays, made for ``env``'s game, as RolloutWorker takes
    them."""
    if policies is None:
        return None, None
    E = cfg.env.envs_per_worker
    seats = None
    if cfg.selfplay.enabled:
        seed = (cfg.seed, rank, worker_id, generation)
        # Each worker's opponents draw their own random moves, repeatably with the run's seed.
        scripted = [make_opponent(find_opponent(name, "selfplay.scripted_opponents entry"), env.observation_space,
                                  env.action_space, int(np.random.default_rng((*seed, k)).integers(2**31)))
                    for k, name in enumerate(cfg.selfplay.scripted_opponents)]
        seats = SelfPlaySeats(arena, E, len(policies.agents), policies.num_policies, cfg.selfplay, seed, scripted)
    return policies.row_policies(E), seats


def make_worker_env(cfg: Config, worker_id: int, rank: int = 0):
    ecfg = cfg.env
    return make_vec_env(
        ecfg.id, num_envs=ecfg.envs_per_worker, batch_size=ecfg.envs_per_worker // ecfg.num_splits,
        # Distinct seeds for every env of every worker of every rank (envpool keeps them mod 2^31).
        seed=(cfg.seed * 1_000_003 + (rank * 4096 + worker_id) * ecfg.envs_per_worker) % 2**31, backend=ecfg.backend,
        async_mode=ecfg.async_mode, num_threads=ecfg.num_threads, thread_affinity=ecfg.thread_affinity,
        env_kwargs=ecfg.kwargs, preprocessing=ImageOptions.from_config(ecfg), actions=ecfg.actions)


def rollout_process(worker_id: int, cfg: Config, layout, arena_name: str, channels: WorkerChannels,
                    generation: int = 0, rank: int = 0, spaces=None, model=None,
                    policies: PolicyMap | None = None) -> None:
    """Main loop of a rollout worker process.

    ``generation`` counts restarts of this worker: a restarted worker ignores action replies
    meant for the process it replaces, and takes back its slots not queued for the learner
    (fastrl.ipc.slots).

    With ``inference.in_workers`` the worker acts for its own batches (``run_acting_itself``):
    ``spaces`` (observation, action) and ``model`` (the user's network or None) are then the
    batcher's, see ``fastrl.sampling.batcher.make_batcher``. ``policies``: the run's, which act for and
    train on its rows (None: one policy).
    """
    configure_child(cfg.retain_freed_memory, cfg.actor_niceness)
    arena = Arena.attach(layout, arena_name)
    slots = worker_slots(cfg, arena, worker_id, channels)
    env = None
    try:
        env = make_worker_env(cfg, worker_id, rank)
        parked = arena.worker_parked[worker_id:worker_id + 1]
        worker = RolloutWorker(worker_id, cfg, arena, env, slots.take(cfg.env.envs_per_worker), slots.take,
                               slots.emit, *worker_policies(cfg, arena, policies, env, worker_id, rank, generation),
                               park=lambda: slots.park(parked))
        worker.start()
        if cfg.inference.in_workers:
            run_acting_itself(worker, cfg, arena, spaces, model, rank)  # leaves by ProcessExit
        else:
            run_with_batcher(worker, channels, arena.control,
                             RequestCodec(cfg.env.num_splits, generation))
    except ProcessExit:
        pass
    finally:
        if env is not None:
            env.close()
        arena.close()
