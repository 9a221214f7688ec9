"""The learner's arithmetic: ``learner.precision`` = float32 | bfloat16 | auto.

``auto`` is bfloat16 for the V-trace learners and DQN on a CPU that computes in bf16 natively
(x86's AVX512_BF16 or AMX-BF16: oneDNN's bf16 convolutions and matmuls run at up to twice the
float32 rate there) and float32 everywhere else: on GPUs, which a user tunes knowingly, on CPUs
that would emulate bf16 (slower than float32), and for r2d2 and sac, which train in float32. Only x86
Linux flags are read: on ARM (whose ``Features`` list ``bf16``) and on macOS ``auto`` is float32;
set bfloat16 there by hand. On a CPU with AVX512_BF16 a Pong learner's ``train()`` takes 0.6 of
its float32 time (see docs/results.md#bf16-or-float32-on-a-cpu).
"""
from __future__ import annotations

import torch

from ..config import BF16_LEARNERS

# x86 flags (Linux /proc/cpuinfo names) of native bfloat16 arithmetic.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags as Linux lists them; empty where there is no such file."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def native_bf16(flags: set[str] | None = None) -> bool:
    """Whether this CPU (``flags``: its, read from the running CPU by default) computes in bf16
    natively. Without oneDNN torch would emulate bf16 even on such a CPU."""
    flags = cpu_flags() if flags is None else flags
    return any(flag in flags for flag in NATIVE_BF16_FLAGS) and torch.backends.mkldnn.is_available()


def learner_precision(setting: str, algo: str, device: torch.device, flags: set[str] | None = None) -> str:
    """``setting`` (``learner.precision``) resolved for a learner of ``algo`` on ``device``:
    "float32" or "bfloat16"; ``flags`` the CPU's (default: read from the running CPU)."""
    if setting != "auto":
        return setting
    if algo not in BF16_LEARNERS or device.type != "cpu":
        return "float32"
    return "bfloat16" if native_bf16(flags) else "float32"


def emulated_bf16_warning(setting: str, algo: str, device: torch.device, flags: set[str] | None = None) -> str | None:
    """A line for a learner set to bfloat16 on a CPU that would emulate it, else None."""
    if setting != "bfloat16" or algo not in BF16_LEARNERS or device.type != "cpu" or native_bf16(flags):
        return None
    return ("[fastrl] learner.precision=bfloat16 on a CPU without native bf16 (avx512_bf16 or amx_bf16): torch "
            "emulates it, 0.27x float32's env steps/s for atari-dqn-cpu on an AVX2 host; set "
            "learner.precision=auto (bf16 where native) or float32")
