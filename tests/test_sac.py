"""SAC (fastrl.learner.sac): its losses, squashed log-probabilities and Polyak update against
brute-force references on tiny inputs; the squashed head's bounds; the twin critics against two
separate MLPs; the learner's updates, resume and refusals; a short learning run on Pendulum."""
import json
import math
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import ConfigError, build_config
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.learner import SACLearner, make_learner
from fastrl.learner.losses import (
    polyak_update,
    sac_actor_loss,
    sac_critic_loss,
    sac_critic_targets,
    sac_temperature_loss,
)
from fastrl.models.encoders import EnsembleMLP
from fastrl.models.heads import SquashedGaussianHead, squashed_gaussian_log_prob
from fastrl.run.training import train
from tests.small_learners import E, T, stream_batches
from tests.test_train import assert_all_exited

PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "mujoco-sac.toml")
OBS_SPACE = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = gymnasium.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


# ---------------------------------------------------------------- pure functions, by brute force


def test_the_squashed_log_prob_is_the_change_of_variables_computed_item_by_item():
    g = torch.Generator().manual_seed(0)
    mean, log_std, u = (torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(3))
    got = squashed_gaussian_log_prob(mean, log_std, u)
    for i in range(5):
        expected = 0.0
        for j in range(3):
            m, s, x = mean[i, j].item(), math.exp(log_std[i, j].item()), u[i, j].item()
            density = math.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
            expected += math.log(density) - math.log(1.0 - math.tanh(x) ** 2)
        assert got[i].item() == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_the_squashed_density_integrates_to_one_and_stays_finite_where_tanh_saturates():
    a = torch.linspace(-1 + 1e-9, 1 - 1e-9, 400_001, dtype=torch.float64)
    u = torch.atanh(a)[:, None]
    logp = squashed_gaussian_log_prob(torch.tensor([[0.3]], dtype=torch.float64),
                                      torch.tensor([[-0.2]], dtype=torch.float64), u)
    assert torch.trapezoid(logp.exp(), a).item() == pytest.approx(1.0, abs=1e-4)
    # At |u| = 30, 1 - tanh(u)^2 is 0 in float32 and float64, and log(0) = -inf; log(4) - 2|u| is its limit.
    far = torch.tensor([[30.0], [-30.0]])
    logp = squashed_gaussian_log_prob(torch.zeros(2, 1), torch.zeros(2, 1), far)
    gaussian = -0.5 * 900 - 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(logp, torch.full((2,), gaussian - (math.log(4) - 60.0)))


def test_the_critic_target_adds_the_discounted_soft_value_item_by_item():
    g = torch.Generator().manual_seed(1)
    returns, q1, q2, logp = (torch.randn(6, generator=g) for _ in range(4))
    discounts = torch.tensor([0.99, 0.0, 0.9801, 0.99, 0.0, 0.970299])
    targets = sac_critic_targets(returns, discounts, q1, q2, logp, 0.2)
    for i in range(6):
        soft_value = min(q1[i].item(), q2[i].item()) - 0.2 * logp[i].item()
        assert targets[i].item() == pytest.approx(returns[i].item() + discounts[i].item() * soft_value, abs=1e-6)
    assert not targets.requires_grad


def test_the_critic_and_actor_losses_match_their_sums():
    g = torch.Generator().manual_seed(2)
    q1, q2, y, w, logp = (torch.randn(5, generator=g) for _ in range(5))
    w = w.abs()
    loss, stats = sac_critic_loss(q1, q2, y, w)
    expected = sum(w[i] * ((q1[i] - y[i]) ** 2 + (q2[i] - y[i]) ** 2) for i in range(5)) / 5 / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(stats["td"], y - (q1 + q2) / 2)
    loss, stats = sac_actor_loss(q1, q2, logp, 0.5)
    expected = sum(0.5 * logp[i] - min(q1[i], q2[i]) for i in range(5)) / 5
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert stats["entropy"].item() == pytest.approx(-logp.mean().item())


