"""The scripted opponents of fastrl-eval --opponent (fastrl/multiagent/opponents.py): found by name or
MODULE:CALLABLE, seeded, the one-ply Connect Four player's rule on boards made by hand, and the
perfect tic-tac-toe player."""
import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.classic import connect_four_v3, tictactoe_v3

from fastrl.multiagent.opponents import (
    ConnectFourOnePly,
    OpponentError,
    RandomLegal,
    TicTacToeMinimax,
    checked_action,
    find_opponent,
    make_opponent,
    tic_tac_toe_bits,
    tic_tac_toe_value,
)
from tests.support import user_modules

C4_OBS = spaces.Dict({"action_mask": spaces.Box(0, 1, (7,), np.int8),
                      "observation": spaces.Box(0, 1, (6, 7, 2), np.int8)})


def board(rows: list[str]) -> dict:
    """A connect_four_v3 observation from text, row 0 the top: x the observing agent's pieces, o
    the other's, . empty; the mask allows every column with room."""
    planes = np.zeros((6, 7, 2), np.int8)
    for r, line in enumerate(rows):
        for c, cell in enumerate(line):
            if cell != ".":
                planes[r, c, "xo".index(cell)] = 1
    mask = (planes[0].sum(-1) == 0).astype(np.int8)
    return {"observation": planes, "action_mask": mask}


def one_ply(seed=0):
    return make_opponent(find_opponent("connect_four_one_ply"), C4_OBS, spaces.Discrete(7), seed)


@pytest.mark.parametrize("rows, moves", [
    (["......."] * 5 + ["xxx.oo."], {3}),  # its row of three: win
    (["......."] * 3 + ["x......", "x..o...", "x..o..o"], {0}),  # its column of three: win
    (["......."] * 3 + ["..xo...", ".xoo...", "xoox..."], {3}),  # its rising diagonal: win
    (["......."] * 5 + ["ooo.xx."], {3}),  # the other's row of three: block
    (["......."] * 3 + ["...o...", "...o...", "x..o.x."], {3}),  # the other's column: block
    (["......."] * 3 + ["..ox...", ".oxx...", "oxxo..."], {3}),  # the other's diagonal: block
    (["......."] * 5 + [".ooo.xx"], {0, 4}),  # two ways to lose: blocks one
])
def test_one_ply_wins_now_else_blocks(rows, moves):
    assert one_ply()(board(rows), "player_0") in moves


def test_one_ply_prefers_its_win_to_a_block_and_otherwise_plays_a_legal_move_at_random():
    win_or_block = board(["......."] * 5 + ["ooo.xxx"])
    assert one_ply()(win_or_block, "player_1") == 3
    quiet = board(["x......", "o......", "x......", "o......", "x......", "o......"])  # column 0 full
    moves = {one_ply(seed)(quiet, "player_0") for seed in range(40)}
    assert moves == set(range(1, 7))


def test_random_honours_the_mask_and_repeats_with_its_seed():
    space = spaces.Discrete(9)
    mask = np.zeros(9, np.int8)
    mask[[2, 5, 7]] = 1
    observation = {"observation": np.zeros((3, 3, 2), np.int8), "action_mask": mask}
    picks = [RandomLegal(None, space, seed=3)(observation, "player_1") for _ in range(2)]
    opponent = RandomLegal(None, space, seed=3)
    drawn = [opponent(observation, "player_1") for _ in range(60)]
    assert set(drawn) == {2, 5, 7} and picks[0] == picks[1] == drawn[0]
    unmasked = RandomLegal(None, spaces.Discrete(3, start=1), seed=0)
    assert {unmasked(np.zeros(2), "a") for _ in range(60)} == {1, 2, 3}


def play_connect_four(first, second, games: int, seed: int = 0, module=connect_four_v3) -> np.ndarray:
    """Returns of ``first`` over ``games`` of connect_four_v3 (or ``module``'s game), seats
    alternating game by game."""
    game = module.env()
    returns = np.zeros(games)
    seats = game.possible_agents
    for g in range(games):
        game.reset(seed=seed + g)
        players = dict(zip(seats, (first, second) if g % 2 == 0 else (second, first)))
        mine = seats[g % 2]
        for agent in game.agent_iter():
            observation, reward, terminated, truncated, _ = game.last()
            if agent == mine:
                returns[g] += reward
            game.step(None if terminated or truncated else players[agent](observation, agent))
    return returns


def test_one_ply_beats_random_at_connect_four_by_a_wide_margin():
    random = make_opponent(find_opponent("random"), C4_OBS, spaces.Discrete(7), seed=1)
    returns = play_connect_four(one_ply(seed=2), random, games=40)
    assert np.mean(returns > 0) >= 0.8, returns


def test_a_module_path_names_an_opponent_and_an_opponent_class_is_made_with_the_spaces_and_seed():
    assert find_opponent("fastrl.multiagent.opponents:ConnectFourOnePly") is ConnectFourOnePly
    assert find_opponent("random") is RandomLegal
    made = make_opponent(find_opponent("fastrl.multiagent.opponents:RandomLegal"), C4_OBS, spaces.Discrete(7), seed=5)
    assert isinstance(made, RandomLegal) and made.action_space == spaces.Discrete(7)

    def plain(observation, agent):
        return 0

    assert make_opponent(find_opponent(plain), C4_OBS, spaces.Discrete(7), seed=5) is plain


