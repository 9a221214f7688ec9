"""A dispatch mode that records the copies a device would make, for the CPU-only tests of the
device paths (fastrl.ipc.sync_counter sees no copies to a device on the CPU)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class DeviceCopies(TorchDispatchMode):
    """Shapes of the tensors copied to a named device (``x.to(device)``); on the CPU a copy to the
    CPU that is no copy never reaches the dispatcher, so what is recorded is what a device would copy."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") is not None:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **kwargs)
