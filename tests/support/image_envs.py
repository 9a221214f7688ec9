"""A tiny image env for tests/unit/envs/test_image_preprocessing.py, made by name
("tests.support.image_envs:make_step_image_env") in spawned workers too.

Frame t of episode e (t = 0 at the reset) is uint8 [height, width, channels] with
``pixel[y, x, c] = (37 e + 7 t + 3 y + 5 x + 11 c) mod 256`` (`frame`), so that every pixel, row and
channel differs and a resize or a grayscale conversion has real work. Step t (1-based) rewards
``t``, and the episode ends at step ``length`` (terminated, or truncated with ``truncate``); a step
past the end raises, so a wrapper that repeats an action through an episode's end fails loudly.
With ``vary`` > 1 the first reset's seed picks the length, ``length + seed % vary``, so that the
envs of a group (seeded seed + i) end at different steps. The action does nothing. With
``dict_obs`` the observation is a Dict: ``screen`` (the frame), ``minimap`` (uint8 [8, 8, 3],
another image), ``clock`` (int64 [2]: e, t) and ``grid`` (uint8 [4, 4], no image: rank 2).
"""
from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces


class SteppedPastTheEnd(RuntimeError):
    """step() after the episode ended, before a reset."""


def frame(episode: int, t: int, height: int = 12, width: int = 16, channels: int = 3) -> np.ndarray:
    """Frame ``t`` of episode ``episode``: uint8 [height, width, channels]."""
    y, x, c = np.meshgrid(np.arange(height), np.arange(width), np.arange(channels), indexing="ij")
    return ((37 * episode + 7 * t + 3 * y + 5 * x + 11 * c) % 256).astype(np.uint8)


class StepImageEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 5, height: int = 12, width: int = 16, channels: int = 3,
                 dict_obs: bool = False, truncate: bool = False, vary: int = 1) -> None:
        self.length, self.vary, self.shape = length, vary, (height, width, channels)
        self.dict_obs, self.truncate = dict_obs, truncate
        screen = spaces.Box(0, 255, self.shape, np.uint8)
        self.observation_space = screen if not dict_obs else spaces.Dict({
            "screen": screen, "minimap": spaces.Box(0, 255, (8, 8, 3), np.uint8),
            "clock": spaces.Box(0, 2**31, (2,), np.int64), "grid": spaces.Box(0, 255, (4, 4), np.uint8)})
        self.action_space = spaces.Discrete(2)
        self.episode, self.t, self.done = -1, 0, True
        self.raw_steps = 0

    def _obs(self):
        image = frame(self.episode, self.t, *self.shape)
        if not self.dict_obs:
            return image
        return {"screen": image, "minimap": frame(self.episode, self.t + 1, 8, 8, 3),
                "clock": np.array([self.episode, self.t], np.int64),
                "grid": np.full((4, 4), self.t, np.uint8)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.length += seed % self.vary
        self.episode, self.t, self.done = self.episode + 1, 0, False
        return self._obs(), {}

    def step(self, action):
        if self.done:
            raise SteppedPastTheEnd(f"step {self.t + 1} of an episode of {self.length}")
        self.t += 1
        self.raw_steps += 1
        self.done = self.t == self.length
        return self._obs(), float(self.t), self.done and not self.truncate, self.done and self.truncate, {}


def make_step_image_env(**kwargs) -> StepImageEnv:
    return StepImageEnv(**kwargs)
