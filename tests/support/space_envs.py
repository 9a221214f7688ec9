"""Toy envs whose spaces carry offsets (``start``) and more than one dimension, for
tests/unit/envs/test_space_layouts.py: built by name ("tests.support.space_envs:make_strict_space_env") in spawned
workers too. Each raises IllegalAction on an action its space does not hold exactly: a value out
of range, another shape, another dtype.

``kind`` picks the action space; the observation shows a target of the same space (a cue in
Discrete(3, start=-1) for the discrete and tuple kinds), and the reward is the fraction of the
action that matches it (Box: minus the squared distance)."""
from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

BOX_LOW = np.array([[-3.0, 0.0, 10.0], [-0.5, 2.0, -20.0]], np.float32)
BOX_HIGH = BOX_LOW + np.array([[1.0, 0.5, 2.0], [1.0, 4.0, 0.25]], np.float32)


def _discrete() -> spaces.Discrete:
    return spaces.Discrete(3, start=-1)


def _multidiscrete_2d() -> spaces.MultiDiscrete:
    return spaces.MultiDiscrete([[3, 2], [2, 4]], start=[[-1, 0], [5, -2]])


def _box_2d() -> spaces.Box:
    return spaces.Box(BOX_LOW, BOX_HIGH, dtype=np.float32)


ACTION_SPACES = {
    "discrete": _discrete,
    "multidiscrete": lambda: spaces.MultiDiscrete([3, 4], start=[-1, 2]),
    "multidiscrete-2d": _multidiscrete_2d,
    "multibinary-2d": lambda: spaces.MultiBinary((2, 3)),
    "box-2d": _box_2d,
    "tuple": lambda: spaces.Tuple((_discrete(), _box_2d(), _multidiscrete_2d(), spaces.MultiBinary((2, 3)))),
}


class IllegalAction(RuntimeError):
    """An action its space does not hold exactly reached the env."""


def check_exactly(space: gymnasium.Space, action) -> None:
    """Raise IllegalAction unless ``action`` is a value of ``space`` in its declared shape and dtype
    (a Tuple: part by part)."""
    if isinstance(space, spaces.Tuple):
        if not isinstance(action, tuple) or len(action) != len(space.spaces):
            raise IllegalAction(f"{action!r} is not a tuple of {len(space.spaces)} parts for {space}")
        for part, value in zip(space.spaces, action):
            check_exactly(part, value)
        return
    value = np.asarray(action)
    if value.shape != space.shape or value.dtype != space.dtype or not space.contains(action):
        raise IllegalAction(f"action {value.tolist()} ({value.dtype}, shape {value.shape}) is not a value of {space} "
                            f"({space.dtype}, shape {space.shape})")


class StrictSpaceEnv(gymnasium.Env):
    """Episodes of ``length`` steps (terminated); each step shows a new random target."""

    def __init__(self, kind: str = "discrete", length: int = 8) -> None:
        self.kind = kind
        self.length = length
        self.action_space = ACTION_SPACES[kind]()
        self.observation_space = _discrete() if kind in ("discrete", "tuple") else ACTION_SPACES[kind]()
        self._target = None
        self._t = 0

    def _obs(self):
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self._target = self.observation_space.sample()
        return self._target

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action) -> tuple:
        check_exactly(self.action_space, action)
        first = action[0] if self.kind == "tuple" else action
        if self.kind == "box-2d":
            reward = -float(np.sum((first - self._target) ** 2))
        else:
            reward = float(np.mean(np.asarray(first) == self._target))
        self._t += 1
        return self._obs(), reward, self._t == self.length, False, {}


def make_strict_space_env(kind: str = "discrete", length: int = 8) -> StrictSpaceEnv:
    return StrictSpaceEnv(kind, length)


class BoundedTargetEnv(gymnasium.Env):
    """A one-step target game whose action Box has the bounds given (inf, or low == high, for the
    refusals of tests/unit/learner/test_sac.py); observations of ``obs_dtype``, as MuJoCo's float64."""

    def __init__(self, low: list, high: list, obs_dtype: str = "float32") -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (len(low),), np.dtype(obs_dtype))
        self.action_space = spaces.Box(np.array(low, np.float32), np.array(high, np.float32))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, self.observation_space.dtype), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, self.observation_space.dtype), 0.0, True, False, {}


def make_bounded_target(low: list, high: list, obs_dtype: str = "float32") -> BoundedTargetEnv:
    return BoundedTargetEnv(low, high, obs_dtype)
