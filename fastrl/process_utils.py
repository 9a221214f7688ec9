"""What every child process does the same way: signals, parent checks, blocking waits."""
from __future__ import annotations

import os
import signal
from multiprocessing.connection import wait

from .shm import Control

WAIT_TIMEOUT_S = 0.5  # how often a blocked process looks at the stop flag and its parent


class ProcessExit(Exception):
    """The run is stopping (stop flag set or the runner is gone): leave the main loop."""


def configure_child(parent_pid: int) -> None:
    """Ctrl-C goes to the runner, which stops the children in order; a child ignores it.

    Thread pools are sized where they are made: torch.set_num_threads in the batcher and the
    learner, env.num_threads for envpool; the numba kernels are serial."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    check_alive(None, parent_pid)


def check_alive(control, parent_pid: int) -> None:
    if control is not None and control[Control.STOP]:
        raise ProcessExit
    if os.getppid() != parent_pid:
        raise ProcessExit


def wait_readable(conns, control, parent_pid: int, timeout: float = WAIT_TIMEOUT_S) -> list:
    """Block until one of ``conns`` is readable; raise ProcessExit when the run stops."""
    ready = wait(conns, timeout)
    check_alive(control, parent_pid)
    return ready
