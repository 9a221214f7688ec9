"""The one interface every env backend implements, and the split machinery two of them share.

A rollout worker owns one `VecEnv` (a "group" of `num_envs` envs) and drives it as

    env.async_reset()
    while True:
        obs, rewards, terminated, truncated, env_ids = env.recv()   # batch_size rows
        actions = policy(obs)                                       # may overlap the next recv
        env.send(actions, env_ids)

with up to `batches_in_flight` (`num_envs // batch_size`) batches outstanding, so that the envs of
batch B step while the actions of batch A are computed (double buffering).

Autoreset is NEXT_STEP, as in gymnasium 1.x and envpool: the step after a done returns the
reset observation with reward 0 and terminated = truncated = False, and the action sent for
that step is ignored. The learner must never train on that transition (docs/architecture.md).
"""

from __future__ import annotations

import abc
import functools
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType

import gymnasium
import numpy as np

from fastrl.envs.spaces import ActionLayout

# (obs [B, *obs_shape], rewards float32 [B], terminated bool [B], truncated bool [B],
#  env_ids int32 [B]) with B = batch_size.
Batch = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
# VecEnv.last_unplayed when no seat left a game unplayed: (rows int64 [0], returns float64 [0]).
NO_UNPLAYED = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))


def as_batch(
    obs: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    env_ids: np.ndarray,
) -> Batch:
    """The interface's dtypes (float32 rewards, bool flags, int32 ids), converting only if needed."""
    return (
        obs,
        rewards.astype(np.float32, copy=False),
        terminated.astype(bool, copy=False),
        truncated.astype(bool, copy=False),
        env_ids.astype(np.int32, copy=False),
    )


def check_whole_games(env_id: str, num_agents: int, rows_per_split: int) -> None:
    """ValueError (one line) unless a split of ``rows_per_split`` rows holds whole games."""
    if rows_per_split < num_agents or rows_per_split % num_agents:
        below = rows_per_split // num_agents * num_agents
        fitting = f"{below} or {below + num_agents}" if below else str(num_agents)
        raise ValueError(f"{env_id!r}: each game is {num_agents} rows (one per agent) and a split of "
                         f"env.envs_per_worker / env.num_splits = {rows_per_split} rows must hold whole games: "
                         f"make env.envs_per_worker a multiple of {num_agents} x env.num_splits (splits of "
                         f"{fitting} rows)")


class VecEnv(abc.ABC):
    """A group of `num_envs` envs stepped in batches of `batch_size`.

    Attributes:
        num_envs: envs in this group (one rollout worker owns one group).
        batch_size: envs returned by one `recv()`; `num_envs % batch_size == 0`.
        observation_space: the observation space of ONE env (see fastrl.envs.spaces.ObsLayout).
        action_space: the action space of ONE env (see fastrl.envs.spaces.ActionLayout).
        frame_skip: emulator frames per env step (4 for Atari, else 1); frames = steps * frame_skip.
        agents: a multi-agent env's agents of one game, in row order (game g holds rows
            ``g * n .. (g + 1) * n - 1``); () for a single-agent env. [policies] maps them to policies.
        last_info: the info of the rows the last `recv()` returned, in gymnasium's vector form
            (key -> array [batch_size], with an optional bool mask ``_key`` of the rows that have
            the key); empty for a backend that passes no info on (env.info_keys reads it).
        episodes_begun: a multi-agent env's resets of each game, int64 [num_envs // len(agents)]:
            after a `recv()`, a row of game g that it returns is in the game's episode
            `episodes_begun[g] - 1` (self-play draws each game's seats by it).
        last_unplayed: the episodes the last `recv()` ended without a step: (rows int64 [k],
            returns float64 [k]) of the seats of a turn-based game that ended before their first
            turn (fastrl/envs/multiagent/turns.py); a game counts for every seat in it.
    """

    num_envs: int
    batch_size: int
    observation_space: gymnasium.Space
    action_space: gymnasium.Space
    frame_skip: int
    agents: tuple[str, ...] = ()
    last_info: Mapping[str, np.ndarray] = MappingProxyType({})
    last_unplayed: tuple[np.ndarray, np.ndarray] = NO_UNPLAYED

    @abc.abstractmethod
    def async_reset(self) -> None:
        """Reset all envs; their first observations come from the following `recv()` calls
        (reward 0, terminated = truncated = False). Call once, before the first `recv()`."""

    @abc.abstractmethod
    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        """Start stepping exactly the envs `env_ids` with `actions`; returns without waiting.

        Args:
            actions: [len(env_ids), *action_layout.shape] rows as fastrl stores them: flat and
                zero-based (fastrl.envs.spaces.ActionLayout), converted to the space's declared
                shape, dtype and start here; Box actions may be unclipped Gaussian samples
                (they are clipped to the bounds here).
            env_ids: int [len(env_ids)], ids returned by an earlier `recv()` and not yet sent.
                Split backends (sync mode) need the whole batch of one `recv()` at once.
        Raises:
            RuntimeError: an env in `env_ids` is not waiting for an action.
        """

    @abc.abstractmethod
    def recv(self) -> Batch:
        """Wait for the next `batch_size` envs that were reset or sent actions.

        Returns:
            obs: [batch_size, *observation_space.shape], dtype of the space (uint8 images stay
                uint8). It may be a view of a backend buffer: valid until the next `recv()`
                that returns the same envs; copy it out before then.
            rewards: float32 [batch_size].
            terminated: bool [batch_size]; the episode ended (no bootstrap).
            truncated: bool [batch_size]; the time limit cut the episode (bootstrap from obs).
            env_ids: int32 [batch_size] in [0, num_envs).
        Raises:
            RuntimeError: fewer than `batch_size` envs are pending (recv would wait forever).
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the envs and their threads."""

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @classmethod
    def game_rows(cls, **env_kwargs) -> int:
        """Rows of one game (its agents) of this class made with ``env_kwargs``, for a class given
        as ``--env module:Class``: a probe makes one game and evaluation whole games. 1 unless
        the class makes multi-agent games."""
        return 1

    @property
    def batches_in_flight(self) -> int:
        """Batches `recv()` can return before any of them is sent: every split's, `num_envs //
        batch_size`, unless some rows can step only once an earlier batch's actions came back
        (turn-based games, see fastrl/envs/multiagent/pettingzoo_turns.py)."""
        return self.num_envs // self.batch_size

    @functools.cached_property
    def action_layout(self) -> ActionLayout:
        """How fastrl stores this group's actions: what `send()` takes."""
        return ActionLayout(self.action_space)

    def _env_actions(self, actions: np.ndarray):
        """Actions as `send()` takes them -> as the env takes them (`ActionLayout.to_env`: the
        declared shape, dtype and `start`, Box actions clipped to their bounds). Every backend
        calls this as actions leave for its envs, and nothing else converts them."""
        return self.action_layout.to_env(actions)


