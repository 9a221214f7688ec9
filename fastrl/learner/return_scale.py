"""Reward scaling by the spread of the discounted return (``learner.normalize_returns``).

What gymnasium's NormalizeReward wrapper does in each env, done once at the learner: every env
stream keeps its running discounted return ``G = gamma * G + r`` (zeroed at an episode end), and
rewards are divided by the standard deviation of all ``G`` seen so far. Value targets then sit
near unit scale whatever the env's reward scale (MuJoCo's returns run to thousands), which keeps
the value loss from swamping the policy gradient. The mean is not subtracted: that would change
which behaviour is rewarded.
"""
from __future__ import annotations

import numpy as np

EPS = 1e-8


class ReturnScale:
    """Running discounted return per env stream and the running variance of all of them."""

    def __init__(self, gamma: float):
        self.gamma = gamma
        self.carry = np.zeros(0)  # each env stream's discounted return so far
        self.count = 0.0
        self.mean = 0.0
        self.var = 1.0

    @property
    def scale(self) -> float:
        """What rewards are multiplied by: 1 / std of the discounted return (1 before any data)."""
        return 1.0 / float(np.sqrt(self.var + EPS)) if self.count else 1.0

    def update(self, rewards: np.ndarray, ends: np.ndarray, valid: np.ndarray, env_ids: np.ndarray | None = None,
               fresh: np.ndarray | None = None) -> None:
        """Advance the streams over a batch (time-major ``[T, B]``; ``ends`` terminated or truncated;
        invalid steps, the autoreset steps, are skipped) and fold every step's return into the
        statistics. ``env_ids`` ``[B]`` (None: each column its own new stream) say which stream
        continues in each column; ``fresh`` marks a stream whose worker restarted (it starts at 0).
        A batch may hold two trajectories of one env: they are taken in column order."""
        T, B = rewards.shape
        if env_ids is None:
            env_ids = np.arange(B) + len(self.carry)
        env_ids = np.asarray(env_ids, dtype=np.int64)
        if env_ids.max(initial=-1) >= len(self.carry):
            self.carry = np.concatenate([self.carry, np.zeros(env_ids.max() + 1 - len(self.carry))])
        if fresh is not None:
            self.carry[env_ids[np.asarray(fresh, dtype=bool)]] = 0.0
        seen = []
        # Pass k takes the k-th trajectory of each env in the batch, so a stream is never advanced
        # by two of its trajectories at once.
        occurrence = np.array([np.sum(env_ids[:b] == env_ids[b]) for b in range(B)])
        for k in range(int(occurrence.max(initial=-1)) + 1):
            columns = np.flatnonzero(occurrence == k)
            streams = env_ids[columns]
            g = self.carry[streams]
            for t in range(T):
                step = valid[t, columns]
                g = np.where(step, self.gamma * g + rewards[t, columns], g)
                seen.append(g[step])
                g = np.where(ends[t, columns], 0.0, g)
            self.carry[streams] = g
        self._fold(np.concatenate(seen) if seen else np.zeros(0))

    def _fold(self, values: np.ndarray) -> None:
        """Chan et al.'s parallel update of (count, mean, var) with ``values``."""
        n = values.size
        if not n:
            return
        mean, var = float(values.mean()), float(values.var())
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta ** 2 * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict:
        return {"carry": self.carry.tolist(), "count": self.count, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: dict) -> None:
        self.carry = np.asarray(state["carry"], dtype=np.float64)
        self.count, self.mean, self.var = float(state["count"]), float(state["mean"]), float(state["var"])
