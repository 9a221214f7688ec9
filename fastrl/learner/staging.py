"""The learner's batches on their way in: full arena slots gathered into host staging buffers,
the slots released, the batch handed to the learner (which copies it to its device).

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

from .batch import BatchStaging, Trajectories


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
