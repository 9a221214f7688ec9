"""Tiny turn-based PettingZoo games (AECEnv) for tests/unit/envs/test_turns.py, made by id in spawned
workers too: ``--env pettingzoo:tests.support.turn_based_envs`` (this module's ``env(**env.kwargs)``,
``game="fold"`` for FoldGame; it has no ``parallel_env``)."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv


def move_rewards(move: int, mover: int, seats: int, target: int) -> np.ndarray:
    """``[seats]`` rewards of move ``move`` (0-based) made by seat ``mover`` when the count reaches
    ``target`` on the move ``target - 1``: every seat that waits gets ``(move + 1) / 100``; the
    last move wins +1 for its mover and -1 for every other seat."""
    rewards = np.full(seats, (move + 1) / 100)
    rewards[mover] = 0.0
    if move == target - 1:
        rewards += np.where(np.arange(seats) == mover, 1.0, -1.0)
    return rewards


class CountGame(AECEnv):
    """``seats`` players take turns adding 1 (action 0) or 2 (action 1) to a count; the one who
    brings it to ``target`` or beyond wins (see move_rewards). With ``max_turns`` the game is
    truncated after that many moves unless won first.

    Seat k observes ``[k, turn, count, game]``: its index, the moves made so far, the count, and
    the seed of the game's first reset. ``uneven``: seat 0 observes one value more."""

    metadata = {"name": "count_game_v0"}

    def __init__(self, seats: int = 2, target: int = 5, max_turns: int | None = None, uneven: bool = False):
        super().__init__()
        self.possible_agents = [f"player_{k}" for k in range(seats)]
        self.target = target
        self.max_turns = max_turns
        self._observation_spaces = {agent: spaces.Box(-1e6, 1e6, (4 + (uneven and k == 0),), np.float32)
                                    for k, agent in enumerate(self.possible_agents)}
        self._action_space = spaces.Discrete(2)
        self.game = -1.0

    def observation_space(self, agent):
        return self._observation_spaces[agent]

    def action_space(self, agent):
        return self._action_space

    def observe(self, agent):
        obs = np.zeros(self._observation_spaces[agent].shape, np.float32)
        obs[:4] = [self.possible_agents.index(agent), self.turn, self.count, self.game]
        return obs

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.game = float(seed)
        self.agents = list(self.possible_agents)
        self.turn = 0
        self.count = 0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}
        self.agent_selection = self.agents[0]

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            return self._was_dead_step(action)
        mover = self.possible_agents.index(agent)
        self.count += int(action) + 1
        won = self.count >= self.target
        rewards = move_rewards(self.turn, mover, len(self.possible_agents), self.turn + 1 if won else -1)
        self.rewards = {a: float(rewards[k]) for k, a in enumerate(self.possible_agents)}
        self._cumulative_rewards[agent] = 0.0
        self.turn += 1
        if won:
            self.terminations = dict.fromkeys(self.agents, True)
        elif self.max_turns is not None and self.turn >= self.max_turns:
            self.truncations = dict.fromkeys(self.agents, True)
        self.agent_selection = self.possible_agents[(mover + 1) % len(self.possible_agents)]
        self._accumulate_rewards()


class FoldGame(AECEnv):
    """Two seats, the first mover drawn at each reset. The first mover folds (action 0: it loses
    -1, the other seat wins +1) or calls (action 1), and then the other seat's move ends the game
    in a draw. With both seats random, each wins, draws and loses 1/4, 1/2, 1/4 of its games; a
    fold ends the game before the other seat's first turn.

    Seat k observes ``[k, turn, first mover, game]`` (game: the seed of its first reset)."""

    metadata = {"name": "fold_game_v0"}

    def __init__(self):
        super().__init__()
        self.possible_agents = ["player_0", "player_1"]
        self._observation_space = spaces.Box(-1e6, 1e6, (4,), np.float32)
        self._action_space = spaces.Discrete(2)
        self.game = -1.0
        self.rng = np.random.default_rng()

    def observation_space(self, agent):
        return self._observation_space

    def action_space(self, agent):
        return self._action_space

    def observe(self, agent):
        return np.array([self.possible_agents.index(agent), self.turn, self.first, self.game], np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.game = float(seed)
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.turn = 0
        self.first = int(self.rng.integers(2))
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}
        self.agent_selection = self.agents[self.first]

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent]:
            return self._was_dead_step(action)
        mover = self.possible_agents.index(agent)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if self.turn == 0 and int(action) == 0:
            self.rewards = {a: (-1.0 if k == mover else 1.0) for k, a in enumerate(self.possible_agents)}
        if self.turn == 1 or int(action) == 0:
            self.terminations = dict.fromkeys(self.agents, True)
        self._cumulative_rewards[agent] = 0.0
        self.turn += 1
        self.agent_selection = self.possible_agents[1 - mover]
        self._accumulate_rewards()


GAMES = {"count": CountGame, "fold": FoldGame}


def env(game: str = "count", **kwargs) -> AECEnv:
    return GAMES[game](**kwargs)
