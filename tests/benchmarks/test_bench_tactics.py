"""scripts/bench.py tactics: positions classified as a player reads them, and the rates of
choosers whose answers are known."""
import argparse

import numpy as np
import pytest

from tests.support.scripts import load_benchmark

tactics = load_benchmark("tactics")

def board(rows):
    """Two bool [6, 7] boards (mover 'x', other 'o') from six strings, the top row first."""
    grid = np.array([list(r) for r in rows])
    return grid == "x", grid == "o"

def test_positions_are_classified_as_the_player_to_move_reads_them():
    win = board([".......", ".......", ".......", ".......", "ooo....", "xxx...."])
    assert tactics.classify(*win) == ("win", [3])
    block = board([".......", ".......", ".......", ".....o.", ".....o.", "x.x..ox"])
    assert tactics.classify(*block) == ("block", [5])
    two_threats = board([".......", ".......", ".......", ".......", ".xxx...", ".ooo..."])
    assert tactics.classify(*two_threats) == ("lost", [0, 4])
    # o's diagonal (5,1)-(4,2)-(3,3) wins at (2,4), not playable yet: quiet. Column 4 fills
    # (3,4) and hands o that square; column 0 does not.
    gift = board([".......", ".......", ".......", "...o...", "..oxx..", ".oxxo.."])
    assert tactics.classify(*gift) == ("quiet", [])
    assert tactics.hands_a_win(*gift, 4)
    assert not tactics.hands_a_win(*gift, 0)

def one_ply(positions):
    out = []
    for mover, other in positions:
        kind, right = tactics.classify(mover, other)
        out.append(right[0] if kind in ("win", "block") else tactics.legal_columns(mover | other)[0])
    return out

def test_the_one_ply_player_takes_every_win_and_blocks_every_single_threat():
    positions = tactics.random_positions(300, seed=1)
    report = tactics.tactics(one_ply, positions)
    assert report["takes_win"] == 1.0 and report["blocks"] == 1.0
    assert report["win_positions"] > 100 and report["block_positions"] > 5
    # A random legal move's rates: on average 1 / legal moves per right answer.
    assert 0.1 < report["random_takes_win"] < 0.4 and 0.1 < report["random_blocks"] < 0.3

def test_a_chooser_of_an_illegal_column_is_refused():
    positions = [board(["x......", "o......", "x......", "o......", "x......", "o......"])]
    with pytest.raises(ValueError, match="chose column 0, not one of the legal"):
        tactics.tactics(lambda ps: [0], positions)

def test_a_missing_run_directory_is_named(tmp_path):
    args = argparse.Namespace(run_dir=tmp_path / "nope", best=False, positions=10, seed=0)
    with pytest.raises(FileNotFoundError, match="no run directory"):
        tactics.run(args)
