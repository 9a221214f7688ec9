"""Named stopwatches: ``with timers.time("gather_s"):`` adds the block's wall-clock seconds to
"gather_s" (Sample Factory's ``timing.add_time``), so a loop's timings read as the blocks they
time rather than as ``perf_counter`` differences."""
from __future__ import annotations

from time import perf_counter


class Timers:
    """Cumulative seconds per name, kept by one thread. Blocks of different names nest, each
    counting its own time; a block inside an open block of the same name adds nothing, its time
    being counted already, so a name never counts more than the wall time spent in it. ``names``
    are read as 0.0 until timed; any other name joins at its first block."""

    def __init__(self, *names: str):
        self._blocks = {name: _Block() for name in names}

    def time(self, name: str) -> "_Block":
        """The context manager that times ``name``: one object per name, reused (no allocation)."""
        block = self._blocks.get(name)
        if block is None:
            block = self._blocks[name] = _Block()
        return block

    def read(self) -> dict[str, float]:
        """Seconds per name of the blocks closed so far (a block still open is not counted yet)."""
        return {name: block.seconds for name, block in self._blocks.items()}


class _Block:
    __slots__ = ("seconds", "depth", "start")

    def __init__(self):
        self.seconds = 0.0
        self.depth = 0
        self.start = 0.0

    def __enter__(self) -> None:
        if self.depth == 0:
            self.start = perf_counter()
        self.depth += 1

    def __exit__(self, *exc_info) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.seconds += perf_counter() - self.start
