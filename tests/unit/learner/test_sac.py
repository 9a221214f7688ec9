"""SAC (fastrl.learner.sac): its losses, squashed log-probabilities and Polyak update against
brute-force references on tiny inputs; the squashed head's bounds; the twin critics against two
separate MLPs; the learner's updates, resume and refusals; a short learning run on Pendulum."""
import math

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import ConfigError, build_config
from fastrl.learner import make_learner
from fastrl.learner.losses import (
    polyak_update,
    sac_actor_loss,
    sac_critic_loss,
    sac_critic_targets,
    sac_temperature_loss,
)
from fastrl.models.encoders import EnsembleMLP
from fastrl.models.heads import SquashedGaussianHead, squashed_gaussian_log_prob
from tests.support.repo import REPO
from tests.support.small_learners import E, T

PROFILE = str(REPO / "profiles" / "mujoco-sac.toml")
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
            expected = 0.9 * old.view(-1)[k].item() + 0.1 * source.view(-1)[k].item()
            assert new.view(-1)[k].item() == pytest.approx(expected, abs=1e-6)
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
    assert ((uniform >= low) & (uniform <= high)).all()
    assert torch.equal(uniform_logp, torch.full((5000,), -2 * math.log(2)))
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
    # One learner thread: the profile's second pays on its 256-unit layers, not on these tiny ones,
    # and on a loaded machine a thread that waits for the other costs many times more.
    return build_config(PROFILE, {"learner.torch_threads": 1,
        "env.id": "Pendulum-v1", "env.num_workers": 1, "env.envs_per_worker": E, "env.num_splits": 1,
        "learner.rollout": T, "learner.batch_size": T * E, "replay.capacity": 64 * E, "replay.min_fill": 64,
        "replay.batch_size": 16, "replay.replay_ratio": 16.0, "model.hidden_sizes": [16, 16], **overrides})


@pytest.mark.parametrize("overrides, message", [
    ({"env.id": "CartPole-v1"}, "needs a continuous Box action space"),
    ({"model.core": "lstm"}, "sac trains a feed-forward actor"),
    ({"model.separate_critic": True}, "separate_critic is for learner.algo=appo"),
    ({"replay.replay_ratio": 0.0}, "replay_ratio' must be > 0 for sac"),
    ({"learner.precision": "bfloat16"}, "sac trains in float32"),
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


def test_images_are_refused_by_the_actor_in_one_line():
    from fastrl.models.networks import SquashedGaussianActor

    image = gymnasium.spaces.Box(0, 255, (84, 84, 3), np.uint8)
    with pytest.raises(ValueError, match="reads vector observations") as caught:
        SquashedGaussianActor(image, ACTION_SPACE, sac_config().model)
    assert "\n" not in str(caught.value) and "learner.algo=appo" in str(caught.value)


def test_a_torchrun_launch_is_refused_in_one_line(tmp_path, monkeypatch):
    from fastrl.run.plan import RunError
    from fastrl.run.preflight import check_request

    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RunError) as caught:
        check_request(sac_config(**{"replay.checkpoint": False}), tmp_path / "run", resume=False)
    assert str(caught.value) == ("learner.algo=sac trains one learner on one replay; a torchrun launch is not "
                                 "supported with it: run it without torchrun")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("low, high, message", [
    ([-1.0, -math.inf], [1.0, 1.0], "has infinite ones: wrap the env"),
    ([-1.0, 0.5, 0.0], [1.0, 0.5, 0.0], r"no room between low and high at 1, 2: wrap the env to drop"),
])
def test_a_box_the_squash_cannot_map_is_refused_before_the_run_dir_is_made(tmp_path, low, high, message):
    """An infinite bound has no affine map from [-1, 1]; a dimension with low >= high has none back
    (its half-width 0 made every stored action NaN, and the run trained on nothing)."""
    from fastrl.run.training import train

    cfg = sac_config(**{"env.id": "tests.support.space_envs:make_bounded_target",
                        "env.kwargs": {"low": low, "high": high}, "device": "cpu"})
    with pytest.raises(ValueError, match=message) as caught:
        train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert "\n" not in str(caught.value) and not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=message):
        SquashedGaussianHead(gymnasium.spaces.Box(np.array(low, np.float32), np.array(high, np.float32)))
