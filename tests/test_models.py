"""Networks and heads: the Gaussian head's smooth log-std bound."""
import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.models import LOG_STD_RANGE, ActorCritic, GaussianHead, bounded_log_std

BOX_ACTIONS = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
VECTOR_OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)


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


def test_initial_std_is_one():
    model = ActorCritic(VECTOR_OBS, BOX_ACTIONS, build_config("mujoco-appo").model)
    params, _ = model(torch.zeros(1, 3))
    _, log_std = GaussianHead()._split(params)
    torch.testing.assert_close(log_std, torch.zeros(1, 2), atol=1e-6, rtol=0)


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
