"""Where replay frames live: one preallocated array (RAM or a scratch np.memmap file), or
LZ4-compressed blobs decompressed by a thread pool.

A frame store maps a slot ``[0, capacity)`` to one frame (e.g. one uint8 ``[84, 84]`` Atari
screen) and knows nothing of streams, stacking or priorities (see :mod:`fastrl.replay.buffer`).
``write(slots, frames)`` stores ``frames[k]`` at ``slots[k]`` (slots distinct); ``read(slots, out)``
copies the frames of ``slots`` (repeats allowed) into ``out[k]``.

Why LZ4: it decompresses 2-3x faster than zstd level 1, and sampling touches 5 frames per
transition. Its block functions release the GIL, so a thread pool decompresses a batch in
parallel. zstd would save ~30% more memory at 2-3x the sampling CPU (the codecs compared in
docs/results.md#replay). Frames are compressed one by one so
that any frame decompresses alone (stacks are rebuilt from single frames at sample time).
"""
from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

CODECS = ("lz4",)


def make_frame_store(capacity: int, frame_shape: tuple, dtype, compress: str | None = None,
                     threads: int = 2, memmap_dir: str | None = None):
    """An :class:`ArrayFrameStore` (RAM, or a scratch file under ``memmap_dir``) or, with
    ``compress="lz4"``, an :class:`LZ4FrameStore`."""
    if compress is None:
        return ArrayFrameStore(capacity, frame_shape, dtype, threads, memmap_dir)
    if compress not in CODECS:
        raise ValueError(f"replay: unknown codec {compress!r}; choose one of {CODECS} or None")
    if memmap_dir is not None:
        raise ValueError("replay: compress and memmap_dir cannot be combined; compressed frames "
                         "live in RAM, a memmap store holds raw frames on disk")
    return LZ4FrameStore(capacity, frame_shape, dtype, threads)


class ArrayFrameStore:
    """Frames uncompressed in one ``[capacity, *frame_shape]`` array.

    In RAM, np.zeros: pages are committed when first written. With ``memmap_dir`` it is an
    np.memmap of an unnamed temporary file in that directory (unlinked at once, so the disk
    space returns when the store is closed or the process dies), for capacities beyond RAM: the
    page cache keeps what fits, the rest is read from disk at sample time. Reads of many frames
    are split over ``threads`` threads (the copy kernel releases the GIL): copying is bound by
    memory bandwidth, which one core does not saturate (1.5x on two idle cores, no gain under
    load).
    """

    def __init__(self, capacity: int, frame_shape: tuple, dtype, threads: int = 1,
                 memmap_dir: str | None = None):
        self.frame_shape = tuple(frame_shape)
        self.dtype = np.dtype(dtype)
        shape = (capacity, *self.frame_shape)
        if memmap_dir is None:
            self.frames = np.zeros(shape, self.dtype)
        else:
            with tempfile.TemporaryFile(dir=memmap_dir, prefix="fastrl-replay-") as file:
                self.frames = np.memmap(file, dtype=self.dtype, mode="w+", shape=shape)
        self._words = _word_rows(self.frames, capacity)
        self._split = _ThreadSplit(threads)

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes

    def write(self, slots: np.ndarray, frames: np.ndarray) -> None:
        _copy_rows(_word_rows(frames, len(slots)), np.arange(len(slots)), self._words, slots)

    def read(self, slots: np.ndarray, out: np.ndarray) -> None:
        if not out.flags.c_contiguous:
            raise ValueError("replay: the output array must be C-contiguous")
        self._split.run(self._read_range, slots, _word_rows(out, len(slots)))

    def close(self) -> None:
        self._split.close()
        # Dropping the last references unmaps the memory (and, for a memmap, frees the disk).
        self.frames = self._words = None

    def _read_range(self, slots: np.ndarray, rows: np.ndarray) -> None:
        _copy_rows(self._words, slots, rows, np.arange(len(slots)))