@pytest.mark.parametrize("spec, message", [
    ("nope", "--opponent 'nope' is neither a built-in opponent (random, connect_four_one_ply, tictactoe_minimax) "
             "nor MODULE:CALLABLE"),
    ("no_such_module_x:fn", "cannot import 'no_such_module_x'"),
    ("fastrl.multiagent.opponents:no_such_fn", "module 'fastrl.multiagent.opponents' has no 'no_such_fn'"),
    ("fastrl.multiagent.opponents:BUILT_IN", "is not callable (type dict)"),
])
def test_an_opponent_that_cannot_be_found_is_one_line(spec, message):
    with pytest.raises(OpponentError) as error:
        find_opponent(spec)
    assert message in str(error.value) and "\n" not in str(error.value)


def looks_at_the_board_only(observation):
    return 0


class ForgetsTheAgent(RandomLegal):
    def __call__(self, observation):
        return 0


@pytest.mark.parametrize("spec, message", [
    ("tests.unit.multiagent.test_opponents:looks_at_the_board_only",
     "--opponent 'tests.unit.multiagent.test_opponents:looks_at_the_board_only' takes "
     "(observation), not (observation, agent); make it fn(observation, agent) -> action"),
    ("tests.unit.multiagent.test_opponents:ForgetsTheAgent", "takes (self, observation), not (observation, agent)"),
    (looks_at_the_board_only, "--opponent 'looks_at_the_board_only' takes (observation)"),
])
def test_an_opponent_that_cannot_take_an_observation_and_an_agent_is_one_line(spec, message):
    with pytest.raises(OpponentError) as error:
        find_opponent(spec)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("module, message", user_modules.BROKEN)
def test_an_opponent_module_that_cannot_be_imported_is_one_line(tmp_path, monkeypatch, module, message):
    user_modules.install(tmp_path, monkeypatch)
    with pytest.raises(OpponentError) as error:
        find_opponent(f"{module}:fn", "eval.opponents entry")
    text = str(error.value)
    assert text.startswith(f"eval.opponents entry '{module}:fn': ") and message in text and "\n" not in text


def test_one_ply_refuses_a_game_other_than_connect_four():
    game = tictactoe_v3.env()
    with pytest.raises(OpponentError, match="connect_four_one_ply plays PettingZoo's connect_four_v3"):
        make_opponent(ConnectFourOnePly, game.observation_space("player_1"), game.action_space("player_1"), 0)


def test_an_illegal_action_is_one_line():
    observation = board(["x......", "o......", "x......", "o......", "x......", "o......"])
    assert checked_action("mine", 3, observation, "player_1", spaces.Discrete(7)) == 3
    with pytest.raises(OpponentError, match=r"opponent 'mine' chose action 0 for 'player_1', which its action_mask "
                                            r"forbids \(legal: \[1, 2, 3, 4, 5, 6\]\)"):
        checked_action("mine", 0, observation, "player_1", spaces.Discrete(7))
    with pytest.raises(OpponentError, match="returned 9 for 'player_1', which is not in its action space"):
        checked_action("mine", 9, observation, "player_1", spaces.Discrete(7))


TTT_OBS = spaces.Dict({"action_mask": spaces.Box(0, 1, (9,), np.int8),
                       "observation": spaces.Box(0, 1, (3, 3, 2), np.int8)})


def minimax(seed=0):
    return make_opponent(find_opponent("tictactoe_minimax"), TTT_OBS, spaces.Discrete(9), seed)


def ttt_board(rows: list[str]) -> dict:
    """A tictactoe_v3 observation from text: x the observing agent's marks, o the other's."""
    planes = np.zeros((3, 3, 2), np.int8)
    for r, line in enumerate(rows):
        for c, cell in enumerate(line):
            if cell != ".":
                planes[r, c, "xo".index(cell)] = 1
    return {"observation": planes, "action_mask": (planes.sum(-1) == 0).reshape(9).astype(np.int8)}


@pytest.mark.parametrize("rows, value, moves", [
    (["...", "...", "..."], 0, None),  # the empty board is a draw
    (["xx.", "oo.", "..."], 1, {2}),  # win now rather than block
    (["oo.", ".x.", "..."], 0, {2}),  # block, else lose
    (["oo.", "x..", "..x"], 1, {2}),  # the block makes two threats at once: a win
    (["o..", ".x.", "..o"], 0, {1, 3, 5, 7}),  # opposite corners against the centre: only an edge holds
    (["o..", "...", "..."], 0, {4}),  # a corner opened: only the centre holds the draw
    (["x.x", "...", "o.o"], 1, {1}),  # both win next: the one to move does
])
def test_minimax_knows_the_values_and_plays_only_moves_that_keep_them(rows, value, moves):
    observation = ttt_board(rows)
    assert tic_tac_toe_value(*tic_tac_toe_bits(observation["observation"])) == value
    if moves is not None:
        assert {minimax(seed)(observation, "player_1") for seed in range(40)} == moves


def test_minimax_never_loses_draws_itself_and_beats_random_at_tic_tac_toe():
    random = make_opponent(find_opponent("random"), TTT_OBS, spaces.Discrete(9), seed=1)
    against_random = play_connect_four(minimax(seed=2), random, games=200, module=tictactoe_v3)
    assert (against_random >= 0).all() and np.mean(against_random > 0) >= 0.85
    against_itself = play_connect_four(minimax(seed=3), minimax(seed=4), games=40, module=tictactoe_v3)
    np.testing.assert_array_equal(against_itself, 0)


def test_minimax_refuses_a_game_other_than_tic_tac_toe():
    with pytest.raises(OpponentError, match="tictactoe_minimax plays PettingZoo's tictactoe_v3"):
        make_opponent(TicTacToeMinimax, C4_OBS, spaces.Discrete(7), 0)
