"""Networks and heads: observation normalization on images, the Gaussian head's smooth log-std
bound, the dueling Q network."""
import math

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.learner import Trajectories, make_learner
from fastrl.models.networks import (
    LOG_STD_RANGE,
    ActorCritic,
    DuelingQNetwork,
    GaussianHead,
    bounded_log_std,
    build_model,
)
from tests.support.small_learners import ACTION_SPACE, OBS_SPACE, dqn_config, perturb

BOX_ACTIONS = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
VECTOR_OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)


# ---------------------------------------------------------------- observation normalization

IMAGES = gymnasium.spaces.Box(0, 255, (2, 5, 5), np.uint8)


def image_batch(T, B, seed=0):
    """uint8 images ``[T+1, B, 2, 5, 5]``: every pixel has its own mean (20..230) and spread."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randint(20, 230, IMAGES.shape, generator=g).float()
    spread = torch.randint(8, 25, IMAGES.shape, generator=g).float()
    obs = (centre + spread * torch.randn(T + 1, B, *IMAGES.shape, generator=g)).round().clamp(0, 255)
    return Trajectories(
        obs=obs.to(torch.uint8), actions=torch.randint(0, 2, (T, B), generator=g),
        behaviour_logp=torch.full((T, B), math.log(0.5)), rewards=torch.randn(T, B, generator=g),
        terminated=torch.zeros(T, B, dtype=torch.bool), truncated=torch.zeros(T, B, dtype=torch.bool),
        valid=torch.ones(T, B, dtype=torch.bool), version=torch.zeros(T, B, dtype=torch.int64))


@pytest.mark.parametrize("algo", ["appo", "dqn"])
def test_normalized_images_reach_the_network_with_zero_mean_and_unit_std(algo):
    model = {"model.kind": "mlp", "model.normalize_obs": True}
    if algo == "dqn":
        cfg, (T, B) = dqn_config(**model), (8, 4)
    else:
        cfg, (T, B) = build_config("cartpole-appo", model), (8, 16)
    learner = make_learner(cfg, IMAGES, gymnasium.spaces.Discrete(2))
    batch = image_batch(T, B)
    learner.train(batch, env_ids=np.arange(B))  # the learner's statistics update, on uint8 images
    seen = learner.model.preprocess(batch.obs[:-1].reshape(T * B, *IMAGES.shape))  # the encoder's input
    torch.testing.assert_close(seen.mean(0), torch.zeros(IMAGES.shape), atol=1e-3, rtol=0)
    # Not exactly 1: the statistics start from a prior (var 1, count 1e-4) that weighs ~1e-4 / n.
    torch.testing.assert_close(seen.std(0, unbiased=False), torch.ones(IMAGES.shape), atol=1e-2, rtol=0)


# ---------------------------------------------------------------- Gaussian head


def test_log_std_bound_is_smooth_and_keeps_its_range():
    lo, hi = LOG_STD_RANGE
    raw = torch.linspace(-40.0, 40.0, 2001, dtype=torch.float64, requires_grad=True)
    bounded = bounded_log_std(raw)
    (slope,) = torch.autograd.grad(bounded.sum(), raw)
    bounded, raw = bounded.detach(), raw.detach()
    assert bool((bounded >= lo - 1e-12).all() and (bounded <= hi + 1e-12).all())  # up to rounding
    assert float(bounded[0]) == pytest.approx(lo, abs=1e-9) and float(bounded[-1]) == pytest.approx(hi, abs=1e-9)
    # Increasing and never flat (until float64 rounds e^-20 away, far beyond any useful std).
    near = (raw > lo - 20) & (raw < hi + 10)
    assert bool((slope[near] > 0).all() and (slope <= 1).all())
    inside = (raw > lo + 4) & (raw < hi - 4)
    torch.testing.assert_close(bounded[inside], raw[inside], atol=0.02, rtol=0)  # ~identity well inside


def test_log_std_parameter_beyond_the_bound_still_gets_a_gradient():
    torch.manual_seed(0)
    model = ActorCritic(VECTOR_OBS, BOX_ACTIONS, build_config("mujoco-appo").model)
    with torch.no_grad():
        model.log_std.copy_(torch.tensor([LOG_STD_RANGE[1] + 1.0, LOG_STD_RANGE[0] - 2.0]))
    obs = torch.randn(16, 3)
    actions = torch.randn(16, 2)
    params, _ = model(obs)
    GaussianHead().log_prob(params, actions).sum().backward()
    assert bool((model.log_std.grad != 0).all()), model.log_std.grad  # a hard clamp gives exactly 0


def test_the_default_initial_std_is_one():
    model = ActorCritic(VECTOR_OBS, BOX_ACTIONS, build_config("cartpole-appo").model)
    params, _ = model(torch.zeros(1, 3))
    _, log_std = GaussianHead()._split(params)
    torch.testing.assert_close(log_std, torch.zeros(1, 2), atol=1e-6, rtol=0)


@pytest.mark.parametrize("log_std", [-0.7, -3.0, 1.0])
def test_the_initial_std_is_the_configured_one(log_std):
    model = ActorCritic(VECTOR_OBS, BOX_ACTIONS, build_config("mujoco-appo", {"model.initial_log_std": log_std}).model)
    params, _ = model(torch.zeros(1, 3))
    _, got = GaussianHead()._split(params)
    torch.testing.assert_close(got, torch.full((1, 2), log_std), atol=1e-5, rtol=0)


def test_the_initial_log_std_range_is_the_heads_bound():
    from fastrl.config import RANGES, ConfigError
    assert (RANGES["model.initial_log_std"].low, RANGES["model.initial_log_std"].high) == LOG_STD_RANGE
    with pytest.raises(ConfigError, match=r"'model.initial_log_std' must be in \(-5.0, 2.0\), got 2.0"):
        build_config("mujoco-appo", {"model.initial_log_std": 2.0})


def test_gaussian_log_probs_and_entropy_match_torch_normal_at_the_bounded_std():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(64, 3, generator=g, dtype=torch.float64)
    raw = torch.empty(64, 3, dtype=torch.float64).uniform_(-9.0, 6.0, generator=g)  # inside and beyond the range
    params = torch.cat([mean, raw], -1)
    head = GaussianHead()
    reference = torch.distributions.Normal(mean, bounded_log_std(raw).exp())
    actions = mean + reference.stddev * torch.randn(64, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(head.log_prob(params, actions), reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(head.entropy(params), reference.entropy().sum(-1))
    sampled, logp = head.sample_with_log_prob(params)
    torch.testing.assert_close(logp, reference.log_prob(sampled).sum(-1))


def test_pixels_scaled_in_one_pass_equal_the_cast_then_the_scaling():
    from fastrl.models.encoders import scale_obs
    pixels = torch.arange(256, dtype=torch.uint8).reshape(4, 8, 8)
    expected = pixels.to(torch.float32) * (1.0 / 255.0)
    scaled = scale_obs(pixels, 1.0 / 255.0)
    assert scaled.dtype == torch.float32 and torch.equal(scaled, expected)
    assert scale_obs(pixels, 1.0 / 255.0, torch.float64).dtype == torch.float64


def test_a_conv_learner_trains_channels_last_to_the_same_numbers():
    """The learner keeps conv weights and scaled pixels NHWC (oneDNN's fast path); a contiguous
    copy of the same model, stepped on the same batch, must agree: outputs, statistics and new weights."""
    cfg = build_config("atari-appo", {"device": "cpu", "learner.rollout": 4, "learner.batch_size": 8,
                                      "learner.num_minibatches": 1, "env.num_workers": 1, "env.envs_per_worker": 2,
                                      "env.num_splits": 1})
    obs_space, act_space = gymnasium.spaces.Box(0, 255, (4, 84, 84), np.uint8), gymnasium.spaces.Discrete(6)
    torch.manual_seed(0)
    learner = make_learner(cfg, obs_space, act_space)
    convs = [m for m in learner.model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    torch.manual_seed(0)
    reference = make_learner(cfg, obs_space, act_space)
    reference.model = reference.model.to(memory_format=torch.contiguous_format)
    first_inputs = []
    convs[0].register_forward_pre_hook(lambda m, args: first_inputs.append(args[0]))
    reference.optimizer = torch.optim.Adam(reference.model.parameters(), lr=cfg.learner.lr, eps=cfg.learner.adam_eps)
    g = torch.Generator().manual_seed(1)
    T, B = 4, 2
    batch = Trajectories(
        obs=torch.randint(0, 255, (T + 1, B, 4, 84, 84), dtype=torch.uint8, generator=g),
        actions=torch.randint(6, (T, B), generator=g), behaviour_logp=torch.full((T, B), -1.79),
        rewards=torch.randn(T, B, generator=g), terminated=torch.zeros(T, B, dtype=torch.bool),
        truncated=torch.zeros(T, B, dtype=torch.bool), valid=torch.ones(T, B, dtype=torch.bool),
        version=torch.zeros(T, B, dtype=torch.int64))
    ours, theirs = learner.train(batch), reference.train(batch)
    # The scaled pixels reach the first convolution NHWC (no reorder there), with the same values.
    assert first_inputs and all(x.is_contiguous(memory_format=torch.channels_last) for x in first_inputs)
    torch.testing.assert_close(first_inputs[0], batch.obs.reshape(-1, 4, 84, 84)[:len(first_inputs[0])] / 255.0)
    for key in ("loss", "grad_norm", "value_loss", "policy_loss"):
        if key in ours:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(learner.model.state_dict().values(), reference.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("separate_critic", [False, True])
def test_under_bf16_autocast_the_encoder_runs_in_bf16_and_the_heads_in_float32(separate_critic):
    """The learner's bf16 (learner.precision) speeds the encoder; the logits V-trace weighs
    against the float32 actor and the values it bootstraps from keep float32 arithmetic."""
    cfg = build_config("atari-appo", {"model.separate_critic": separate_critic}).model
    torch.manual_seed(0)
    model = ActorCritic(gymnasium.spaces.Box(0, 255, (4, 84, 84), np.uint8), gymnasium.spaces.Discrete(6), cfg)
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        features = model.encode(obs)
        value_features = features if not separate_critic else model.encode(obs, model.value_encoder)
        params, value = model(obs)
    assert features.dtype == value_features.dtype == torch.bfloat16
    assert params.dtype == value.dtype == torch.float32
    torch.testing.assert_close(params, model.policy(features.float()), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(value, model.value(value_features.float()).squeeze(-1), rtol=1e-6, atol=1e-7)
    (params.sum() + value.sum()).backward()  # the gradient reaches the bf16 encoder through the casts
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and bool(p.grad.abs().sum() > 0)
               for p in model.parameters())
    params_outside, _ = model(obs)  # no autocast: float32 throughout
    assert model.encode(obs).dtype == params_outside.dtype == torch.float32


# ---------------------------------------------------------------- separate critic

def critic_model(observation_space, **overrides) -> ActorCritic:
    cfg = build_config("mujoco-appo", {"model.separate_critic": True, **overrides}).model
    return ActorCritic(observation_space, BOX_ACTIONS, cfg)


@pytest.mark.parametrize("obs_space", [VECTOR_OBS, "dict"])
def test_a_separate_critic_s_value_loss_leaves_the_policy_encoder_alone(obs_space):
    space = obs_space
    if obs_space == "dict":
        space = gymnasium.spaces.Dict({"position": VECTOR_OBS, "mode": gymnasium.spaces.Discrete(3)})
    torch.manual_seed(0)
    model = critic_model(space)
    space.seed(0)
    obs = torch.from_numpy(model.obs_layout.sample(8))
    params, value = model(obs)
    value.square().sum().backward()
    assert all(p.grad is None for p in model.encoder.parameters())
    assert model.policy.weight.grad is None
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.value_encoder.parameters())
    model.zero_grad(set_to_none=True)
    params.square().sum().backward()
    assert all(p.grad is None for p in model.value_encoder.parameters())
    assert any(bool(p.grad.abs().sum() > 0) for p in model.encoder.parameters())


def test_a_separate_critic_s_value_is_its_own_encoder_s_output():
    torch.manual_seed(0)
    model = critic_model(VECTOR_OBS)
    obs = torch.randn(5, 3)
    params, value = model(obs)
    features = model.value_encoder(model.preprocess(obs))
    torch.testing.assert_close(value, model.value(features).squeeze(-1))
    torch.testing.assert_close(params[:, :2], model.policy(model.encoder(model.preprocess(obs))))


def test_a_shared_model_has_no_critic_encoder():
    model = ActorCritic(VECTOR_OBS, BOX_ACTIONS, build_config("mujoco-appo", {"model.separate_critic": False}).model)
    assert model.value_encoder is None


def test_dueling_network_is_value_plus_centred_advantages():
    torch.manual_seed(0)
    net = build_model(OBS_SPACE, gymnasium.spaces.Discrete(3), build_config("cartpole-dqn").model, algo="dqn")
    assert isinstance(net, DuelingQNetwork)
    perturb(net, scale=0.5)  # the small-gain initial heads would make every check near zero
    obs = torch.randn(16, 4)
    q, q_max = net(obs)
    with torch.no_grad():
        features = net.encoder(net.preprocess(obs))
        adv, value = net.policy(features), net.value(features)
    assert q.shape == (16, 3) and q_max.shape == (16,)
    torch.testing.assert_close(q, value + adv - adv.mean(-1, keepdim=True))
    torch.testing.assert_close(q.mean(-1), value.squeeze(-1))
    torch.testing.assert_close(q_max, q.max(-1).values, rtol=0, atol=0)
    assert type(build_model(OBS_SPACE, ACTION_SPACE, build_config("cartpole-dqn").model)) is ActorCritic


def test_dueling_network_refuses_continuous_actions():
    box = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    with pytest.raises(ValueError, match="appo"):
        build_model(OBS_SPACE, box, build_config("cartpole-dqn").model, algo="dqn")
    with pytest.raises(ValueError, match="Discrete action space"):
        DuelingQNetwork(OBS_SPACE, box)
