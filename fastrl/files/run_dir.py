"""The run directory: which files make it hold a run, and the rules for starting in one.

A run writes ``config.toml``, ``metrics.jsonl``, ``train.log``, ``processes*.json``, ``tb/``,
``checkpoints/`` and, as configured, ``league/``, ``pbt/``, ``videos/`` and ``wandb/`` into its
directory. Starting a second run over them would mix two runs' metrics and let the pruning of old
checkpoints (by step number) delete the new run's own, so a directory that holds a run is refused
unless the user says ``--resume`` or ``--overwrite`` (which removes every one of them).

The rules:

- One run at a time: a run holds an exclusive lock on ``RUN_DIR/.lock`` (:class:`RunDirLock`)
  from its first check of the directory to its last write; another start there is refused.
- Never through a link: a run refuses a directory where one of these names is a symbolic link
  (writing there would change the link's target, and ``--overwrite`` would delete through it), and
  opens what it appends to with ``O_NOFOLLOW``, so a link made during the run is not followed
  either. The run directory itself may be a link (to a bigger disk, say).
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from multiprocessing import reduction
from pathlib import Path
from typing import BinaryIO

import psutil

# The record of the elastic torchrun job that owns the run (fastrl.run.elastic).
ELASTIC_RECORD = "elastic.json"
# What fastrl writes into a run directory; --overwrite removes these and nothing else. league/
# (fastrl.multiagent.league) and pbt/ (fastrl.tuning.pbt) go too: a new run must not play the old run's snapshots
# or go on with its lineage.
RUN_FILES = ("config.toml", "metrics.jsonl", "train.log", "train.log.1", ELASTIC_RECORD)
RUN_DIRS = ("checkpoints", "tb", "wandb", "videos", "league", "pbt")
# With the temporary files of a write_atomic that a kill cut short.
RUN_FILE_PATTERNS = ("processes*.json", *(f".{name}.*.tmp" for name in (*RUN_FILES, "processes*.json")))
# Any of these means an earlier run lives here. Not processes.rankN.json: the other ranks of a
# distributed run write theirs without waiting for rank 0, which checks the directory.
RUN_MARKERS = ("config.toml", "metrics.jsonl", "checkpoints", "processes.json")
# Kept (never removed): removing a lock file lets a waiting opener and a new one lock two files.
LOCK_FILE = ".lock"
PID_RECORD_WAIT_S = 1.0  # how long a refusal waits for a runner that just took the lock to record its pid


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked; the message says what to do instead."""


def holds_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in RUN_MARKERS)


def own_paths(run_dir: Path) -> list[Path]:
    """The paths of ``run_dir`` that fastrl writes or removes by name (whether they exist or not)."""
    run_dir = Path(run_dir)
    return ([run_dir / name for name in (*RUN_FILES, *RUN_DIRS, LOCK_FILE)]
            + [path for pattern in RUN_FILE_PATTERNS for path in sorted(run_dir.glob(pattern))])


def link_error(path: Path) -> OSError:
    """The OSError (one line, naming the fix) for a symbolic link where fastrl writes."""
    path = Path(path)
    target = f" to '{os.readlink(path)}'" if path.is_symlink() else ""
    return OSError(errno.ELOOP, f"'{path}' is a symbolic link{target}, and fastrl never writes through one: remove "
                                f"it, or link the run directory itself instead", str(path))


def refuse_links(run_dir: Path) -> None:
    """RunDirError naming the first of fastrl's own paths in ``run_dir`` that is a symbolic link."""
    for path in own_paths(run_dir):
        if path.is_symlink():
            raise _link_refusal(run_dir, path)


def _link_refusal(run_dir: Path, path: Path) -> RunDirError:
    return RunDirError(f"cannot use run directory '{run_dir}': {link_error(path).strerror}")


def default_run_dir(profile: str, root: Path = Path("runs")) -> Path:
    """A new ``root/<profile>-<date>-<time>`` made here and now; ``-2``, ``-3``, ... when another
    run took that name in the same second (mkdir is atomic, so two starts never share one)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create the runs folder '{root}' ({exc.strerror}); pass --run-dir DIR") from None
    stem = f"{Path(profile).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    for attempt in range(1, 1000):
        path = root / (stem if attempt == 1 else f"{stem}-{attempt}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise RunDirError(f"cannot create a run directory in '{root}' ({exc.strerror}); "
                              f"pass --run-dir DIR") from None
    raise RunDirError(f"could not create a new run directory under '{root}'; pass --run-dir DIR")


def first_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist (what making ``path`` makes)."""
    top = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        top = folder
    return top


