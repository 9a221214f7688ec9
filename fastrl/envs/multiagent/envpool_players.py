"""envpool's multi-player tasks, every player a row (the multi-agent conventions of
docs/multiagent.md): game g holds rows ``[g * n, (g + 1) * n)``, player k row ``g * n + k``, and
one shared policy acts for all of them.

envpool steps a multi-player task's envs ("games") as it steps single-player ones and returns one
observation and one reward per player (its ``players`` arrays), with a single ``done`` / ``trunc``
per game. Two kinds, told apart by the task's state spec:

- **Turn-based** (pgx's board and card games: a ``current_player`` and the ``legal_action_mask``
  of that player): ``EnvpoolTurns``, the turn-based rows of fastrl/envs/multiagent/turns.py. A seat's row is
  returned at its own turns only, with its own observation (pgx gives each player the board from
  its side) and the Dict observation ``{"observation", "action_mask"}`` of PettingZoo's classic
  games; the game's one action is the mover's. Who moves first is pgx's choice (it draws the
  seats' colours at each reset). A game must not be stepped while its seats' final steps are
  reported, so it is stepped alone: one pool of the worker's games in async mode with
  ``batch_size = 1``, a group's games sent together and received one by one.
- **Simultaneous** (highway's ``IntersectionMultiAgent``: one action per player each step):
  ``PlayerRows`` over the sync splits or the async pool of games (fastrl/envs/backends/envpool_backend.py),
  every player a row of every batch, a split holding whole games. Every player of a game ends
  its episode with the game (envpool gives no per-player end), with the game's flags.

Game g of a group is seeded ``seed + g`` (envpool seeds the envs of a pool).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from fastrl.envs.base import Batch, VecEnv
from fastrl.envs.multiagent.turns import TurnGroups

CURRENT_PLAYER = "info:current_player"
LEGAL_ACTION_MASK = "info:legal_action_mask"
# The state arrays a turn-based pool is read through: each game's id, its players' seats,
# observations and rewards, and the game's flags, mover and mover's legal actions.
TURN_STATE_KEYS = ("info:env_id", "info:players.id", "obs", "reward", "done", "trunc", CURRENT_PLAYER,
                   LEGAL_ACTION_MASK)
TURN_ACTION_KEYS = ["env_id", "players.env_id", "action"]


def player_names(players: int) -> tuple[str, ...]:
    return tuple(f"player_{k}" for k in range(players))


def is_turn_based(spec: Any) -> bool:
    """Whether an envpool task spec (``envpool.make_spec``) has one player to move at a time."""
    return CURRENT_PLAYER in spec.state_array_spec


class EnvpoolTurns(TurnGroups):
    """The games of one turn-based envpool pool (async, ``batch_size = 1``) in groups of
    ``games_per_group``, every seat a row (see the module and fastrl/envs/multiagent/turns.py)."""

    def __init__(self, env_id: str, pool: Any, games_per_group: int, observation_space: gymnasium.Space,
                 action_space: gymnasium.Space) -> None:
        state_keys, action_keys = list(pool._state_keys), list(pool._spec._action_keys)
        if not set(TURN_STATE_KEYS) <= set(state_keys) or action_keys != TURN_ACTION_KEYS:
            pool.close()
            raise ValueError(f"{env_id!r}: this envpool lays out the turn-based task's arrays as {state_keys} / "
                             f"{action_keys}, not as fastrl reads them ({list(TURN_STATE_KEYS)} / "
                             f"{TURN_ACTION_KEYS}): install envpool 1.2 (pip install 'envpool>=1.2,<1.3')")
        games, players = pool.config["num_envs"], pool.config["max_num_players"]
        self.env_id = env_id
        self.agents = player_names(players)
        self._init_groups(games, players, games_per_group)
        self._pool = pool
        self._state_index = [state_keys.index(key) for key in TURN_STATE_KEYS]
        self._action_dtype = np.dtype(pool.spec.action_array_spec["action"].dtype)
        self.action_space = action_space
        self.observation_space = gymnasium.spaces.Dict(
            {"observation": observation_space, "action_mask": gymnasium.spaces.MultiBinary(int(action_space.n))})
        self.frame_skip = 1
        # Each game's latest state as the pool returned it; a seat's observation and the mask are
        # read when its row is returned (at its turn, or its final step from the last state).
        self._seat_obs = np.zeros((games, players, *observation_space.shape), dtype=observation_space.dtype)
        self._turn_obs = np.zeros_like(self._seat_obs)  # each seat's observation at its last turn
        self._seat_rewards = np.zeros((games, players), dtype=np.float64)
        self.episodes_begun = np.zeros(games, dtype=np.int64)
        self._mask = np.ones((games, int(action_space.n)), dtype=bool)
        self._to_move = np.zeros(games, dtype=np.int64)
        self._ended = np.zeros(games, dtype=bool)
        self._terminated = np.zeros(games, dtype=bool)
        self._truncated = np.zeros(games, dtype=bool)
        self._arrived = np.zeros(games, dtype=bool)  # a state came since the game's row was last returned
        self._resetting = np.zeros(games, dtype=bool)  # its next state is a reset one
        self._steps_next = np.zeros(games, dtype=bool)  # the group's next send steps it
        self._unreceived = np.zeros(self.num_groups, dtype=np.int64)  # states sent for and not received

    def _reset_groups(self) -> None:
        self._pool.async_reset()
        self._resetting[:] = True
        self._arrived[:] = False
        self._unreceived[:] = self.batch_size

    def _send_group(self, group: int, actions: np.ndarray) -> None:
        """Step the group's games that wait for an action, and those whose seats' final steps were
        all reported (envpool's autoreset: the action sent on a final observation is ignored)."""
        games = self.group_games(group)
        stepped = np.flatnonzero(self._steps_next[games.start:games.stop])
        if len(stepped) == 0:
            return
        env_ids = (games.start + stepped).astype(np.int32)
        env_actions = np.ascontiguousarray(self._env_actions(actions)[stepped], dtype=self._action_dtype)
        self._pool._send([env_ids, env_ids, env_actions])
        self._unreceived[group] += len(env_ids)

    def _receive_state(self) -> None:
        """One game's state from the pool (any group's): kept until its group's next batch."""
        state = self._pool._recv()
        env_id, seats, obs, rewards, done, trunc, to_move, mask = (state[i] for i in self._state_index)
        g = int(env_id[0])
        self._seat_obs[g, seats] = obs
        self._seat_rewards[g, seats] = rewards
        self._ended[g] = done[0]
        self._truncated[g] = trunc[0]
        self._terminated[g] = done[0] and not trunc[0]
        self._to_move[g] = to_move[0]
        self._mask[g] = mask[0]
        self._arrived[g] = True
        self._unreceived[g // self.batch_size] -= 1

    def _play_group(self, group: int, rows: np.ndarray):
        while self._unreceived[group]:
            self._receive_state()
        span = self.group_games(group)
        games = np.arange(span.start, span.stop)
        window = slice(span.start, span.stop)
        ledger = self.seat_ledger
        arrived = games[self._arrived[window]]
        reset = arrived[self._resetting[arrived]]
        ledger.start(reset)
        self.episodes_begun[reset] += 1
        self._resetting[reset] = False
        ledger.receive(arrived, self._seat_rewards[arrived])
        ended = arrived[self._ended[arrived]]
        every_seat = np.arange(ledger.seats)
        ledger.leave(ended[:, None], every_seat, self._terminated[ended, None], self._truncated[ended, None])
        self._arrived[window] = False
        finals, finished = ledger.take_finals(games)
        final = finals >= 0
        rows[:] = np.where(final, finals, games * ledger.seats + self._to_move[window])
        self._steps_next[window] = ~final | finished
        self._resetting[window] = final & finished
        seats = rows - games * ledger.seats
        obs = self._seat_obs[games, seats]
        self._turn_obs[games[~final], seats[~final]] = obs[~final]
        # A truncated seat that is not to move bootstraps from its last turn (fastrl/envs/multiagent/turns.py).
        waiting = final & self._truncated[window] & (seats != self._to_move[window])
        obs[waiting] = self._turn_obs[games[waiting], seats[waiting]]
        return {"observation": obs, "action_mask": self._mask[window]}

    def render_game(self, g: int = 0) -> np.ndarray:
        """Game g's frame (made with ``render_mode="rgb_array"``: uint8 [H, W, 3])."""
        return self._pool.render(env_ids=np.array([g], dtype=np.int32))[0]

    def close(self) -> None:
        self._pool.close()


class PlayerRows(VecEnv):
    """The players of a simultaneous multi-player task as rows of ``games``, a VecEnv of its games
    (EnvpoolSplitVecEnv or EnvpoolAsync) whose batches of ``b`` games hold ``b * n`` players' observations
    and rewards in game order (see the module)."""

    def __init__(self, games: VecEnv, players: int) -> None:
        self._games = games
        self._players = players
        self.agents = player_names(players)
        self.num_envs = games.num_envs * players
        self.batch_size = games.batch_size * players
        self.observation_space, self.action_space = games.observation_space, games.action_space
        self.frame_skip = games.frame_skip
        self._seats = np.arange(players, dtype=np.int32)
        self.episodes_begun = np.zeros(games.num_envs, dtype=np.int64)
        self._game_over = np.ones(games.num_envs, dtype=bool)  # its next batch is a reset one

    def async_reset(self) -> None:
        self._games.async_reset()
        self._game_over[:] = True

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        self._games.send(actions, np.asarray(env_ids)[::self._players] // self._players)

    def recv(self) -> Batch:
        obs, rewards, terminated, truncated, game_ids = self._games.recv()
        self.episodes_begun[game_ids[self._game_over[game_ids]]] += 1
        self._game_over[game_ids] = np.logical_or(terminated, truncated)
        rows = (game_ids[:, None] * self._players + self._seats).reshape(-1)
        return (obs, rewards, np.repeat(terminated, self._players), np.repeat(truncated, self._players), rows)

    def render_game(self, g: int = 0) -> np.ndarray:
        return self._games.render_game(g)

    def close(self) -> None:
        self._games.close()
