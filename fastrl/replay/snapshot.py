"""A replay's contents on disk, so that a resumed run keeps what its learner had stored
(``replay.checkpoint``).

One directory per replay: an ``.npy`` file per array (the frames written and read back in chunks,
so a replay larger than RAM's headroom, or on a memmap, is never copied whole) and ``meta.json``
(the layout it must match, the buffer's counters and random state, and the learner's counters
that go with it: the replay ratio's). A run's checkpoint at ``N`` env steps keeps its replays in
``checkpoints/replay_<N:012d>/<policy>/``, written under a temporary name and renamed into
place, so a directory of that name is whole; a save that a killed process never finished is a
``.replay_*.tmp`` directory, removed when the run resumes.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..files.run_dir import fsync_dir
from .buffer import written_slot_ranges

FORMAT = 1
META = "meta.json"
FRAMES = "frames.npy"
CHUNK_BYTES = 64 << 20  # frames copied per step: bounded memory whatever the replay's size
REPLAY_PREFIX = "replay_"


def _no_beat() -> None:
    """The ``beat`` of a save nobody waits on."""


class ReplaySnapshotError(RuntimeError):
    """A saved replay that cannot load into this one (another layout, or missing or damaged files)."""


def replay_dir(checkpoints: Path, env_steps: int) -> Path:
    """Where the replays saved with the checkpoint at ``env_steps`` live."""
    return Path(checkpoints) / f"{REPLAY_PREFIX}{env_steps:012d}"


def save_replay(replay, directory: Path, counters: dict | None = None, beat=None) -> None:
    """Write ``replay`` (a fastrl.replay.buffer replay) and the learner's ``counters`` into the new
    directory ``directory`` (its parent exists). ``beat()`` is called after every file and chunk
    written: the sign of progress a stopping run waits on."""
    beat = beat or _no_beat
    directory.mkdir()
    for name, array in replay.snapshot_arrays().items():
        with open(directory / f"{name}.npy", "wb") as f:
            np.save(f, array)
            _sync(f)
        beat()
    frames = np.lib.format.open_memmap(directory / FRAMES, mode="w+", dtype=replay.obs_dtype,
                                       shape=(replay.capacity, *replay.frame_shape))
    for start, stop in _chunks(replay, replay.written_ranges()):
        buffer = np.empty((stop - start, *replay.frame_shape), replay.obs_dtype)
        replay.read_frames(start, stop, buffer)
        frames[start:stop] = buffer
        beat()
    frames.flush()
    del frames
    with open(directory / FRAMES, "rb+") as f:
        os.fsync(f.fileno())
    meta = {"format": FORMAT, "layout": replay.snapshot_layout(), "scalars": replay.snapshot_scalars(),
            "counters": counters or {}}
    with open(directory / META, "w") as f:
        f.write(json.dumps(meta))
        _sync(f)
    fsync_dir(directory)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def load_replay(replay, directory: Path) -> dict:
    """Fill ``replay`` from ``directory`` (written by :func:`save_replay`); returns the learner's
    counters saved with it. ReplaySnapshotError (one line) if it cannot; every check comes before
    the replay is touched, so a refused load leaves it as it was."""
    try:
        meta = json.loads((directory / META).read_text())
    except (OSError, ValueError) as exc:
        raise ReplaySnapshotError(f"no readable {META} in {directory} ({type(exc).__name__})") from None
    found = meta.get("format") if isinstance(meta, dict) else None
    if found != FORMAT:
        raise ReplaySnapshotError(f"{directory} holds replay format {found}, this fastrl reads {FORMAT}")
    _check_meta(meta, directory)
    saved, wanted = meta["layout"], replay.snapshot_layout()
    differs = [f"{key} {saved.get(key)!r} (now {value!r})" for key, value in wanted.items() if saved.get(key) != value]
    if differs:
        raise ReplaySnapshotError(f"{directory} was saved by a replay of another layout: {', '.join(differs)}")
    try:
        arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r") for name in replay.snapshot_arrays()}
        frames = np.load(directory / FRAMES, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise ReplaySnapshotError(f"{directory} is missing or has a damaged array ({exc})") from None
    expected = {name: (array.shape, array.dtype) for name, array in replay.snapshot_arrays().items()}
    expected[FRAMES] = ((replay.capacity, *replay.frame_shape), replay.obs_dtype)
    for name, array in [*arrays.items(), (FRAMES, frames)]:
        if (array.shape, array.dtype) != expected[name]:
            raise ReplaySnapshotError(f"{directory}: {name} is {array.dtype} {list(array.shape)}, expected "
                                      f"{expected[name][1]} {list(expected[name][0])}")
    for start, stop in _chunks(replay, written_slot_ranges(np.asarray(arrays["written"]), replay.ring_len)):
        replay.write_frames(start, stop, np.ascontiguousarray(frames[start:stop]))
    replay.restore_snapshot({name: np.asarray(array) for name, array in arrays.items()}, meta["scalars"])
    return meta["counters"]


def _check_meta(meta: dict, directory: Path) -> None:
    """ReplaySnapshotError unless ``meta`` has every entry a load reads, of usable types: checked
    before the replay is touched, so a refused load leaves it as it was."""
    scalars, counters = meta.get("scalars"), meta.get("counters")
    try:
        if not isinstance(meta.get("layout"), dict) or not isinstance(counters, dict):
            raise TypeError("layout or counters")
        int(scalars["added"]), float(scalars["max_priority"])
        np.random.default_rng().bit_generator.state = scalars["rng"]  # a state the generator takes
        for value in counters.values():  # integers, or lists of them (a ratio's numerator and denominator)
            [int(v) for v in value] if isinstance(value, list) else int(value)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplaySnapshotError(f"{directory}/{META} lacks or mangles an entry ({type(exc).__name__}: "
                                  f"{str(exc)[:80]})") from None


def _chunks(replay, ranges):
    """``ranges`` cut into pieces of at most CHUNK_BYTES of frames."""
    frame_bytes = max(1, int(np.prod(replay.frame_shape, dtype=np.int64)) * replay.obs_dtype.itemsize)
    step = max(1, CHUNK_BYTES // frame_bytes)
    for start, stop in ranges:
        for a in range(start, stop, step):
            yield a, min(stop, a + step)


def save_replays(checkpoints: Path, env_steps: int, replays: dict[str, tuple], beat=None) -> Path:
    """Save ``replays`` (``{name: (replay, counters)}``) as the replays of the checkpoint at
    ``env_steps``, then remove every other checkpoint's: replays are large, and only the newest
    checkpoint's is kept. OSError if the disk refuses; nothing partial is left behind. ``beat``:
    see save_replay."""
    final = replay_dir(checkpoints, env_steps)
    tmp = Path(checkpoints) / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    beat = beat or _no_beat
    beat()  # the save has begun, however long the checkpoint before it took
    try:
        tmp.mkdir()
        for name, (replay, counters) in replays.items():
            save_replay(replay, tmp / name, counters, beat)
        fsync_dir(tmp)
        if final.exists():
            # The final checkpoint at the env steps of the last periodic one: the old directory is
            # renamed away (to a name that counts as partial) before the new one takes its name,
            # so no kill leaves a half-removed directory under the final name.
            os.replace(final, Path(checkpoints) / f".{final.name}.old.tmp")
        os.replace(tmp, final)
        fsync_dir(Path(checkpoints))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    remove_saved_replays(checkpoints, keep=final)
    return final


def remove_saved_replays(checkpoints: Path, keep: Path | None = None) -> list[Path]:
    """Remove every saved replay directory but ``keep``, and partial saves; returns the removed."""
    removed = []
    saved = [path for path in sorted(Path(checkpoints).glob(f"{REPLAY_PREFIX}*")) if saved_env_steps(path) is not None]
    for other in saved + sorted(Path(checkpoints).glob(f".{REPLAY_PREFIX}*.tmp")):
        if other != keep and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed


def saved_env_steps(directory: Path) -> int | None:
    """The env steps in a saved replay directory's name (None for another name)."""
    digits = Path(directory).name[len(REPLAY_PREFIX):]
    return int(digits) if Path(directory).name.startswith(REPLAY_PREFIX) and digits.isdigit() else None


def newest_saved_replay(checkpoints: Path, env_steps: int) -> Path | None:
    """The replays saved with the newest checkpoint at or before ``env_steps``: a run stopped while
    its final replay was being written resumes from its final checkpoint with the replay of the
    one before (older records, and counters consistent among themselves)."""
    found = [path for path in Path(checkpoints).glob(f"{REPLAY_PREFIX}*")
             if path.is_dir() and saved_env_steps(path) is not None and saved_env_steps(path) <= env_steps]
    return max(found, key=saved_env_steps, default=None)


def remove_partial_replays(checkpoints: Path) -> None:
    """Replay saves that a killed process never finished."""
    for tmp in Path(checkpoints).glob(f".{REPLAY_PREFIX}*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
