"""The tests of tests/unit/envs/test_turns.py's subject that train in this process."""
import pytest

from tests.unit.envs.test_turns import check_self_play_trains_and_evaluates

CONNECT_FOUR = "pettingzoo:pettingzoo.classic.connect_four_v3"

@pytest.mark.parametrize("serial", [True, False], ids=["serial", "processes"])
def test_connect_four_trains_by_self_play_and_evaluates(tmp_path, serial):
    # The shortest game: the first seat wins on its 4th turn, the second seat has played 3.
    check_self_play_trains_and_evaluates(tmp_path, CONNECT_FOUR, serial, env_steps=2_000, turns=(3, 21))
