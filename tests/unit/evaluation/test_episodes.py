"""fastrl-eval --opponent (fastrl.evaluation.episodes.evaluate_against): the policy in one seat, a scripted
opponent in the others, the policy's seat rotating; win, draw and loss rates overall and per seat,
in turn-based and parallel games, with a video too; one-line errors. Run directories are made by
hand (config.toml and a checkpoint of an untrained model), so no training is needed, except for
fastrl-eval --policy, which picks one policy of a run trained with several."""
import importlib.util
import json

import numpy as np
import pytest
import torch

from fastrl.cli import eval_main
from fastrl.config import build_config, to_toml
from fastrl.envs import probe_env
from fastrl.envs.spaces import MASK_KEY, ObsLayout
from fastrl.evaluation import episodes as policy_eval
from fastrl.evaluation.episodes import evaluate_against, load_run_model
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from fastrl.models.networks import build_model
from fastrl.multiagent.opponents import tic_tac_toe_bits, tic_tac_toe_value
from fastrl.run.training import train
from tests.e2e.test_cli_errors import one_line_error, untrained_state
from tests.support import user_modules

TIC_TAC_TOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"
COUNT_GAME = "pettingzoo:tests.support.turn_based_envs"
CUE_GAME = "pettingzoo:tests.support.pettingzoo_envs"
CUE_LENGTH = 5


def game_config(env_id, env_kwargs=None):
    return build_config("cartpole-appo", {
        "env.id": env_id, "env.kwargs": env_kwargs or {}, "env.num_workers": 1, "env.envs_per_worker": 6,
        "env.num_splits": 1 if env_id == CUE_GAME else 2, "learner.rollout": 2, "learner.batch_size": 6,
        "device": "cpu", "model.kind": "mlp", "model.hidden_sizes": [16]})


def untrained(env_id, env_kwargs=None):
    cfg = game_config(env_id, env_kwargs)
    spec = probe_env(cfg)
    return cfg, build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)


def untrained_run(tmp_path, env_id, env_kwargs=None):
    """A run directory as fastrl-train leaves it, holding an untrained model of ``env_id``."""
    cfg = game_config(env_id, env_kwargs)
    (tmp_path / "config.toml").write_text(to_toml(cfg))
    save_checkpoint(tmp_path, untrained_state(cfg), 100, keep=3)
    return tmp_path


def evaluate(capsys, *args):
    code = eval_main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return json.loads(out)


def check_rates(result, seats, episodes):
    assert result["episodes"] == sum(seat["episodes"] for seat in result["seats"].values()) == episodes
    assert list(result["seats"]) == seats
    for rates in [result, *result["seats"].values()]:
        assert rates["win_rate"] + rates["draw_rate"] + rates["loss_rate"] == pytest.approx(1.0)
    overall = sum(seat["win_rate"] * seat["episodes"] for seat in result["seats"].values()) / episodes
    assert result["win_rate"] == pytest.approx(overall)


class Recording:
    """An opponent that keeps every (observation, agent) it is given and plays a legal action:
    ``choose(observation, agent)``, else the first the action_mask allows."""

    def __init__(self, choose=None):
        self.calls = []
        self.choose = choose

    def __call__(self, observation, agent):
        self.calls.append((observation, agent))
        if self.choose is not None:
            return self.choose(observation, agent)
        return int(np.flatnonzero(observation["action_mask"])[0])


def test_random_against_random_at_tic_tac_toe_gives_rates_per_seat(tmp_path, capsys):
    run_dir = untrained_run(tmp_path, TIC_TAC_TOE)  # an untrained policy plays about at random
    result = evaluate(capsys, run_dir, "--opponent", "random", "--episodes", 60)
    check_rates(result, ["player_1", "player_2"], 60)
    assert [seat["episodes"] for seat in result["seats"].values()] == [30, 30]
    assert result["opponent"] == "random" and result["env_steps"] == 100
    # Either side wins some, and some games are drawn (random play: 59% / 29% / 13%).
    assert 0 < result["win_rate"] < 1 and 0 < result["loss_rate"] < 1


def test_the_opponent_gets_each_agents_observation_as_the_game_gives_it_and_its_name():
    cfg, model = untrained(TIC_TAC_TOE)
    opponent = Recording()
    evaluate_against(cfg, model, opponent, 6)
    observations, agents = zip(*opponent.calls)
    assert set(agents) == {"player_1", "player_2"}
    for observation in observations:
        assert type(observation) is dict and set(observation) == {"observation", "action_mask"}
        assert observation["observation"].dtype == np.int8 and observation["observation"].shape == (3, 3, 2)
        assert observation["action_mask"].any()  # never asked to play an ended game


