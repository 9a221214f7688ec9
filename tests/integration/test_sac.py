"""The tests of tests/unit/learner/test_sac.py's subject that train in this process."""

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.learner import SACLearner, make_learner
from fastrl.run.training import train
from tests.support.small_learners import E, T, stream_batches
from tests.support.training import read_metrics
from tests.unit.learner.test_sac import ACTION_SPACE, PROFILE, sac_config

OBS_SPACE = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)

def continuous_batches(num_batches, seed=0):
    """stream_batches with actions ``[T, E, 2]`` inside ACTION_SPACE."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for batch, env_ids in stream_batches(num_batches, seed=seed):
        low, high = torch.as_tensor(ACTION_SPACE.low), torch.as_tensor(ACTION_SPACE.high)
        batch.actions = low + (high - low) * torch.rand(T, E, 2, generator=g)
        out.append((batch, env_ids))
    return out

def test_one_update_per_env_step_trains_every_network_and_moves_the_targets_by_tau():
    torch.manual_seed(0)
    learner = make_learner(sac_config(), OBS_SPACE, ACTION_SPACE)
    assert isinstance(learner, SACLearner) and learner.target_entropy == -2.0
    batches = continuous_batches(4)
    for batch, env_ids in batches[:2]:  # 64 records: min_fill reached, no update owed yet
        learner.train(batch, env_ids=env_ids)
    actor = [p.clone() for p in learner.model.parameters()]
    critic = [p.clone() for p in learner.critic.parameters()]
    target = [p.clone() for p in learner.target_critic.parameters()]
    alpha = learner.temperature
    batch, env_ids = batches[2]
    stats = learner.train(batch, env_ids=env_ids)
    assert learner.updates == learner.replayed_batches == T * E  # replay_ratio 16 / batch 16: one per env step
    assert all(not torch.equal(a, b) for a, b in zip(actor, learner.model.parameters()))
    assert all(not torch.equal(a, b) for a, b in zip(critic, learner.critic.parameters()))
    assert learner.temperature != alpha and stats["temperature"] == pytest.approx(learner.temperature)
    # After k updates the target is (1 - tau)^k old + the rest from the critics: never a copy.
    assert all(not torch.equal(a, b) for a, b in zip(target, learner.target_critic.parameters()))
    assert {"critic_loss", "actor_loss", "temperature_loss", "q_mean", "entropy"} <= stats.keys()
    assert learner.achieved_ratio(3 * T * E) == pytest.approx(16.0)

def test_a_fixed_temperature_stays_and_has_no_optimizer_group():
    learner = make_learner(sac_config(**{"learner.learn_temperature": False, "learner.temperature": 0.05}),
                           OBS_SPACE, ACTION_SPACE)
    for batch, env_ids in continuous_batches(3):
        stats = learner.train(batch, env_ids=env_ids)
    assert learner.updates > 0 and learner.temperature == pytest.approx(0.05) and "temperature_loss" not in stats
    assert len(learner.optimizer.param_groups) == 2

def test_a_resumed_learner_continues_the_temperature_optimizers_and_counters():
    torch.manual_seed(0)
    cfg = sac_config()
    first = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    for batch, env_ids in continuous_batches(4):
        first.train(batch, env_ids=env_ids)
    state = first.state_dict()
    second = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    second.load_state_dict(state)
    assert second.temperature == first.temperature != cfg.learner.temperature
    assert (second.updates, second.version) == (first.updates, first.version) and second.updates > 0
    for name in ("critic", "target_critic"):
        a, b = getattr(first, name).state_dict(), getattr(second, name).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    moments = [s for s in second.optimizer.state_dict()["state"].values()]
    assert len(moments) == len(first.optimizer.state_dict()["state"]) == sum(
        len(g["params"]) for g in first.optimizer.param_groups)
    for a, b in zip(first.optimizer.state_dict()["state"].values(), moments):
        assert all(torch.equal(a[k], b[k]) for k in a)
    # The same next update from the same sample: the optimizers' moments and the temperature carry on.
    sample = first.replay.sample(16, rng=1)
    torch.manual_seed(5)
    loss_first = first.loss(sample)[0]
    torch.manual_seed(5)
    loss_second = second.loss(sample)[0]
    assert loss_first.item() == loss_second.item()

def pendulum_config(**overrides):
    """Small networks and batches: Pendulum is solved in about 10K env steps at one update each."""
    return build_config(PROFILE, {
        "env.id": "Pendulum-v1", "device": "cpu", "report_every_s": 2.0, "eval.every_s": 0.0,
        "model.hidden_sizes": [64, 64], "replay.min_fill": 1_000, "replay.batch_size": 64,
        "replay.replay_ratio": 64.0, **overrides})


@pytest.mark.parametrize("step_s, replay_ratio, budget, who_waits", [
    (0.005, 16.0, 800, "learner/wait_s"),  # envs much slower than the learner: the learner waits
    (0.0, 32.0, 2_000, "rollout/wait_slots_s"),  # envs much faster: the actors wait for free slots
])
def test_the_replay_ratio_holds_whichever_side_is_faster(tmp_path, step_s, replay_ratio, budget, who_waits):
    cfg = build_config(PROFILE, {
        "env.id": "tests.support.paced_envs:make_paced_target", "env.kwargs": {"step_s": step_s}, "device": "cpu",
        "env.num_workers": 1, "env.envs_per_worker": 4, "env.num_splits": 1, "learner.rollout": 4,
        "learner.batch_size": 16, "slots_per_env": 2, "replay.min_fill": 200, "replay.batch_size": 16,
        "replay.replay_ratio": replay_ratio, "model.hidden_sizes": [16, 16], "train_for_env_steps": budget,
        "report_every_s": 1.0, "eval.every_s": 0.0})
    train(cfg, run_dir=tmp_path, quiet=True)
    records = read_metrics(tmp_path)
    first, last = next(r for r in records if r["env_steps"]), records[-1]
    # The learner is behind the actors by at most the slots' 4 envs x 2 slots x 4 steps = 32 env steps.
    assert last["learner/replay_ratio_achieved"] == pytest.approx(replay_ratio, rel=0.05)
    waited = last[who_waits] - first[who_waits]
    assert waited > 0.3 * (last["wall_time"] - first["wall_time"])
