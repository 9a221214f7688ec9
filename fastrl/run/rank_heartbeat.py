"""Which rank went away: every rank's runner beats a counter in torchrun's store from a thread and
watches the other ranks' counters.

gloo reports a peer that went away either as a reset connection (at once, when the peer's host
is up to close its sockets) or as a collective that timed out (after ``dist_timeout_s``, when
the host itself is gone); neither says which rank it was. The store does: a rank whose counter
stands still for ``silence_s`` went away (its process, its node, or the network to it). The
thread beats while the main thread waits inside a collective (gloo releases the GIL there), so a
rank held up by a dead peer is not taken for dead itself; a rank that stops, for whatever
reason, says so in the store first, so that it is not taken for one that went away.
"""
from __future__ import annotations

import os
import threading
import time

from ..distributed import process_group as distributed
from ..distributed.process_group import PEER_FAILURE, DistInfo
from .plan import ChildExited, RunError

BEAT_S = 0.5
SILENCE_MAX_S = 10.0


class RankWatch:
    """The watch of the ranks of this attempt, through the store at MASTER_ADDR:MASTER_PORT.
    ``silence_s``: min(dist_timeout_s / 2, SILENCE_MAX_S), so that by the time a collective with a
    silent rank times out, the watch has named it."""

    def __init__(self, info: DistInfo, timeout_s: float):
        self.rank, self.world_size = info.rank, info.world_size
        self.silence_s = min(timeout_s / 2, SILENCE_MAX_S)
        self.store = distributed.connect_store(info.world_size, False, timeout_s)
        self.lost = ""  # who went away, in words
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fastrl-rank-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        counts = {rank: -1 for rank in range(self.world_size) if rank != self.rank}
        since = {rank: time.monotonic() for rank in counts}
        try:
            while not self._stop.wait(BEAT_S):
                self.store.add(_key("beat", self.rank), 1)
                now = time.monotonic()
                for rank in counts:
                    count = self.store.add(_key("beat", rank), 0)
                    if count != counts[rank]:
                        counts[rank], since[rank] = count, now
                    elif (not self.lost and now - since[rank] > self.silence_s
                          and not self.store.check([_key("left", rank)])):
                        self.lost = (f"rank {rank} went away (no sign of life for {self.silence_s:.0f} s: its "
                                     f"process or its node died, or the network to it failed)")
        except RuntimeError as exc:  # DistStoreError / DistNetworkError: the store's host is gone
            self.store = None
            if not self._stop.is_set():
                self.lost = (f"torchrun's store at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
                             f"went away, and with it node 0 ({str(exc).splitlines()[0][:120]})")

    def explains(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a peer's failure that the watch names: waits for it to do so (up to
        ``silence_s`` and two beats); afterwards ``lost`` says who went away. Any failure after a
        rank went away is put down to it (a learner that NCCL's watchdog aborted, say), and so is a
        child's exit, which may follow a peer's (a learner that agreed to stop with a rank whose
        runner was killed)."""
        if self.lost:
            return True
        if not (distributed.is_peer_failure(exc) or str(exc).startswith(PEER_FAILURE) or isinstance(exc, ChildExited)):
            return False
        deadline = time.monotonic() + self.silence_s + 2 * BEAT_S
        while not self.lost and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(BEAT_S / 5)
        return bool(self.lost)

    def error(self) -> RunError:
        """The run's one-line error once ``lost`` is known."""
        return RunError(f"{self.lost}; the run stopped (the last checkpoint is kept)")

    def leave(self) -> None:
        """Stop watching, and tell the others that this rank stops (so it is not taken for gone)."""
        self._stop.set()
        self._thread.join(timeout=2 * BEAT_S)
        if self.store is None:
            return  # the store is gone: nobody is left to tell
        try:
            self.store.set(_key("left", self.rank), "1")
        except RuntimeError:
            pass


def _key(kind: str, rank: int) -> str:
    return distributed.attempt_prefix(f"ranks/{kind}/{rank}")
