"""The tests of tests/unit/envs/test_envpool_players.py's subject that train in this process."""
import numpy as np
import pytest

from fastrl.envs import probe_env
from fastrl.envs.spaces import ObsLayout
from tests.unit.envs.test_envpool_players import TIC_TAC_TOE, tic_tac_toe_config
from tests.unit.envs.test_turns import check_self_play_trains_and_evaluates
from tests.unit.sampling.test_rollout_worker import run_worker

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]

def leaf(layout: ObsLayout, rows: np.ndarray, name: str) -> np.ndarray:
    """Leaf ``name`` of packed observation rows ``[..., row_bytes]``, as bool ``[..., *shape]``."""
    part = next(x for x in layout.leaves if x.name == name)
    values = rows[..., part.offset:part.offset + part.nbytes].view(part.dtype)
    return values.reshape(*rows.shape[:-1], *part.shape).astype(bool)

def has_line(marks: np.ndarray) -> bool:
    return any(marks[list(line)].all() for line in LINES)

def check_own_turns(own, opp, mask, actions, rewards, terminated, truncated, valid) -> tuple[int, int]:
    """Brute force over one slot of a seat: ``own`` / ``opp`` ``[T + 1, 9]`` its marks and the
    opponent's in the observations it was given, ``mask`` ``[T + 1, 9]``, the steps' ``actions``,
    ``rewards``, flags and ``valid`` ``[T]``. Every valid step goes from one of its turns to its next
    turn or the game's end: its own move (the action) and exactly one move of the opponent unless
    its own ended the game, with the reward of the end on the step it lands on. Returns (games
    won on its own move, games lost on the opponent's)."""
    won = lost = 0
    for t in range(len(actions)):
        assert not truncated[t]
        if not valid[t]:  # the reset step after a final one: a fresh board, at most the opponent's first move
            assert not own[t + 1].any() and opp[t + 1].sum() <= 1 and rewards[t] == 0 and not terminated[t]
            continue
        empty = ~(own[t] | opp[t])
        np.testing.assert_array_equal(mask[t], empty)  # its turn: its legal moves are the empty cells
        assert own[t].sum() in (opp[t].sum(), opp[t].sum() - 1)
        a = actions[t]
        after = own[t].copy()
        after[a] = True
        np.testing.assert_array_equal(own[t + 1], after)  # its own move, and only it
        if has_line(after) or (after | opp[t]).all():  # its move ended the game: the opponent never moved
            np.testing.assert_array_equal(opp[t + 1], opp[t])
            expected, done = (1.0, True) if has_line(after) else (0.0, True)
            won += has_line(after)
        else:
            moved = opp[t + 1] & ~opp[t]
            assert moved.sum() == 1 and not (moved & after).any()
            np.testing.assert_array_equal(opp[t + 1], opp[t] | moved)
            done = has_line(opp[t + 1]) or (after | opp[t + 1]).all()
            expected = -1.0 if has_line(opp[t + 1]) else 0.0
            lost += has_line(opp[t + 1])
        assert rewards[t] == expected and terminated[t] == done
    return won, lost

def test_each_seats_trajectory_holds_exactly_its_own_turns_at_tic_tac_toe():
    cfg = tic_tac_toe_config()
    layout = ObsLayout(probe_env(cfg).observation_space)
    rng = np.random.default_rng(0)

    def legal_moves(obs):
        return np.array([rng.choice(np.flatnonzero(m)) for m in leaf(layout, obs, "action_mask")])

    arena, full = run_worker(cfg, steps_per_env=40, choose=legal_moves)
    emitted = {row: 0 for row in range(cfg.env.envs_per_worker)}
    won = lost = 0
    for slot in full:
        emitted[int(arena.slot_env[slot])] += 1
        board = leaf(layout, arena.obs[slot], "observation").reshape(-1, 9, 2)  # [T + 1, cell, (own, opponent)]
        outcome = check_own_turns(board[..., 0], board[..., 1], leaf(layout, arena.obs[slot], "action_mask"),
                                  arena.actions[slot], arena.rewards[slot], arena.terminated[slot],
                                  arena.truncated[slot], arena.valid[slot])
        won, lost = won + outcome[0], lost + outcome[1]
    assert min(emitted.values()) >= 2
    # Every game won on a move is lost on the opponent's: the loss lands on the loser's last turn.
    assert won == lost > 10

@pytest.mark.parametrize("serial", [True, False], ids=["serial", "processes"])
def test_tic_tac_toe_trains_by_self_play_and_evaluates(tmp_path, serial):
    check_self_play_trains_and_evaluates(tmp_path, TIC_TAC_TOE, serial, env_steps=3_000, turns=(2, 5))
