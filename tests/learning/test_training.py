"""CartPole is learned by DQN and by APPO with the central batcher; a user's own env factory and model
learn continuous actions in every run mode."""
import json

import pytest

from fastrl.config import build_config
from fastrl.run.training import train
from tests.integration.test_training import TinyPolicy, target_env_config, train_until_reported
from tests.support.training import assert_all_exited, read_metrics


@pytest.mark.parametrize("overrides", [{"serial": True}, {"inference.in_workers": False},
                                       {"inference.in_workers": True}], ids=["serial", "batcher", "workers-act"])
def test_own_env_factory_and_own_model_learn_continuous_actions(tmp_path, overrides):
    # reward = -(a - target)^2 per step: a random policy (std e^-0.5) scores about -6.5 per episode.
    cfg = target_env_config(**overrides)
    result = train(cfg, run_dir=tmp_path, model=TinyPolicy(), quiet=True)
    returns = [r["episode_return_mean"] for r in result.reports if r["episode_return_mean"] is not None]
    assert returns[-1] > -2.5, returns
    assert result.final["env_steps"] >= 60_000
    if not overrides.get("serial"):
        roles = json.loads((tmp_path / "processes.json").read_text())
        assert len(roles["inference"]) == (0 if overrides["inference.in_workers"] else 1)
        assert_all_exited(tmp_path)


def test_cartpole_learns_when_a_batcher_runs_the_policy(tmp_path):
    """inference.in_workers=false: the batcher process acts for the workers, which wait for its
    actions and act for none of their batches (the workers' path is the profile's, cartpole_run)."""
    # 2M env steps: the best report by then was 226-351 in four runs (two each way); at 1.2M the
    # batcher's run once stopped at 139 in CI (an asynchronous run's curve varies with its lag).
    budget = 2_000_000
    cfg = build_config("cartpole-appo", {"train_for_env_steps": budget, "device": "cpu", "report_every_s": 1.0,
                                         "inference.in_workers": False})
    result = train_until_reported(cfg, tmp_path, lambda r: (r["episode_return_mean"] or 0) > 150
                                  and r["env_steps"] < budget - 300_000)
    records = read_metrics(tmp_path)
    assert max(r["episode_return_mean"] or 0 for r in records) > 150
    # Ctrl-C stopped it (the bar met early) or its budget did: the result says which.
    assert result.stopped_by == ("SIGINT" if result.final["env_steps"] < budget else "")
    roles = json.loads((tmp_path / "processes.json").read_text())
    assert len(roles["rollout"]) == 2 and len(roles["inference"]) == 1
    final = result.final
    assert final["rollout/inference_s"] == 0 and final["inference/inference_batches"] > 0
    assert final["rollout/wait_actions_s"] > 0
    assert_all_exited(tmp_path)


def test_cartpole_dqn_learns(tmp_path):
    # Ape-X DQN end to end; seeds 0-2 first reached a mean >= 400 at 113K-290K env steps.
    budget = 400_000
    cfg = build_config("cartpole-dqn", {"train_for_env_steps": budget, "device": "cpu", "report_every_s": 1.0,
                                        "seed": 1})
    train_until_reported(cfg, tmp_path, lambda r: (r["episode_return_mean"] or 0) >= 400
                         and r["env_steps"] < budget - 50_000)
    records = read_metrics(tmp_path)
    assert max(r["episode_return_mean"] or 0 for r in records) >= 400
    last = records[-1]
    assert last["learner/replay_size"] > 50_000 and last["learner/replayed_batches"] > 1_000
    # replay_ratio 8 with batches of 128: one gradient step per 16 env steps once min_fill is in.
    assert last["learner_updates"] >= (last["env_steps"] - 5_000 - 64 * 16 * 3) / 16 * 0.9
    assert_all_exited(tmp_path)
