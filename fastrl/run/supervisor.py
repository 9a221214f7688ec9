"""Supervision of a run's processes: crashed rollout workers and a failed evaluator restarted,
any other child's exit turned into the run's one-line RunError, and the stop in order at the end
(the learner given time for its final checkpoint, stragglers killed)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import deque
from multiprocessing.connection import wait
from pathlib import Path

import psutil

from ..config import Config
from ..evaluation.evaluator import MAX_RESTARTS as EVALUATOR_MAX_RESTARTS
from ..evaluation.evaluator import given_up_notice, restarted_notice
from ..files.run_dir import write_atomic
from ..ipc.arena import Arena, Control, get_error
from ..ipc.child import SHUTDOWN_GRACE_S
from ..reporting.console import Console
from .plan import ChildExited, RunError


class Supervisor:
    """Watches the children: restarts crashed rollout workers, and the evaluator (an observer: up
    to EVALUATOR_MAX_RESTARTS times, then the run goes on without it); stops the run on anything
    else. ``evaluator_failures`` is the read end of the pipe every evaluator says its failure on."""

    def __init__(self, cfg: Config, arena: Arena, make_worker, procs: dict, run_dir: Path | None,
                 console: Console, process_file: str = "processes.json", make_evaluator=None,
                 evaluator_failures=None):
        self.cfg = cfg
        self.console = console
        self.arena = arena
        self.make_worker = make_worker
        self.procs = procs
        self.run_dir = run_dir
        self.process_file = process_file
        self.make_evaluator = make_evaluator
        self.evaluator_failures = evaluator_failures
        self.restart_times: deque[float] = deque()
        self.restarts = {"rollout": 0, "evaluator": 0}
        self.generations = [0] * len(procs["rollout"])

    def restart_counts(self) -> dict:
        """The metrics' restart counters (evaluator_restarts where this rank evaluates)."""
        counts = {"worker_restarts": self.restarts["rollout"]}
        if "evaluator" in self.procs:
            counts["evaluator_restarts"] = self.restarts["evaluator"]
        return counts

    def everyone(self) -> list:
        return [p for group in self.procs.values() for p in group]

    def write_process_file(self) -> None:
        """processes.json: every pid of the run by role, the runner's too (for the profiler and
        ``scripts/bench.py soak``; the directory's lock is what marks it in use, fastrl.files.run_dir)."""
        if self.run_dir is not None:
            pids = {role: [p.pid for p in group] for role, group in self.procs.items()}
            write_atomic(self.run_dir / self.process_file, json.dumps({**pids, "runner": [os.getpid()]}))

    def watch(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a child to exit; handle it. Raises RunError to stop the run."""
        dead = wait([p.sentinel for p in self.everyone()], timeout=timeout)
        if self.arena.control[Control.ERROR]:
            raise RunError(get_error(self.arena))
        for p in [p for p in self.everyone() if p.sentinel in dead]:
            p.join(1.0)  # reap it, so that exitcode is known
            if p in self.procs["rollout"]:
                self.restart_worker(self.procs["rollout"].index(p), p)
            elif p in self.procs.get("evaluator", ()):
                self.restart_evaluator(p)
            else:
                raise ChildExited(f"{p.name} (pid {p.pid}) exited with code {p.exitcode}; the run stopped "
                               f"(the last checkpoint is kept)")

    def restart_worker(self, w: int, dead) -> None:
        now = time.time()
        self.restart_times.append(now)
        while self.restart_times and now - self.restart_times[0] > self.cfg.restart_window_s:
            self.restart_times.popleft()
        if len(self.restart_times) > self.cfg.max_worker_restarts:
            raise RunError(f"rollout workers crashed {len(self.restart_times)} times within "
                           f"{self.cfg.restart_window_s:.0f} s (last: {dead.name}, exit code {dead.exitcode}); "
                           f"stopping (raise max_worker_restarts to tolerate more, or fix the env)")
        self.generations[w] += 1
        replacement = self.make_worker(w, self.generations[w])
        self._replace("rollout", w, replacement)
        self.console.notice(f"[fastrl] {dead.name} (pid {dead.pid}) exited with code {dead.exitcode}; restarted as "
                            f"pid {replacement.pid} (restart {self.restarts['rollout']})")

    def restart_evaluator(self, dead) -> None:
        """Start a new evaluator, or after EVALUATOR_MAX_RESTARTS go on without one (one notice)."""
        failure = f"{dead.name} (pid {dead.pid}) {self._evaluator_failure(dead)}"
        if self.restarts["evaluator"] >= EVALUATOR_MAX_RESTARTS:
            self.procs["evaluator"] = []
            self.write_process_file()
            self.console.notice(given_up_notice(failure, EVALUATOR_MAX_RESTARTS))
            return
        replacement = self.make_evaluator()
        self._replace("evaluator", 0, replacement)
        self.console.notice(restarted_notice(failure, f"pid {replacement.pid}", self.restarts["evaluator"],
                                             EVALUATOR_MAX_RESTARTS))

    def _evaluator_failure(self, dead) -> str:
        """The line a dead evaluator sent (fastrl.evaluation.evaluator.failure_line), else how it ended."""
        said = None
        while self.evaluator_failures.poll():
            said = self.evaluator_failures.recv()
        if said is not None:
            return f"failed ({said})"
        if dead.exitcode is not None and dead.exitcode < 0:
            return f"was killed by {signal.Signals(-dead.exitcode).name}"
        return f"exited with code {dead.exitcode}"

    def _replace(self, role: str, index: int, replacement) -> None:
        replacement.start()
        self.procs[role][index] = replacement
        self.restarts[role] += 1
        self.write_process_file()


# A replay can take longer to write than the grace (a million Atari frames are gigabytes), and a
# kill there loses it. So past the grace the learner is waited for while it reports progress: a
# stamp (Control.SAVE_BEAT_MS) per file and 64 MB chunk written, at most SAVE_SILENCE_S apart
# (room for the final fsync of what the kernel still holds), for at most SAVE_GRACE_MAX_S.
SAVE_SILENCE_S = 30.0
SAVE_GRACE_MAX_S = 600.0


def stop_processes(arena: Arena, procs: dict, console: Console) -> None:
    """Stop flag first; the learner gets time for its final checkpoint, and more while it writes
    its replay; stragglers are killed."""
    arena.control[Control.STOP] = 1
    started = time.time()
    deadline = started + SHUTDOWN_GRACE_S
    for role in ("rollout", "inference", "evaluator", "learner"):
        for p in procs.get(role, ()):
            if p.pid is not None:
                p.join(max(0.1, deadline - time.time()))
    for p in procs.get("learner", ()):
        _wait_while_saving(arena, p, started + SAVE_GRACE_MAX_S, console)
    for group in procs.values():
        for p in group:
            if p.pid is not None and p.is_alive():
                waited = time.time() - started
                console.notice(f"[fastrl] {p.name} (pid {p.pid}) did not stop within {waited:.0f} s; killed"
                               + (" before its final checkpoint or replay was whole (a resume takes the newest "
                                  "whole ones)" if p.name == "fastrl-learner" else ""))
                kill_with_descendants(p)


def _wait_while_saving(arena: Arena, process, until: float, console: Console) -> None:
    """Join ``process`` while its replay-save stamps are fresh, up to the time ``until``."""
    told = False
    while process.pid is not None and process.is_alive() and time.time() < until:
        if time.time() - arena.control[Control.SAVE_BEAT_MS] / 1000 > SAVE_SILENCE_S:
            return
        if not told:
            console.notice(f"[fastrl] {process.name} is still writing its replay: waiting while it makes progress "
                           f"(at most {SAVE_GRACE_MAX_S:.0f} s from the stop)")
            told = True
        process.join(min(0.5, max(0.01, until - time.time())))


def kill_with_descendants(process) -> None:
    """Kill ``process`` (a multiprocessing.Process) and the processes it started: an env's own
    processes (ViZDoom's engines) outlive a killed worker otherwise, orphaned."""
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    process.kill()
    process.join(5)
    for child in descendants:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
