"""PettingZoo turn-based (AEC) games: ``pettingzoo:MODULE`` with ``env()`` and no ``parallel_env()``
(PettingZoo's classic board and card games), each seat a row, every row acted by one shared policy.

A row's trajectory runs in its own time: one step per turn its agent acts. The step from one of its
turns to the next carries the sum of the rewards the agent received in between (on its own move and
on the others'), and bootstraps from its value at that next turn. The turns it waits are no steps
of its trajectory at all, so V-trace's trace runs unbroken from turn to turn. When the game ends, on
any agent's move, each agent's row gets one final step from its last turn: the rewards since then
(a loss decided on the opponent's move lands here) and its flags; the next step of the row is the
reset observation at its first turn of the next game, NEXT_STEP autoreset as the interface says
(base.py): reward 0, no flags, the action sent for the final observation ignored.

Batches. A game has one agent to move, so a batch takes one row from each of the ``batch_size``
games of a group: the row of the agent to move, or a row whose final step is due (one a batch per
game, in seat order, before the game resets). The row ids of a batch vary with whose turn it is, as
envpool's async batches do; the worker keeps each row's own cursor and slot. A group's next batch
depends on its own actions only, so it is stepped once they came back and never waits for another
group: a worker of ``num_envs`` rows has ``num_envs / (n * batch_size)`` batches in flight
(``batches_in_flight``) for ``n``-seat games, ``env.num_splits / n``, which must therefore be whole.
Game g holds rows ``[g * n, (g + 1) * n)``, seat k row ``g * n + k``.

Rewards are read from the game's ``rewards`` after each ``step`` (PettingZoo: the rewards of that
step). Rewards an agent receives before its first turn of a game have no step to land on: that
step is the reset step, reward 0. An agent whose turn comes while it is terminated or truncated is
stepped with ``None``, as the AEC API asks, its final step already reported.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from fastrl.envs.base import VecEnv, as_batch
from fastrl.envs.pettingzoo_games import Games


def check_turn_groups(env_id: str, num_agents: int, num_envs: int, batch_size: int) -> None:
    """ValueError (one line) unless ``num_envs`` rows in batches of ``batch_size`` make whole
    groups of ``batch_size`` games of ``num_agents`` seats."""
    if num_envs % (num_agents * batch_size):
        raise ValueError(f"{env_id!r} is a turn-based game of {num_agents} seats: a batch takes one row (the seat to "
                         f"move) from each of env.envs_per_worker / env.num_splits = {batch_size} games, so "
                         f"env.num_splits ({num_envs // batch_size}) must be a multiple of {num_agents}")


class TurnBasedGames(Games, VecEnv):
    """``games`` games of one AECEnv in groups of ``games_per_group`` (a batch: one row from each
    game of a group), every seat a row (see the module; seeds: see Games)."""

    def __init__(self, env_id: str, make_game: Callable[[], Any], games: int, games_per_group: int, seed: int,
                 first) -> None:
        self._hold_games(env_id, make_game, games, seed, first)
        self.num_envs = games * len(self.agents)
        self.batch_size = games_per_group
        self.num_groups = games // games_per_group
        self._needs_reset = np.ones(games, dtype=bool)
        self._mover = np.full(games, -1, dtype=np.int64)  # seat whose action the game waits for, else -1
        self._done = np.zeros(self.num_envs, dtype=bool)  # the row's agent's episode ended in this game
        self._reported = np.zeros(self.num_envs, dtype=bool)  # ... and its final step was returned
        self._terminated = np.zeros(self.num_envs, dtype=bool)
        self._truncated = np.zeros(self.num_envs, dtype=bool)
        self._reward_since_turn = np.zeros(self.num_envs, dtype=np.float64)
        self._in_game = np.zeros(self.num_envs, dtype=bool)  # the row was returned since its game's reset
        self._last_obs: list = [None] * self.num_envs
        B = games_per_group
        self._batched_actions = batch_space(self.action_space, B)
        self._actions = [np.zeros((B, *self.action_layout.shape), dtype=self.action_layout.dtype)
                         for _ in range(self.num_groups)]
        self._obs = [create_empty_array(self.observation_space, B, fn=np.zeros) for _ in range(self.num_groups)]
        self._rows = np.zeros((self.num_groups, B), dtype=np.int32)  # the rows each group's last batch returned
        self._pending: deque[int] = deque()
        self._acting = np.zeros(self.num_groups, dtype=bool)

    @property
    def batches_in_flight(self) -> int:
        return self.num_groups

    def async_reset(self) -> None:
        self._pending = deque(range(self.num_groups))
        self._acting[:] = False
        self._needs_reset[:] = True
        self._mover[:] = -1

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        env_ids = np.asarray(env_ids)
        group = int(env_ids[0]) // (len(self.agents) * self.batch_size) if len(env_ids) == self.batch_size else -1
        if not (0 <= group < self.num_groups and self._acting[group] and np.array_equal(env_ids, self._rows[group])):
            raise RuntimeError(f"send() needs the env_ids of one whole batch returned by recv() and not yet sent; got "
                               f"{env_ids.tolist()[:8]}... ({len(env_ids)} ids, batch_size {self.batch_size})")
        self._actions[group][:] = actions
        self._acting[group] = False
        self._pending.append(group)

    def recv(self):
        if not self._pending:
            raise RuntimeError("recv() with no batch pending: call async_reset() first, and send() the actions "
                               "of every batch before receiving it again")
        group = self._pending.popleft()
        B = self.batch_size
        rewards = np.zeros(B, dtype=np.float32)
        terminated = np.zeros(B, dtype=bool)
        truncated = np.zeros(B, dtype=bool)
        rows = self._rows[group]
        actions = list(iterate(self._batched_actions, self._env_actions(self._actions[group])))
        for i, g in enumerate(range(group * B, (group + 1) * B)):
            rows[i] = row = self._next_row(g, actions[i])
            # A row's first turn of a game is its reset observation: reward 0 (see the module).
            rewards[i] = self._reward_since_turn[row] if self._in_game[row] else 0.0
            self._reward_since_turn[row] = 0.0
            self._in_game[row] = True
            if self._reported[row]:
                terminated[i], truncated[i] = self._terminated[row], self._truncated[row]
        obs = concatenate(self.observation_space, [self._last_obs[row] for row in rows], self._obs[group])
        self._acting[group] = True
        return as_batch(obs, rewards, terminated, truncated, rows.copy())

    def _next_row(self, g: int, action) -> int:
        """Play game g on to the next row it reports: apply ``action`` if the game waits for one,
        then the first final step due (seat order), else the agent to move (after a reset once
        every final step was reported). Sets that row's observation."""
        game, n = self._games[g], len(self.agents)
        base = g * n
        if self._needs_reset[g]:
            self._reset_game(g)
            game = self._games[g]
        elif self._mover[g] >= 0:
            self._step_game(g, action)
        self._mover[g] = -1
        rows = slice(base, base + n)
        while True:
            due = self._done[rows] & ~self._reported[rows]
            # A seat that never played this game has no step to end: its row waits for the next game.
            self._reported[rows] |= due & ~self._in_game[rows]
            due &= self._in_game[rows]
            if due.any():
                seat = int(np.argmax(due))
                row = base + seat
                self._reported[row] = True
                if self.agents[seat] in game.agents:
                    self._last_obs[row] = game.observe(self.agents[seat])
                self._needs_reset[g] = self._reported[rows].all()
                return row
            agent = game.agent_selection
            seat = self.agents.index(agent)
            if self._done[base + seat]:
                self._step_game(g, None)  # the AEC API's step for a dead agent's turn
                continue
            self._mover[g] = seat
            self._last_obs[base + seat] = game.observe(agent)
            return base + seat

    def _reset_game(self, g: int) -> None:
        if self._games[g] is None:
            self._games[g] = self._make_game()
        self._begin_episode(g)
        rows = slice(g * len(self.agents), (g + 1) * len(self.agents))
        for array in (self._done, self._reported, self._terminated, self._truncated, self._in_game):
            array[rows] = False
        self._reward_since_turn[rows] = 0.0
        self._needs_reset[g] = False

    def _step_game(self, g: int, action) -> None:
        """Step game g; add each playing agent's reward to its row, and mark the agents that left."""
        game = self._games[g]
        game.step(action)
        base = g * len(self.agents)
        for k, agent in enumerate(self.agents):
            row = base + k
            if self._reported[row]:
                continue
            self._reward_since_turn[row] += game.rewards.get(agent, 0.0)
            if self._done[row]:
                continue
            if agent not in game.agents:
                # Gone with neither flag: it will not act again, so nothing is bootstrapped beyond it.
                self._done[row] = self._terminated[row] = True
            elif game.terminations[agent] or game.truncations[agent]:
                self._done[row] = True
                self._terminated[row] = bool(game.terminations[agent])
                self._truncated[row] = bool(game.truncations[agent]) and not self._terminated[row]
