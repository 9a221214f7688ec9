"""How a run starts its child processes: forked from a fork server that has imported torch,
numpy, numba, envpool and fastrl's process modules once.

A spawned child is a fresh interpreter that imports all of that again: about 2 s of a core per
child, so 8-10 s of CPU before a four-process run steps its first env, on every start and every
restarted worker. The fork server (multiprocessing's ``forkserver``) pays it once per runner and
forks each child from that state. train() starts the server before it probes the env, so the
server's imports overlap the probe; it lives as long as the runner, and a process that runs
several runs (a notebook, the test suite) keeps it.
Forking from it is safe where forking the runner would not be: the server has started no thread,
touched no GPU and opened no env. A child still gets its arguments pickled, and imports the
runner's ``__main__`` as a spawned one does (hence the ``__main__`` guard, fastrl.run.main_guard).

A child takes the runner's environment as it is when the child starts, not the server's: a
variable set between two runs (CUDA_VISIBLE_DEVICES, the collectives' interfaces) reaches it."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from multiprocessing import forkserver

# What the fork server imports; a module that is not installed (envpool) is skipped. The warm-up
# goes last: it does what each child would repeat on first use (its docstring has the figures).
PRELOADED = ("numpy", "torch", "numba", "envpool", "fastrl.sampling.rollout_worker", "fastrl.sampling.batcher",
             "fastrl.learner.process", "fastrl.evaluation.evaluator", "fastrl.profiler.rawenv",
             "fastrl.ipc.fork_server_warmup")


def child_context():
    """The multiprocessing context a run's children, pipes and queues come from, its fork server
    running.

    The server is started with SIGTERM and SIGHUP ignored (dispositions it keeps through exec):
    SIGTERM to the run's process group (torchrun stopping a rank, fastrl-sweep a trial) and a
    terminal's hang-up must leave it to report its children's exits to the runner while they stop
    in order, as they ignore them too (fastrl.ipc.child.configure_child). It exits once the runner
    and every child are gone. Starting it does not wait for its imports."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOADED))  # read when the server starts; no-op after
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        forkserver.ensure_running()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return ctx


def fork_server_pid() -> int | None:
    """The pid of this process's fork server, None where none was started (or it was stopped)."""
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def stop_fork_server() -> None:
    """Stop this process's fork server at once, its imports finished or not, so that a command
    refused after starting it (fastrl-train) leaves no process behind. A no-op where none runs, and
    where a child forked from it still runs: the server is the parent that reaps it."""
    server = forkserver._forkserver
    pid = fork_server_pid()
    if pid is None or multiprocessing.active_children():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # it ignores SIGTERM (child_context), and would finish its imports first
    with contextlib.suppress(OSError):
        server._stop()  # reaps it and removes its socket (CPython 3.10-3.13 name it so)


def child_process(ctx, target, name: str, args: tuple, daemon: bool | None = None):
    """A Process of ``ctx`` that runs ``target(*args)`` in the runner's current environment."""
    return ctx.Process(target=_in_environment, name=name, args=(dict(os.environ), target, args), daemon=daemon)


def _in_environment(environ: dict, target, args: tuple) -> None:
    os.environ.clear()
    os.environ.update(environ)
    target(*args)
