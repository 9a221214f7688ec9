"""scripts/bench.py tactics and perfect-play on run directories (made by hand: a config and an
untrained model's checkpoint): each reads its own game's runs and refuses the other's in one line."""
import argparse

import pytest
import torch

from tests.support.scripts import load_benchmark
from tests.unit.evaluation.test_episodes import TIC_TAC_TOE, untrained_run

CONNECT_FOUR = "pettingzoo:pettingzoo.classic.connect_four_v3"
tactics = load_benchmark("tactics")
perfect_play = load_benchmark("perfect_play")


def tactics_args(run_dir):
    return argparse.Namespace(run_dir=run_dir, best=False, positions=200, seed=0)


def test_perfect_play_audits_a_tic_tac_toe_run_in_both_seats(tmp_path, capsys):
    # The untrained weights must be the same in every test order: with others, one seat can play
    # its 10 positions without a blunder.
    torch.manual_seed(0)
    report = perfect_play.run(argparse.Namespace(run_dir=untrained_run(tmp_path, TIC_TAC_TOE), best=False))
    assert report["env_steps"] == 100 and list(report["seats"]) == list(perfect_play.SEATS)
    for seat in report["seats"].values():  # an untrained policy gives games away somewhere
        assert seat["positions"] > 0 and seat["blunders"] > 0 and 0 < seat["loss_share"] <= 1
    assert report["never_loses"] is False
    assert "greedy, against every line of perfect play" in capsys.readouterr().out


def test_tactics_reads_a_connect_four_run(tmp_path):
    report = tactics.run(tactics_args(untrained_run(tmp_path, CONNECT_FOUR)))
    assert report["env_steps"] == 100
    assert all(0 <= report[key] <= 1 for key in ("takes_win", "blocks", "hands_a_win"))


@pytest.mark.parametrize("env_id,script,args,refusal", [
    (CONNECT_FOUR, perfect_play, lambda run_dir: argparse.Namespace(run_dir=run_dir, best=False),
     "not PettingZoo's tictactoe_v3: perfect-play reads PettingZoo's tictactoe_v3 boards only"),
    (TIC_TAC_TOE, tactics, tactics_args,
     "not PettingZoo's connect_four_v3: tactics reads PettingZoo's connect_four_v3 boards only")])
def test_a_run_of_the_other_game_is_refused_in_one_line(tmp_path, env_id, script, args, refusal):
    run_dir = untrained_run(tmp_path, env_id)
    with pytest.raises(ValueError) as refused:
        script.run(args(run_dir))
    assert str(refused.value) == f"{run_dir} trained on {env_id}, {refusal}"
