"""Turn-based games as rows: what PettingZoo's AEC games (fastrl/envs/multiagent/pettingzoo_turns.py) and
envpool's board games (fastrl/envs/multiagent/envpool_players.py) share. Every seat of a game is a row, and
every row is acted by one shared policy.

A row's trajectory runs in its own time: one step per turn its agent acts. The step from one of its
turns to the next carries the sum of the rewards the agent received in between (on its own move and
on the others'), and bootstraps from its value at that next turn. The turns it waits are no steps
of its trajectory at all, so V-trace's trace runs unbroken from turn to turn. When the game ends, on
any agent's move, each agent's row gets one final step from its last turn: the rewards since then
(a loss decided on the opponent's move lands here) and its flags; the next step of the row is the
reset observation at its first turn of the next game, NEXT_STEP autoreset as the interface says
(base.py): reward 0, no flags, the action sent for the final observation ignored. Rewards an agent
receives before its first turn of a game have no step to land on: that step is the reset step,
reward 0. A seat whose game ends before its first turn has no step in that game, yet it played
it: ``last_unplayed`` reports that episode (its return: every reward of the game) in the
``recv()`` whose batch holds the game's first final step, so that every game counts once for
every seat in it.

Truncation. A seat's value is trained at its own turns only, and the state a game is cut in is a
turn of the seat to move and of no other. So a truncated seat's final step bootstraps from one
of its own turns: the seat to move from the state the game was cut in, every other seat from its
last turn's observation (a value its trajectory trains, one turn stale, rather than the value of
a state its value head never sees: the opponent to move).

Batches. A game has one agent to move, so a batch takes one row from each of the ``batch_size``
games of a group: the row of the agent to move, or a row whose final step is due (one a batch per
game, in seat order, before the game resets). The row ids of a batch vary with whose turn it is, as
envpool's async batches do; the worker keeps each row's own cursor and slot. A group's next batch
depends on its own actions only, so it is stepped once they came back and never waits for another
group: a worker of ``num_envs`` rows has ``num_envs / (n * batch_size)`` batches in flight
(``batches_in_flight``) for ``n``-seat games, ``env.num_splits / n``, which must therefore be whole.
Game g holds rows ``[g * n, (g + 1) * n)``, seat k row ``g * n + k``; group q games
``[q * batch_size, (q + 1) * batch_size)``.
"""

from __future__ import annotations

import abc
from collections import deque

import numpy as np

from fastrl.envs.base import NO_UNPLAYED, Batch, VecEnv, as_batch


def check_turn_groups(env_id: str, num_agents: int, num_envs: int, batch_size: int) -> None:
    """ValueError (one line) unless ``num_envs`` rows in batches of ``batch_size`` make whole
    groups of ``batch_size`` games of ``num_agents`` seats."""
    if num_envs % (num_agents * batch_size):
        raise ValueError(f"{env_id!r} is a turn-based game of {num_agents} seats: a batch takes one row (the seat to "
                         f"move) from each of env.envs_per_worker / env.num_splits = {batch_size} games, so "
                         f"env.num_splits ({num_envs // batch_size}) must be a multiple of {num_agents}")


