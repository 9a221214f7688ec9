"""Ape-X-style DQN learner (Horgan et al. 2018): dueling double-Q network, n-step targets and
prioritized replay inside the learner.

The actors are the rollout workers and the batcher that serve V-trace: the batcher acts
epsilon-greedily on the dueling network's Q-values with one epsilon per env
(:func:`fastrl.sampling.batcher.apex_epsilons`). Full trajectory slots reach :meth:`DQNLearner.train`
as :class:`~fastrl.learner.Trajectories` batches. Every step enters the replay with a priority
from its n-step TD error under the current networks (Ape-X computes it in the actor; here the
learner holds the networks and the whole trajectory, so it is computed once, batched, on the
learner's device), or with ``replay.arrival_priority = "max"`` the largest priority seen (PER).
Then the learner takes as many gradient steps as ``replay.replay_ratio`` allows, updates the
sampled priorities after each step, and copies the online network into the target network every
``learner.target_update_every`` steps (its observation statistics included: they change only then).

Checkpoints leave the replay out unless ``replay.checkpoint`` (a million Atari frames is
gigabytes: :mod:`fastrl.replay.snapshot`); without it a resumed run refills the replay to
``replay.min_fill`` before its first gradient step.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..config import Config
from ..kernels import nstep_targets
from ..models.networks import build_model
from ..replay.buffer import TransitionReplay
from .batch import Trajectories
from .losses import td_loss
from .qlearning import PRIORITY_EPS, ReplayQLearner
from .replay_feed import add_trajectories


class DQNLearner(ReplayQLearner):
    """Ape-X DQN: the online network ``model``, its ``target`` copy and a prioritized
    :class:`~fastrl.replay.buffer.TransitionReplay`; driven like every learner of the family."""

    def __init__(self, cfg: Config, observation_space, action_space, model: nn.Module | None = None,
                 device: torch.device | str = "cpu", device_path: bool | None = None):
        model = build_model(observation_space, action_space, cfg.model, model, algo="dqn")
        layout = model.obs_layout
        replay = TransitionReplay(
            cfg.replay, gamma=cfg.learner.gamma, num_streams=cfg.total_envs, obs_shape=layout.storage_shape,
            obs_dtype=layout.storage_dtype, action_shape=(), action_dtype=np.int64, seed=cfg.seed)
        # Batches per added record: replay_ratio transitions sampled per env step, batch_size each.
        super().__init__(cfg, model, device, replay, cfg.replay.replay_ratio / cfg.replay.batch_size, device_path)
        # Every sample's frames land in one host buffer, pinned on CUDA so that their copy to the
        # device is asynchronous; the event recorded after that copy is waited on before the
        # next sample overwrites them. (The next sample is not drawn ahead: it must see the
        # priorities this step sets.)
        frames = np.empty(replay.frames_shape(cfg.replay.batch_size), replay.obs_dtype)
        self.frames_out = torch.empty(frames.shape, dtype=torch.from_numpy(frames).dtype,
                                      pin_memory=self.device.type == "cuda").numpy()
        self.frames_copied: torch.cuda.Event | None = None

    def train(self, batch: Trajectories, progress: float = 0.0, env_ids: np.ndarray | None = None,
              fresh: np.ndarray | None = None) -> dict:
        """Add the trajectories ``batch`` to the replay (``env_ids`` ``[B]``: each column's env, its
        replay stream; ``fresh`` ``[B]``: see :func:`~fastrl.learner.replay_feed.add_trajectories`),
        then take the gradient steps the replay ratio allows; returns statistics."""
        batch.validate()
        env_ids = self.stream_ids(batch, env_ids)
        lag_stats = self.lag_stats(batch)
        self.set_learning_rate(progress)
        with self.timers.time("replay_s"):
            rewards = self.transformed_rewards(batch.rewards)
            # No priorities: the replay gives the steps its largest priority seen.
            arrival = ({"priorities": self.arrival_priorities(batch, rewards)}
                       if self.rcfg.arrival_priority == "td" else {})
            finite = bool(torch.isfinite(rewards).all()) and all(np.isfinite(p).all() for p in arrival.values())
            if finite:
                # The target's statistics stay frozen with its weights until the next refresh: the
                # target network is one fixed function between refreshes.
                self.update_normalizer(batch)
                add_trajectories(self.replay, batch, rewards, env_ids, fresh, **arrival)
        return self.replay_steps(lag_stats) if finite else self.drop(batch, env_ids)

    def sample(self):
        if self.frames_copied is not None:
            self.frames_copied.synchronize()
        return self.replay.sample(self.rcfg.batch_size, out=self.frames_out)

    @staticmethod
    def q_values(network: nn.Module, obs: torch.Tensor) -> torch.Tensor:
        return network(obs)[0]

    @torch.no_grad()
    def bootstrap_values(self, next_obs: torch.Tensor) -> torch.Tensor:
        """``Q_target(s', argmax_a Q_online(s', a))`` (double Q), or ``max_a Q_target(s', a)``."""
        target_q = self.q_values(self.target, next_obs)
        if not self.lcfg.double_q:
            return target_q.max(-1).values
        best = self.q_values(self.model, next_obs).argmax(-1, keepdim=True)
        return target_q.gather(-1, best).squeeze(-1)

    @torch.no_grad()
    def arrival_priorities(self, batch, rewards: torch.Tensor) -> np.ndarray:
        """``|n-step TD error| + eps`` of every step of ``batch`` ``[T, B]`` (float64), by the
        replay's window rule (:func:`fastrl.kernels.nstep_targets`): cut after a terminated or
        truncated step and at the trajectory's end, where the target bootstraps from ``obs[T]``."""
        T, B = rewards.shape
        flat = self.upload(batch.obs.reshape((T + 1) * B, *batch.obs.shape[2:]))  # once, for both networks
        with self.autocast():
            online = self.q_values(self.model, flat).reshape(T + 1, B, -1)
            target = self.q_values(self.target, flat).reshape(T + 1, B, -1)
        best = (online if self.lcfg.double_q else target).argmax(-1, keepdim=True)
        bootstrap = target.gather(-1, best).squeeze(-1)  # [T + 1, B]
        terminated, truncated = batch.terminated.cpu().numpy(), batch.truncated.cpu().numpy()
        # The step after a done is the autoreset step: no window runs into it, and its own is empty
        # (that priority is never used: the replay never samples a step whose action was discarded).
        valid = np.ones_like(terminated)
        valid[1:] = ~(terminated[:-1] | truncated[:-1])
        step_rewards = rewards.cpu().numpy()
        windows = nstep_targets(step_rewards, (self.lcfg.gamma * ~terminated).astype(step_rewards.dtype),
                                self.rcfg.n_step, valid=valid)
        returns, discounts, ends = (self.upload(array) for array in windows)
        targets = returns + discounts * bootstrap.gather(0, ends)
        taken = online[:T].gather(-1, self.upload(batch.actions).long()[..., None]).squeeze(-1)
        return ((targets - taken).abs() + PRIORITY_EPS).double().cpu().numpy()

    def loss(self, sample) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """The importance-weighted TD loss of sampled n-step transitions, its statistics and their
        new priorities ``|td|``."""
        frames = self.upload(sample.frames)  # [B, S + n, *frame]: obs and next_obs are cut from one copy
        if self.device.type == "cuda":
            self.frames_copied = torch.cuda.Event()
            self.frames_copied.record()
        actions, returns, discounts, weights = (self.upload(values) for values in (
            sample.actions, sample.returns, sample.discounts, sample.weights))
        # learner.precision=bfloat16 runs the encoders in bf16; the Q heads, targets and loss stay
        # float32 (models.float32_heads).
        with self.autocast():
            targets = returns + discounts * self.bootstrap_values(sample.next_obs_of(frames))
            taken = self.q_values(self.model, sample.obs_of(frames)).gather(-1, actions[:, None]).squeeze(-1)
        loss, stats = td_loss(taken, targets, weights)
        return loss, {**stats, "value_loss": stats["loss"]}, stats["td"].abs()
