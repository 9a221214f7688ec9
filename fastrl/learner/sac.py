"""Soft Actor-Critic (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications") on the
in-learner replay, Ape-X's shape: every actor feeds one replay, one learner samples it.

The actors are the rollout workers and the batcher that serve every algorithm: the batcher draws
actions from the newest published squashed Gaussian policy
(:class:`fastrl.models.heads.SquashedGaussianHead`, scaled to the env's bounds), and uniformly random ones
until ``replay.min_fill`` env steps were taken. Full slots reach :meth:`SACLearner.train`; their
steps enter a :class:`~fastrl.replay.buffer.TransitionReplay` (n-step windows, uniform sampling with
``replay.alpha = 0``, else prioritized by the critics' TD errors), and the learner takes as many
updates as ``replay.replay_ratio`` allows (:mod:`.qlearning`).

One update computes the three losses of a sampled batch on the same networks, as softlearning's
SAC does: the twin critics' soft TD loss against Polyak-averaged target critics, the policy's loss
through the critics (their weights take no gradient from it) and the temperature's loss; their
parameter sets are disjoint, so one backward pass and one fused Adam step (three parameter groups)
serve all three. Then the target critics move ``learner.tau`` of the way to the critics.

The actor is the published ``model``; the critics, their targets and the temperature stay in the
learner and its checkpoints. The replay joins them with ``replay.checkpoint``; without it a resumed
run refills it to ``replay.min_fill`` before its first update, acting with its policy meanwhile.
"""
from __future__ import annotations

import copy
import math

import gymnasium
import numpy as np
import torch
from torch import nn

from ..config import Config
from ..models.heads import SquashedGaussianHead
from ..models.networks import TwinQCritic, build_model
from ..replay.buffer import TransitionReplay
from .base import make_adam
from .batch import Trajectories
from .losses import polyak_update, sac_actor_loss, sac_critic_loss, sac_critic_targets, sac_temperature_loss
from .qlearning import ReplayLearner
from .replay_feed import add_trajectories