def test_the_policys_seat_rotates_and_each_outcome_is_its_own_seats():
    # The count game to 3: seat 0 moves, then seat 1 reaches 3 whatever it plays. An opponent
    # adding 2 therefore always wins in seat 0 and always loses in seat 1, whatever the policy does.
    cfg, model = untrained(COUNT_GAME, {"seats": 2, "target": 3})
    opponent = Recording(choose=lambda observation, agent: 1)
    result = evaluate_against(cfg, model, opponent, 7)
    check_rates(result, ["player_0", "player_1"], 7)
    seats = result["seats"]
    assert seats["player_0"]["episodes"] == 4 and seats["player_0"]["loss_rate"] == 1.0
    assert seats["player_1"]["episodes"] == 3 and seats["player_1"]["win_rate"] == 1.0
    assert seats["player_1"]["episode_return_mean"] == pytest.approx(1.0)  # its winning move
    # Each call shows the agent its own observation [seat, turn, count, game], on its own turn.
    assert all(observation[0] == int(agent[-1]) == observation[1] % 2 for observation, agent in opponent.calls)


def test_in_a_parallel_game_the_opponent_acts_for_the_other_agents_rows():
    cfg, model = untrained(CUE_GAME, {"num_agents": 3, "length": CUE_LENGTH, "masked": True})
    opponent = Recording(choose=lambda observation, agent: int(observation["observation"][2]))  # its cue
    result = evaluate_against(cfg, model, opponent, 6)
    check_rates(result, ["agent_0", "agent_1", "agent_2"], 6)
    assert all(seat["episodes"] == 2 for seat in result["seats"].values())
    # The team's reward: at least the two opponents' 2 / 3 each step, whatever the policy plays.
    assert result["win_rate"] == 1.0 and result["episode_return_mean"] >= CUE_LENGTH * 2 / 3 - 1e-6
    # Each agent is the opponent's in 4 of the 6 games, for its 5 moves; always its own observation.
    counts = {agent: 0 for agent in ["agent_0", "agent_1", "agent_2"]}
    for observation, agent in opponent.calls:
        counts[agent] += 1
        assert observation["observation"][0] == int(agent[-1]) and observation["action_mask"].sum() == 2
    assert counts == {"agent_0": 20, "agent_1": 20, "agent_2": 20}


def test_a_policy_of_several_plays_all_its_own_seats_and_the_opponent_the_others_unpadded():
    cfg = build_config("cartpole-appo", {
        "env.id": "pettingzoo:mpe2.simple_tag_v3", "env.num_workers": 1, "env.envs_per_worker": 8,
        "env.num_splits": 1, "learner.rollout": 2, "learner.batch_size": 8, "policies.mapping": "by_kind",
        "device": "cpu", "model.kind": "mlp", "model.hidden_sizes": [16]})
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    opponent = Recording(choose=lambda observation, agent: 0)
    seats = policy_eval.policy_seats(cfg, spec, "adversary")
    assert seats == ("adversary_0", "adversary_1", "adversary_2")
    result = evaluate_against(cfg, model, opponent, 5, seats=seats, num_envs=8)
    # 5 of the model's episodes take 2 games of 3 adversaries each: 6 episodes, 2 in each seat.
    assert {agent: seat["episodes"] for agent, seat in result["seats"].items()} == {
        "adversary_0": 2, "adversary_1": 2, "adversary_2": 2, "agent_0": 0}
    assert result["episodes"] == 6
    assert {agent for _, agent in opponent.calls} == {"agent_0"}
    assert {observation.shape for observation, _ in opponent.calls} == {(14,)}  # the prey's own, unpadded
    assert len(opponent.calls) == 2 * 25  # the prey's 25 moves in each of the 2 games


@pytest.mark.skipif(importlib.util.find_spec("imageio_ffmpeg") is None,
                    reason="the [video] extra (imageio, imageio-ffmpeg) is not installed")
def test_a_video_of_games_against_an_opponent(tmp_path, capsys):
    run_dir = untrained_run(tmp_path, CUE_GAME, {"num_agents": 3, "length": CUE_LENGTH})
    result = evaluate(capsys, run_dir, "--opponent", "random", "--episodes", 3, "--video", tmp_path / "games.mp4")
    check_rates(result, ["agent_0", "agent_1", "agent_2"], 3)
    # One game rendered: its first observation and a frame per step, game after game.
    assert result["video_frames"] == 3 * (CUE_LENGTH + 1) and (tmp_path / "games.mp4").stat().st_size > 0