def test_the_temperature_rises_while_the_entropy_is_below_its_target_and_falls_above():
    log_alpha = torch.tensor(math.log(0.3), requires_grad=True)
    logp = torch.tensor([1.0, 3.0])  # entropy -2 below a target of -1
    loss, stats = sac_temperature_loss(log_alpha, logp, target_entropy=-1.0)
    loss.backward()
    assert loss.item() == pytest.approx(-math.log(0.3) * ((1.0 - 1.0) + (3.0 - 1.0)) / 2)
    assert log_alpha.grad.item() == pytest.approx(-1.0)  # -mean(logp + target): descent raises alpha
    assert stats["temperature"].item() == pytest.approx(0.3)
    log_alpha.grad = None
    sac_temperature_loss(log_alpha, torch.tensor([-3.0]), target_entropy=-1.0)[0].backward()
    assert log_alpha.grad.item() == pytest.approx(4.0)


def test_polyak_moves_each_target_element_tau_of_the_way():
    g = torch.Generator().manual_seed(3)
    targets = [torch.randn(3, 2, generator=g), torch.randn(4, generator=g)]
    sources = [torch.randn(3, 2, generator=g), torch.randn(4, generator=g)]
    before = [t.clone() for t in targets]
    polyak_update(targets, sources, 0.1)
    for new, old, source in zip(targets, before, sources):
        for k in range(new.numel()):
            assert new.view(-1)[k].item() == pytest.approx(0.9 * old.view(-1)[k].item() + 0.1 * source.view(-1)[k].item(),
                                                           abs=1e-6)
    with pytest.raises(ValueError, match="2 targets for 1 sources"):
        polyak_update(targets, sources[:1], 0.1)


# ---------------------------------------------------------------- the head and the networks


def test_squashed_actions_lie_in_the_bounds_and_map_back_exactly():
    head = SquashedGaussianHead(ACTION_SPACE)
    params = torch.cat([torch.randn(1000, 2) * 5, torch.randn(1000, 2)], dim=-1)
    actions, logp = head.sample_with_log_prob(params)
    low, high = torch.as_tensor(ACTION_SPACE.low), torch.as_tensor(ACTION_SPACE.high)
    assert ((actions >= low) & (actions <= high)).all() and torch.isfinite(logp).all()
    torch.testing.assert_close(head.from_env(actions), (actions - (low + high) / 2) / ((high - low) / 2))
    torch.testing.assert_close(head.to_env(head.from_env(actions)), actions)
    torch.testing.assert_close(head.sample(params, deterministic=True), head.to_env(torch.tanh(params[:, :2])))
    uniform, uniform_logp = head.sample_uniform(5000)
    assert ((uniform >= low) & (uniform <= high)).all() and torch.equal(uniform_logp, torch.full((5000,), -2 * math.log(2)))
    assert abs(uniform[:, 0].mean().item()) < 0.1 and abs(uniform[:, 1].mean().item() - 0.5) < 0.05
    with pytest.raises(ValueError, match="infinite"):
        SquashedGaussianHead(gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32))