def remove_unused_run_dir(run_dir: Path, made_from: Path | None = None) -> None:
    """Remove a run directory made for a run that could not start, if it holds nothing but its
    lock file and no other start holds that lock: anything else may be what the user wants; then
    its parents up to ``made_from`` (the outermost folder the start made), while they are empty.
    The caller has released its own lock."""
    run_dir = Path(run_dir)
    _remove_run_dir_if_unused(run_dir)
    if made_from is None or run_dir.exists():
        return
    for folder in run_dir.parents:
        if not folder.is_relative_to(made_from):
            return
        try:
            folder.rmdir()
        except OSError:
            return


def _remove_run_dir_if_unused(run_dir: Path) -> None:
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another start took the directory meanwhile
        except OSError:
            pass  # no flock on this file system: no start can hold the directory either
        if {path.name for path in run_dir.iterdir()} <= {LOCK_FILE}:
            (run_dir / LOCK_FILE).unlink()
            run_dir.rmdir()
    except OSError:
        pass
    finally:
        os.close(fd)


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool, check_existing: bool = True) -> RunDirLock | None:
    """Raise RunDirError unless a run can start in ``run_dir`` as asked; deletes nothing, so it
    runs before everything else is checked (the directory is created if missing). Returns the
    directory's lock, taken before the checks of what it holds: the caller releases it after its
    last write.

    ``check_existing`` is False on the ranks of a distributed run other than rank 0: rank 0 owns
    the directory (and its lock) and may already have written into it; they get None."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory '{run_dir}' is a file; pass another --run-dir")
    if resume and overwrite:
        raise RunDirError("--resume continues a run and --overwrite replaces it: pass one of them")
    if resume and not run_dir.is_dir():
        raise RunDirError(f"run directory '{run_dir}' does not exist; check the path given to --resume")
    if check_existing and run_dir.is_dir():
        refuse_links(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=run_dir, prefix=".fastrl-write-test-")
        probe.close()
    except OSError as exc:
        raise RunDirError(f"cannot write into run directory '{run_dir}' ({exc.strerror}); pass a writable "
                          f"--run-dir") from None
    if not check_existing:
        return None
    lock = RunDirLock.take(run_dir)
    if not resume and not overwrite and holds_run(run_dir):
        lock.release()
        raise RunDirError(f"run directory '{run_dir}' already holds a run: pass --resume to continue it, "
                          f"--overwrite to replace it, or another --run-dir")
    lock.record_pid()  # only now: a refused start leaves the directory as it found it
    return lock


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """With ``overwrite``, remove the earlier run's files; call once everything else is checked."""
    if overwrite and not resume:
        remove_run_files(run_dir)


class RunDirLock:
    """An exclusive ``flock`` on ``RUN_DIR/.lock``: one run works in a directory at a time.

    The kernel drops the lock when the last descriptor of its open file closes, so a killed run
    leaves nothing to clean up. The descriptor is close-on-exec and a child started by the fork
    server (fastrl.ipc.start) gets only the descriptors it is given, so children do not hold the
    lock unless given it: pickled while a child starts, a RunDirLock passes its descriptor on.
    The learner is given it, so that the final checkpoint it writes when the runner was killed is
    still the run's, not a race with the next run's pruning. A child left hanging would then keep
    the directory locked: the refusal names its pid. The file records the pid of the runner that holds the lock."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self.fd = fd

    @classmethod
    def take(cls, run_dir: Path, wait_s: float = 0.0) -> RunDirLock:
        """The lock of ``run_dir``; RunDirError naming who holds it when another process still does
        after ``wait_s`` seconds."""
        path = Path(run_dir) / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link_refusal(run_dir, path) from None
            raise RunDirError(f"cannot lock run directory '{run_dir}' ({exc.strerror}); pass a writable "
                              f"--run-dir") from None
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
            except OSError as exc:  # ENOLCK, EOPNOTSUPP, ENOSYS: a file system without flock
                os.close(fd)
                raise RunDirError(f"cannot lock run directory '{run_dir}' ({exc.strerror}): its file system "
                                  f"({file_system(path)}) does not support flock, which keeps two runs out of one "
                                  f"directory; pass a --run-dir on a local disk, or mount it with locking on (NFS: "
                                  f"lockd running; Lustre: -o flock)") from None
            os.close(fd)
            raise RunDirError(f"run directory '{run_dir}' is in use by {lock_holder(path)}; stop it first, or pass "
                              f"another --run-dir") from None
        return cls(path, fd)

    def record_pid(self) -> None:
        """Write this process's pid into the lock file, for the refusals of other starts."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __reduce__(self):
        # reduction.DupFd while a child starts adds the descriptor to those the child keeps.
        return _adopt_lock, (self.path, reduction.DupFd(self.fd))


