"""The learner's batches on their way in: full arena slots gathered into host staging buffers,
the slots released, the batch handed to the learner (which copies it to its device).
:class:`BatchStaging` is one staging set (host buffers that one batch is gathered into);
:class:`BatchFeed` takes turns between two of them; :func:`gather_trajectories` copies slots into a
new batch once.

Two staging sets are used in turn. On the CPU the learner reads them directly (no copy beyond the
gather) and each batch is gathered in line, then trained on. On the device path
(``learner.device_path``: a CUDA learner, or one forced onto that path in the tests) the sets are
pinned on CUDA, so that the learner's copy of each field to the device is one asynchronous copy, and
each batch is gathered on a background thread while the learner trains on the previous one: a batch
is trained one call after it arrives (one update more of policy lag), and a run's last batch by
``LearnerRuntime.flush`` at the end (one rank only: see fastrl.learner.process). Its slots are
released as soon as it has been copied out (copy, then release), so the workers never wait for the
training. An event recorded after each training (and so after its copies to the device) is waited on
before the set it read is filled again.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from .batch import Trajectories

# Trajectories field -> its rows per slot beyond T (obs has T + 1); terminated, truncated and
# valid are stored as 0/1 bytes and read as bool.
_STEP_FIELDS = {"obs": 1, "actions": 0, "behaviour_logp": 0, "rewards": 0, "terminated": 0, "truncated": 0,
                "valid": 0, "version": 0}
_BOOL_FIELDS = ("terminated", "truncated", "valid")


class BatchStaging:
    """Host buffers for one batch of ``B`` trajectory slots, refilled by every :meth:`gather`.

    Each field is one ``np.take`` from the arena straight into its buffer, laid out time-major
    (``[T(+1), B, ...]``): no temporary, no allocation per batch, and numpy drops the GIL while
    it copies (a background thread can gather while the learner trains). ``pin``: page-locked
    buffers, which a CUDA copy can read asynchronously (torch refuses to pin without CUDA)."""

    def __init__(self, arena, batch_size: int, pin: bool = False):
        self.arena = arena
        self.batch_size = batch_size
        self.num_slots, T = arena.rewards.shape
        names = [*_STEP_FIELDS, *(["initial_state"] if "slot_state" in arena.arrays else [])]
        self.sources = {name: self._source(name) for name in names}
        self.buffers = {}
        for name, source in self.sources.items():
            rows = () if name == "initial_state" else (T + _STEP_FIELDS[name],)
            empty = torch.from_numpy(np.empty(0, source.dtype))
            self.buffers[name] = torch.empty((*rows, batch_size, *source.shape[1:]), dtype=empty.dtype,
                                             pin_memory=pin)
        self.batch = Trajectories(**self.buffers)

    def _source(self, name: str) -> np.ndarray:
        """The arena's array of ``name``, rows flattened to ``[N * rows, ...]`` (a view)."""
        if name == "initial_state":
            return self.arena.slot_state
        array = self.arena.arrays[name]
        if name in _BOOL_FIELDS:
            array = array.view(np.bool_)
        return array.reshape(-1, *array.shape[2:])

    def gather(self, slot_ids: np.ndarray) -> Trajectories:
        """Copy the slots ``slot_ids`` ``[B]`` into the buffers; returns the batch over them (the
        same tensors every call: the caller must be done with the last batch)."""
        slots = np.asarray(slot_ids, dtype=np.int64)
        if slots.shape != (self.batch_size,) or slots.min() < 0 or slots.max() >= self.num_slots:
            raise IndexError(f"BatchStaging.gather: need {self.batch_size} slot ids in [0, {self.num_slots}), "
                             f"got {slots.tolist()}")
        for name, source in self.sources.items():
            out = self.buffers[name].numpy()
            if name == "initial_state":
                index = slots
            else:
                rows = len(out)
                index = (slots[None, :] * rows + np.arange(rows)[:, None]).ravel()  # [t, b] -> slot b's row t
            # mode="clip": indices were checked above; the default "raise" buffers ``out`` (a second copy).
            np.take(source, index, axis=0, out=out.reshape(len(index), *source.shape[1:]), mode="clip")
        return self.batch


def gather_trajectories(arena, slot_ids: np.ndarray) -> Trajectories:
    """Copy the trajectory slots ``slot_ids`` ``[B]`` out of the arena into a new time-major batch."""
    return BatchStaging(arena, len(slot_ids)).gather(slot_ids)


@dataclass
class Gathered:
    """A gathered batch: ``batch`` (views of one staging set), ``env_ids`` ``[B]`` int64 each
    trajectory's env, ``fresh`` ``[B]`` bool the env's first trajectory since its worker (re)started."""

    batch: Trajectories
    env_ids: np.ndarray
    fresh: np.ndarray
    staging: int  # index of the staging set that holds it


class BatchFeed:
    """Gathers full slots of ``arena`` for a learner on ``device``; ``pipelined``: gather on a
    background thread, one batch ahead of the training (the device path, module docstring)."""

    def __init__(self, arena, device: torch.device, pipelined: bool):
        self.arena = arena
        self.pin = device.type == "cuda"
        self.stagings: list[BatchStaging | None] = [None, None]
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fastrl-gather") if pipelined else None
        self.waiting: Gathered | None = None  # gathered at the last call, not yet trained on

    @property
    def pipelined(self) -> bool:
        return self.pool is not None

    def take_waiting(self) -> Gathered | None:
        """The batch to train on before this call's (device path), handed over once."""
        waiting, self.waiting = self.waiting, None
        return waiting

    def gather(self, slot_ids: np.ndarray) -> Future:
        """Start copying the slots ``slot_ids`` ``[B]`` into the next staging set: on the device
        path in the background, else now. The future's result is a :class:`Gathered`."""
        staging, self.turn = self.turn, 1 - self.turn
        if self.pool is not None:
            return self.pool.submit(self._gather, staging, slot_ids)
        done = Future()
        done.set_result(self._gather(staging, slot_ids))
        return done

    def arrived(self, gathered: Gathered) -> Gathered | None:
        """The batch to train on now that ``gathered`` is in (its slots released): ``gathered``
        itself on the CPU; on the device path none, it waits for the next call."""
        if self.pool is None:
            return gathered
        self.waiting = gathered
        return None

    def trained(self, gathered: Gathered) -> None:
        """The learner has queued all its work on ``gathered``: its staging set may be refilled
        once that work is done."""
        if self.pin:
            event = self.events[gathered.staging] = torch.cuda.Event()
            event.record()

    def _gather(self, staging: int, slot_ids: np.ndarray) -> Gathered:
        slot_ids = np.asarray(slot_ids, dtype=np.int64)
        event = self.events[staging]
        if event is not None:
            event.synchronize()  # the copies to the device that read this set are done
        buffers = self.stagings[staging]
        if buffers is None or buffers.batch_size != len(slot_ids):
            buffers = self.stagings[staging] = BatchStaging(self.arena, len(slot_ids), pin=self.pin)
        return Gathered(buffers.gather(slot_ids), self.arena.slot_env[slot_ids].astype(np.int64),
                        self.arena.slot_fresh[slot_ids].astype(bool), staging)
