"""PettingZoo backend: ``pettingzoo:MODULE`` ParallelEnvs, each agent one row of the batch; a
module with ``env()`` and no ``parallel_env()`` is a turn-based game (fastrl/envs/multiagent/pettingzoo_turns.py).

``--env pettingzoo:mpe2.simple_spread_v3`` imports ``mpe2.simple_spread_v3`` and makes its games
with ``parallel_env(**env.kwargs)``. Every agent of ``possible_agents`` is a row, like an env of a
single-agent backend: its own slot rows, trajectory, recurrent state and episode statistics, all
acted by one shared policy. A game's agents are consecutive rows (game g holds rows
``[g * n, (g + 1) * n)`` for n agents), and a split holds whole games, so ``num_envs`` and
``batch_size`` count rows and must be multiples of n.

Autoreset is NEXT_STEP per game, as the interface says (base.py): a game ends when its ``agents``
list is empty (or every agent has left); that step gives each row still playing its final reward
and flags as PettingZoo gives them, and the next step gives every row of the game its reset
observation (reward 0, no flags).

An agent that leaves while the others play on (terminated or truncated, or gone from ``agents``)
is an absent row until its game resets: no action goes to the game for it, its observation stays
its own last one, its reward is 0, and it reports the flags it left with on every step. To the
rollout worker (fastrl/sampling/rollout_worker.py) that is exactly a run of autoreset steps, by its rule that a
step following a done is not valid: each absent step is stored ``valid = False``, so the learners
never train on it, V-trace's trace stops there (rho = c = 0), a recurrent state restarts after
it, and the replays (which apply the same rule within each env's stream) sample no window that
starts on it or runs into it. The step the agent left on stays valid and bootstraps, or not, by
its own flags. The rollout counts an episode only at a valid done, so an absent row's repeated
dones are no extra episodes. Agents that join a game after its reset, or return after leaving,
are refused in one line: their rows would need an episode that starts mid-game, which this
backend does not give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from fastrl.config import ConfigError
from fastrl.envs.base import Batch, SplitVecEnv, VecEnv, check_whole_games
from fastrl.envs.multiagent.pettingzoo_games import PettingZooGamesMixin
from fastrl.envs.multiagent.pettingzoo_turns import PettingZooTurnVecEnv
from fastrl.envs.multiagent.turns import check_turn_groups
from fastrl.user_code import import_user_module

PREFIX = "pettingzoo:"
EXAMPLE = "pettingzoo:mpe2.simple_spread_v3"


def is_pettingzoo_id(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def require_pettingzoo(env_id: str) -> None:
    """ConfigError naming the extra when ``env_id`` is PettingZoo's and PettingZoo is missing:
    checked before a run starts (and before its run directory is made)."""
    if not is_pettingzoo_id(env_id):
        return
    try:
        import pettingzoo.utils.env  # noqa: F401
    except ImportError:
        raise ConfigError(f"--env {env_id} needs PettingZoo, which is not installed: pip install "
                          f"'fastrl[multiagent]'") from None


def game_maker(env_id: str, env_kwargs: dict[str, Any]) -> tuple[Callable[[], Any], bool]:
    """A zero-argument constructor of one game of ``env_id`` ("pettingzoo:MODULE"), and whether the
    game is turn-based: MODULE's ``parallel_env(**env_kwargs)``, else its ``env(**env_kwargs)`` (an
    AECEnv, fastrl/envs/multiagent/pettingzoo_turns.py). Raises ValueError (one line) for a module that cannot
    be imported, has neither, or makes no env of PettingZoo's kind."""
    require_pettingzoo(env_id)
    from pettingzoo.utils.env import AECEnv, ParallelEnv  # the [multiagent] extra: imported only when used

    module_name = env_id[len(PREFIX):]
    module = import_user_module(module_name, "env.id", env_id, not_found="correct the module name or install it "
                                "(pip install 'fastrl[multiagent]' installs pettingzoo and mpe2)")
    make, kind, name = getattr(module, "parallel_env", None), ParallelEnv, "parallel_env"
    if make is None:
        make, kind, name = getattr(module, "env", None), AECEnv, "env"
    if make is None:
        raise ValueError(f"{env_id!r} is not a PettingZoo env module (it has neither parallel_env() nor env()), "
                         f"e.g. --env {EXAMPLE}")

    def make_game():
        game = make(**env_kwargs)
        if not isinstance(game, kind):
            raise ValueError(f"{env_id!r}: {name}() returned {type(game).__name__}, not a pettingzoo.{kind.__name__}")
        return game

    return make_game, kind is AECEnv