def always_the_first_square(observation, agent):
    return 0


@pytest.mark.parametrize("env_id, opponent, message", [
    (TIC_TAC_TOE, "nope", "--opponent 'nope' is neither a built-in opponent (random, connect_four_one_ply, "
                          "tictactoe_minimax) nor MODULE:CALLABLE"),
    (TIC_TAC_TOE, "no_such_module_x:fn", "cannot import 'no_such_module_x'"),
    (TIC_TAC_TOE, "fastrl.multiagent.opponents:BUILT_IN", "is not callable (type dict)"),
    (TIC_TAC_TOE, "tests.unit.evaluation.test_episodes:always_the_first_square",
     "chose action 0 for 'player_"),
    (TIC_TAC_TOE, "connect_four_one_ply", "connect_four_one_ply plays PettingZoo's connect_four_v3"),
    ("fastrl.envs.toy:make_countdown", "random", "has one agent: evaluate it without --opponent"),
])
def test_what_cannot_be_played_is_one_line(tmp_path, capsys, env_id, opponent, message):
    run_dir = untrained_run(tmp_path, env_id)
    one_line_error(capsys, eval_main([str(run_dir), "--opponent", opponent, "--episodes", "4"]), 2, "fastrl-eval",
                   message)


def plays_without_the_agent(observation):
    return 0


@pytest.mark.parametrize("spec, message", [
    *((f"{module}:fn", f"--opponent '{module}:fn': {message}") for module, message in user_modules.BROKEN),
    ("tests.unit.evaluation.test_episodes:plays_without_the_agent",
     "--opponent 'tests.unit.evaluation.test_episodes:plays_without_the_agent' "
     "takes (observation), not (observation, agent)"),
])
def test_an_opponent_that_cannot_be_loaded_is_one_line(tmp_path, monkeypatch, capsys, spec, message):
    user_modules.install(tmp_path, monkeypatch)
    run_dir = untrained_run(tmp_path, TIC_TAC_TOE)
    one_line_error(capsys, eval_main([str(run_dir), "--opponent", spec, "--episodes", "4"]), 2, "fastrl-eval",
                   message)


@pytest.fixture(scope="module")
def two_policy_run(tmp_path_factory):
    """A short tic-tac-toe run of fastrl-train with a policy per player (policies.mapping=per_agent)."""
    run_dir = tmp_path_factory.mktemp("policies") / "run"
    cfg = build_config("cartpole-appo", {
        "env.id": TIC_TAC_TOE, "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 2,
        "learner.rollout": 4, "learner.batch_size": 8, "train_for_env_steps": 200, "serial": True,
        "inference.in_workers": False, "device": "cpu", "model.hidden_sizes": [8], "policies.mapping": "per_agent"})
    train(cfg, run_dir=run_dir, quiet=True)
    return run_dir


def saved_weights(run_dir) -> dict:
    """Each policy's model weights in the run's latest checkpoint, by name."""
    state = load_checkpoint(list_checkpoints(run_dir)[-1])
    return {name: entry["learner"]["model"] for name, entry in state["policies"].items()}


def same_weights(model, weights) -> bool:
    return all(torch.equal(value, weights[key]) for key, value in model.state_dict().items())


def test_policy_picks_which_policys_weights_are_loaded(two_policy_run):
    saved = saved_weights(two_policy_run)
    assert list(saved) == ["player_1", "player_2"]
    assert not all(torch.equal(saved["player_1"][key], saved["player_2"][key]) for key in saved["player_1"])
    for name in saved:
        _, model, source = load_run_model(two_policy_run, policy=name)
        assert source["policy"] == name and same_weights(model, saved[name])
    _, model, source = load_run_model(two_policy_run)
    assert source["policy"] == "player_1" and same_weights(model, saved["player_1"])  # the first by default


