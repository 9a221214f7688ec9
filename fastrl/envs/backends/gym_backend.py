"""gymnasium backend: one `SyncVectorEnv` per split, stepped in the worker's own thread.

For envs envpool does not have (user factories, gymnasium-only ids, Atari without envpool). All
stepping happens inside `recv()`, so there is no overlap between splits: async mode is the same
as sync mode here. Env i of a group is seeded `seed + i` on the first reset, as with envpool.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from fastrl.envs.base import Batch, SplitVecEnv


class GymnasiumSplitVecEnv(SplitVecEnv):
    """Split s is a `SyncVectorEnv` over envs [s*B, (s+1)*B), NEXT_STEP autoreset.

    `recv()` returns the split's observation buffer itself (copy=False): valid until the next
    `recv()` of the same split.
    """

    def __init__(
        self,
        env_fn: Callable[[], gymnasium.Env],
        num_envs: int,
        batch_size: int,
        seed: int,
        frame_skip: int = 1,
    ) -> None:
        super().__init__(num_envs, batch_size)
        self._vecs = [
            SyncVectorEnv(
                [env_fn] * batch_size, copy=False, autoreset_mode=AutoresetMode.NEXT_STEP
            )
            for _ in range(self.num_splits)
        ]
        self.observation_space = self._vecs[0].single_observation_space
        self.action_space = self._vecs[0].single_action_space
        self.frame_skip = frame_skip
        self._seeds: list[list[int] | None] = [
            list(range(seed + split * batch_size, seed + (split + 1) * batch_size))
            for split in range(self.num_splits)
        ]
        self._resetting = np.zeros(self.num_splits, dtype=bool)
        # Actions as send() takes them (fastrl.envs.spaces.ActionLayout), converted for the env per step.
        layout = self.action_layout
        self._actions = [np.zeros((batch_size, *layout.shape), dtype=layout.dtype) for _ in range(self.num_splits)]
        self._local_ids = np.arange(batch_size, dtype=np.int32)

    def _reset_split(self, split: int) -> None:
        self._resetting[split] = True

    def _send_split(self, split: int, actions: np.ndarray, local_ids: np.ndarray) -> None:
        self._actions[split][local_ids] = actions

    def _recv_split(self, split: int) -> Batch:
        vec = self._vecs[split]
        if self._resetting[split]:
            self._resetting[split] = False
            # Seed once; later resets continue each env's own random stream.
            obs, self.last_info = vec.reset(seed=self._seeds[split])
            self._seeds[split] = None
            no_flags = np.zeros(self.batch_size, dtype=bool)
            rewards = np.zeros(self.batch_size, dtype=np.float32)
            return obs, rewards, no_flags, no_flags.copy(), self._local_ids
        obs, rewards, terminated, truncated, self.last_info = vec.step(self._env_actions(self._actions[split]))
        return obs, rewards, terminated, truncated, self._local_ids

    def close(self) -> None:
        for vec in self._vecs:
            vec.close()
        self._vecs = []
