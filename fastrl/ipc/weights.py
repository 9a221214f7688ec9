"""A model kept at the learner's newest published weights: what the inference batcher acts with
and the evaluator evaluates.

The learner publishes flat float32 weights through :class:`fastrl.ipc.arena.WeightBuffer` (two buffers,
a seqlock each). A reader copies the newest into a host buffer (pinned when it feeds a GPU), then
into a flat buffer on its device that the model's tensors view (fastrl.ipc.device_io.view_flat): one
copy loads every weight, at addresses a compiled policy (CUDA graphs) can keep.
"""
from __future__ import annotations

import time

import torch

from ..models.networks import num_state_values, state_tensors
from .arena import Arena, WeightBuffer
from .device_io import pinned_empty, view_flat

TORN_READ_RETRY_S = 0.001  # the learner is writing the buffer just read: it is done within moments


class PublishedWeights:
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
