"""The tests of tests/unit/envs/test_pettingzoo.py's subject that start fastrl's commands or processes."""
import contextlib
import io
import json

import pytest

from fastrl.cli import eval_main
from fastrl.config import build_config
from fastrl.run.training import train

SPREAD = "pettingzoo:mpe2.simple_spread_v3"

@pytest.mark.parametrize("serial", [True, False], ids=["serial", "processes"])
def test_simple_spread_trains_and_evaluates(tmp_path, serial):
    cfg = build_config("cartpole-appo", {
        "env.id": SPREAD, "env.num_workers": 1 if serial else 2, "env.envs_per_worker": 6, "env.num_splits": 2,
        "learner.rollout": 8, "learner.batch_size": 48, "train_for_env_steps": 3_000, "report_every_s": 0.5,
        "serial": serial, "inference.in_workers": False, "device": "cpu"})
    result = train(cfg, run_dir=tmp_path, quiet=True)
    assert result.final["env_steps"] >= 3_000 and result.final["learner_updates"] > 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lengths = [r["episode_length_mean"] for r in records if r["episode_length_mean"] is not None]
    assert lengths and set(lengths) == {25}  # every agent plays each game's 25 steps: one episode each
    args = [str(tmp_path), "--episodes", "4"] + (["--video", str(tmp_path / "spread.mp4")] if serial else [])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert eval_main(args) == 0
    evaluated = json.loads(printed.getvalue())
    assert evaluated["episodes"] == 4 and evaluated["episode_length_mean"] == 25
    if serial:
        assert evaluated["video_frames"] == 2 * 26  # two games (four agent episodes of three a game)
        assert (tmp_path / "spread.mp4").stat().st_size > 0


def test_predators_and_prey_of_different_spaces_train_under_their_own_policies(tmp_path, capsys):
    cfg = build_config("cartpole-appo", {
        "env.id": "pettingzoo:mpe2.simple_tag_v3", "env.num_workers": 1, "env.envs_per_worker": 8,
        "env.num_splits": 2, "learner.rollout": 5, "learner.batch_size": 20, "slots_per_env": 4,
        "train_for_env_steps": 2_000,
        "report_every_s": 0.5, "serial": True, "inference.in_workers": False, "device": "cpu",
        "policies.mapping": "by_kind", "eval.every_s": 1.0, "eval.opponents": ["random"], "eval.episodes": 3})
    result = train(cfg, run_dir=tmp_path, quiet=True)
    assert result.final["env_steps"] >= 2_000
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    # Evaluation during training: the first policy (adversary) in its three seats against random prey.
    evaluations = [r for r in records if r.get("eval/random/episodes")]
    assert evaluations and all(r["eval/random/episodes"] == 3 for r in evaluations)
    assert all(r["eval_return_mean"] == r["eval/random/episode_return_mean"] for r in evaluations)
    assert (tmp_path / "checkpoints" / "best.pt").is_file()
    for policy in ("adversary", "agent"):
        assert last[f"policy/{policy}/learner/learner_updates"] > 0
        assert last[f"policy/{policy}/episode_return_mean"] is not None
    capsys.readouterr()
    assert eval_main([str(tmp_path), "--policy", "agent", "--opponent", "random", "--episodes", "3"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["policy"] == "agent" and evaluated["episodes"] == 3
    assert {agent: seat["episodes"] for agent, seat in evaluated["seats"].items()} == {
        "adversary_0": 0, "adversary_1": 0, "adversary_2": 0, "agent_0": 3}
    assert eval_main([str(tmp_path), "--episodes", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fastrl-eval without --opponent plays one policy in every seat" in err
    assert "--policy NAME --opponent random" in err
