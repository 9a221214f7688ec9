"""The run directory: which files make it hold a run, and the rules for starting in one.

A run writes ``config.toml``, ``metrics.jsonl``, ``train.log``, ``processes*.json``, ``tb/`` and
``checkpoints/`` into its directory. Starting a second run over them would mix two runs'
metrics and let the pruning of old checkpoints (by step number) delete the new run's own, so a
directory that holds a run is refused unless the user says ``--resume`` or ``--overwrite``.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil

# What fastrl writes into a run directory; --overwrite removes these and nothing else.
RUN_FILES = ("config.toml", "metrics.jsonl", "train.log", "train.log.1")
RUN_DIRS = ("checkpoints", "tb", "wandb", "videos")
RUN_FILE_PATTERNS = ("processes*.json",)
# Any of these means an earlier run lives here.
RUN_MARKERS = ("config.toml", "metrics.jsonl", "checkpoints")


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked; the message says what to do instead."""


def holds_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in RUN_MARKERS)


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
            raise RunDirError(f"cannot create a run directory in '{root}' ({exc.strerror}); pass --run-dir DIR") from None
    raise RunDirError(f"could not create a new run directory under '{root}'; pass --run-dir DIR")


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool, check_existing: bool = True) -> None:
    """Raise RunDirError unless a run can start in ``run_dir`` as asked; deletes nothing, so it
    runs before everything else is checked (the directory is created if missing).

    ``check_existing`` is False on the ranks of a distributed run other than rank 0: rank 0 owns
    the directory and may already have written into it."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory '{run_dir}' is a file; pass another --run-dir")
    if resume and overwrite:
        raise RunDirError("--resume continues a run and --overwrite replaces it: pass one of them")
    if resume and not run_dir.is_dir():
        raise RunDirError(f"run directory '{run_dir}' does not exist; check the path given to --resume")
    if check_existing and run_dir.is_dir():
        running = live_runner(run_dir)
        if running is not None:
            raise RunDirError(f"run directory '{run_dir}' is in use by a running fastrl-train (pid {running}); "
                              f"stop it first, or pass another --run-dir")
        if not resume and not overwrite and holds_run(run_dir):
            raise RunDirError(f"run directory '{run_dir}' already holds a run: pass --resume to continue it, "
                              f"--overwrite to replace it, or another --run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=run_dir, prefix=".fastrl-write-test-")
        probe.close()
    except OSError as exc:
        raise RunDirError(f"cannot write into run directory '{run_dir}' ({exc.strerror}); pass a writable "
                          f"--run-dir") from None


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """With ``overwrite``, remove the earlier run's files; call once everything else is checked."""
    if overwrite and not resume:
        remove_run_files(run_dir)


def live_runner(run_dir: Path) -> int | None:
    """The pid of a runner still working in ``run_dir`` (from its processes.json), if any."""
    path = Path(run_dir) / "processes.json"
    try:
        pid = json.loads(path.read_text())["runner"][0]  # none once the run stopped
        if pid == os.getpid():
            return None  # an earlier train() of this process: it returns once its run stopped
        process = psutil.Process(pid)
        # A pid the OS gave to a newer process after the run ended is not the run.
        if process.create_time() <= path.stat().st_mtime + 1 and process.status() != psutil.STATUS_ZOMBIE:
            return pid
    except (OSError, ValueError, KeyError, IndexError, TypeError, psutil.Error):
        pass
    return None


def remove_run_files(run_dir: Path) -> None:
    """Remove what an earlier run wrote into ``run_dir`` (only fastrl's own files)."""
    run_dir = Path(run_dir)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for pattern in RUN_FILE_PATTERNS:
        for path in run_dir.glob(pattern):
            path.unlink(missing_ok=True)
    for name in RUN_DIRS:
        if (run_dir / name).is_dir():
            shutil.rmtree(run_dir / name)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a part."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
