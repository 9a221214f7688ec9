"""scripts/bench.py perfect-play: the audit of a tic-tac-toe policy against every line of perfect
play, on choosers whose play is known."""
import argparse

import numpy as np
import pytest

from fastrl.multiagent.opponents import tic_tac_toe_lined
from tests.support.scripts import load_benchmark

perfect_play = load_benchmark("perfect_play")
NO_PROBS = np.zeros(9)


def perfect(mine, theirs):
    values = {s: perfect_play.move_value(mine, theirs, s) for s in perfect_play.empty_squares(mine, theirs)}
    return max(values, key=values.get), NO_PROBS


def lowest_square(mine, theirs):
    return perfect_play.empty_squares(mine, theirs)[0], NO_PROBS


@pytest.mark.parametrize("first", [True, False])
def test_a_perfect_player_never_blunders_nor_loses_in_either_seat(first):
    found = perfect_play.audit(perfect, first)
    assert found["blunders"] == [] and found["loss_share"] == 0.0
    # The positions a deterministic perfect policy meets against every perfect line: few as the
    # first mover (it picks its opening), most replies to every opening as the second.
    assert found["positions"] == (6 if first else 183)


def simulated_loss_rate(choose, first, games, seed):
    """Brute force: games against a perfect player drawing uniformly among its best moves."""
    rng, losses = np.random.default_rng(seed), 0
    for _ in range(games):
        mine, theirs, policy_to_move = 0, 0, first
        while not perfect_play.ended(mine, theirs):
            if policy_to_move:
                square, _ = choose(mine, theirs)
            else:
                values = {s: perfect_play.move_value(mine, theirs, s) for s in perfect_play.empty_squares(mine, theirs)}
                square = int(rng.choice([s for s, v in values.items() if v == max(values.values())]))
            mine, theirs, policy_to_move = theirs, mine | 1 << square, not policy_to_move
        # The player who moved last holds `theirs`: it won if it has a line.
        losses += tic_tac_toe_lined(theirs) and policy_to_move
    return losses / games


@pytest.mark.parametrize("first", [True, False])
def test_the_loss_share_is_what_games_against_the_perfect_player_give(first):
    found = perfect_play.audit(lowest_square, first)
    assert found["blunders"] and 0 < found["loss_share"] <= 1
    for mine, theirs, square, right, _ in found["blunders"]:
        assert square == perfect_play.empty_squares(mine, theirs)[0] and square not in right
    games = 3000
    rate = simulated_loss_rate(lowest_square, first, games, seed=0)
    assert abs(rate - found["loss_share"]) < 4 * np.sqrt(found["loss_share"] * (1 - found["loss_share"]) / games) + 1e-9


def test_a_chooser_of_a_taken_square_is_refused():
    with pytest.raises(ValueError, match="chose square 4, not one of the empty"):
        perfect_play.audit(lambda mine, theirs: (4, NO_PROBS), False)


def test_boards_read_down_the_columns_as_pettingzoo_numbers_them():
    # squares 0 (top left), 4 (centre) and 6 (top right) for x; 2 (bottom left) for o
    assert perfect_play.board_text(1 << 0 | 1 << 4 | 1 << 6, 1 << 2) == "x.x/.x./o.."


def test_a_missing_run_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run directory"):
        perfect_play.run(argparse.Namespace(run_dir=tmp_path / "nope", best=False))
