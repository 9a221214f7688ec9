"""The tests of tests/unit/evaluation/test_episodes.py's subject that train in this process."""
from fastrl.evaluation.episodes import evaluate_against
from tests.unit.evaluation.test_episodes import check_rates, untrained

CONNECT_FOUR = "pettingzoo:pettingzoo.classic.connect_four_v3"

def test_an_untrained_policy_loses_most_games_to_one_ply_at_connect_four():
    cfg, model = untrained(CONNECT_FOUR)
    result = evaluate_against(cfg, model, "connect_four_one_ply", 40)
    check_rates(result, ["player_0", "player_1"], 40)
    assert result["loss_rate"] >= 0.75 and all(seat["loss_rate"] >= 0.6 for seat in result["seats"].values())
