"""Whether a rank's policies now score: the mean return of the newest episodes its workers
finished, read from the arena's episode rings. The batcher asks it before it gives the actors a
late, smaller exploration rate (``learner.epsilon_late_return_episodes``): set from a step count
alone, that rate came while some seeds still lost every point, and held them in long scoreless
rallies (docs/results.md#atari-dqn-cpu)."""
from __future__ import annotations

from collections import deque

import numpy as np

from ..ipc.arena import new_episodes


class RecentReturn:
    """The mean return of the ``episodes`` newest episodes of ``arena`` played by one of its first
    ``num_policies`` weight sets (a self-play snapshot's episodes are the opponent's), counted from
    construction on; :meth:`reached` once that mean is at least ``threshold``, and from then on."""

    def __init__(self, arena, episodes: int, threshold: float, num_policies: int = 1):
        if episodes < 1:
            raise ValueError(f"RecentReturn needs at least one episode to average, got {episodes}")
        self.arena = arena
        self.counts = arena.episode_count
        self.seen = self.counts.copy()
        self.returns = deque(maxlen=episodes)
        self.threshold = threshold
        self.num_policies = num_policies
        self.passed = False

    def mean(self) -> float | None:
        """The mean over the newest episodes, once as many ended as it averages; else None."""
        self.read()
        return float(np.mean(self.returns)) if len(self.returns) == self.returns.maxlen else None

    def reached(self) -> bool:
        if not self.passed:
            mean = self.mean()
            self.passed = mean is not None and mean >= self.threshold
        return self.passed

    def read(self) -> None:
        """Take in the episodes ended since the last read. Each worker's are taken in turn, so the
        window is newest across workers to within the episodes between two reads."""
        if np.array_equal(self.counts, self.seen):  # the common case, once per batch: nothing ended
            return
        self.seen, indices = new_episodes(self.arena, self.seen)
        for w, index in enumerate(indices):
            ours = self.arena.episode_actor[w, index] < self.num_policies
            self.returns.extend(self.arena.episode_return[w, index[ours]].tolist())
