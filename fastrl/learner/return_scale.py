"""Reward scaling by the spread of the discounted return (``learner.normalize_returns``).

What gymnasium's NormalizeReward wrapper does in each env, done once at the learner: every env
stream keeps its running discounted return ``G = gamma * G + r`` (zeroed at an episode end), and
rewards are divided by the standard deviation of all ``G`` seen so far. Value targets then sit
near unit scale whatever the env's reward scale (MuJoCo's returns run to thousands), which keeps
the value loss from swamping the policy gradient. The mean is not subtracted: that would change
which behaviour is rewarded.

The rule every test checks: the statistics are those of every valid step's ``G``, each stream's
steps taken in time order (a batch's columns arrive in time order, so an env's later trajectory
follows its earlier one), ``G`` restarting at 0 where a stream's worker restarted and after steps
the learner never saw (a skipped non-finite batch). With several ranks the statistics are those
of every rank's steps: each batch's (count, mean, M2) is gathered from all ranks and merged in
rank order, so every rank holds the same scale.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

EPS = 1e-8


def merge_moments(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float, float]:
    """(count, mean, M2) of the union of two samples from each one's (Chan, Golub and LeVeque
    1979); ``M2`` is the sum of squared deviations from the mean."""
    na, mean_a, m2a = a
    nb, mean_b, m2b = b
    n = na + nb
    if not n:
        return a
    delta = mean_b - mean_a
    return n, mean_a + delta * nb / n, m2a + m2b + delta ** 2 * na * nb / n


class ReturnScale:
    """Running discounted return per env stream and the running variance of all of them."""

    def __init__(self, gamma: float):
        self.gamma = gamma
        self.carry = np.zeros(0)  # each env stream's discounted return so far
        self.count = 0.0
        self.mean = 0.0
        self.var = 1.0
        # Data-parallel hook (fastrl.distributed.process_group.join_data_parallel): this rank's batch moments
        # [3] float64 -> every rank's, [world_size, 3]. None: this process alone.
        self.gather: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def scale(self) -> float:
        """What rewards are multiplied by: 1 / std of the discounted return (1 before any data)."""
        return 1.0 / float(np.sqrt(self.var + EPS)) if self.count else 1.0

    def update(self, rewards: np.ndarray, ends: np.ndarray, valid: np.ndarray, env_ids: np.ndarray | None = None,
               fresh: np.ndarray | None = None) -> None:
        """Advance the streams over a batch (time-major ``[T, B]``; ``ends`` terminated or truncated;
        invalid steps, the autoreset steps, are skipped) and fold every step's return into the
        statistics.

        ``env_ids`` ``[B]``: the stream each column continues; one env may fill several columns,
        taken in column order. ``fresh`` ``[B]``: the column is its env's first trajectory since
        its worker restarted, so its return starts at 0 (the env's earlier columns still continue
        the old episode). ``env_ids=None``: every column is a trajectory of its own that continues
        nothing and is not continued (its return starts at 0, nothing is kept); pass ``env_ids``
        to carry returns across batches."""
        T, B = rewards.shape
        if env_ids is None:
            carry, env_ids, fresh = np.zeros(B), np.arange(B), np.ones(B, bool)
        else:
            env_ids = self._stream_ids(env_ids, B)
            fresh = np.zeros(B, bool) if fresh is None else np.asarray(fresh, dtype=bool)
            if fresh.shape != (B,):
                raise ValueError(f"ReturnScale.update: fresh must have shape [{B}], got {list(fresh.shape)}")
            carry = self.carry
        seen = []
        # Pass k takes the k-th column of each env in the batch, so a stream is never advanced
        # by two of its trajectories at once and a fresh column restarts its stream after the
        # earlier columns' pass.
        occurrence = np.array([np.sum(env_ids[:b] == env_ids[b]) for b in range(B)])
        for k in range(int(occurrence.max(initial=-1)) + 1):
            columns = np.flatnonzero(occurrence == k)
            streams = env_ids[columns]
            g = np.where(fresh[columns], 0.0, carry[streams])
            for t in range(T):
                step = valid[t, columns]
                g = np.where(step, self.gamma * g + rewards[t, columns], g)
                seen.append(g[step])
                g = np.where(ends[t, columns], 0.0, g)
            carry[streams] = g
        self._fold(np.concatenate(seen) if seen else np.zeros(0))

    def skip(self, env_ids: np.ndarray | None = None) -> None:
        """A batch left out of the statistics (non-finite data): the streams of ``env_ids`` ``[B]``
        restart at 0 after its missing steps, and the fold still meets the other ranks', with
        nothing from this one."""
        if env_ids is not None:
            env_ids = np.asarray(env_ids, dtype=np.int64)
            self.carry[self._stream_ids(env_ids, len(env_ids))] = 0.0
        self._fold(np.zeros(0))

    def _stream_ids(self, env_ids, B: int) -> np.ndarray:
        """``env_ids`` checked (``[B]`` ints >= 0), the carry grown to hold each of their streams."""
        env_ids = np.asarray(env_ids, dtype=np.int64)
        if env_ids.shape != (B,) or env_ids.min(initial=0) < 0:
            raise ValueError(f"ReturnScale: env_ids must be [{B}] ints >= 0, each column's env; got shape "
                             f"{list(env_ids.shape)}")
        if env_ids.max(initial=-1) >= len(self.carry):
            self.carry = np.concatenate([self.carry, np.zeros(env_ids.max() + 1 - len(self.carry))])
        return env_ids

    def _fold(self, values: np.ndarray) -> None:
        """Merge ``values`` (with ``gather``, every rank's, in rank order) into (count, mean, var)."""
        n = values.size
        local = np.array([n, values.mean() if n else 0.0, values.var() * n if n else 0.0], dtype=np.float64)
        moments = (self.count, self.mean, self.var * self.count)
        for part in ([local] if self.gather is None else self.gather(local)):
            moments = merge_moments(moments, tuple(float(x) for x in part))
        count, self.mean, m2 = moments
        if count:
            self.count, self.var = count, m2 / count

    def state_dict(self) -> dict:
        return {"carry": self.carry.tolist(), "count": self.count, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: dict) -> None:
        self.carry = np.asarray(state["carry"], dtype=np.float64)
        self.count, self.mean, self.var = float(state["count"]), float(state["mean"]), float(state["var"])
