"""The C heap of fastrl's processes: freed tensor memory is kept for the next batch.

glibc serves an allocation above its mmap threshold (128 KiB at start, raised on the fly up to
32 MiB) with a fresh ``mmap`` and returns it to the kernel on ``free``; it also gives the top of
the heap back once more than the trim threshold lies free there. Then a batch can page-fault its
activations and gradients in again. For a CartPole learner step (``[4224, 64]`` activations, 1 MiB
each), whether glibc settles into that depends on the order of allocations: without this
setting a call can page-fault hundreds of times.

:func:`retain_freed_memory` serves every allocation from the heap (no block gets a mapping of its
own) and never trims it, so a process's resident memory stays at its peak instead of following
each batch down and back up. Blocks above 32 MiB matter most: glibc would map each afresh per use
whatever its threshold, and a ViZDoom learner batch (528 frames of 72x128x3, ``convnet_simple``)
allocates several: mapping none of them makes its train() 1.31x faster (see docs/results.md#heap).
"""
from __future__ import annotations

import ctypes
import os
import platform

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
LARGEST_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's cap on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
NEVER_TRIM = 2 ** 31 - 1  # mallopt takes a C int

# A user who tunes glibc's heap through its own variables keeps their settings: the four that set
# what mallopt would set, and any glibc.malloc tunable.
GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
GLIBC_MALLOC_TUNABLE = "glibc.malloc."


def users_heap_settings(environ=os.environ) -> bool:
    return (any(name in environ for name in GLIBC_VARIABLES)
            or GLIBC_MALLOC_TUNABLE in environ.get("GLIBC_TUNABLES", ""))


def retain_freed_memory() -> bool:
    """Keep every freed block in this process's heap for reuse (glibc only); True if set.

    Nothing is changed off glibc (macOS, musl) or when the user tunes glibc's heap
    (:data:`GLIBC_VARIABLES`, or a ``glibc.malloc.*`` entry in ``GLIBC_TUNABLES``)."""
    if platform.libc_ver()[0] != "glibc" or users_heap_settings():
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # The threshold too, though M_MMAP_MAX 0 maps no block: glibc stops raising it on the fly once set.
    return (bool(mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD)) and bool(mallopt(M_MMAP_MAX, 0))
            and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)))
