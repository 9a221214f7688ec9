"""fastrl's APPO update, with the keys docs/results.md#appo-and-textbook-ppo names, is PPO as
CleanRL's ppo_atari.py writes it: the same stored batch, the same starting weights, the same
weights after four epochs. The reference below is written from PPO's definition, apart from the
learner's code: GAE once from the values stored while acting, the clipped surrogate, the
(optionally clipped) value loss, the entropy bonus, one norm clip and Adam."""
import copy

import gymnasium
import numpy as np
import pytest
import torch
from torch.distributions import Categorical

from fastrl.config import build_config
from fastrl.learner import VTraceLearner
from tests.unit.learner.test_vtrace_learner import random_batch

T, B, EPOCHS = 8, 16, 4
PPO = {"learner.targets": "batch", "learner.vtrace_lambda": 0.95, "learner.ppo_clip": 0.1,
       "learner.normalize_advantages": True, "learner.num_epochs": EPOCHS, "learner.num_minibatches": 1,
       "learner.lr": 2.5e-3, "learner.lr_decay": False, "learner.adam_eps": 1e-5, "learner.entropy_coef": 0.01,
       "learner.value_coef": 0.5, "learner.max_grad_norm": 0.5, "learner.gamma": 0.99, "learner.reward_scale": 1.0,
       "learner.rollout": T, "learner.batch_size": T * B}


def textbook_ppo(model, obs, actions, rewards, discounts, *, epochs, lr, clip, value_clip, entropy_coef,
                 value_coef, max_grad_norm, lambda_, adam_eps):
    """PPO's update on one batch taken as one minibatch; returns the updated copy of ``model``."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, eps=adam_eps)
    with torch.no_grad():  # what the actors stored: log-probs and values of the acting policy
        logits, values = model(obs.reshape((T + 1) * B, -1))
        values = values.reshape(T + 1, B)
        old_logp = Categorical(logits=logits[:T * B]).log_prob(actions.reshape(-1))
    advantages = torch.zeros(T, B)
    running = torch.zeros(B)
    for t in reversed(range(T)):  # GAE; discounts = gamma * (1 - terminated)
        delta = rewards[t] + discounts[t] * values[t + 1] - values[t]
        running = delta + discounts[t] * lambda_ * running
        advantages[t] = running
    returns = (advantages + values[:T]).reshape(-1)
    advantages, old_values = advantages.reshape(-1), values[:T].reshape(-1)
    for _ in range(epochs):
        logits, new_values = model(obs[:T].reshape(T * B, -1))
        dist = Categorical(logits=logits)
        ratio = torch.exp(dist.log_prob(actions.reshape(-1)) - old_logp)
        # The spread as fastrl estimates it (biased variance, epsilon inside the root); CleanRL's
        # std() + 1e-8 differs from it by a factor sqrt(n / (n - 1)) on the advantages.
        normalized = (advantages - advantages.mean()) / torch.sqrt(advantages.var(unbiased=False) + 1e-8)
        policy_loss = torch.max(-normalized * ratio, -normalized * ratio.clamp(1 - clip, 1 + clip)).mean()
        squared = (new_values - returns).square()
        if value_clip > 0:
            moved = old_values + (new_values - old_values).clamp(-value_clip, value_clip)
            squared = torch.max(squared, (moved - returns).square())
        loss = policy_loss - entropy_coef * dist.entropy().mean() + value_coef * 0.5 * squared.mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    return model


def learner_and_textbook_update(**overrides):
    """A learner with the PPO keys and ``overrides``, an on-policy batch (acted by the learner's
    weights, lag 0), and the weights textbook PPO ends with on that batch."""
    torch.manual_seed(0)
    cfg = build_config("cartpole-appo", {**PPO, **overrides})
    learner = VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32), gymnasium.spaces.Discrete(2))
    batch = random_batch(T=T, B=B, seed=7)
    with torch.no_grad():
        logits, _ = learner.model(batch.obs[:T].reshape(T * B, -1))
        batch.behaviour_logp = Categorical(logits=logits).log_prob(batch.actions.reshape(-1)).reshape(T, B)
    rewards, discounts = learner.rewards_and_discounts(batch)
    lcfg = cfg.learner
    want = textbook_ppo(learner.model, batch.obs, batch.actions, rewards, discounts, epochs=EPOCHS, lr=lcfg.lr,
                        clip=lcfg.ppo_clip, value_clip=lcfg.value_clip, entropy_coef=lcfg.entropy_coef,
                        value_coef=lcfg.value_coef, max_grad_norm=lcfg.max_grad_norm, lambda_=lcfg.vtrace_lambda,
                        adam_eps=lcfg.adam_eps)
    return learner, batch, want


@pytest.mark.parametrize("value_clip", [0.0, 0.1])  # 0: the compiled APPO loss; 0.1: PPO's clipped value loss
def test_appo_with_batch_targets_in_lockstep_is_textbook_ppo(value_clip):
    learner, batch, want = learner_and_textbook_update(**{"learner.value_clip": value_clip})
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.train(batch)
    assert learner.updates == EPOCHS and stats["policy_lag_max"] == 0
    for name, got, expected, start in zip(dict(learner.model.named_parameters()), learner.model.parameters(),
                                          want.parameters(), before):
        assert not torch.equal(got, start), name  # every tensor moved ...
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=name)  # ... as PPO moves it


def test_with_targets_per_minibatch_the_update_departs_from_textbook_ppo():
    """The default (V-trace targets from the current network before every step) is not PPO past
    a batch's first step: the check above tells the two apart."""
    learner, batch, want = learner_and_textbook_update(**{"learner.targets": "minibatch"})
    learner.train(batch)
    gaps = [float((got - expected).detach().abs().max())
            for got, expected in zip(learner.model.parameters(), want.parameters())]
    assert max(gaps) > 1e-3  # 0.012 here, against 1e-7 with batch targets
