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
    construction on; :meth:`reached` while that mean is at least ``threshold`` (the batcher keeps
    the stage it starts)."""

    def __init__(self, arena, episodes: int, threshold: float, num_policies: int = 1):
        if episodes < 1:
            raise ValueError(f"RecentReturn needs at least one episode to average, got {episodes}")
        self.arena = arena
        self.counts = arena.episode_count
        self.seen = self.counts.copy()
        self.returns = deque(maxlen=episodes)
        self.threshold = threshold
        self.num_policies = num_policies
        self.mean: float | None = None  # once as many episodes ended as it averages

    def reached(self) -> bool:
        self.read()
        return self.mean is not None and self.mean >= self.threshold

    def read(self) -> None:
        """Take in the episodes ended since the last read. Each worker's are taken in turn, so the
        window is newest across workers to within the episodes between two reads."""
        if np.array_equal(self.counts, self.seen):  # the common case, once per batch: nothing ended
            return
        self.seen, indices = new_episodes(self.arena, self.seen)
        for w, index in enumerate(indices):
            ours = self.arena.episode_actor[w, index] < self.num_policies
            self.returns.extend(self.arena.episode_return[w, index[ours]].tolist())
        if len(self.returns) == self.returns.maxlen:
            self.mean = float(np.mean(self.returns))
