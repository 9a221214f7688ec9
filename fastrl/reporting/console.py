"""Console output that can never stop a run, and its copy in ``RUN_DIR/train.log``.

Long runs outlive their terminals: ``fastrl-train ... | head``, a ``tee`` whose reader went away,
an ssh session that closed. Writing to such a stream raises (EPIPE, EBADF, EIO); let escape, the
error ends the run's metrics reports and budget checks while training goes on. So every console
write here is best-effort: the first failure points the stream at /dev/null (so that the
interpreter's own flush at exit cannot fail either) and the run goes on quietly, its lines going to
``train.log`` for ``tail -f``. A reader that stays but stops reading (``| less``, a paused
terminal, a stalled ssh session) fills the pipe: a line the console cannot take at once is dropped
rather than waited for, so that the run never blocks on it.
"""
from __future__ import annotations

import os
import select
import sys
from pathlib import Path

from ..files.run_dir import open_for_append

LOG_NAME = "train.log"
# train.log is rotated once past this size: train.log.1 keeps the previous part, so a run that
# goes on for weeks holds at most twice this on disk.
LOG_MAX_BYTES = 8 * 2**20


def write_best_effort(stream, text: str) -> bool:
    """Write ``text`` and a newline to ``stream``; False (and the stream silenced) if it is gone."""
    try:
        stream.write(text + "\n")
        stream.flush()
        return True
    except (OSError, ValueError):  # EPIPE / EBADF / EIO, or a stream already closed
        _silence(stream)
        return False


def write_if_ready(stream, text: str) -> bool:
    """:func:`write_best_effort`, but only if ``stream`` can take the line without blocking; False
    when the line was dropped or the stream is gone."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture): nothing can block
        return write_best_effort(stream, text)
    try:
        _, ready, _ = select.select([], [fd], [], 0)
    except (OSError, ValueError):
        _silence(stream)
        return False
    return bool(ready) and write_best_effort(stream, text)


def _silence(stream) -> None:
    """Point ``stream``'s file descriptor at /dev/null and drop what its buffer still holds."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    try:
        stream.flush()  # now lands in /dev/null, so interpreter shutdown does not fail on it
    except (OSError, ValueError):
        pass


class Console:
    """Status lines and notices of a run: to stderr unless ``quiet``, and to ``RUN_DIR/train.log``."""

    def __init__(self, run_dir: Path | None, quiet: bool = False, max_log_bytes: int = LOG_MAX_BYTES):
        self.quiet = quiet
        self.max_log_bytes = max_log_bytes
        self.log_path = Path(run_dir) / LOG_NAME if run_dir is not None else None
        self.log = None
        if self.log_path is not None:
            try:
                self.log = open_for_append(self.log_path)
            except OSError as exc:
                self.notice(f"[fastrl] cannot write {self.log_path} ({exc.strerror}); status lines go to the "
                            f"console only")

    def notice(self, text: str) -> None:
        """A line the user should see even with ``quiet`` (restarts, stops)."""
        write_if_ready(sys.stderr, text)
        self._log(text)

    def record(self, text: str) -> None:
        """A line for train.log only (the console gets it another way, e.g. the command's error)."""
        self._log(text)

    def status(self, text: str) -> None:
        if not self.quiet:
            write_if_ready(sys.stderr, text)
        self._log(text)

    def hung_up(self) -> None:
        """The terminal went away (SIGHUP): the run goes on, its status lines to train.log only."""
        self.quiet = True
        self._log("[fastrl] the console hung up (SIGHUP); training goes on, status lines go here only")

    def _log(self, text: str) -> None:
        if self.log is None:
            return
        try:
            if self.log.tell() >= self.max_log_bytes:
                self.log.close()
                os.replace(self.log_path, self.log_path.with_name(LOG_NAME + ".1"))
                self.log = open_for_append(self.log_path)
            self.log.write(text + "\n")
            self.log.flush()
        except OSError as exc:
            # The log is a copy of the console: losing it must not stop training (a full disk is
            # caught where metrics and checkpoints are written).
            self.close()
            write_if_ready(sys.stderr, f"[fastrl] stopped writing {self.log_path} ({exc.strerror})")

    def close(self) -> None:
        if self.log is not None:
            try:
                self.log.close()
            except OSError:
                pass
            self.log = None
