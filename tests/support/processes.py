"""What a run leaves behind: its processes and its shared-memory segments, judged by the pids
the test started, so that another test's run beside it (pytest-xdist) is not counted."""
import os
import time

import psutil

from fastrl.ipc.arena import SHM_DIR, segment_creator


def still_running(pids) -> list[int]:
    """Of ``pids``, those that have not exited (a zombie has)."""
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def segments_of(*creators: int) -> list[str]:
    """The fastrl segments in /dev/shm that one of ``creators`` made."""
    return [name for name in os.listdir(SHM_DIR) if segment_creator(name) in set(creators)]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
