"""Ape-X-style DQN learner (Horgan et al. 2018): dueling double-Q network, n-step targets and
prioritized replay inside the learner.

The actors are the rollout workers and the batcher that serve V-trace: the batcher acts
epsilon-greedily on the dueling network's Q-values with one epsilon per env
(:func:`fastrl.inference.apex_epsilons`). Full trajectory slots reach :meth:`DQNLearner.train`
as :class:`~fastrl.learner.Trajectories` batches. Every step enters the replay with a priority
from its n-step TD error under the current networks (Ape-X computes it in the actor; here the
learner holds the networks and the whole trajectory, so it is computed once, batched, on the
learner's device). Then the learner takes as many gradient steps as ``replay.replay_ratio``
allows, updates the sampled priorities after each step, and copies the online network into the
target network every ``learner.target_update_every`` steps (its observation statistics included:
they change only then).

The replay is not saved in checkpoints (a million Atari frames is gigabytes); a resumed run
refills it to ``replay.min_fill`` before its first gradient step.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .config import Config
from .learner import gradient_step
from .models import build_model
from .replay import ReplayConfig, ReplayRatio, TransitionReplay

PRIORITY_EPS = 1e-6  # keeps every valid transition sampleable (a zero priority never is)


def make_replay_config(cfg: Config) -> ReplayConfig:
    r = cfg.replay
    return ReplayConfig(capacity=r.capacity, min_fill=r.min_fill, alpha=r.alpha, beta=r.beta, n_step=r.n_step,
                        gamma=cfg.learner.gamma, sequence_length=cfg.learner.rollout,
                        sequence_stride=cfg.learner.rollout, compress=r.compress or None, threads=r.threads,
                        memmap_dir=r.memmap_dir or None)


def trajectory_windows(rewards: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, gamma: float,
                       n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step windows inside ``[T, B]`` trajectories, cut at the first terminated or truncated step
    and at the trajectory's end (the replay's rule, fastrl.replay.TransitionBatch).

    Returns ``(returns, discounts, ends)``: the target of step t is
    ``returns[t] + discounts[t] * Q(obs[ends[t]])``; ``discounts`` is ``gamma^m`` for a window of m
    steps, 0 when it ends in a termination; ``ends`` (int64, in ``[1, T]``) is the index of the
    observation after the window (a truncated step bootstraps from the final observation)."""
    T, B = rewards.shape
    time_index = torch.arange(T, device=rewards.device)
    returns = torch.zeros_like(rewards)
    scale = torch.ones_like(rewards)
    ends = (time_index + 1)[:, None].expand(T, B).clone()
    terminal = torch.zeros_like(terminated)
    active = torch.ones_like(terminated)
    for k in range(n):
        step = time_index + k
        inside = (step < T)[:, None]
        step = step.clamp(max=T - 1)
        live = active & inside
        returns = torch.where(live, returns + scale * rewards[step], returns)
        scale = torch.where(live, scale * gamma, scale)
        ends = torch.where(live, (step + 1)[:, None].expand(T, B), ends)
        done = terminated[step] | truncated[step]
        terminal |= live & terminated[step]
        active = live & ~done
    return returns, torch.where(terminal, torch.zeros_like(scale), scale), ends


def add_trajectories(replay, batch, rewards: torch.Tensor, env_ids, fresh=None, **per_step) -> None:
    """Append the trajectories ``batch`` ``[T, B]`` to ``replay``, column b as T records of stream
    ``env_ids[b]`` (columns in arrival order, so each stream's records stay in time order).

    ``fresh[b]`` marks an env's first trajectory since its worker (re)started: its episode did
    not continue the stream's last record, so the stream is restarted before that column
    (:meth:`fastrl.replay.TransitionReplay.restart_streams`). ``per_step``: further ``[T, B]``
    numpy arrays for ``add`` (``priorities`` or ``logp``)."""
    T, B = rewards.shape
    env_ids = np.asarray(env_ids, dtype=np.int64)
    fresh = np.zeros(B, bool) if fresh is None else np.asarray(fresh, bool)
    if fresh.shape != (B,):
        raise ValueError(f"fresh must have shape [{B}], got {list(fresh.shape)}")

    def add_columns(a: int, c: int) -> None:
        obs = batch.obs[:T, a:c].transpose(0, 1)
        actions = batch.actions[:, a:c].transpose(0, 1)
        replay.add(np.repeat(env_ids[a:c], T), obs.reshape(-1, *obs.shape[2:]).numpy(),
                   actions.reshape(-1, *actions.shape[2:]).numpy(), rewards[:, a:c].T.reshape(-1).numpy(),
                   batch.terminated[:, a:c].T.reshape(-1).numpy(), batch.truncated[:, a:c].T.reshape(-1).numpy(),
                   **{name: np.ascontiguousarray(values[:, a:c].T).reshape(-1) for name, values in per_step.items()})

    start = 0
    for b in np.flatnonzero(fresh).tolist():
        if replay.stream_length(env_ids[b]) == 0 and env_ids[b] not in env_ids[start:b]:
            continue  # a stream's very first records: nothing to cut
        add_columns(start, b)
        replay.restart_streams(env_ids[b:b + 1])
        start = b
    add_columns(start, B)