class LZ4FrameStore:
    """Frames as LZ4 blocks, one Python ``bytes`` per slot; ``threads`` threads compress on write
    and decompress on read (python-lz4 releases the GIL inside the codec)."""

    def __init__(self, capacity: int, frame_shape: tuple, dtype, threads: int = 2):
        try:
            import lz4.block
        except ImportError as exc:
            raise ImportError("replay compression needs lz4: pip install 'fastrl[replay]' "
                              "(or pip install lz4), or set compress=None") from exc
        self._lz4 = lz4.block
        self.frame_shape = tuple(frame_shape)
        self.dtype = np.dtype(dtype)
        self._frame_bytes = int(np.prod(self.frame_shape, dtype=np.int64)) * self.dtype.itemsize
        self._blobs: list[bytes | None] = [None] * capacity
        self._sizes = np.zeros(capacity, dtype=np.int64)  # bytes held per slot, for nbytes
        self._split = _ThreadSplit(threads)

    @property
    def nbytes(self) -> int:
        """Compressed payloads plus each blob's object header and its list pointer (allocator
        slack not included; RSS shows that)."""
        stored = int(np.count_nonzero(self._sizes))
        return int(self._sizes.sum()) + stored * sys.getsizeof(b"") + 8 * len(self._blobs)

    def write(self, slots: np.ndarray, frames: np.ndarray) -> None:
        self._split.run(self._compress_range, slots, frames.reshape(len(slots), -1))

    def read(self, slots: np.ndarray, out: np.ndarray) -> None:
        if not out.flags.c_contiguous:
            raise ValueError("replay: the output array must be C-contiguous")
        self._split.run(self._decompress_range, slots, out.reshape(len(slots), -1).view(np.uint8))

    def close(self) -> None:
        self._split.close()

    def _compress_range(self, slots: np.ndarray, frames: np.ndarray) -> None:
        compress, blobs, sizes = self._lz4.compress, self._blobs, self._sizes
        for slot, frame in zip(slots.tolist(), frames):
            frame = frame if frame.flags.c_contiguous else np.ascontiguousarray(frame)
            blob = compress(frame, store_size=False)
            blobs[slot] = blob
            sizes[slot] = len(blob)

    def _decompress_range(self, slots: np.ndarray, rows: np.ndarray) -> None:
        decompress, blobs, size = self._lz4.decompress, self._blobs, self._frame_bytes
        view = memoryview(rows).cast("B")
        for k, slot in enumerate(slots.tolist()):
            view[k * size:(k + 1) * size] = decompress(blobs[slot], uncompressed_size=size)


class _ThreadSplit:
    """Runs ``work(slots[part], rows[part])`` on up to ``threads`` contiguous parts at once, each
    of at least MIN_PART_BYTES of frames; smaller jobs run inline (a round trip through the pool
    costs ~60 us, and several times that under load)."""

    MIN_PART_BYTES = 1 << 19

    def __init__(self, threads: int):
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, "fastrl-replay") if threads > 1 else None

    def run(self, work, slots: np.ndarray, rows: np.ndarray) -> None:
        parts = min(self.threads, rows.nbytes // self.MIN_PART_BYTES)
        if parts <= 1:
            work(slots, rows)
            return
        bounds = np.linspace(0, len(slots), parts + 1).astype(np.int64)
        futures = [self._pool.submit(work, slots[a:b], rows[a:b])
                   for a, b in zip(bounds[:-1], bounds[1:])]
        for future in futures:
            future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def _word_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` as ``[rows, words]`` of the widest unsigned integer that divides a row, without
    copying when its rows are contiguous: the copy kernel then moves 8 bytes per load/store
    (3x faster than np.take on 84x84 uint8 rows)."""
    data = array.reshape(rows, -1)
    if data.shape[1] and data.strides[1] != data.itemsize:
        data = np.ascontiguousarray(data)
    row_bytes = data.shape[1] * data.itemsize
    data = data.view(np.uint8)
    for word in (np.uint64, np.uint32, np.uint16):
        size = np.dtype(word).itemsize
        if row_bytes % size == 0 and data.strides[0] % size == 0:
            return data.view(word)
    return data


@numba.njit(cache=True, nogil=True)
def _copy_rows(src, src_rows, dst, dst_rows):
    """``dst[dst_rows[k]] = src[src_rows[k]]`` for every k, in order."""
    for k in range(src_rows.shape[0]):
        source = src[src_rows[k]]
        target = dst[dst_rows[k]]
        for j in range(source.shape[0]):
            target[j] = source[j]
