"""KL(uniform over the legal actions || policy): the heads' values against brute force, its
gradient where the entropy's has vanished, and the one-line refusal for continuous actions."""
import math

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import ConfigError, build_config
from fastrl.envs.spaces import ActionLayout
from fastrl.models.heads import (
    MASKED_LOGIT,
    BernoulliHead,
    CategoricalHead,
    FactorizedHead,
    GaussianHead,
    discrete_actions,
)


def brute_kl(probs) -> float:
    """sum over the k legal actions of (1/k) log((1/k) / p(a)), the legal ones those with p > 0."""
    legal = [p for p in probs if p > 0]
    return sum(math.log((1 / len(legal)) / p) / len(legal) for p in legal)


def test_categorical_kl_is_from_the_uniform_over_the_legal_actions_only():
    logits = torch.tensor([[2.0, -1.0, 0.5, MASKED_LOGIT], [0.0, 0.0, 0.0, 0.0], [30.0, 0.0, MASKED_LOGIT, 0.0]],
                          dtype=torch.float64)
    got = CategoricalHead().uniform_kl(logits)
    for row, value in zip(logits, got):
        legal = row > MASKED_LOGIT
        probs = torch.zeros_like(row)
        probs[legal] = torch.softmax(row[legal], -1)
        assert value.item() == pytest.approx(brute_kl(probs.tolist()), rel=1e-9, abs=1e-12)
    assert got[1].item() == 0.0  # the uniform policy
    assert torch.isfinite(got).all()


def test_bernoulli_and_factorized_kls_add_up_over_bits_and_parts():
    bits = torch.tensor([[1.5, -0.3], [0.0, 4.0]], dtype=torch.float64)
    got = BernoulliHead().uniform_kl(bits)
    for row, value in zip(bits, got):
        p = torch.sigmoid(row).tolist()
        assert value.item() == pytest.approx(sum(brute_kl([q, 1 - q]) for q in p), rel=1e-9)
    space = gymnasium.spaces.MultiDiscrete([3, 2])
    head = FactorizedHead(ActionLayout(space))
    params = torch.tensor([[0.2, 1.0, -2.0, 0.7, 0.1]], dtype=torch.float64)
    expected = brute_kl(torch.softmax(params[0, :3], -1).tolist()) + brute_kl(torch.softmax(params[0, 3:], -1).tolist())
    assert head.uniform_kl(params).item() == pytest.approx(expected, rel=1e-9)


def test_its_gradient_brings_back_an_action_whose_entropy_gradient_has_vanished():
    # A policy that has all but ruled out two of its three legal moves (p ~ 1e-13).
    logits = torch.tensor([30.0, 0.0, 0.0, MASKED_LOGIT], dtype=torch.float64, requires_grad=True)
    CategoricalHead().uniform_kl(logits[None]).sum().backward()
    probs = torch.softmax(logits[:3].detach(), -1)
    np.testing.assert_allclose(logits.grad[:3].numpy(), (probs - 1 / 3).numpy(), rtol=1e-9)
    assert logits.grad[3].item() == 0.0
    entropy_logits = logits.detach().clone().requires_grad_(True)
    CategoricalHead().entropy(entropy_logits[None]).sum().backward()
    # Gradient descent on the KL raises a ruled-out move's logit by 1/3 per unit step; ascent on
    # the entropy by ~1e-11.
    assert -logits.grad[1].item() == pytest.approx(1 / 3, rel=1e-9)
    assert 0 < entropy_logits.grad[1].item() < 1e-10


def test_only_discrete_action_spaces_have_it():
    assert discrete_actions(gymnasium.spaces.Discrete(4))
    assert discrete_actions(gymnasium.spaces.MultiBinary(3))
    assert discrete_actions(gymnasium.spaces.Tuple((gymnasium.spaces.Discrete(2), gymnasium.spaces.MultiDiscrete([2]))))
    box = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
    assert not discrete_actions(box)
    assert not discrete_actions(gymnasium.spaces.Tuple((gymnasium.spaces.Discrete(2), box)))
    with pytest.raises(TypeError, match="discrete actions only"):
        GaussianHead().uniform_kl(torch.zeros(1, 4))


def test_a_run_with_continuous_actions_refuses_it_in_one_line_and_leaves_nothing(tmp_path):
    from fastrl.run.training import train

    cfg = build_config("cartpole-appo", {"env.id": "Pendulum-v1", "learner.uniform_kl_coef": 0.1})
    with pytest.raises(ConfigError) as error:
        train(cfg, run_dir=tmp_path / "run", quiet=True)
    message = str(error.value)
    assert "learner.uniform_kl_coef=0.1" in message and "set learner.uniform_kl_coef=0" in message
    assert "\n" not in message
    assert not (tmp_path / "run").exists()
