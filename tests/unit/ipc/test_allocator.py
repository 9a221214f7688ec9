"""fastrl.ipc.allocator: freed heap blocks stay in the process (glibc's mallopt), checked on the
process's own memory map in a fresh interpreter (the settings are per process)."""
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from fastrl.ipc import child as process_utils
from fastrl.ipc.allocator import GLIBC_VARIABLES

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

# Prints whether fresh 1 MiB and 64 MiB mallocs land in the [heap] mapping (64 MiB is above the largest
# threshold glibc allows: only mapping nothing keeps it), and whether freeing 64 MiB at
# the heap's top shrinks that mapping (a trim), after calling retain_freed_memory() or not.
PROBE = textwrap.dedent("""
    import ctypes, sys
    from fastrl.ipc.allocator import retain_freed_memory
    changed = retain_freed_memory() if sys.argv[1] == "retain" else False
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    def heap():
        for line in open("/proc/self/maps"):
            if line.rstrip().endswith("[heap]"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                return lo, hi
        return 0, 0
    block = libc.malloc(1 << 20)
    lo, hi = heap()
    in_heap = lo <= block < hi
    big = libc.malloc(64 << 20)
    ctypes.memset(big, 1, 64 << 20)
    lo, top = heap()
    big_in_heap = lo <= big < top
    libc.free(big)
    trimmed = heap()[1] < top
    print(changed, in_heap and big_in_heap, trimmed)
""")


def probe(mode: str, env: dict | None = None) -> list[str]:
    """The probe's three words, in an environment cleared of the caller's own heap settings."""
    clean = {k: v for k, v in os.environ.items() if k not in GLIBC_VARIABLES and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**clean, **(env or {})})
    return out.stdout.split()


def test_retained_blocks_come_from_the_heap_and_are_not_trimmed():
    assert probe("retain") == ["True", "True", "False"]


def test_glibc_default_maps_a_large_block_on_its_own():
    # The reference the test above differs from: a fresh process mmaps 1 MiB outside the heap.
    _, in_heap, _ = probe("default")
    assert in_heap == "False"


def test_the_users_own_glibc_settings_win():
    changed, in_heap, _ = probe("retain", {"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert (changed, in_heap) == ("False", "False")


def test_a_glibc_malloc_tunable_is_the_users_setting_too():
    changed, in_heap, _ = probe("retain", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"})
    assert (changed, in_heap) == ("False", "False")


@pytest.mark.parametrize("setting", [True, False])
def test_a_child_retains_freed_memory_only_when_the_config_says_so(monkeypatch, setting):
    calls = []
    monkeypatch.setattr(process_utils.allocator, "retain_freed_memory", lambda: calls.append(1))
    monkeypatch.setattr(process_utils.signal, "signal", lambda *args: None)
    process_utils.configure_child(setting)
    assert len(calls) == int(setting)
