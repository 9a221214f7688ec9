"""A process that has imported torch spends most of its exit in the interpreter's final garbage
collection: it walks every object torch, numba and envpool made (~0.8-1.0 s of a core on a
2-vCPU EPYC with avx512, where the same process ended in 0.15 s with them frozen first). The
objects are the process's to the end, so nothing is gained by collecting them; moving them to
the collector's permanent generation (``gc.freeze``) skips the walk.

Used where fastrl owns the process: its command-line entry points and ``scripts/bench.py`` (on
the way out), and the fork server (after its imports, before it forks: a forked child then never
walks the inherited objects either, and leaves their pages unwritten, as ``gc.freeze``'s
documentation recommends). Not in ``train()`` called from a user's own process: there the
process goes on after the run, and what is frozen is never collected."""
from __future__ import annotations

import atexit
import gc

_registered = False


def skip_final_collection() -> None:
    """At this process's exit (an atexit handler), freeze the objects still alive so that the
    interpreter's final collection skips them. Their ``__del__`` still runs where their reference
    count reaches zero; only cyclic garbage left at exit is not finalized (which CPython does not
    promise either). Idempotent."""
    global _registered
    if not _registered:
        # Freezing changes no object, only what the collector walks: where it falls among the
        # other atexit handlers does not matter to them.
        atexit.register(gc.freeze)
        _registered = True