class SeatLedger:
    """What each seat of ``games`` games of ``seats`` seats is owed at its next step: the rewards
    it received since its last turn, and once its episode ended, its flags and whether its final
    step was reported (see the module). Arrays ``[games, seats]``; ``games`` arguments are a game
    index or an int array of them, ``rows`` int arrays of row ids."""

    def __init__(self, games: int, seats: int) -> None:
        self.seats = seats
        shape = (games, seats)
        self.done = np.zeros(shape, dtype=bool)  # the seat's episode ended in this game
        self.reported = np.zeros(shape, dtype=bool)  # ... and its final step was returned
        self.terminated = np.zeros(shape, dtype=bool)
        self.truncated = np.zeros(shape, dtype=bool)
        self.in_game = np.zeros(shape, dtype=bool)  # the seat's row was returned since its game's reset
        self.reward_since_turn = np.zeros(shape, dtype=np.float64)
        self._unplayed: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, returns) not taken yet

    def start(self, games) -> None:
        """``games`` were reset: nothing is owed to their seats."""
        for array in (self.done, self.reported, self.terminated, self.truncated, self.in_game):
            array[games] = False
        self.reward_since_turn[games] = 0.0

    def receive(self, games, rewards: np.ndarray) -> None:
        """``rewards`` ``[..., seats]`` received by the seats of ``games``, for those whose final
        step is not reported yet."""
        self.reward_since_turn[games] += np.where(self.reported[games], 0.0, rewards)

    def leave(self, games, seats, terminated, truncated) -> None:
        """The episodes of ``seats`` of ``games`` ended with these flags (truncated only when not
        terminated); seats that already left keep the flags they left with."""
        staying = ~self.done[games, seats]
        self.terminated[games, seats] = np.where(staying, terminated, self.terminated[games, seats])
        self.truncated[games, seats] = np.where(staying, np.logical_and(truncated, np.logical_not(terminated)),
                                                self.truncated[games, seats])
        self.done[games, seats] = True

    def take_finals(self, games) -> tuple[np.ndarray, np.ndarray]:
        """For each of ``games``: the row of its first seat (seat order) whose final step is due,
        now reported, or -1; and whether every seat's final step is reported (the game resets at
        its next step). A seat that never played the game has no step to end: it counts as
        reported, its episode kept for ``take_unplayed``."""
        unplayed = self.done[games] & ~self.in_game[games] & ~self.reported[games]
        if unplayed.any():
            rows = np.asarray(games)[..., None] * self.seats + np.arange(self.seats)
            self._unplayed.append((rows[unplayed], self.reward_since_turn[games][unplayed]))
        reported = self.reported[games] | unplayed
        due = self.done[games] & ~reported
        has_final = due.any(-1)
        seat = np.argmax(due, axis=-1)
        reported |= has_final[..., None] & (np.arange(self.seats) == seat[..., None])
        self.reported[games] = reported
        return np.where(has_final, np.asarray(games) * self.seats + seat, -1), reported.all(-1)

    def take_unplayed(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows (int64 ``[k]``) of the seats found since the last call to have left a game
        before their first turn, and their returns (float64 ``[k]``)."""
        found, self._unplayed = self._unplayed, []
        if not found:
            return NO_UNPLAYED
        return (np.concatenate([rows for rows, _ in found]).astype(np.int64),
                np.concatenate([returns for _, returns in found]))

    def report(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``rows`` ``[B]`` (one per game) are returned: their rewards since their last turn
        (0 at their game's first), now paid, and their flags (set on a final step only)."""
        games, seats = np.divmod(rows, self.seats)
        rewards = np.where(self.in_game[games, seats], self.reward_since_turn[games, seats], 0.0)
        self.reward_since_turn[games, seats] = 0.0
        self.in_game[games, seats] = True
        reported = self.reported[games, seats]
        return (rewards.astype(np.float32), reported & self.terminated[games, seats],
                reported & self.truncated[games, seats])


class TurnGroups(VecEnv):
    """``games`` games of ``seats`` seats in groups of ``games_per_group``, a batch one row of each
    game of a group (see the module). ``seat_ledger`` holds what each seat is owed; subclasses
    take a group's actions (``_send_group``) and play its games on to the rows they report next
    (``_play_group``), keeping the ledger."""

    def _init_groups(self, games: int, seats: int, games_per_group: int) -> None:
        self.num_envs = games * seats
        self.batch_size = games_per_group
        self.num_groups = games // games_per_group
        self.seat_ledger = SeatLedger(games, seats)
        self._rows = np.zeros((self.num_groups, games_per_group), dtype=np.int32)  # each group's last batch
        self._pending: deque[int] = deque()
        self._acting = np.zeros(self.num_groups, dtype=bool)

    @property
    def batches_in_flight(self) -> int:
        return self.num_groups

    def group_games(self, group: int) -> range:
        return range(group * self.batch_size, (group + 1) * self.batch_size)

    def async_reset(self) -> None:
        self._pending = deque(range(self.num_groups))
        self._acting[:] = False
        self._reset_groups()

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        env_ids = np.asarray(env_ids)
        group = int(env_ids[0]) // (self.seat_ledger.seats * self.batch_size) if len(env_ids) == self.batch_size else -1
        if not (0 <= group < self.num_groups and self._acting[group] and np.array_equal(env_ids, self._rows[group])):
            raise RuntimeError(f"send() needs the env_ids of one whole batch returned by recv() and not yet sent; got "
                               f"{env_ids.tolist()[:8]}... ({len(env_ids)} ids, batch_size {self.batch_size})")
        self._send_group(group, actions)
        self._acting[group] = False
        self._pending.append(group)

    def recv(self) -> Batch:
        if not self._pending:
            raise RuntimeError("recv() with no batch pending: call async_reset() first, and send() the actions "
                               "of every batch before receiving it again")
        group = self._pending.popleft()
        rows = self._rows[group]
        obs = self._play_group(group, rows)
        rewards, terminated, truncated = self.seat_ledger.report(rows)
        self.last_unplayed = self.seat_ledger.take_unplayed()
        self._acting[group] = True
        return as_batch(obs, rewards, terminated, truncated, rows.copy())

    @abc.abstractmethod
    def _reset_groups(self) -> None:
        """Every game resets before its first row is reported."""

    @abc.abstractmethod
    def _send_group(self, group: int, actions: np.ndarray) -> None:
        """``actions`` (as ``send()`` takes them) for the rows of the group's last batch."""

    @abc.abstractmethod
    def _play_group(self, group: int, rows: np.ndarray):
        """Play each game of ``group`` on to the row it reports next (its actions applied where the
        game waited for one), keeping the ledger; write the rows into ``rows`` ``[batch_size]`` and
        return their observations."""
