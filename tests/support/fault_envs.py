"""Fault-injection envs for the tests, factories usable as "tests.support.fault_envs:NAME" (spawned workers
and the evaluator build them by name, as they do fastrl.envs.toy's): an env that raises on a given
step or only in one process, one whose observations turn NaN, and one whose observation space
fastrl cannot store."""
from __future__ import annotations

import multiprocessing
import os

import numpy as np
from gymnasium import spaces

from fastrl.envs.toy import CountdownEnv


class RaisesAtEnv(CountdownEnv):
    """A countdown env that raises RuntimeError on its `step`-th step (counted over episodes).
    With ``once_marker`` (a path) it raises only while that file does not exist, and creates it:
    one fault per run, however fast the restarted worker steps."""

    def __init__(self, step: int, length: int = 5, once_marker: str | None = None) -> None:
        super().__init__(length=length)
        self._raise_at = step
        self._steps = 0
        self._once_marker = once_marker

    def step(self, action: int) -> tuple:
        self._steps += 1
        if self._steps == self._raise_at:
            if self._once_marker is None:
                raise RuntimeError(f"injected fault: RaisesAtEnv step {self._steps}")
            if not os.path.exists(self._once_marker):
                open(self._once_marker, "w").close()
                raise RuntimeError(f"injected fault: RaisesAtEnv step {self._steps}")
        return super().step(action)


class NanObsEnv(CountdownEnv):
    """A countdown env whose observation is NaN on every `every`-th step (counted over episodes)."""

    def __init__(self, every: int = 3, length: int = 5) -> None:
        super().__init__(length=length)
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self._every = every
        self._steps = 0

    def step(self, action: int) -> tuple:
        self._steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        if self._steps % self._every == 0:
            obs[:] = np.nan
        return obs, reward, terminated, truncated, info


def make_raises_at(step: int, length: int = 5, once_marker: str | None = None) -> RaisesAtEnv:
    return RaisesAtEnv(step, length, once_marker)


def make_raises_in(process: str, length: int = 5) -> CountdownEnv:
    """A countdown env that raises on its first step in the process named ``process`` (e.g.
    "fastrl-evaluator": an env that fails only in evaluation), a plain one elsewhere."""
    if multiprocessing.current_process().name == process:
        return RaisesAtEnv(1, length)
    return CountdownEnv(length)


def make_nan_obs(every: int = 3, length: int = 5) -> NanObsEnv:
    return NanObsEnv(every, length)


class UnsupportedSpaceEnv(CountdownEnv):
    """A countdown env that declares an observation space fastrl cannot store: ``kind`` text,
    graph or sequence, at the top level or (``nested``) under key "inner" of a Dict
    {"position": Box, "inner": Dict {"items": <that space>}}. Only its spaces are ever used."""

    def __init__(self, kind: str = "text", nested: bool = False) -> None:
        super().__init__()
        space = {"text": lambda: spaces.Text(8),
                 "graph": lambda: spaces.Graph(spaces.Box(0.0, 1.0, (2,), np.float32), None),
                 "sequence": lambda: spaces.Sequence(spaces.Discrete(3))}[kind]()
        if nested:
            space = spaces.Dict({"position": self.observation_space, "inner": spaces.Dict({"items": space})})
        self.observation_space = space


def make_unsupported_space(kind: str = "text", nested: bool = False) -> UnsupportedSpaceEnv:
    return UnsupportedSpaceEnv(kind, nested)
