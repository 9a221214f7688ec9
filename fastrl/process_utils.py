"""What every child process does the same way: thread limits, signals, blocking waits."""
from __future__ import annotations

import os
import signal
from multiprocessing.connection import wait

from .shm import Control

WAIT_TIMEOUT_S = 0.5  # how often a blocked process looks at the stop flag and its parent


class ProcessExit(Exception):
    """The run is stopping (stop flag set or the runner is gone): leave the main loop."""


def limit_threads(num_threads: int = 1) -> None:
    """Keep torch, numba and BLAS pools from oversubscribing the cores (measured: torch with two
    intra-op threads stalls for milliseconds on a 2-vCPU VM). Call before importing them."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(num_threads)


def configure_child(parent_pid: int, num_threads: int = 1) -> None:
    """Ctrl-C goes to the runner, which stops the children in order; a child ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_threads(num_threads)
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
