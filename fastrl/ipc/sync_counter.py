"""Counting what makes the host wait for an accelerator: synchronisations and copies.

A CUDA op returns as soon as it is queued; the host stalls only when it needs a result. That
happens on a read of a value (``.item()``, ``float()``, ``bool()``, ``.tolist()``, ``.numpy()``
after ``.cpu()``), on an op whose output size depends on the data (boolean-mask indexing,
``nonzero``, ``masked_select``, ``unique``, ...: the host must learn the size to allocate the
output), and on a copy to host memory. :class:`SyncCounter` is a ``TorchDispatchMode`` that
counts those ops while it is active, so a test can bound them without a GPU.

Where the tensors live decides what is counted. Pass the accelerator (``SyncCounter("cuda")``) and
only ops on its tensors count, plus every copy between it and the host. Pass the CPU (tests, CI)
and nothing really stalls: every tensor is then taken to live on an accelerator, and the counter
reports the ops that *would* synchronise there. That is an upper bound: reads of tensors that
would have stayed on the host (a batch before its copy to the device, an optimizer's step
counters) and of code that runs on the CPU only are counted too, unless those tensors are named
as ``host``. On the CPU, ``.numpy()`` and ``.tolist()`` never reach the dispatcher, so the counter wraps them
for as long as it is active; copies to the device cannot be seen there (host and device are the
same memory) and stay 0.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# Ops that read a value back or size their output by the data: each one waits for the device.
SYNCING_OPS = {
    aten._local_scalar_dense.default: "item",  # .item(), float(), int()
    aten.is_nonzero.default: "bool",
    aten.equal.default: "equal",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten.unique_dim.default: "unique",
    aten._unique.default: "unique",
    aten._unique2.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.bincount.default: "bincount",
    aten.repeat_interleave.Tensor: "repeat_interleave",
}
# Indexing by a boolean mask: the number of selected elements is data.
MASK_INDEXING_OPS = {aten.index.Tensor: "mask_index", aten.index_put.default: "mask_index_put",
                     aten.index_put_.default: "mask_index_put", aten._index_put_impl_.default: "mask_index_put"}
HOST_READS = ("numpy", "tolist")


class SyncCounter(TorchDispatchMode):
    """``with SyncCounter(device) as counter: ...`` counts, by kind, in ``counter.syncs`` (a
    Counter: ``item``, ``bool``, ``nonzero``, ``mask_index``, ``numpy``, ``tolist``, ``to_host``,
    ...) the host synchronisations of the code inside, and in ``to_host`` / ``to_device`` its
    copies between host and ``device`` (see the module docstring for what the CPU counts).
    ``host``: tensors that stay on the host even beside an accelerator (:func:`optimizer_steps`),
    whose reads the CPU must not count."""

    def __init__(self, device: torch.device | str = "cpu", host: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.device = torch.device(device)
        self.simulated = self.device.type == "cpu"
        self.host = {id(t): t for t in host}  # the tensors are held, so their ids stay theirs
        self.syncs: Counter = Counter()
        self.to_host = 0
        self.to_device = 0
        self._wrapped: dict = {}

    @property
    def total(self) -> int:
        """Host synchronisations counted, all kinds."""
        return sum(self.syncs.values())

    def __enter__(self):
        if self.simulated:
            for name in HOST_READS:
                original = getattr(torch.Tensor, name)
                self._wrapped[name] = (name in torch.Tensor.__dict__, original)
                setattr(torch.Tensor, name, self._host_read(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, (own, original) in self._wrapped.items():
            if own:
                setattr(torch.Tensor, name, original)
            else:
                delattr(torch.Tensor, name)
        self._wrapped.clear()
        return super().__exit__(*exc)

    def _host_read(self, name: str, original):
        counter = self

        def read(tensor, *args, **kwargs):
            if counter._on_device(tensor):
                counter.syncs[name] += 1
                counter.to_host += 1
            return original(tensor, *args, **kwargs)

        return read

    def _is_device(self, device: torch.device) -> bool:
        return device.type == self.device.type and self.device.index in (None, device.index)

    def _on_device(self, value) -> bool:
        if not isinstance(value, torch.Tensor):
            return False
        return id(value) not in self.host if self.simulated else self._is_device(value.device)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [*args, *kwargs.values()]
        if func in SYNCING_OPS:
            if any(self._on_device(a) for a in inputs):
                self.syncs[SYNCING_OPS[func]] += 1
        elif func in MASK_INDEXING_OPS:
            if self._on_device(args[0]) and _masks_data_sized(func, args):
                self.syncs[MASK_INDEXING_OPS[func]] += 1
        elif not self.simulated and func in (aten._to_copy.default, aten.copy_.default):
            self._count_copy(func, args, kwargs)
        return func(*args, **kwargs)

    def _count_copy(self, func, args, kwargs) -> None:
        if func is aten._to_copy.default:
            source = args[0].device
            target = torch.device(kwargs.get("device") or source)
            blocking = not kwargs.get("non_blocking", False)
        else:
            target, source = args[0].device, args[1].device
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        if self._is_device(source) and target.type == "cpu":
            self.to_host += 1
            if blocking:  # the host waits for the device to reach the copy
                self.syncs["to_host"] += 1
        elif source.type == "cpu" and self._is_device(target):
            self.to_device += 1


def optimizer_steps(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The step counters a non-fused, non-capturable torch optimizer keeps on the host whatever
    the parameters' device (it reads them each step); none for a fused one, which keeps them
    beside the parameters."""
    if any(group.get("fused") or group.get("capturable") for group in optimizer.param_groups):
        return []
    return [state["step"] for state in optimizer.state.values() if torch.is_tensor(state.get("step"))]


def _masks_data_sized(func, args) -> bool:
    """Whether an indexing op takes a boolean mask whose selection size the host must learn.
    ``x[mask] = v`` with a one-element host value runs as ``masked_fill_`` (no size needed),
    as ATen's ``index_put_`` dispatches it unless it accumulates."""
    if not any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
        return False
    if func is aten.index.Tensor:
        return True
    value, accumulate = args[2], len(args) > 3 and args[3]
    return accumulate or not (value.numel() == 1 and value.device.type == "cpu")
