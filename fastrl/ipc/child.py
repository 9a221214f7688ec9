"""What every child process does the same way: signals, parent checks, blocking waits, and the
pipes that carry slot and request ids between the processes."""
from __future__ import annotations

import multiprocessing
import os
import select
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import NamedTuple

from threadpoolctl import threadpool_limits

from . import allocator
from .arena import Control

# How long a stopping run gives its children (the learner its final checkpoint) before killing them.
SHUTDOWN_GRACE_S = 15.0
WAIT_TIMEOUT_S = 0.5  # how often a blocked process looks at the stop flag and its parent


class ProcessExit(Exception):
    """The run is stopping (stop flag set or the runner is gone): leave the main loop."""


def configure_child(retain_freed_memory: bool, niceness: int = 0) -> None:
    """Ctrl-C goes to the runner, which stops the children in order; a child ignores it, SIGTERM
    sent to the whole process group (torchrun stopping a rank, fastrl-sweep a trial: the learner
    must live to write its final checkpoint), and a terminal's hang-up, which the runner survives.
    ``retain_freed_memory`` is the config key of that name: see :mod:`fastrl.ipc.allocator`.

    Thread pools are sized where they are made: torch.set_num_threads in the batcher and the
    learner, env.num_threads for envpool; the numba kernels are serial. numpy's BLAS (the
    batcher's MLP path, fastrl.sampling.numpy_mlp) gets one thread here: OpenBLAS otherwise starts one per
    core and its idle threads spin on the cores the envs step on (sampling ran at 0.77x).

    ``niceness`` is added to every thread's (config key ``actor_niceness`` for the rollout workers
    and the batcher): set here, before the envs and the model are made, so that the threads they
    start inherit it. Why: where a CPU learner bounds training, sharing the cores evenly with the
    envs and the batcher stretches its forward-backward; niced actors gave Pong on a CPU 1.23x
    the training env steps/s. Where the actors' round trips bound training it costs, so the
    default is 0 and atari-appo sets it (see docs/results.md#actor-priority)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A handler, not SIG_IGN: an ignored signal stays ignored across exec, so the processes a child
    # starts (ViZDoom engines, a factory env's subprocesses) could not be terminated.
    signal.signal(signal.SIGTERM, _ignore_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    threadpool_limits(1, user_api="blas")
    if retain_freed_memory:
        allocator.retain_freed_memory()
    if niceness:
        lower_priority(niceness)
    global _runner
    _runner = _RunnerWatch()
    check_alive(None)


def _ignore_signal(signum, frame) -> None:
    pass


def lower_priority(niceness: int) -> None:
    """Add ``niceness`` to every thread of this process; threads it starts later inherit it.

    The threads already running (torch's and numba's, started when the process unpickled its
    arguments) are set one by one: on Linux ``os.nice`` changes the calling thread only."""
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + niceness)
    # Without /proc (not Linux) who=0 is the process, whose threads share one niceness there.
    threads = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        except ProcessLookupError:
            pass  # a thread that has just exited
        except PermissionError:
            return  # not permitted here (a sandbox): run at the same priority, which only costs speed


class _RunnerWatch:
    """How a child tells that the runner is gone, in about a microsecond.

    A child started through multiprocessing holds a pipe end whose other end only the runner
    holds (the parent sentinel): it reads as closed once the runner has exited, however it died.
    getppid() would not do: a child forked from the fork server (fastrl.ipc.start) has the server
    as its parent, and the server lives as long as any child does. A process started otherwise
    (a test's plain subprocess) watches its parent's pid."""

    def __init__(self) -> None:
        parent = multiprocessing.parent_process()
        self.poller = None
        self.parent_pid = os.getppid()
        if parent is not None:
            self.poller = select.poll()
            self.poller.register(parent.sentinel, select.POLLIN)

    def runner_gone(self) -> bool:
        if self.poller is not None:
            return bool(self.poller.poll(0))
        return os.getppid() != self.parent_pid


_runner: _RunnerWatch | None = None  # set by configure_child


def runner_alive() -> bool:
    """Whether the runner that started this child is still there (True outside a child)."""
    return _runner is None or not _runner.runner_gone()


def check_alive(control) -> None:
    """Raise ProcessExit when the run is stopping or the runner is gone."""
    if control is not None and control[Control.STOP]:
        raise ProcessExit
    if not runner_alive():
        raise ProcessExit


class ReadablePipes:
    """A fixed set of pipe ends, watched through one ``select.poll`` object registered once.

    multiprocessing's ``wait()`` and ``Connection.poll()`` build, fill and close a selector on
    every call: 4.5 and 3.4 us against 1.0 us for ``ready()`` on two ends, and the rollout
    workers and the batcher ask several times per batch. A multiprocessing pipe end does not
    buffer what it has read, so its descriptor is readable exactly when a message (or the other
    end's close) is waiting."""

    def __init__(self, conns) -> None:
        self._poller = select.poll()
        self._conn_of_fd: dict[int, Connection] = {}
        for conn in conns:
            self._poller.register(conn.fileno(), select.POLLIN)
            self._conn_of_fd[conn.fileno()] = conn

    def ready(self, timeout_s: float = 0.0) -> list[Connection]:
        """The ends with a message waiting (or whose other end closed), after at most ``timeout_s``."""
        return [self._conn_of_fd[fd] for fd, _ in self._poller.poll(timeout_s * 1000.0)]

    def wait(self, control, timeout_s: float = WAIT_TIMEOUT_S) -> list[Connection]:
        """Block until an end is readable; raise ProcessExit when the run stops."""
        ready = self.ready(timeout_s)
        check_alive(control)
        return ready


class WorkerChannels(NamedTuple):
    """One rollout worker's pipe ends (``_in`` receives, ``_out`` sends)."""

    requests_out: Connection | None  # request ids of env batches ready to act on, to the batcher
    actions_in: Connection | None  # request ids whose actions the batcher wrote (None: no batcher)
    full_out: Connection  # ids of full slots, to the learner
    free_in: Connection  # ids of slots the learner is done with


class BatcherChannels(NamedTuple):
    """The inference batcher's ends, one per worker (index = worker id)."""

    requests_in: list[Connection]
    actions_out: list[Connection]


class LearnerChannels(NamedTuple):
    """The learner's ends, one per worker (index = worker id)."""

    full_in: list[Connection]
    free_out: list[Connection]


@dataclass(frozen=True)
class RunChannels:
    """Every pipe of one node: four one-way pipes per worker, two to the batcher, two to the learner
    (two per worker when no batcher runs).

    The ends are named tuples, so a process may also unpack its ends (``full_in, free_out = channels``)."""

    workers: list[WorkerChannels]
    batcher: BatcherChannels | None  # None when the workers act for themselves (inference.in_workers)
    learner: LearnerChannels


def make_channels(ctx, num_workers: int, batcher: bool = True) -> RunChannels:
    """The pipes of a run with ``num_workers`` rollout workers, made with the multiprocessing context ``ctx``.

    ``batcher=False`` (the workers act for themselves) leaves out the batcher's two pipes per worker."""
    full_in, full_out = _one_way_pipes(ctx, num_workers)
    free_in, free_out = _one_way_pipes(ctx, num_workers)
    learner = LearnerChannels(full_in, free_out)
    if not batcher:
        return RunChannels([WorkerChannels(None, None, full_out[w], free_in[w]) for w in range(num_workers)],
                           None, learner)
    requests_in, requests_out = _one_way_pipes(ctx, num_workers)
    actions_in, actions_out = _one_way_pipes(ctx, num_workers)
    workers = [WorkerChannels(requests_out=requests_out[w], actions_in=actions_in[w], full_out=full_out[w],
                              free_in=free_in[w]) for w in range(num_workers)]
    return RunChannels(workers, BatcherChannels(requests_in, actions_out), learner)


def _one_way_pipes(ctx, n: int) -> tuple[list[Connection], list[Connection]]:
    """``n`` pipes as (receiving ends, sending ends)."""
    receiving, sending = zip(*(ctx.Pipe(duplex=False) for _ in range(n)))
    return list(receiving), list(sending)
