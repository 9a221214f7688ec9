"""The slot protocol: who holds each trajectory slot when, what moves it, and the messages that
carry slot and request ids. Both run modes follow it: the parallel run over pipes (the worker's
ends in fastrl.sampling.rollout_worker, the learner's in fastrl.learner.process), the serial run in one process
(serial_slots). TorchBeast's monobeast is the model: a free queue and a full queue of indices
into shared buffers.

Ownership. The arena holds ``N = num_workers * P`` slots, ``P = envs_per_worker * slots_per_env``
(``Config.slots_per_worker``). Worker ``w`` owns the block ``w * P .. (w + 1) * P - 1``
(worker_slot_ids); only its envs fill them, and a released slot goes back to ``slot // P``.

A slot's states, and who moves it from one to the next::

    spare --take (worker)--> filling --emit (worker)--> queued --release (learner)--> spare

- spare: in its owner's free queue (WorkerSlots); nothing writes it.
- filling: one env's cursor (``arena.env_slot``) points at it: the worker writes the env's
  observations, rewards and flags, the inference batcher the actions it chose.
- queued: full (``T`` steps), ``arena.slot_queued[slot] = 1``, its id on the full queue to the
  learner (FullQueue); the learner copies it out.
- release: once copied, before training on it, the learner sets ``slot_queued`` back to 0 and
  sends the id to its owner's free queue.

A worker emits its full slots before it takes new ones: a worker that held them while it waited
could leave the learner one trajectory short of a batch, forever. A worker with no spare slot
waits for a release (WorkerSlots.take): that back-pressure bounds memory and policy lag. A
restarted worker takes back every slot of its block that is not queued (those its predecessor
was filling or held spare); the queued ones come back by release as usual, so one id can arrive
both ways: a worker holds it once.

Messages. Slot ids travel as int32 arrays (slot_bytes, slot_ids_from): worker -> learner on the
full pipe, learner -> owner on the free pipe. Request ids travel as one byte each: a worker keeps
up to ``S = env.num_splits`` requests out, request ``r`` in ``0 .. S - 1`` naming a split of its
envs (``arena.request_envs[w, r]``). Its byte is ``tag * S + r`` with ``tag = generation %
(256 // S)``, ``generation`` counting the worker's restarts (RequestCodec). The batcher acts for
``byte % S`` (request_ids) and sends the same byte back; the worker acts only on its own tag's
bytes, so a restarted worker ignores the replies meant for the process it replaced. Two tags at
least need ``S <= MAX_SPLITS``, the limit the config checks ``env.num_splits`` against.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

import numpy as np

from ..config.schema import MAX_SPLITS  # REQUEST_VALUES // 2: at least two generation tags

REQUEST_VALUES = 256  # a request travels as one byte
SLOT_ID_DTYPE = np.int32  # slot ids on the pipes
NOT_THIS_GENERATION = -1  # RequestCodec.requests: a byte another generation of the worker sent


def worker_slot_ids(worker_id: int, per_worker: int) -> np.ndarray:
    """The ``[per_worker]`` slot ids (int32) worker ``worker_id`` owns."""
    return np.arange(worker_id * per_worker, (worker_id + 1) * per_worker, dtype=SLOT_ID_DTYPE)


def slot_bytes(slot_ids: np.ndarray) -> bytes:
    """Slot ids as they travel on a pipe."""
    return slot_ids.astype(SLOT_ID_DTYPE).tobytes()


def slot_ids_from(message: bytes) -> np.ndarray:
    """The slot ids (int32) of a pipe message written by slot_bytes."""
    return np.frombuffer(message, dtype=SLOT_ID_DTYPE)


class RequestCodec:
    """The request bytes of one generation of a worker that keeps ``num_splits`` requests out.

    ``messages[r]`` is request ``r``'s byte; ``requests[byte]`` is the request a reply names, or
    NOT_THIS_GENERATION for a byte of another generation. Tables, so that the worker's loop pays a
    list index per request."""

    def __init__(self, num_splits: int, generation: int = 0):
        if not 1 <= num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}] (one byte holds a request and at least two "
                             f"generation tags), got {num_splits}")
        self.num_splits = num_splits
        self.tag = generation % (REQUEST_VALUES // num_splits)
        self.messages = [bytes([self.tag * num_splits + r]) for r in range(num_splits)]
        self.requests = [value % num_splits if value // num_splits == self.tag else NOT_THIS_GENERATION
                         for value in range(REQUEST_VALUES)]


def request_ids(messages: np.ndarray, num_splits: int) -> np.ndarray:
    """The request ids that request bytes ``messages`` ``[n]`` name, whatever their generation (the
    batcher's reading)."""
    return messages % num_splits


class SlotsExhausted(RuntimeError):
    """A worker needs a free slot and none can come (the serial run has no one to wait for)."""


class WorkerSlots:
    """One worker's side: its free queue, ``take(n)`` and ``emit(slot_ids)``.

    ``owned``: the worker's block (worker_slot_ids); the ones not queued start spare.
    ``send_full(slot_ids)`` puts full slots on the full queue. ``receive(slots, block)`` hands this
    object the ids released since the last call (through ``returned``); with ``block`` it first
    waits until some come, or a timeout passes. ``wait_seconds`` ``[1]``: the seconds ``take``
    spends, added to its element (the worker's WAIT_SLOTS timing)."""

    def __init__(self, arena, owned: np.ndarray, send_full: Callable[[np.ndarray], None],
                 receive: Callable[[WorkerSlots, bool], None], wait_seconds: np.ndarray):
        self.slot_queued = arena.slot_queued
        available = owned[self.slot_queued[owned] == 0]
        self.held = set(available.tolist())  # spare or filling
        self.spare = deque(available.tolist())
        self.send_full = send_full
        self.receive = receive
        self.wait_seconds = wait_seconds

    def take(self, n: int) -> np.ndarray:
        """``n`` spare slot ids (int32), oldest returned first; waits for releases while short."""
        waited = time.perf_counter()
        self.receive(self, False)
        while len(self.spare) < n:
            # A worker past the step budget whose slots all wait in the learner's unfinished batch
            # would wait here for ever: the receive parks it (fastrl.sampling.rollout_worker).
            self.receive(self, True)
        self.wait_seconds[0] += time.perf_counter() - waited
        spare = self.spare
        return np.array([spare.popleft() for _ in range(n)], dtype=SLOT_ID_DTYPE)

    def emit(self, slot_ids: np.ndarray) -> None:
        """Full slots ``[k]`` to the learner: queued from now until it releases them."""
        self.slot_queued[slot_ids] = 1
        self.held.difference_update(slot_ids.tolist())
        self.send_full(slot_ids)

    def park(self, parked: np.ndarray) -> None:
        """Past the step budget: mark this worker in ``parked`` ``[1]`` and take the learner's releases
        until the run stops (``receive`` ends the wait then: ProcessExit), so that the learner is
        never blocked on a full free pipe while it trains on what the workers sent."""
        parked[0] = 1
        while True:
            self.receive(self, True)

    def returned(self, slot_ids: np.ndarray) -> None:
        """Released slots back into the free queue (an id held already is not added twice)."""
        for slot in slot_ids.tolist():
            if slot not in self.held:
                self.held.add(slot)
                self.spare.append(slot)


class FullQueue:
    """The learner's side: full slot ids in arrival order, taken ``batch_size`` at a time, and
    released to their owners (``give_back(worker, slot_ids)``) once copied out."""

    def __init__(self, arena, per_worker: int, batch_size: int, give_back: Callable[[int, np.ndarray], None]):
        self.slot_queued = arena.slot_queued
        self.per_worker = per_worker
        self.batch_size = batch_size
        self.give_back = give_back
        self.queue: deque[int] = deque()

    def put(self, slot_ids: np.ndarray) -> None:
        self.queue.extend(slot_ids.tolist())

    def next_batch(self) -> np.ndarray | None:
        """The ``[batch_size]`` oldest queued ids (int64), or None while fewer are queued."""
        queue = self.queue
        if len(queue) < self.batch_size:
            return None
        return np.array([queue.popleft() for _ in range(self.batch_size)], dtype=np.int64)

    def release(self, slot_ids: np.ndarray) -> None:
        """Hand ``slot_ids`` ``[B]`` back to the workers that own them: their contents were copied out."""
        self.slot_queued[slot_ids] = 0
        owners = slot_ids // self.per_worker
        for w in np.unique(owners):
            self.give_back(int(w), slot_ids[owners == w])


class PolicyQueues:
    """The learner's side with several policies: a FullQueue per policy, each full slot put on its
    env row's policy's queue (``row_policy`` ``[W * E]``, indexed by ``arena.slot_env``), batches
    taken from the queues in turn. With ``drop_untrained`` (self-play) a slot with no valid step
    (a snapshot's rows: nothing to train on) is released as it arrives instead of queued."""

    def __init__(self, arena, per_worker: int, batch_size: int, give_back: Callable[[int, np.ndarray], None],
                 row_policy: np.ndarray, drop_untrained: bool = False):
        num_policies = int(row_policy.max()) + 1
        self.queues = [FullQueue(arena, per_worker, batch_size, give_back) for _ in range(num_policies)]
        self.slot_env = arena.slot_env
        self.valid = arena.valid
        self.row_policy = row_policy
        self.drop_untrained = drop_untrained
        self.release = self.queues[0].release
        self.turn = 0  # the queue asked first for the next batch

    def put(self, slot_ids: np.ndarray) -> None:
        if self.drop_untrained:
            untrained = ~self.valid[slot_ids].any(axis=1)
            if untrained.any():
                self.release(slot_ids[untrained])
                slot_ids = slot_ids[~untrained]
        if len(self.queues) == 1:
            self.queues[0].put(slot_ids)
            return
        policies = self.row_policy[self.slot_env[slot_ids]]
        for p in np.unique(policies):
            self.queues[p].put(slot_ids[policies == p])

    def queued(self) -> int:
        """Full slots held in the queues, not yet taken in a batch."""
        return sum(len(q.queue) for q in self.queues)

    def next_batch(self) -> tuple[int, np.ndarray] | None:
        """(policy, its ``[batch_size]`` oldest queued ids) from the first queue in turn that holds a
        batch, or None while none does."""
        for k in range(len(self.queues)):
            p = (self.turn + k) % len(self.queues)
            batch = self.queues[p].next_batch()
            if batch is not None:
                self.turn = (p + 1) % len(self.queues)
                return p, batch
        return None


def serial_slots(arena, num_workers: int, per_worker: int, batch_size: int,
                 wait_seconds: Callable[[int], np.ndarray], row_policy: np.ndarray | None = None,
                 drop_untrained: bool = False) -> tuple[list[WorkerSlots], PolicyQueues]:
    """The protocol in one process: every worker's WorkerSlots and the learner's PolicyQueues
    (``row_policy``: see there; None, one policy), emits put straight on the full queues and
    releases straight into the owner's free queue. ``wait_seconds(w)`` is worker ``w``'s ``[1]``
    timing element (see WorkerSlots)."""
    workers: list[WorkerSlots] = []
    row_policy = np.zeros(arena.env_slot.size, np.int16) if row_policy is None else row_policy
    full = PolicyQueues(arena, per_worker, batch_size, lambda w, slot_ids: workers[w].returned(slot_ids),
                        row_policy, drop_untrained)
    for w in range(num_workers):
        workers.append(WorkerSlots(arena, worker_slot_ids(w, per_worker), full.put, _nothing_to_wait_for,
                                   wait_seconds(w)))
    return workers, full


def _nothing_to_wait_for(slots: WorkerSlots, block: bool) -> None:
    """The serial run's ``receive``: releases arrive by the learner's own call, never while a worker waits."""
    if block:
        raise SlotsExhausted("serial mode ran out of free trajectory slots; raise slots_per_env")
