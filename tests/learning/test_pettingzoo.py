"""A policy shared by every agent learns PettingZoo's cooperative cue game."""
from fastrl.run.training import train
from tests.unit.envs.test_pettingzoo import cue_config


def test_a_shared_policy_learns_the_cooperative_cue_game(tmp_path):
    # Every agent gets the team's reward, the fraction of agents that act on their own cue: a
    # random policy scores 8 / 3 in 8 steps, the best policy 8 (reached in ~6 s here, serial).
    cfg = cue_config(**{"env.kwargs": {"num_agents": 2, "length": 8, "tagged": False}, "serial": True,
                        "env.envs_per_worker": 64, "learner.rollout": 8, "learner.batch_size": 512,
                        "learner.lr": 3e-3, "learner.gamma": 0.9, "learner.entropy_coef": 0.0,
                        "train_for_env_steps": 0, "train_for_seconds": 10.0, "report_every_s": 1.0})
    result = train(cfg, run_dir=tmp_path, quiet=True)
    returns = [r["episode_return_mean"] for r in result.reports if r["episode_return_mean"] is not None]
    assert returns[-1] > 6.0, returns
