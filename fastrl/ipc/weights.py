"""Weight publication: the learner writes each weight set's flat float32 weights into the arena,
and the inference batcher and the evaluator read them into their models.

:class:`WeightBuffer` is the shared double buffer of one weight set with its seqlock: the learner
(and the league, for its snapshots) writes through ``publish``, a reader copies through ``read_into``.
:class:`WeightReader` keeps a model at the newest weights: it copies them into a host buffer
(pinned when it feeds a GPU), then into a flat buffer on its device that the model's tensors view
(fastrl.ipc.device_io.view_flat). One copy loads every weight, at addresses a compiled policy (CUDA
graphs) can keep.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..models.networks import num_state_values, state_tensors
from .arena import Arena
from .device_io import pinned_empty, view_flat

TORN_READ_RETRY_S = 0.001  # the learner is writing the buffer just read: it is done within moments


class WeightBuffer:
    """Flat float32 weights of weight set ``index`` (a policy, or a league snapshot) published by
    the learner, read by the inference batcher.

    Two buffers and a seqlock per buffer: the learner writes version ``v`` into buffer ``v % 2``
    (sequence odd while writing), then publishes ``v``. A reader copies buffer ``v % 2`` and keeps
    the copy only if that buffer's sequence was even and unchanged around the copy, so a torn read
    is retried instead of used.
    """

    def __init__(self, arena: Arena, index: int = 0):
        self.weights = arena.weights[index]
        self.seq = arena.weight_seq[index]
        self.version = arena.weight_version[index:index + 1]

    def publish(self, flat: np.ndarray, version: int) -> None:
        slot = version % 2
        self.seq[slot] += 1
        self.weights[slot, :] = flat
        self.seq[slot] += 1
        self.version[0] = version

    def read_into(self, out: np.ndarray) -> int | None:
        """Copy the newest weights into ``out``; return their version, or None if torn."""
        version = int(self.version[0])
        slot = version % 2
        before = int(self.seq[slot])
        if before % 2:
            return None
        out[:] = self.weights[slot]
        if int(self.seq[slot]) != before:
            return None
        return version


class WeightReader:
    """Loads the weights the learner publishes in ``arena`` for weight set ``index`` (a policy, or a
    self-play snapshot) into ``model`` (already on ``device``)."""

    def __init__(self, arena: Arena, model: torch.nn.Module, device: torch.device, index: int = 0):
        self.buffer = WeightBuffer(arena, index)
        self.host = pinned_empty(num_state_values(model), torch.float32, device)  # [P] newest weights read
        self.host_np = self.host.numpy()
        self.on_device = torch.empty_like(self.host, device=device)
        with torch.no_grad():
            view_flat(state_tensors(model), self.on_device)
        self.version = -1  # of the weights loaded; -1 before the first

    def refresh(self) -> bool:
        """Load the newest published weights when they are newer than the model's; a torn read is
        left for the next call. True once any weights are loaded."""
        published = int(self.buffer.version[0])
        if published != self.version and published >= 0:
            version = self.buffer.read_into(self.host_np)
            if version is not None:
                # Blocking: the next read_into overwrites this copy's source.
                self.on_device.copy_(self.host)
                self.version = version
        return self.version >= 0

    def load_newest(self, keep_going=None) -> int | None:
        """Load the newest published weights, retrying torn reads; their version, None before the
        learner's first publication. ``keep_going()`` (raises to stop) is called between retries."""
        while int(self.buffer.version[0]) >= 0:
            self.version = -1  # reload even the same version: a torn read may not be kept
            if self.refresh():
                return self.version
            if keep_going is not None:
                keep_going()
            time.sleep(TORN_READ_RETRY_S)
        return None
