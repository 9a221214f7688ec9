"""Session-wide guard: the suite must leave no fastrl process or shared-memory segment behind."""
import os

import psutil
import pytest

from fastrl.shm import SEGMENT_PREFIX


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(SEGMENT_PREFIX)} \
        if os.path.isdir("/dev/shm") else set()


@pytest.fixture(scope="session", autouse=True)
def no_leftovers():
    before = _segments()
    yield
    me = psutil.Process()
    children = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())]
    assert not children, f"processes left behind: {[(p.pid, p.cmdline()) for p in children]}"
    assert _segments() <= before, f"shared memory left in /dev/shm: {_segments() - before}"
