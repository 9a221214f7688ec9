"""``env.actions``: the policy chooses among some of a Discrete env's actions (ALE's minimal action
set, for any backend). MiniGrid's Memory task, for one, declares seven actions of which only
left, right and forward do anything there; every no-op the policy keeps sampling is a step wasted
in exploration.

The wrapper is a VecEnv around any backend's group: its action space is ``Discrete(len(actions))``
and action ``i`` becomes the env's ``actions[i]`` as the group's rows leave for the envs.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium
import numpy as np

from fastrl.envs.base import VecEnv


def action_subset_error(space: gymnasium.Space, actions: Sequence[int], has_mask: bool) -> str:
    """Why ``actions`` cannot select from ``space`` (one line naming the fix), or ""."""
    if not isinstance(space, gymnasium.spaces.Discrete):
        return (f"env.actions picks among a Discrete space's actions, but the action space is {space}: "
                f"set env.actions = []")
    start, n = int(space.start), int(space.n)
    outside = [a for a in actions if not start <= a < start + n]
    if outside:
        return (f"env.actions {list(actions)} names {outside}, outside the env's actions {start}..{start + n - 1}: "
                f"pick actions from that range")
    if len(set(actions)) != len(actions):
        return f"env.actions {list(actions)} names an action twice: list each once"
    if has_mask:
        return ("env.actions cannot be combined with the env's own action_mask (it masks all of its actions): "
                "set env.actions = []")
    return ""


class ActionSubset(VecEnv):
    """``env`` acting only with ``actions`` (the env's own action values, as ``env.step`` takes them)."""

    def __init__(self, env: VecEnv, actions: Sequence[int]) -> None:
        self.env = env
        self.actions = tuple(int(a) for a in actions)
        # send() of the wrapped group takes zero-based rows; the space may start elsewhere.
        self._to_inner = np.asarray(self.actions, dtype=np.int64) - int(env.action_space.start)
        self.num_envs, self.batch_size = env.num_envs, env.batch_size
        self.observation_space = env.observation_space
        self.action_space = gymnasium.spaces.Discrete(len(self.actions))
        self.frame_skip, self.agents = env.frame_skip, env.agents

    @property
    def last_info(self):
        return self.env.last_info

    @property
    def last_unplayed(self):
        return self.env.last_unplayed

    @property
    def batches_in_flight(self) -> int:
        return self.env.batches_in_flight

    def async_reset(self) -> None:
        self.env.async_reset()

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        self.env.send(self._to_inner[np.asarray(actions, dtype=np.int64)], env_ids)

    def recv(self):
        return self.env.recv()

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name: str):
        # A backend's own extras: a PettingZoo group's agents' observations, a renderer.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)