class SACLearner(ReplayLearner):
    """SAC: the actor ``model`` (published), the twin ``critic`` and its ``target_critic``, the
    temperature ``exp(log_temperature)``, and the replay; driven like every learner of the family."""

    def __init__(self, cfg: Config, observation_space, action_space: gymnasium.spaces.Box,
                 model: nn.Module | None = None, device: torch.device | str = "cpu", device_path: bool | None = None):
        model = build_model(observation_space, action_space, cfg.model, model, algo="sac")
        layout = model.obs_layout
        dims = int(np.prod(action_space.shape))
        replay = TransitionReplay(
            cfg.replay, gamma=cfg.learner.gamma, num_streams=cfg.total_envs, obs_shape=layout.storage_shape,
            obs_dtype=layout.storage_dtype, action_shape=(dims,), action_dtype=np.float32, seed=cfg.seed)
        # Batches per added record: replay_ratio transitions sampled per env step, batch_size each.
        super().__init__(cfg, model, device, replay, cfg.replay.replay_ratio / cfg.replay.batch_size, device_path)
        lcfg = self.lcfg
        self.head = SquashedGaussianHead(action_space)
        self.critic = TwinQCritic(int(np.prod(layout.storage_shape)), dims, cfg.model).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        # The pairs Polyak averages after every update, listed once (load_state_dict copies in place).
        self.polyak_pairs = (list(self.target_critic.parameters()), list(self.critic.parameters()))
        self.log_temperature = torch.tensor(math.log(lcfg.temperature), device=self.device,
                                            requires_grad=lcfg.learn_temperature)
        self.target_entropy = -lcfg.target_entropy_scale * dims
        groups = [{"params": list(self.model.parameters())}, {"params": list(self.critic.parameters())}]
        if lcfg.learn_temperature:
            groups.append({"params": [self.log_temperature]})
        self.optimizer = make_adam(groups, lcfg.lr, lcfg.adam_eps)
        self.prioritized = cfg.replay.alpha > 0  # uniform sampling needs no priorities
        self.last_stats = {"temperature": lcfg.temperature}

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.detach().exp())

    def train(self, batch: Trajectories, progress: float = 0.0, env_ids: np.ndarray | None = None,
              fresh: np.ndarray | None = None) -> dict:
        """Add the trajectories ``batch`` (actions ``[T, B, d]`` in the env's bounds) to the replay
        (``env_ids``, ``fresh``: see :func:`~fastrl.learner.replay_feed.add_trajectories`), then take
        the updates the replay ratio allows; returns statistics."""
        batch.validate()
        env_ids = self.stream_ids(batch, env_ids)
        lag_stats = self.lag_stats(batch)
        self.set_learning_rate(progress)
        if not batch.is_finite():
            return self.drop(batch, env_ids)
        with self.timers.time("replay_s"):
            self.update_normalizer(batch)
            add_trajectories(self.replay, batch, self.transformed_rewards(batch.rewards), env_ids, fresh)
        return self.replay_steps(lag_stats)

    def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations as the actor's encoder and the critics read them (scaled, normalized)."""
        return self.model.preprocess(obs)

    def policy(self, x: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The actor's params ``[N, 2d]`` from preprocessed ``x`` (``obs`` as stored)."""
        return self.model.heads(self.model.encoder(x), obs)[0]

    def loss(self, sample) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """The sum of the critic, actor and temperature losses of sampled n-step transitions
        (disjoint parameters: one backward pass trains each on its own loss), their statistics and
        the transitions' new priorities ``|td|``."""
        frames = self.upload(sample.frames)
        obs, next_obs = sample.obs_of(frames), sample.next_obs_of(frames)
        actions, returns, discounts, weights = (self.upload(values) for values in (
            sample.actions, sample.returns, sample.discounts, sample.weights))
        x, next_x = self.preprocess(obs), self.preprocess(next_obs)
        temperature = self.log_temperature.detach().exp()
        with torch.no_grad():
            next_actions, next_logp = self.head.rsample(self.policy(next_x, next_obs))
            next_q = self.target_critic(next_x, next_actions)
            targets = sac_critic_targets(returns, discounts, next_q[0], next_q[1], next_logp, temperature)
        q = self.critic(x, self.head.from_env(actions))
        critic_loss, stats = sac_critic_loss(q[0], q[1], targets, weights if self.prioritized else None)
        policy_actions, logp = self.head.rsample(self.policy(x, obs))
        self.critic.requires_grad_(False)  # the actor's loss moves the actor only
        policy_q = self.critic(x, policy_actions)
        self.critic.requires_grad_(True)
        actor_loss, actor_stats = sac_actor_loss(policy_q[0], policy_q[1], logp, temperature)
        loss = critic_loss + actor_loss
        stats.update(actor_stats, temperature=temperature)
        if self.lcfg.learn_temperature:
            temperature_loss, temperature_stats = sac_temperature_loss(self.log_temperature, logp, self.target_entropy)
            loss = loss + temperature_loss
            stats["temperature_loss"] = temperature_stats["temperature_loss"]
        stats["loss"] = loss.detach()
        return loss, stats, stats.pop("td").abs()

    def clip_gradients(self) -> torch.Tensor:
        """The actor's and the critics' gradients each clipped to ``max_grad_norm``; the norm of
        both norms (NaN if either is)."""
        limit = self.lcfg.max_grad_norm
        norms = torch.stack([nn.utils.clip_grad_norm_(self.model.parameters(), limit),
                             nn.utils.clip_grad_norm_(self.critic.parameters(), limit)])
        return norms.norm()

    def refresh_targets(self) -> None:
        """The target critics move ``learner.tau`` of the way to the critics after every update."""
        polyak_update(*self.polyak_pairs, self.lcfg.tau)

    def counters(self) -> dict:
        return {**super().counters(), "temperature": self.temperature}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "critic": self.critic.state_dict(),
                "target_critic": self.target_critic.state_dict(),
                "log_temperature": self.log_temperature.detach().cpu()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.critic.load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        with torch.no_grad():
            self.log_temperature.copy_(state["log_temperature"])