def test_the_ensemble_mlp_equals_its_members_applied_one_by_one():
    torch.manual_seed(0)
    net = EnsembleMLP(2, 5, [8, 7], 1, "relu")
    x = torch.randn(6, 5)
    out = net(x)
    for k in range(2):
        h = x
        for layer, (weight, bias) in enumerate(zip(net.weights, net.biases)):
            h = h @ weight[k] + bias[k]
            if layer < 2:
                h = torch.relu(h)
        torch.testing.assert_close(out[k], h)
    # Orthogonal rows per member, as nn.Linear's would be: W^T W = gain^2 I on the smaller side.
    first = net.weights[0][1]
    torch.testing.assert_close(first @ first.T, 2.0 * torch.eye(5), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- the learner


def sac_config(**overrides):
    return build_config(PROFILE, {
        "env.id": "Pendulum-v1", "env.num_workers": 1, "env.envs_per_worker": E, "env.num_splits": 1,
        "learner.rollout": T, "learner.batch_size": T * E, "replay.capacity": 64 * E, "replay.min_fill": 64,
        "replay.batch_size": 16, "replay.replay_ratio": 16.0, "model.hidden_sizes": [16, 16], **overrides})


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


@pytest.mark.parametrize("overrides, message", [
    ({"env.id": "CartPole-v1"}, "needs a continuous Box action space"),
    ({"model.core": "lstm"}, "sac trains a feed-forward actor"),
    ({"model.separate_critic": True}, "separate_critic is for learner.algo=appo"),
    ({"replay.replay_ratio": 0.0}, "replay_ratio' must be > 0 for sac"),
    ({"learner.precision": "bfloat16"}, "sac trains in float32"),
    ({"pbt.population": 2}, "learner.algo=sac is not supported with pbt"),
])
def test_nonsensical_combinations_are_refused_in_one_line(overrides, message):
    from fastrl.envs import probe_env

    def build():
        cfg = sac_config(**overrides)
        spec = probe_env(cfg)
        make_learner(cfg, spec.observation_space, spec.action_space)

    with pytest.raises((ConfigError, ValueError), match=message) as caught:
        build()
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------- end to end


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def pendulum_config(**overrides):
    """Small networks and batches: Pendulum is solved in about 10K env steps at one update each."""
    return build_config(PROFILE, {
        "env.id": "Pendulum-v1", "device": "cpu", "report_every_s": 2.0, "eval.every_s": 0.0,
        "model.hidden_sizes": [64, 64], "replay.min_fill": 1_000, "replay.batch_size": 64,
        "replay.replay_ratio": 64.0, **overrides})


@pytest.mark.slow
def test_sac_learns_pendulum_and_a_resumed_run_carries_on(tmp_path):
    # Seed 0 on a loaded 2-core CPU: -193 at 12K env steps in 52 s (docs/results.md#sac).
    budget = 30_000
    result = train(pendulum_config(train_for_env_steps=budget), run_dir=tmp_path, quiet=True,
                   stop_when=lambda r: (r["episode_return_mean"] or -2000) > -250)
    records = read_metrics(tmp_path)
    assert records[-1]["episode_return_mean"] > -250 and records[-1]["env_steps"] < budget
    saved = load_checkpoint(list_checkpoints(tmp_path)[-1])
    learner = saved["learner"]
    assert learner["updates"] > 5_000 and learner["log_temperature"].exp().item() < 0.5  # learned down from 1
    # Resumed for a few more steps: the counters, the temperature and the optimizers carry on.
    steps = saved["counters"]["env_steps"]
    train(pendulum_config(train_for_env_steps=steps + 2_400), run_dir=tmp_path, resume=True, quiet=True)
    resumed = load_checkpoint(list_checkpoints(tmp_path)[-1])["learner"]
    assert resumed["updates"] > learner["updates"] and resumed["version"] > learner["version"]
    steps_after = {k: v["step"].item() for k, v in resumed["optimizer"]["state"].items()}
    assert min(steps_after.values()) > learner["updates"]  # Adam's step counts went on, not from 0
    # A resumed replay refills to min_fill acting with the policy (not at random): its episodes stay good.
    assert read_metrics(tmp_path)[-1]["episode_return_mean"] > -400
    assert_all_exited(tmp_path)
    assert result.reports


@pytest.mark.slow
@pytest.mark.parametrize("step_s, replay_ratio, budget, who_waits", [
    (0.015, 16.0, 1_200, "learner/wait_s"),  # envs much slower than the learner: the learner waits
    (0.0, 64.0, 3_000, "rollout/wait_slots_s"),  # envs much faster: the actors wait for free slots
])
def test_the_replay_ratio_holds_whichever_side_is_faster(tmp_path, step_s, replay_ratio, budget, who_waits):
    cfg = build_config(PROFILE, {
        "env.id": "tests.paced_envs:make_paced_target", "env.kwargs": {"step_s": step_s}, "device": "cpu",
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