def make_pettingzoo_vec_env(env_id: str, num_envs: int, batch_size: int, seed: int,
                            env_kwargs: dict[str, Any]) -> VecEnv:
    """``num_envs`` agent rows of ``env_id`` returned ``batch_size`` at a time: splits of whole
    games for a ParallelEnv, a row from each of ``batch_size`` games for a turn-based one."""
    make_game, turn_based = game_maker(env_id, env_kwargs)
    first = make_game()
    n = len(first.possible_agents)
    try:
        if turn_based:
            check_turn_groups(env_id, n, num_envs, batch_size)
        else:
            check_whole_games(env_id, n, batch_size)
    except ValueError:
        first.close()
        raise
    if turn_based:
        return PettingZooTurnVecEnv(env_id, make_game, num_envs // n, batch_size, seed, first)
    return PettingZooSplitVecEnv(env_id, make_game, num_envs // n, batch_size // n, seed, first)


def open_games(env_id: str, min_rows: int, seed: int, env_kwargs: dict[str, Any]) -> VecEnv:
    """The fewest games of ``env_id`` that hold ``min_rows`` agent rows, all in one batch (a
    split, or for a turn-based game one group: a row of each game), for evaluation and videos."""
    make_game, turn_based = game_maker(env_id, env_kwargs)
    first = make_game()
    games = -(-min_rows // len(first.possible_agents))
    if turn_based:
        return PettingZooTurnVecEnv(env_id, make_game, games, games, seed, first)
    return PettingZooSplitVecEnv(env_id, make_game, games, games, seed, first)


class PettingZooSplitVecEnv(PettingZooGamesMixin, SplitVecEnv):
    """``games`` games of one ParallelEnv, ``games_per_split`` to a split, every agent a row
    (seeds: see PettingZooGamesMixin)."""

    def __init__(self, env_id: str, make_game: Callable[[], Any], games: int, games_per_split: int, seed: int,
                 first) -> None:
        self._hold_games(env_id, make_game, games, seed, first)
        n = len(self.agents)
        super().__init__(games * n, games_per_split * n)
        self._games_per_split = games_per_split
        self._game_over = np.ones(games, dtype=bool)  # it resets at its next step
        self._present = np.zeros(self.num_envs, dtype=bool)  # the row's agent plays in its game
        self._left_terminated = np.zeros(self.num_envs, dtype=bool)  # how an absent row's agent left
        self._left_truncated = np.zeros(self.num_envs, dtype=bool)
        self._last_obs: list = [None] * self.num_envs  # each row's latest observation, as the game gave it
        layout = self.action_layout
        B = self.batch_size
        self._actions = [np.zeros((B, *layout.shape), dtype=layout.dtype) for _ in range(self.num_splits)]
        self._batched_actions = batch_space(self.action_space, B)
        self._obs = [create_empty_array(self.observation_space, B, fn=np.zeros) for _ in range(self.num_splits)]
        self._rewards = np.zeros((self.num_splits, B), dtype=np.float32)
        self._terminated = np.zeros((self.num_splits, B), dtype=bool)
        self._truncated = np.zeros((self.num_splits, B), dtype=bool)
        self._local_ids = np.arange(B, dtype=np.int32)

    def _reset_split(self, split: int) -> None:
        for g in self._split_games(split):
            if self._games[g] is None:
                self._games[g] = self._make_game()
            self._game_over[g] = True

    def _send_split(self, split: int, actions: np.ndarray, local_ids: np.ndarray) -> None:
        self._actions[split][local_ids] = actions

    def _recv_split(self, split: int) -> Batch:
        n = len(self.agents)
        first_row = split * self.batch_size
        rewards, terminated, truncated = self._rewards[split], self._terminated[split], self._truncated[split]
        actions = list(iterate(self._batched_actions, self._env_actions(self._actions[split])))
        for g in self._split_games(split):
            rows = range(g * n, (g + 1) * n)
            local = slice(g * n - first_row, (g + 1) * n - first_row)
            if self._game_over[g]:
                self._reset_game(g, rows)
                rewards[local] = terminated[local] = truncated[local] = 0
            else:
                self._step_game(g, rows, actions[local], rewards[local])
                # A row reports the flags it left with while it is absent, including the step it left on.
                terminated[local] = self._left_terminated[rows.start:rows.stop]
                truncated[local] = self._left_truncated[rows.start:rows.stop]
        batch_rows = range(first_row, first_row + self.batch_size)
        # Padding costs a call and an array per row per step: only where the agents' spaces differ.
        observations = ([self.row_observation(row) for row in batch_rows] if self.agent_observation_spaces
                        else self._last_obs[first_row:first_row + self.batch_size])
        obs = concatenate(self.observation_space, observations, self._obs[split])
        return obs, rewards, terminated, truncated, self._local_ids

    def _reset_game(self, g: int, rows: range) -> None:
        observations, _ = self._begin_episode(g)
        for row, agent in zip(rows, self.agents):
            self._last_obs[row] = observations[agent]
        self._present[rows.start:rows.stop] = True
        self._left_terminated[rows.start:rows.stop] = self._left_truncated[rows.start:rows.stop] = False
        self._game_over[g] = False

    def _step_game(self, g: int, rows: range, actions: list, rewards: np.ndarray) -> None:
        """Step game g with the actions of its present rows; ``rewards`` ``[n]`` get the rows'
        rewards (0 for absent rows); the rows of agents that left become absent."""
        game = self._games[g]
        present = self._present[rows.start:rows.stop]
        observations, step_rewards, terminations, truncations, _ = game.step(
            {agent: actions[k] for k, agent in enumerate(self.agents) if present[k]})
        remaining = set(game.agents)
        for k, agent in enumerate(self.agents):
            row = rows.start + k
            if not present[k]:
                rewards[k] = 0.0
                continue
            rewards[k] = step_rewards.get(agent, 0.0)
            if agent in observations:
                self._last_obs[row] = observations[agent]
            term, trunc = bool(terminations.get(agent, False)), bool(truncations.get(agent, False))
            if term or trunc or agent not in remaining:
                # Gone from the game with neither flag: it will not act again, and nothing says
                # its episode was cut short, so nothing is bootstrapped beyond it.
                present[k] = False
                self._left_terminated[row] = term or not trunc
                self._left_truncated[row] = trunc
        returned = [agent for k, agent in enumerate(self.agents) if not present[k] and agent in remaining]
        if returned:
            raise RuntimeError(f"{self.env_id!r}: agent {returned[0]!r} left the game (terminated or truncated) but "
                               f"is among its agents again: agents that come back are not supported")
        if not remaining or not present.any():
            self._game_over[g] = True

    def _split_games(self, split: int) -> range:
        return range(split * self._games_per_split, (split + 1) * self._games_per_split)