def _adopt_lock(path: Path, dup) -> RunDirLock:
    """A child's share of the runner's lock; held until the child exits."""
    fd = dup.detach()
    os.set_inheritable(fd, False)  # the child's own children do not get it
    return RunDirLock(path, fd)


def file_system(path: Path) -> str:
    """The file system ``path`` is on, in words: its type and mount point ("nfs4 at /shared")."""
    target = os.path.realpath(path)
    mounts = [p for p in psutil.disk_partitions(all=True)
              if target == p.mountpoint or target.startswith(p.mountpoint.rstrip("/") + "/")]
    if not mounts:
        return "of unknown type"
    mount = max(mounts, key=lambda p: len(p.mountpoint))
    return f"{mount.fstype} at {mount.mountpoint}"


def lock_holder(path: Path) -> str:
    """Who holds the lock file at ``path``, in words: the runner whose pid it records while that
    process lives; else the processes that have it open (a child its runner left behind)."""
    # A runner that has just taken the lock records its pid a moment later: give it that moment.
    deadline = time.monotonic() + PID_RECORD_WAIT_S
    while True:
        pid = _recorded_pid(path)
        if pid is not None and pid != os.getpid() and _runs_since(pid, path.stat().st_mtime):
            return f"a running fastrl-train (pid {pid})"
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    target = os.path.realpath(path)
    holders = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and any(f.path == target for f in process.open_files()):
                holders.append(str(process.pid))
        except psutil.Error:
            continue
    if holders:
        left_by = f" (pid {pid})" if pid is not None else ""
        return f"pid {', '.join(holders)}, left running by a fastrl-train that has exited{left_by}"
    if pid == os.getpid():
        return f"another train() of this process (pid {pid})"
    return f"another process (it holds '{path}')"


def _recorded_pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or being rewritten


def _runs_since(pid: int, since: float) -> bool:
    """Whether process ``pid`` lives and was started by ``since`` (a pid the OS gave to a newer
    process after the one recorded exited is not that process)."""
    try:
        process = psutil.Process(pid)
        return process.create_time() <= since + 1 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def remove_run_files(run_dir: Path) -> None:
    """Remove what an earlier run wrote into ``run_dir`` (only fastrl's own files). Everything is
    checked first, so that a path it cannot remove stops it before anything is deleted."""
    run_dir = Path(run_dir)
    refuse_links(run_dir)
    files = [run_dir / name for name in RUN_FILES]
    files += [path for pattern in RUN_FILE_PATTERNS for path in run_dir.glob(pattern)]
    dirs = [run_dir / name for name in RUN_DIRS]
    for path, want_dir in [*((path, False) for path in files), *((path, True) for path in dirs)]:
        if path.exists() and path.is_dir() != want_dir:
            raise RunDirError(f"--overwrite: '{path}' is a {'file' if want_dir else 'folder'} where fastrl keeps a "
                              f"{'folder' if want_dir else 'file'}; move it out of the run directory")
    for path in files:
        path.unlink(missing_ok=True)
    for path in dirs:
        if path.is_dir():
            shutil.rmtree(path)


def open_for_append(path: Path):
    """``path`` opened to append text, created if missing; never through a symbolic link
    (O_NOFOLLOW), so a link made there during the run is not followed either."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_error(path) from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def make_dir(path: Path) -> Path:
    """``path`` as a folder of the run, made if missing; OSError if it is a symbolic link."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        raise link_error(path)
    return path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as :func:`write_file_atomic` does."""
    write_file_atomic(path, lambda f: f.write(text.encode("utf-8")))


def write_file_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``write(f)`` (``f`` a binary file) so that readers see the old file or
    the new one, never a part, and a crash once it returned keeps the new one: the file is fsynced
    before the rename and its directory after it (the rename lives in the directory). A symbolic
    link at ``path`` is replaced, not written through (the temporary file ``.NAME.*.tmp`` is made
    with O_EXCL | O_NOFOLLOW); on an error it is removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make the renames and removals done in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
