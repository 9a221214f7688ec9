"""PettingZoo turn-based (AEC) games: ``pettingzoo:MODULE`` with ``env()`` and no ``parallel_env()``
(PettingZoo's classic board and card games), each seat a row, every row acted by one shared policy,
with the turn-based rows of fastrl/envs/multiagent/turns.py (a seat's trajectory holds its own turns; batches
of one row per game of a group).

The games are stepped in ``recv()``, in Python. Rewards are read from the game's ``rewards`` after
each ``step`` (PettingZoo: the rewards of that step). An agent that is terminated or truncated
while the others play on leaves with its flags; when its turn comes it is stepped with ``None``, as
the AEC API asks, its final step already reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from fastrl.envs.multiagent.pettingzoo_games import PettingZooGamesMixin
from fastrl.envs.multiagent.turns import TurnGroups


class PettingZooTurnVecEnv(PettingZooGamesMixin, TurnGroups):
    """``games`` games of one AECEnv in groups of ``games_per_group`` (a batch: one row from each
    game of a group), every seat a row (see the module; seeds: see PettingZooGamesMixin)."""

    def __init__(self, env_id: str, make_game: Callable[[], Any], games: int, games_per_group: int, seed: int,
                 first) -> None:
        self._hold_games(env_id, make_game, games, seed, first, pad=False)
        self._init_groups(games, len(self.agents), games_per_group)
        self._needs_reset = np.ones(games, dtype=bool)
        self._mover = np.full(games, -1, dtype=np.int64)  # seat whose action the game waits for, else -1
        self._last_obs: list = [None] * self.num_envs
        B = games_per_group
        self._batched_actions = batch_space(self.action_space, B)
        self._actions = [np.zeros((B, *self.action_layout.shape), dtype=self.action_layout.dtype)
                         for _ in range(self.num_groups)]
        self._obs = [create_empty_array(self.observation_space, B, fn=np.zeros) for _ in range(self.num_groups)]

    def _reset_groups(self) -> None:
        self._needs_reset[:] = True
        self._mover[:] = -1

    def _send_group(self, group: int, actions: np.ndarray) -> None:
        self._actions[group][:] = actions

    def _play_group(self, group: int, rows: np.ndarray):
        actions = list(iterate(self._batched_actions, self._env_actions(self._actions[group])))
        for i, g in enumerate(self.group_games(group)):
            rows[i] = self._next_row(g, actions[i])
        return concatenate(self.observation_space, [self._last_obs[row] for row in rows], self._obs[group])

    def _next_row(self, g: int, action) -> int:
        """Play game g on to the next row it reports: apply ``action`` if the game waits for one,
        then the first final step due (seat order), else the agent to move (after a reset once
        every final step was reported). Sets that row's observation."""
        game, n = self._games[g], len(self.agents)
        if self._needs_reset[g]:
            self._reset_game(g)
            game = self._games[g]
        elif self._mover[g] >= 0:
            self._step_game(g, action)
        self._mover[g] = -1
        while True:
            row, finished = self.seat_ledger.take_finals(g)
            if row >= 0:
                row = int(row)
                agent = self.agents[row % n]
                # A truncated seat that is not to move bootstraps from its last turn (turns.py).
                waiting = self.seat_ledger.truncated[g, row % n] and agent != game.agent_selection
                if agent in game.agents and not waiting:
                    self._last_obs[row] = game.observe(agent)
                self._needs_reset[g] = finished
                return row
            agent = game.agent_selection
            seat = self.agents.index(agent)
            if self.seat_ledger.done[g, seat]:
                self._step_game(g, None)  # the AEC API's step for a dead agent's turn
                continue
            self._mover[g] = seat
            self._last_obs[g * n + seat] = game.observe(agent)
            return g * n + seat

    def _reset_game(self, g: int) -> None:
        if self._games[g] is None:
            self._games[g] = self._make_game()
        self._begin_episode(g)
        self.seat_ledger.start(g)
        self._needs_reset[g] = False

    def _step_game(self, g: int, action) -> None:
        """Step game g; its agents' rewards go to the ledger, and the agents that left leave it."""
        game = self._games[g]
        game.step(action)
        self.seat_ledger.receive(g, np.array([game.rewards.get(agent, 0.0) for agent in self.agents]))
        for k, agent in enumerate(self.agents):
            if agent not in game.agents:
                # Gone with neither flag: it will not act again, so nothing is bootstrapped beyond it.
                self.seat_ledger.leave(g, k, True, False)
            elif game.terminations[agent] or game.truncations[agent]:
                self.seat_ledger.leave(g, k, bool(game.terminations[agent]), bool(game.truncations[agent]))