class SplitVecEnv(VecEnv):
    """`num_envs // batch_size` independent splits of `batch_size` envs, each stepped as a whole.

    Split s holds envs [s * batch_size, (s + 1) * batch_size). `recv()` returns the split that
    was reset or sent actions longest ago (FIFO), so a worker that alternates splits keeps all of
    them busy. Subclasses implement the three per-split hooks.
    """

    def __init__(self, num_envs: int, batch_size: int) -> None:
        self.num_envs = num_envs
        self.batch_size = batch_size
        self.num_splits = num_envs // batch_size
        self._pending: deque[int] = deque()  # splits reset or sent, oldest first
        self._acting = np.zeros(self.num_splits, dtype=bool)  # returned by recv, awaiting send

    def async_reset(self) -> None:
        self._pending.clear()
        self._acting[:] = False
        for split in range(self.num_splits):
            self._reset_split(split)
            self._pending.append(split)

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        env_ids = np.asarray(env_ids)
        split = int(env_ids[0]) // self.batch_size if len(env_ids) == self.batch_size else -1
        local_ids = env_ids - split * self.batch_size
        # A range check by min and max: integer division of every id cost ~3x as much per batch.
        if not (
            0 <= split < self.num_splits
            and self._acting[split]
            and local_ids.min() >= 0
            and local_ids.max() < self.batch_size
        ):
            raise RuntimeError(
                f"send() needs the env_ids of one whole batch returned by recv() and not yet "
                f"sent; got {env_ids.tolist()[:8]}... ({len(env_ids)} ids, batch_size "
                f"{self.batch_size})"
            )
        self._send_split(split, actions, local_ids)
        self._acting[split] = False
        self._pending.append(split)

    def recv(self) -> Batch:
        if not self._pending:
            raise RuntimeError(
                "recv() with no batch pending: call async_reset() first, and send() the actions "
                "of every batch before receiving it again"
            )
        split = self._pending.popleft()
        obs, rewards, terminated, truncated, local_ids = self._recv_split(split)
        self._acting[split] = True
        return as_batch(obs, rewards, terminated, truncated, local_ids + split * self.batch_size)

    @abc.abstractmethod
    def _reset_split(self, split: int) -> None:
        """Start resetting every env of `split`."""

    @abc.abstractmethod
    def _send_split(self, split: int, actions: np.ndarray, local_ids: np.ndarray) -> None:
        """Start stepping `split`; `actions[i]` (as `send()` takes them: the backend converts them
        with `_env_actions`) goes to its env `local_ids[i]` in [0, batch_size)."""

    @abc.abstractmethod
    def _recv_split(self, split: int) -> Batch:
        """Wait for `split`; like `recv()` but with env ids local to the split."""