@pytest.mark.parametrize("opponent", [[], ["--opponent", "random"]], ids=["alone", "against an opponent"])
def test_fastrl_eval_plays_the_named_policy(two_policy_run, capsys, monkeypatch, opponent):
    played = []

    def record(play):
        def playing(cfg, model, *args, **kwargs):
            played.append({key: value.clone() for key, value in model.state_dict().items()})
            return play(cfg, model, *args, **kwargs)
        return playing

    monkeypatch.setattr(policy_eval, "evaluate_policy", record(policy_eval.evaluate_policy))
    monkeypatch.setattr(policy_eval, "evaluate_against", record(policy_eval.evaluate_against))
    result = evaluate(capsys, two_policy_run, "--policy", "player_2", "--episodes", 4, *opponent)
    assert result["policy"] == "player_2" and result["episodes"] == 4
    if opponent:  # in its own seat only, as it trained
        assert result["seats"]["player_2"]["episodes"] == 4 and result["seats"]["player_1"]["episodes"] == 0
        assert result["win_rate"] + result["draw_rate"] + result["loss_rate"] == pytest.approx(1.0)
    (weights,) = played
    assert all(torch.equal(value, saved_weights(two_policy_run)["player_2"][key]) for key, value in weights.items())


@pytest.mark.parametrize("args, message", [
    (["--policy", "player_3"], "--policy 'player_3' is not a policy of this run; its policies: player_1, player_2"),
    (["--policy", "player_3", "--opponent", "random"], "its policies: player_1, player_2"),
    (["--policy", "player_2", "--best"], "--best: checkpoints/best.pt holds policy 'player_1', the one evaluated "
                                         "during training; drop --best to evaluate 'player_2'"),
])
def test_a_policy_the_run_does_not_have_is_one_line(two_policy_run, capsys, args, message):
    one_line_error(capsys, eval_main([str(two_policy_run), "--episodes", "4", *args]), 2, "fastrl-eval", message)


def test_a_single_policy_run_names_its_one_policy(tmp_path, capsys):
    run_dir = untrained_run(tmp_path, TIC_TAC_TOE)
    assert evaluate(capsys, run_dir, "--policy", "main", "--episodes", 2)["policy"] == "main"
    one_line_error(capsys, eval_main([str(run_dir), "--policy", "player_1"]), 2, "fastrl-eval",
                   "--policy 'player_1' is not a policy of this run; its policies: main")


def test_games_over_before_the_policys_first_turn_count_with_their_outcome():
    # The fold game, both sides uniform: the first mover folds half the time, a win for the other
    # seat before its first turn. Each seat wins, draws and loses 1/4, 1/2, 1/4 of its games.
    cfg, model = untrained(COUNT_GAME, {"game": "fold"})
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()  # uniform over both actions
    result = evaluate_against(cfg, model, "random", 400)
    check_rates(result, ["player_0", "player_1"], 400)
    assert [seat["episodes"] for seat in result["seats"].values()] == [200, 200]
    for key, share in [("win_rate", 0.25), ("draw_rate", 0.5), ("loss_rate", 0.25)]:
        assert abs(result[key] - share) < 4 * np.sqrt(share * (1 - share) / 400), (key, result)
    assert result["episode_return_mean"] == pytest.approx(result["win_rate"] - result["loss_rate"])


class PerfectTicTacToe(torch.nn.Module):
    """A policy that plays tic-tac-toe perfectly: logits 0 on the moves of the best minimax
    value, -10 on the others (acting greedily, the first best move)."""

    def __init__(self, observation_space):
        super().__init__()
        self.layout = ObsLayout(observation_space)

    def check_mask(self, obs, final):
        pass

    def forward(self, obs):
        leaves = self.layout.unpack(obs)
        boards, masks = leaves["observation"].numpy(), leaves[MASK_KEY].numpy()
        logits = np.full((len(obs), 9), -10.0, np.float32)
        for row, (board, mask) in enumerate(zip(boards, masks)):
            mine, theirs = tic_tac_toe_bits(board)
            legal = np.flatnonzero(mask)
            if not len(legal):
                continue  # a final observation: its action is discarded
            values = np.array([-tic_tac_toe_value(theirs, mine | 1 << int(square)) for square in legal])
            logits[row, legal[values == values.max()]] = 0.0
        return torch.as_tensor(logits), torch.zeros(len(obs))


def test_perfect_play_against_the_perfect_opponent_is_a_draw_every_game_in_both_seats():
    cfg, _ = untrained(TIC_TAC_TOE)
    perfect = PerfectTicTacToe(probe_env(cfg).observation_space)
    result = evaluate_against(cfg, perfect, "tictactoe_minimax", 20, deterministic=True)
    check_rates(result, ["player_1", "player_2"], 20)
    assert result["draw_rate"] == 1.0 and result["episode_return_mean"] == 0.0
    assert all(seat["draw_rate"] == 1.0 for seat in result["seats"].values())
    against_random = evaluate_against(cfg, perfect, "random", 40, deterministic=True)
    assert against_random["loss_rate"] == 0.0 and against_random["win_rate"] >= 0.8
