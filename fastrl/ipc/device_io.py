"""Host <-> device traffic of the inference batcher and the learner's weight publication.

Every blocking copy between host and GPU is a host synchronisation, and every small copy pays a
fixed launch cost. So a batch crosses in one copy each way: its inputs are gathered straight into
one host byte buffer (pinned on CUDA, so the copy to the device is asynchronous) and copied to
the device at once; its outputs are packed into one device byte buffer and copied back at once.
On the CPU host and device memory are one, so the plain path there copies nothing; ``staged=True``
forces the staged path on the CPU, which is how tests count its copies without a GPU.
"""
from __future__ import annotations

import math

import numpy as np
import torch

_ALIGN = 64  # every array starts on a 64-byte boundary, so any dtype can view its bytes
NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
                torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
                torch.uint8: np.uint8, torch.bool: np.bool_}


def pinned_empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An empty host tensor, page-locked when it feeds a CUDA ``device`` (``pin_memory`` raises
    without CUDA)."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


def _offsets(nbytes: list[int]) -> tuple[list[int], int]:
    """Aligned start of each array of ``nbytes`` bytes packed in order, and the total size."""
    offsets, cursor = [], 0
    for n in nbytes:
        offsets.append(cursor)
        cursor += -(-n // _ALIGN) * _ALIGN
    return offsets, cursor


class ByteBuffer:
    """A byte buffer on the host (pinned for CUDA) and its twin on ``device``, regrown to the next
    power of two when a batch needs more."""

    def __init__(self, device: torch.device):
        self.device = device
        self.host = pinned_empty(0, torch.uint8, device)
        self.host_np = self.host.numpy()
        self.on_device = torch.empty(0, dtype=torch.uint8, device=device)

    def reserve(self, nbytes: int) -> None:
        if nbytes > self.host.numel():
            size = 1 << max(nbytes - 1, 0).bit_length()
            self.host = pinned_empty(size, torch.uint8, self.device)
            self.host_np = self.host.numpy()
            self.on_device = torch.empty(size, dtype=torch.uint8, device=self.device)


class BatchTransfer:
    """Moves one batch's arrays host -> device and device -> host, one copy each way when
    ``staged`` (the default on CUDA)."""

    def __init__(self, device: torch.device, staged: bool | None = None):
        self.device = device
        self.staged = device.type == "cuda" if staged is None else staged
        self.inputs = ByteBuffer(device)
        self.outputs = ByteBuffer(device)
        self._input_offsets: list[int] = []

    def host_arrays(self, specs: list[tuple[tuple, np.dtype]]) -> list[np.ndarray]:
        """Empty host arrays of ``specs`` ``[(shape, numpy dtype), ...]`` for the caller to fill,
        then hand to :meth:`to_device`; on the staged path views into the staging buffer."""
        if not self.staged:
            return [np.empty(shape, dtype) for shape, dtype in specs]
        nbytes = [math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in specs]
        self._input_offsets, total = _offsets(nbytes)
        self.inputs.reserve(total)
        return [self.inputs.host_np[o:o + n].view(dtype).reshape(shape)
                for o, n, (shape, dtype) in zip(self._input_offsets, nbytes, specs)]

    def to_device(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """The arrays of the last :meth:`host_arrays` call as tensors on the device."""
        if not self.staged:
            return [torch.from_numpy(a).to(self.device, non_blocking=True) for a in arrays]
        end = self._input_offsets[-1] + arrays[-1].nbytes
        # Asynchronous from pinned memory: the batch's blocking copy back (to_host) completes it
        # before the next batch overwrites the staging buffer.
        self.inputs.on_device[:end].copy_(self.inputs.host[:end], non_blocking=True)
        return [self.inputs.on_device[o:o + a.nbytes].view(torch.from_numpy(a).dtype).view(a.shape)
                for o, a in zip(self._input_offsets, arrays)]

    def to_host(self, tensors: list[torch.Tensor]) -> list[np.ndarray]:
        """The device ``tensors`` as host arrays, valid until the next call."""
        if not self.staged:
            return [t.cpu().numpy() for t in tensors]
        nbytes = [t.numel() * t.element_size() for t in tensors]
        offsets, total = _offsets(nbytes)
        out = self.outputs
        out.reserve(total)
        for o, n, t in zip(offsets, nbytes, tensors):
            out.on_device[o:o + n].view(t.dtype).view(t.shape).copy_(t)
        out.host[:total].copy_(out.on_device[:total])  # the batch's one wait for the device
        return [out.host_np[o:o + n].view(NUMPY_DTYPES[t.dtype]).reshape(t.shape)
                for o, n, t in zip(offsets, nbytes, tensors)]


def view_flat(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Make ``tensors`` (a model's state, see fastrl.models.networks.state_tensors) views of consecutive
    slices of the 1-D ``flat`` on their device, their values copied in: a later ``flat.copy_``
    then loads all of them in one copy, at addresses that CUDA graphs can keep."""
    offset = 0
    for tensor in tensors:
        n = tensor.numel()
        view = flat[offset:offset + n].view_as(tensor)
        view.copy_(tensor.detach())
        tensor.data = view
        offset += n