class DQNLearner:
    """Same interface as :class:`fastrl.learner.Learner` (model, optimizer, version, train,
    state_dict), so :class:`fastrl.learner.LearnerHost` and the runner drive either."""

    def __init__(self, cfg: Config, observation_space, action_space, model: nn.Module | None = None,
                 device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.lcfg = cfg.learner
        self.rcfg = cfg.replay
        self.device = torch.device(device)
        self.model = build_model(observation_space, action_space, cfg.model, model, algo="dqn").to(self.device)
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lcfg.lr, eps=self.lcfg.adam_eps)
        self.version = 0
        self.updates = 0
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self.timings = {"forward_backward_s": 0.0, "vtrace_s": 0.0, "optimizer_s": 0.0, "replay_s": 0.0}
        self.grad_sync = None  # as Learner.grad_sync
        self.replay = TransitionReplay(
            make_replay_config(cfg), num_streams=cfg.total_envs, obs_shape=tuple(observation_space.shape),
            obs_dtype=observation_space.dtype, frame_stack=self.rcfg.frame_stack, action_shape=(),
            action_dtype=np.int64, seed=cfg.seed)
        # Batches per added record: replay_ratio transitions sampled per env step, batch_size each.
        self.ratio = ReplayRatio(self.rcfg.replay_ratio / self.rcfg.batch_size, start=self.rcfg.min_fill)
        self.replayed_batches = 0  # since this replay was made (a resume starts a fresh one)
        self.last_stats: dict = {}

    def learning_rate(self, progress: float) -> float:
        if not self.lcfg.lr_decay:
            return self.lcfg.lr
        return self.lcfg.lr * max(0.0, 1.0 - progress)

    def transformed_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        rewards = rewards * self.lcfg.reward_scale
        if self.lcfg.reward_clip > 0:
            rewards = rewards.clamp(-self.lcfg.reward_clip, self.lcfg.reward_clip)
        return rewards

    def train(self, batch, progress: float = 0.0, env_ids: np.ndarray | None = None,
              fresh: np.ndarray | None = None) -> dict:
        """Add the trajectories ``batch`` to the replay (``env_ids`` ``[B]``: each column's env, its
        replay stream; ``fresh`` ``[B]``: see :func:`add_trajectories`), then take the gradient
        steps the replay ratio allows; returns statistics."""
        batch.validate()
        T, B = batch.rewards.shape
        if env_ids is None:
            raise ValueError("DQNLearner.train needs env_ids [B]: the env of each trajectory (its replay stream)")
        env_ids = np.asarray(env_ids, dtype=np.int64)
        if env_ids.shape != (B,):
            raise ValueError(f"DQNLearner.train: env_ids must have shape [{B}], got {list(env_ids.shape)}")
        lag = (self.version - batch.version)[batch.valid].float()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(progress)
        start = time.perf_counter()
        rewards = self.transformed_rewards(batch.rewards)
        priorities = self.arrival_priorities(batch, rewards)
        if not (np.isfinite(priorities).all() and bool(torch.isfinite(rewards).all())):
            # NaN/Inf observations or rewards would poison every batch that samples them: the
            # trajectories are dropped and counted as a skipped update, as Learner.train does. Their
            # envs' streams restart, as after a worker restart: the next records do not follow the
            # stored ones, and an n-step window across the gap would skip the dropped steps.
            ended = (batch.terminated[-1] | batch.truncated[-1]).cpu().numpy()
            self.replay.restart_streams(env_ids, ended=ended)
            self.skipped_updates += 1
            self.consecutive_skips += 1
            self.version += 1
            return {**self.last_stats, "learner_updates": self.updates, "skipped_updates": self.skipped_updates,
                    "version": self.version, "replay_size": len(self.replay)}
        normalizer = getattr(self.model, "normalizer", None)
        if normalizer is not None:
            # The target's statistics stay frozen with its weights until the next refresh: the
            # target network is one fixed function between refreshes.
            normalizer.update(batch.obs[:-1][batch.valid].to(self.device))
        add_trajectories(self.replay, batch, rewards, env_ids, fresh, priorities=priorities)
        self.timings["replay_s"] += time.perf_counter() - start

        stats = dict(self.last_stats)
        for _ in range(self.ratio.allowed_batches(self.replay.added, self.replayed_batches)):
            step_stats = self._update()
            if step_stats is None:
                break
            stats = self.last_stats = step_stats
        self.version += 1
        stats.update(
            policy_lag_min=float(lag.min()) if lag.numel() else 0.0,
            policy_lag_mean=float(lag.mean()) if lag.numel() else 0.0,
            policy_lag_max=float(lag.max()) if lag.numel() else 0.0,
            lr=self.optimizer.param_groups[0]["lr"], learner_updates=self.updates,
            skipped_updates=self.skipped_updates, version=self.version, replay_size=len(self.replay),
            replayed_batches=self.replayed_batches)
        return stats

    def q_values(self, network: nn.Module, obs: torch.Tensor) -> torch.Tensor:
        return network(obs.to(self.device, non_blocking=self.device.type == "cuda"))[0]

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
        """``|n-step TD error| + eps`` of every step of ``batch`` ``[T, B]`` (float64), windows cut at
        the trajectory's end (:func:`trajectory_windows`)."""
        T, B = rewards.shape
        flat = batch.obs.reshape((T + 1) * B, *batch.obs.shape[2:])
        online = self.q_values(self.model, flat).reshape(T + 1, B, -1)
        target = self.q_values(self.target, flat).reshape(T + 1, B, -1)
        best = (online if self.lcfg.double_q else target).argmax(-1, keepdim=True)
        bootstrap = target.gather(-1, best).squeeze(-1)  # [T + 1, B]
        returns, discounts, ends = trajectory_windows(rewards.to(self.device), batch.terminated.to(self.device),
                                                      batch.truncated.to(self.device), self.lcfg.gamma,
                                                      self.rcfg.n_step)
        targets = returns + discounts * bootstrap.gather(0, ends)
        taken = online[:T].gather(-1, batch.actions.to(self.device).long()[..., None]).squeeze(-1)
        return ((targets - taken).abs() + PRIORITY_EPS).double().cpu().numpy()

    def _update(self) -> dict | None:
        start = time.perf_counter()
        sample = self.replay.sample(self.rcfg.batch_size)
        if sample is None:
            return None
        self.replayed_batches += 1
        to_device = {"device": self.device, "non_blocking": self.device.type == "cuda"}
        actions = torch.from_numpy(sample.actions).to(**to_device)
        returns = torch.from_numpy(sample.returns).to(**to_device)
        discounts = torch.from_numpy(sample.discounts).to(**to_device)
        weights = torch.from_numpy(sample.weights).to(**to_device)
        obs, next_obs = torch.from_numpy(sample.obs), torch.from_numpy(sample.next_obs)
        sampled = time.perf_counter()
        self.timings["replay_s"] += sampled - start

        targets = returns + discounts * self.bootstrap_values(next_obs)
        q = self.q_values(self.model, obs)
        taken = q.gather(-1, actions[:, None]).squeeze(-1)
        td = targets - taken
        loss = (weights * F.smooth_l1_loss(taken, targets, reduction="none")).mean()

        updates_before = self.updates
        grad_norm, backward_done = gradient_step(self, loss, self.lcfg.max_grad_norm)
        if self.updates > updates_before and self.updates % self.lcfg.target_update_every == 0:
            self.target.load_state_dict(self.model.state_dict())
        optimized = time.perf_counter()
        priorities = td.detach().abs().double().cpu().numpy() + PRIORITY_EPS
        if np.isfinite(priorities).all():
            self.replay.update_priorities(sample.indices, sample.generations, priorities)
        end = time.perf_counter()
        self.timings["forward_backward_s"] += backward_done - sampled
        self.timings["optimizer_s"] += optimized - backward_done
        self.timings["replay_s"] += end - optimized
        return {"loss": float(loss.detach()), "value_loss": float(loss.detach()), "grad_norm": grad_norm,
                "q_mean": float(taken.detach().mean())}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "version": self.version, "updates": self.updates,
                "skipped_updates": self.skipped_updates}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.target.load_state_dict(state.get("target", state["model"]))
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        self.updates = state["updates"]
        self.skipped_updates = state.get("skipped_updates", 0)

    def close(self) -> None:
        self.replay.close()
