"""Scripted opponents: what plays every seat but the trained policy's in ``fastrl-eval --opponent``
and in the evaluations during training of ``eval.opponents`` (fastrl.evaluation.episodes.evaluate_against).

An opponent is any callable ``fn(observation, agent) -> action``. ``observation`` is the agent's
observation exactly as the env gives it (for PettingZoo's classic games a dict with ``observation``
and ``action_mask``), ``agent`` the agent's name (``"player_1"``), and the action one of the
agent's action space as the env takes it; an action the space does not hold, or that the
observation's ``action_mask`` forbids, ends the evaluation (OpponentError, one line).

``--opponent`` names one as ``MODULE:CALLABLE`` or by a built-in name (BUILT_IN). A class deriving
from Opponent is made once per evaluation with the game's spaces and the evaluation's seed, so
that its random choices repeat with the seed: the built-ins are such classes.
"""
from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Mapping

import gymnasium
import numpy as np
from gymnasium import spaces

from ..envs.spaces import MASK_KEY
from ..user_code import load_callable

PLAYS = "fn(observation, agent) -> action"  # what an opponent is, as errors say it


class OpponentError(ValueError):
    """An opponent that cannot be found, made or played; the message says what to do."""


class Opponent:
    """An opponent made per evaluation with the game's ``observation_space`` and ``action_space``
    (one agent's) and a ``seed`` for its random choices (``self.rng``)."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space, seed: int):
        self.observation_space = observation_space
        self.action_space = action_space
        self.rng = np.random.default_rng(seed)

    def __call__(self, observation, agent: str):
        raise NotImplementedError


def legal_actions(observation, action_space: gymnasium.Space) -> np.ndarray | None:
    """The actions (int [k], the space's values) that ``observation``'s ``action_mask`` allows in a
    Discrete ``action_space``; None when it has no mask."""
    if not (isinstance(observation, Mapping) and MASK_KEY in observation and isinstance(action_space, spaces.Discrete)):
        return None
    return np.flatnonzero(np.asarray(observation[MASK_KEY]).reshape(-1)) + int(action_space.start)


class RandomLegal(Opponent):
    """Uniform over the legal actions: those the ``action_mask`` allows, else the whole action space."""

    def __init__(self, observation_space, action_space, seed):
        super().__init__(observation_space, action_space, seed)
        self._sampler = copy.deepcopy(action_space)  # seeded apart from the env's own space
        self._sampler.seed(int(self.rng.integers(2**31)))

    def __call__(self, observation, agent):
        legal = legal_actions(observation, self.action_space)
        if legal is None:
            return self._sampler.sample()
        return int(self.rng.choice(legal))


# PettingZoo's connect_four_v3: planes [rows, columns, 2] (row 0 the top; plane 0 the observing
# agent's pieces, plane 1 the other's) and one action per column.
CONNECT_FOUR_ROWS, CONNECT_FOUR_COLUMNS = 6, 7
_LINES = ((0, 1), (1, 0), (1, 1), (1, -1))  # horizontal, vertical, both diagonals


class ConnectFourOnePly(Opponent):
    """One-ply lookahead for PettingZoo's ``connect_four_v3``: a move that wins now, else one
    that blocks the other player's win on its next move, else a random legal move."""

    def __init__(self, observation_space, action_space, seed):
        super().__init__(observation_space, action_space, seed)
        board = observation_space.get("observation") if isinstance(observation_space, spaces.Dict) else None
        if (getattr(board, "shape", None) != (CONNECT_FOUR_ROWS, CONNECT_FOUR_COLUMNS, 2)
                or action_space != spaces.Discrete(CONNECT_FOUR_COLUMNS)):
            raise OpponentError(f"connect_four_one_ply plays PettingZoo's connect_four_v3 (board planes "
                                f"[6, 7, 2], 7 actions), not an env with observations {observation_space} and "
                                f"actions {action_space}; pick another opponent")

    def __call__(self, observation, agent):
        planes = np.asarray(observation["observation"])
        mine, theirs = planes[:, :, 0] != 0, planes[:, :, 1] != 0
        legal = legal_actions(observation, self.action_space)
        for pieces in (mine, theirs):  # win now, else take the square the other player wins on
            for column in legal:
                if wins_by_dropping(pieces, mine | theirs, int(column)):
                    return int(column)
        return int(self.rng.choice(legal))


def wins_by_dropping(pieces: np.ndarray, filled: np.ndarray, column: int) -> bool:
    """Whether a piece dropped in ``column`` makes four in a line with ``pieces``.

    pieces, filled: bool [rows, columns], row 0 the top; ``filled`` holds both players' pieces."""
    empty = np.flatnonzero(~filled[:, column])
    if not len(empty):
        return False
    row = int(empty[-1])
    rows, columns = pieces.shape
    for dr, dc in _LINES:
        line = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < rows and 0 <= c < columns and pieces[r, c]:
                line += 1
                r, c = r + sign * dr, c + sign * dc
        if line >= 4:
            return True
    return False


# PettingZoo's tictactoe_v3: planes [3, 3, 2] (plane 0 the observing agent's marks, plane 1 the
# other's), square r * 3 + c of the planes is action r * 3 + c.
TIC_TAC_TOE_LINES = tuple(sum(1 << square for square in line) for line in (
    (0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)))
TIC_TAC_TOE_FULL = (1 << 9) - 1


def tic_tac_toe_lined(marks: int) -> bool:
    """Whether the squares in the bit set ``marks`` (bit i: square i) hold a line of three."""
    return any(marks & line == line for line in TIC_TAC_TOE_LINES)


@functools.lru_cache(maxsize=None)
def tic_tac_toe_value(mine: int, theirs: int) -> int:
    """The game's value for the player to move, with perfect play on both sides: 1 a win, 0 a
    draw, -1 a loss. ``mine`` / ``theirs``: bit sets of the squares of the player to move and of
    the other (bit i: square i). Negamax over the at most 5,478 positions, each solved once."""
    if tic_tac_toe_lined(theirs):
        return -1
    if mine | theirs == TIC_TAC_TOE_FULL:
        return 0
    empty = [square for square in range(9) if not (mine | theirs) >> square & 1]
    return max(-tic_tac_toe_value(theirs, mine | 1 << square) for square in empty)


def tic_tac_toe_bits(planes: np.ndarray) -> tuple[int, int]:
    """A tictactoe_v3 board ``[3, 3, 2]`` as the bit sets (mine, theirs) of tic_tac_toe_value."""
    flat = np.asarray(planes).reshape(9, 2) != 0
    weights = 1 << np.arange(9)
    return int(weights[flat[:, 0]].sum()), int(weights[flat[:, 1]].sum())


class TicTacToeMinimax(Opponent):
    """A perfect player for PettingZoo's ``tictactoe_v3``: a move of the best value by minimax
    (tic_tac_toe_value), uniformly among the moves of that value, so that it never loses and
    plays every line a perfect player may play."""

    def __init__(self, observation_space, action_space, seed):
        super().__init__(observation_space, action_space, seed)
        board = observation_space.get("observation") if isinstance(observation_space, spaces.Dict) else None
        if getattr(board, "shape", None) != (3, 3, 2) or action_space != spaces.Discrete(9):
            raise OpponentError(f"tictactoe_minimax plays PettingZoo's tictactoe_v3 (board planes [3, 3, 2], 9 "
                                f"actions), not an env with observations {observation_space} and actions "
                                f"{action_space}; pick another opponent")

    def __call__(self, observation, agent):
        mine, theirs = tic_tac_toe_bits(observation["observation"])
        legal = legal_actions(observation, self.action_space)
        values = np.array([-tic_tac_toe_value(theirs, mine | 1 << int(square)) for square in legal])
        return int(self.rng.choice(legal[values == values.max()]))


BUILT_IN: dict[str, type[Opponent]] = {"random": RandomLegal, "connect_four_one_ply": ConnectFourOnePly,
                                       "tictactoe_minimax": TicTacToeMinimax}


def find_opponent(spec: str | Callable, option: str = "--opponent") -> Callable:
    """What ``spec`` names: a built-in name (BUILT_IN) or ``MODULE:CALLABLE``; a callable is
    returned as it is. OpponentError (one line, naming the ``option`` that gave ``spec``) when
    there is none, or when it cannot be called as ``fn(observation, agent)``."""
    if isinstance(spec, str) and spec in BUILT_IN:
        return BUILT_IN[spec]
    if isinstance(spec, str) and ":" not in spec:
        raise OpponentError(f"{option} {spec!r} is neither a built-in opponent ({', '.join(BUILT_IN)}) nor "
                            f"MODULE:CALLABLE, {PLAYS}")
    found = spec if callable(spec) else load_callable(spec, option, PLAYS, OpponentError)
    _check_plays(found, f"{option} {opponent_name(spec)!r}")
    return found


def _check_plays(found: Callable, named: str) -> None:
    """OpponentError (one line, starting with ``named``) when ``found``, or the instances of an
    Opponent class, cannot be called with (observation, agent)."""
    made = isinstance(found, type) and issubclass(found, Opponent)
    plays = found.__call__ if made else found
    try:
        signature = inspect.signature(plays)
    except (TypeError, ValueError):  # a builtin that states none: its first call will tell
        return
    try:
        signature.bind(*[None] * (3 if made else 2))  # an Opponent's __call__ also takes self
    except TypeError:
        raise OpponentError(f"{named} takes {signature}, not (observation, agent); make it {PLAYS}") from None


def make_opponent(found: Callable, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                  seed: int) -> Callable:
    """The opponent ``found`` (find_opponent's) for one evaluation: an Opponent class made with the
    game's spaces and ``seed``, any other callable as it is."""
    if isinstance(found, type) and issubclass(found, Opponent):
        return found(observation_space, action_space, seed)
    return found


def opponent_name(spec: str | Callable) -> str:
    """How results and errors name the opponent ``spec``."""
    return spec if isinstance(spec, str) else getattr(spec, "__qualname__", type(spec).__name__)


def checked_action(name: str, action, observation, agent: str, action_space: gymnasium.Space):
    """``action``, chosen by opponent ``name`` for ``agent`` on ``observation``, if the space holds
    it and the observation's action_mask allows it; else OpponentError (one line)."""
    if not action_space.contains(action):
        raise OpponentError(f"opponent {name!r} returned {action!r} for {agent!r}, which is not in its action space "
                            f"{action_space}; return one of the space's actions")
    legal = legal_actions(observation, action_space)
    if legal is not None and int(action) not in legal:
        raise OpponentError(f"opponent {name!r} chose action {int(action)} for {agent!r}, which its action_mask "
                            f"forbids (legal: {legal.tolist()}); choose among the actions the mask allows")
    return action
