"""Envs of controlled speed for the replay-ratio tests, factories usable as
"tests.support.paced_envs:NAME" (spawned workers build them by name)."""
from __future__ import annotations

import time

from fastrl.envs.toy import TargetEnv


class PacedTargetEnv(TargetEnv):
    """fastrl.envs.toy's continuous TargetEnv whose every step takes at least ``step_s`` seconds."""

    def __init__(self, step_s: float, action_dim: int = 2) -> None:
        super().__init__(action_dim=action_dim)
        self.step_s = step_s

    def step(self, action):
        if self.step_s:
            time.sleep(self.step_s)
        return super().step(action)


def make_paced_target(step_s: float = 0.0, action_dim: int = 2) -> PacedTargetEnv:
    return PacedTargetEnv(step_s, action_dim)
