"""What the two PettingZoo groups share (fastrl/envs/multiagent/pettingzoo_backend.py's splits of ParallelEnv
games, fastrl/envs/multiagent/pettingzoo_turns.py's turn-based games): one shared policy's spaces, and their
games, seeded, rendered and closed one way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

from fastrl.envs.spaces import UnsupportedSpace


def shared_spaces(env_id: str, game, agents: tuple[str, ...]) -> tuple[gymnasium.Space, gymnasium.Space]:
    """The observation and action space every agent of ``game`` has; UnsupportedSpace (one line,
    naming the agents of each space) when they differ: one policy acts for all of them."""
    for kind in ("observation", "action"):
        spaces = [getattr(game, f"{kind}_space")(agent) for agent in agents]
        if any(space != spaces[0] for space in spaces[1:]):
            groups: dict[str, list[str]] = {}
            for agent, space in zip(agents, spaces):
                groups.setdefault(str(space), []).append(agent)
            listed = "; ".join(f"{', '.join(names)}: {space}" for space, names in groups.items())
            raise UnsupportedSpace(f"{env_id!r}: its agents share one policy, so they need the same {kind} "
                                   f"space, but they differ ({listed}); several policies are not supported yet: "
                                   f"pad the spaces to one (e.g. supersuit's pad_observations_v0 / "
                                   f"pad_action_space_v0) in a module of your own")
    return (game.observation_space(agents[0]), game.action_space(agents[0]))


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

    def _hold_games(self, env_id: str, make_game: Callable[[], Any], games: int, seed: int, first) -> None:
        """Take ``first`` and make the others later; the agents' shared spaces (or UnsupportedSpace)."""
        self.env_id = env_id
        self.agents: tuple[str, ...] = tuple(first.possible_agents)
        try:
            self.observation_space, self.action_space = shared_spaces(env_id, first, self.agents)
        except UnsupportedSpace:
            first.close()
            raise
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
        """Row ``row``'s latest observation exactly as its game gave it: after a ``recv()`` that
        returned the row, the observation that batch holds for it."""
        return self._last_obs[row]

    def render_game(self, g: int = 0):
        """Game g's ``render()`` (made with ``render_mode="rgb_array"``: a uint8 [H, W, 3] frame)."""
        return self._games[g].render()

    def close(self) -> None:
        for game in self._games:
            if game is not None:
                game.close()
        self._games = []
