"""What the two PettingZoo groups share (fastrl/envs/multiagent/pettingzoo_backend.py's splits of ParallelEnv
games, fastrl/envs/multiagent/pettingzoo_turns.py's turn-based games): one shared policy's spaces, and their
games, seeded, rendered and closed one way; the rows' spaces, vector observations of different
lengths padded to one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

from fastrl.envs.spaces import UnsupportedSpace


def row_spaces(env_id: str, game, agents: tuple[str, ...], pad: bool = True):
    """The observation and action space of ``game``'s rows (every agent's row of the arena has
    one shape), and each agent's own observation space where they differ (else None).

    Agents of different 1-D Box observations (MPE's ``simple_tag``: predators see 16 values, prey
    14) share a row space ``pad`` allows: the longest, the others' observations zero-padded at
    their end, bounds and all (SuperSuit's ``pad_observations_v0`` does the same by hand); each
    policy must then act for agents of one space (fastrl.multiagent.policy_map.check_policy_spaces).
    Other differences, and any between action spaces, raise UnsupportedSpace (one line, naming
    the agents of each space)."""
    observation_spaces = [game.observation_space(agent) for agent in agents]
    actions = [game.action_space(agent) for agent in agents]
    differ = any(space != actions[0] for space in actions[1:])
    if differ:
        raise UnsupportedSpace(f"{env_id!r}: its agents have different action spaces ({space_groups(agents, actions)}),"
                               f" which fastrl does not support: pad them to one (e.g. supersuit's "
                               f"pad_action_space_v0) in a module of your own")
    if all(space == observation_spaces[0] for space in observation_spaces[1:]):
        return observation_spaces[0], actions[0], None
    vectors = all(isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 1 for space in observation_spaces)
    if not (pad and vectors):
        why = ("fastrl pads vector observations of different lengths, and these are not all 1-D Boxes" if pad
               else "a turn-based game's seats share one policy")
        raise UnsupportedSpace(f"{env_id!r}: its agents have different observation spaces "
                               f"({space_groups(agents, observation_spaces)}); {why}: pad them to one (e.g. "
                               f"supersuit's pad_observations_v0) in a module of your own")
    return padded_box(observation_spaces), actions[0], tuple(observation_spaces)


def space_groups(agents, spaces) -> str:
    """'a, b: SPACE; c: OTHER': the agents of each space, for a one-line message."""
    groups: dict[str, list[str]] = {}
    for agent, space in zip(agents, spaces):
        groups.setdefault(str(space), []).append(agent)
    return "; ".join(f"{', '.join(names)}: {space}" for space, names in groups.items())


def padded_box(spaces) -> gymnasium.spaces.Box:
    """One 1-D Box that holds each of ``spaces`` (1-D Boxes) in its first values and 0 after."""
    size = max(space.shape[0] for space in spaces)
    low, high = np.full(size, np.inf), np.full(size, -np.inf)
    for space in spaces:
        n = space.shape[0]
        low[:n], high[:n] = np.minimum(low[:n], space.low), np.maximum(high[:n], space.high)
        low[n:], high[n:] = np.minimum(low[n:], 0), np.maximum(high[n:], 0)
    dtype = np.result_type(*(space.dtype for space in spaces))
    return gymnasium.spaces.Box(low.astype(dtype), high.astype(dtype), (size,), dtype)


def pad_observation(observation, size: int, dtype) -> np.ndarray:
    """A 1-D observation zero-padded at its end to ``size`` values."""
    padded = np.zeros(size, dtype)
    padded[:len(observation)] = observation
    return padded


class PettingZooGamesMixin:
    """What both kinds of group share: their games (``_games``, None until made), seeded, reset,
    rendered and closed one way. Game g's first reset is seeded ``seed + g * n`` (the seed of its
    first row, as envs are seeded ``seed + i`` elsewhere); later resets continue its own random
    stream. Games other than ``first`` are made at their first reset, so that probing a group's
    spaces makes one game. ``episodes_begun[g]`` counts game g's resets: after a ``recv()``, a row
    of game g is in its game's episode ``episodes_begun[g] - 1`` (a final step comes before its
    game's reset), which is how evaluation against an opponent knows whose seat is whose."""

    _games: list
    _last_obs: list  # each row's latest observation, as its game gave it

    def _hold_games(self, env_id: str, make_game: Callable[[], Any], games: int, seed: int, first,
                    pad: bool = True) -> None:
        """Take ``first`` and make the others later; the rows' spaces (or UnsupportedSpace), with
        vector observations of different lengths padded where ``pad`` allows (row_spaces)."""
        self.env_id = env_id
        self.agents: tuple[str, ...] = tuple(first.possible_agents)
        try:
            self.observation_space, self.action_space, own = row_spaces(env_id, first, self.agents, pad)
        except UnsupportedSpace:
            first.close()
            raise
        # Each agent's own observation space where they differ (then its rows are padded), else ().
        self.agent_observation_spaces: tuple = own or ()
        self.frame_skip = 1
        self._make_game = make_game
        self._games = [first] + [None] * (games - 1)
        self._seeds: list[int | None] = [seed + g * len(self.agents) for g in range(games)]
        self.episodes_begun = np.zeros(games, dtype=np.int64)

    def _begin_episode(self, g: int):
        """Reset game g (seeded at its first reset), check that every agent plays from the reset,
        and count the episode; returns what ``reset()`` returned."""
        game = self._games[g]
        reset = game.reset(seed=self._seeds[g])
        self._seeds[g] = None
        if set(game.agents) != set(self.agents):
            raise RuntimeError(f"{self.env_id!r} reset with agents {list(game.agents)} of possible_agents "
                               f"{list(self.agents)}: every agent must play from the reset (agents that join "
                               f"later are not supported)")
        self.episodes_begun[g] += 1
        return reset

    def agent_observation(self, row: int):
        """Row ``row``'s latest observation exactly as its game gave it (unpadded): after a
        ``recv()`` that returned the row, the observation that batch holds for it."""
        return self._last_obs[row]

    def row_observation(self, row: int):
        """Row ``row``'s latest observation as the row space holds it: padded where the agents'
        spaces differ."""
        if not self.agent_observation_spaces:
            return self._last_obs[row]
        return pad_observation(self._last_obs[row], self.observation_space.shape[0], self.observation_space.dtype)

    def render_game(self, g: int = 0):
        """Game g's ``render()`` (made with ``render_mode="rgb_array"``: a uint8 [H, W, 3] frame)."""
        return self._games[g].render()

    def close(self) -> None:
        for game in self._games:
            if game is not None:
                game.close()
        self._games = []
