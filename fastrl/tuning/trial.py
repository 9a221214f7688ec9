"""One fastrl-sweep trial: a whole ``fastrl-train`` run in a process group of its own, its learning
curve read from its metrics.jsonl while it trains, and a stop that leaves nothing behind.

Why a subprocess and not ``train()`` in a thread: a trial is a full run (workers, batcher,
learner, a shared-memory arena) with its own signal handling, and stopping a pruned one must
reach every process it started. In its own session (``setsid``) the trial's processes are one
group, which ``stop()`` signals as a whole: SIGTERM first (the runner stops its children in order,
writes a final checkpoint and unlinks its arena), SIGKILL for whatever is left after
``STOP_GRACE_S``, then the segments of runners killed outright are unlinked. The trial's runner
gets SIGTERM when the sweep dies, even by SIGKILL (``PR_SET_PDEATHSIG``), so a killed sweep
leaves no trial training on unseen.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from ..ipc.arena import remove_stale_segments
from ..ipc.child import SHUTDOWN_GRACE_S

# A runner stopping on SIGTERM gives its children SHUTDOWN_GRACE_S, then writes its last report.
STOP_GRACE_S = SHUTDOWN_GRACE_S + 15.0
GROUP_EXIT_WAIT_S = 10.0  # after SIGKILL, for the kernel to take the group's processes away
OUTPUT_FILE = "trial.log"  # in the trial's run directory: what fastrl-train printed

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if os.uname().sysname == "Linux" else None


def _die_with_parent() -> None:
    """In the forked child before exec: SIGTERM when the thread that started it exits. Resolved
    beforehand, the call takes no lock another thread of the sweep might hold at the fork."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class TrialProcess:
    """``command`` (a fastrl-train command line) run in its own session; its output goes to
    ``run_dir/trial.log``, a new file in a folder made for the trial: FileExistsError where one
    is there (another run's log, a link), which is never truncated nor written through."""

    def __init__(self, command: list[str], run_dir: Path):
        self.run_dir = Path(run_dir)
        fd = os.open(self.run_dir / OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666)
        with os.fdopen(fd, "wb") as output:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        self.pgid = self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def last_line(self) -> str:
        """The last line the run printed: its one-line error when it failed."""
        try:
            lines = (self.run_dir / OUTPUT_FILE).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def stop(self) -> None:
        """Stop the trial's every process (SIGTERM, then SIGKILL after STOP_GRACE_S) and unlink the
        arenas of runners killed outright; return when none of its processes is left."""
        if self.running():
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self.reap()

    def reap(self) -> None:
        """Make sure nothing of the trial outlives it: the runner's children are given the grace
        a stopping runner gives them, then killed with the rest of the group."""
        deadline = time.monotonic() + STOP_GRACE_S
        while group_members(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_members(self.pgid):
            self._signal_group(signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + GROUP_EXIT_WAIT_S
        while group_members(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        remove_stale_segments()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                members.append(proc.info["pid"])
        except (ProcessLookupError, psutil.Error):
            pass
    return members


class ObjectiveCurve:
    """The objective's values in a run's metrics.jsonl, read as the run appends them.

    ``x_key`` is the report's position on the budget's axis: env_steps (or eval_at_env_steps for
    the evaluation's figures, which describe the weights taken then) or trained_seconds. A report
    whose objective is not a finite number (no episode finished yet) is skipped; a partial last line
    waits for the rest of it."""

    def __init__(self, path: Path, objective: str, x_key: str):
        self.path = Path(path)
        self.objective = objective
        self.x_key = x_key
        self.offset = 0
        self.points: list[tuple[float, float]] = []  # (x, value) in the order written

    def read(self) -> list[tuple[float, float]]:
        """The points written since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        new = []
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            x, value = row.get(self.x_key), row.get(self.objective)
            if _finite(x) and _finite(value):
                new.append((float(x), float(value)))
        self.points.extend(new)
        return new

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None

    def tail_mean(self, span: float) -> float | None:
        """The curve's mean over its last ``span`` on the x axis, each report weighted by the x it
        covers since the report before it (a report's figures describe that stretch), so that
        one late swing of a noisy curve does not decide a trial. A curve of one report (or none
        that covers any x) is its last value."""
        if not self.points:
            return None
        start = self.points[-1][0] - span
        total = weight = 0.0
        for (before, _), (x, value) in zip(self.points, self.points[1:]):
            covered = x - max(before, start)
            if covered > 0:
                total += covered * value
                weight += covered
        return total / weight if weight > 0 else self.last


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Rungs:
    """Where a trial's curve is reported to Optuna: ``count`` points evenly over the budget.

    Optuna's pruners compare trials at equal steps, and a run's reports land at whatever env
    steps (or seconds) the report clock gives, so each rung gets the value of the last report at
    or before it: what the trial had reached by then, never a value measured later (which would
    favour the trials that report less often). A rung is reported once a report at or past it
    shows that no other report comes before it; a rung before the first report gets no value."""

    def __init__(self, budget: float, count: int):
        self.steps = sorted({round(budget * k / count) for k in range(1, count + 1)} - {0})
        self.next = 0
        self.last_value: float | None = None  # the last report's: before every rung not passed yet

    def passed(self, x: float, value: float) -> list[tuple[int, float]]:
        """(step, value) of each rung a report at ``x`` passes, not reported before."""
        out = []
        while self.next < len(self.steps) and self.steps[self.next] <= x:
            step = self.steps[self.next]
            known = value if step == x else self.last_value
            if known is not None:
                out.append((step, known))
            self.next += 1
        self.last_value = value
        return out
