"""Tiny deterministic gymnasium envs for tests, with factories usable as "module:callable"
(e.g. `make_vec_env("fastrl.envs.toy:make_countdown", ..., env_kwargs={"length": 5})`), so
spawned worker processes can build them by name.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces


class CountdownEnv(gymnasium.Env):
    """Step index as observation, reward 1 per step, a known episode end.

    reset -> obs t=0. Step k (k = 1, 2, ...) -> obs t=k, reward 1, and
    terminated = (k == length), truncated = (k == time_limit < length). So with discount gamma
    the return from t=0 is sum_{k<length} gamma^k when terminated; after a truncation the value
    target must bootstrap from V(obs t=time_limit).

    Observation: float32 [1] holding t, or with `one_hot` float32 [length + 1] with a 1 at t.
    Actions: Discrete(num_actions), ignored.
    """

    def __init__(
        self,
        length: int = 5,
        time_limit: int | None = None,
        one_hot: bool = False,
        num_actions: int = 2,
    ) -> None:
        if length < 1 or (time_limit is not None and not 1 <= time_limit < length):
            raise ValueError(
                f"need length >= 1 and 1 <= time_limit < length, got {length=}, {time_limit=}"
            )
        self.length = length
        self.time_limit = time_limit
        self.one_hot = one_hot
        size = length + 1 if one_hot else 1
        self.observation_space = spaces.Box(0.0, float(length), (size,), np.float32)
        self.action_space = spaces.Discrete(num_actions)
        self._t = 0

    def _obs(self) -> np.ndarray:
        if self.one_hot:
            obs = np.zeros(self.length + 1, dtype=np.float32)
            obs[self._t] = 1.0
            return obs
        return np.array([self._t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple:
        self._t += 1
        terminated = self._t == self.length
        truncated = not terminated and self._t == self.time_limit
        return self._obs(), 1.0, terminated, truncated, {}


class RaisesAtEnv(CountdownEnv):
    """A countdown env that raises RuntimeError on its `step`-th step (counted over episodes)."""

    def __init__(self, step: int, length: int = 5) -> None:
        super().__init__(length=length)
        self._raise_at = step
        self._steps = 0

    def step(self, action: int) -> tuple:
        self._steps += 1
        if self._steps == self._raise_at:
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


class TargetEnv(gymnasium.Env):
    """Continuous actions: reward = -sum((a - target)^2), target shown as the observation.

    The target is drawn uniformly from [-target_scale, target_scale]^action_dim at each reset;
    episodes last `length` steps (terminated). Actions: Box [-1, 1]^action_dim, float32, so a
    clipped action a' gives reward -sum((a' - target)^2) with |target| <= target_scale < 1.
    """

    def __init__(self, action_dim: int = 1, length: int = 10, target_scale: float = 0.5) -> None:
        self.length = length
        self.target_scale = target_scale
        self.observation_space = spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
        self._target = np.zeros(action_dim, dtype=np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        self._target = self.np_random.uniform(
            -self.target_scale, self.target_scale, self._target.shape
        ).astype(np.float32)
        return self._target.copy(), {}

    def step(self, action: np.ndarray) -> tuple:
        self._t += 1
        reward = -float(np.sum((np.asarray(action, dtype=np.float32) - self._target) ** 2))
        return self._target.copy(), reward, self._t == self.length, False, {}


def make_countdown(
    length: int = 5, time_limit: int | None = None, one_hot: bool = False, num_actions: int = 2
) -> CountdownEnv:
    return CountdownEnv(length, time_limit, one_hot, num_actions)


def make_raises_at(step: int, length: int = 5) -> RaisesAtEnv:
    return RaisesAtEnv(step, length)


def make_nan_obs(every: int = 3, length: int = 5) -> NanObsEnv:
    return NanObsEnv(every, length)


def make_target(action_dim: int = 1, length: int = 10, target_scale: float = 0.5) -> TargetEnv:
    return TargetEnv(action_dim, length, target_scale)


class MemoryEnv(gymnasium.Env):
    """A cue shown only on the first step, to be acted on ``length`` steps later: needs memory.

    Observation float32 [3]: (cue, is the decision step, t / length). The cue is +1 or -1 on the
    first observation and 0 afterwards. Actions Discrete(2); only the action on the decision step
    (the observation at t = length - 1) counts: reward +1 if it names the cue (0 for -1, 1 for +1),
    else -1, and the episode terminates. A feed-forward policy sees no cue there: its expected
    return is 0; a policy that remembers the cue gets 1.
    """

    def __init__(self, length: int = 8) -> None:
        if length < 2:
            raise ValueError(f"MemoryEnv needs length >= 2, got {length}")
        self.length = length
        self.observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0
        self._cue = 1

    def _obs(self) -> np.ndarray:
        cue = float(self._cue) if self._t == 0 else 0.0
        return np.array([cue, float(self._t == self.length - 1), self._t / self.length], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        self._cue = 1 if self.np_random.random() < 0.5 else -1
        return self._obs(), {}

    def step(self, action: int) -> tuple:
        if self._t == self.length - 1:
            reward = 1.0 if int(action) == (1 if self._cue > 0 else 0) else -1.0
            self._t += 1
            return self._obs(), reward, True, False, {}
        self._t += 1
        return self._obs(), 0.0, False, False, {}


def make_memory(length: int = 8) -> MemoryEnv:
    return MemoryEnv(length)
