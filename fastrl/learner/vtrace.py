"""The V-trace learner: APPO (default) and IMPALA on batches of full trajectories.

Usable on its own: build a :class:`VTraceLearner` (exported from ``fastrl.learner``), assemble a
:class:`~fastrl.learner.batch.Trajectories` batch yourself and call :meth:`VTraceLearner.train`. The
losses themselves are the pure functions of :mod:`fastrl.learner.losses`.

Autoreset and truncation. Gymnasium 1.x and envpool autoreset on the step *after* a done: that
step's action is ignored and its "transition" goes from the final observation to the reset
observation. Such steps carry ``valid = False``; the loss gives them ``log_rho = -inf`` so that
rho = c = 0 there, which makes ``vs_t = V(x_t)`` and cuts the trace. The final observation stays in
the trajectory, so a truncated step bootstraps from the current value of the real final
observation: ``r_t + gamma * V(x_final)``, with discount ``gamma * (1 - terminated_t)``.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..config import Config
from ..envs.spaces import ActionLayout, ObsLayout
from ..models.networks import action_head, build_model
from ..replay.buffer import SequenceReplay
from ..sampling.numpy_mlp import NumpyMLPActorCritic
from .base import BaseLearner, read_stats, unroll
from .batch import Trajectories
from .losses import appo_loss, impala_loss
from .losses import vtrace_targets as vtrace_targets_of
from .replay_feed import add_trajectories
from .return_scale import ReturnScale


class VTraceLearner(BaseLearner):
    """APPO or IMPALA (``learner.algo``): every batch trains ``num_epochs`` x ``num_minibatches``
    steps, minibatches split along trajectories (never along time)."""

    def __init__(self, cfg: Config, observation_space, action_space, model: nn.Module | None = None,
                 device: torch.device | str = "cpu", device_path: bool | None = None):
        super().__init__(cfg, build_model(observation_space, action_space, cfg.model, model, cfg.learner.algo), device,
                         device_path, observation_space)
        self.head = action_head(action_space)
        # The head's and APPO loss's compiled kernels (fastrl.kernels.torch_ops) are the CPU's
        # choice, like V-trace's numba kernel; False: torch ops (bench_learner's torch-ops variant).
        self.compiled_kernels = not self.device_path
        obs_dtype = ObsLayout(observation_space).storage_dtype
        self.numpy_mlp = (NumpyMLPActorCritic(self.model) if (
            self.lcfg.numpy_mlp and self.device.type == "cpu" and not self.device_path
            and self.precision == "float32" and NumpyMLPActorCritic.supports(self.model, obs_dtype)) else None)
        self.loss = appo_loss if self.lcfg.algo == "appo" else impala_loss
        # IMPALA-paper replay: replay.vtrace_fraction of every batch are replayed trajectories.
        self.replay = None
        if cfg.replay.vtrace_fraction > 0:
            obs, act = ObsLayout(observation_space), ActionLayout(action_space)
            self.replay = SequenceReplay(
                cfg.replay, sequence_length=cfg.learner.rollout, sequence_stride=cfg.learner.rollout,
                num_streams=cfg.total_envs, obs_shape=obs.storage_shape, obs_dtype=obs.storage_dtype,
                action_shape=act.shape, action_dtype=act.dtype, seed=cfg.seed,
                state_size=getattr(self.model, "state_size", 0))
        self.return_scale = ReturnScale(self.lcfg.gamma) if self.lcfg.normalize_returns else None

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.return_scale is not None:
            state["return_scale"] = self.return_scale.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.return_scale is not None and "return_scale" in state:
            self.return_scale.load_state_dict(state["return_scale"])

    def loss_settings(self) -> dict:
        lcfg = self.lcfg
        settings = dict(clip_rho=lcfg.clip_rho, clip_c=lcfg.clip_c, clip_pg_rho=lcfg.clip_pg_rho,
                        lambda_=lcfg.vtrace_lambda, value_coef=lcfg.value_coef, entropy_coef=lcfg.entropy_coef)
        if lcfg.algo == "appo":
            settings.update(ppo_clip=lcfg.ppo_clip, normalize_advantages=lcfg.normalize_advantages,
                            value_clip=lcfg.value_clip, compiled=self.compiled_kernels)
        return settings

    def train(self, batch: Trajectories, progress: float = 0.0, env_ids: np.ndarray | None = None,
              fresh: np.ndarray | None = None) -> dict:
        """One learner step on ``batch`` (all epochs and minibatches); returns statistics.

        ``env_ids`` ``[B]`` (each trajectory's env) is needed with ``replay.vtrace_fraction``:
        the batch is then stored for replay and completed with replayed trajectories; ``fresh``
        ``[B]`` marks an env's first trajectory after its worker restarted (see
        :func:`fastrl.learner.replay_feed.add_trajectories`). With ``normalize_returns`` they
        carry each env's discounted return across batches (without ``env_ids`` every trajectory's
        return starts at 0: :meth:`~fastrl.learner.return_scale.ReturnScale.update`).

        On the device path (:class:`~fastrl.learner.base.BaseLearner`), without replay and
        without return or observation normalization, the device is read once per gradient step
        (its gradient norm) and once for the statistics."""
        batch.validate()
        fresh_columns = batch.rewards.shape[1]
        if self.return_scale is not None:
            self.return_scale.gamma = self.lcfg.gamma  # a population's member may have explored another
            if batch.is_finite():
                self.return_scale.update(self.transformed_rewards(batch.rewards).numpy(),
                                         (batch.terminated | batch.truncated).numpy(), batch.valid.numpy(), env_ids,
                                         fresh)
            else:  # left out, as its update will be: the streams restart after the missing steps
                self.return_scale.skip(env_ids)
        if self.replay is not None:
            if batch.is_finite():
                batch = self.with_replayed(batch, env_ids, fresh)
            else:
                # Stored, NaN/Inf data would come back in later batches and skip them too; the
                # envs' streams restart, so no replayed sequence spans the missing steps. This
                # batch's own update is skipped by the non-finite loss.
                self.replay.restart_streams(np.asarray(env_ids, dtype=np.int64),
                                            ended=(batch.terminated[-1] | batch.truncated[-1]).numpy())
        batch = batch.to(self.device)
        # Replayed trajectories carry the current version: the lag statistics are of this batch's own.
        lag_stats = self.policy_lag(batch.version[:, :fresh_columns], batch.valid[:, :fresh_columns])
        lag = (self.version - batch.version).float()
        loss_mask = batch.valid & (lag <= self.lcfg.max_policy_lag)
        loss_mask[:self.lcfg.burn_in] = False  # burn-in steps only warm the recurrent state
        normalizer = getattr(self.model, "normalizer", None)
        if normalizer is not None:
            normalizer.update(batch.obs[:-1][batch.valid])
        self.set_learning_rate(progress)
        rewards, discounts = self.rewards_and_discounts(batch)
        start = self.batch_start(batch, rewards, discounts)

        B = batch.rewards.shape[1]
        minibatches = self.lcfg.num_minibatches
        stats_sum: dict[str, torch.Tensor] = {}
        grad_norm_sum = 0.0
        steps = 0
        for _ in range(self.lcfg.num_epochs):
            order = torch.randperm(B, device=self.device) if minibatches > 1 else None
            for chunk in range(minibatches):
                if order is None:
                    index = slice(None)
                    part = batch
                else:
                    size = B // minibatches
                    index = order[chunk * size:(chunk + 1) * size]
                    part = batch.columns(index)
                columns = None if start is None else [x if x is None else x[:, index] for x in start]
                step_stats, grad_norm = self.update(part, rewards[:, index], discounts[:, index], loss_mask[:, index],
                                                    columns)
                for key, value in step_stats.items():
                    stats_sum[key] = stats_sum.get(key, 0.0) + value
                grad_norm_sum += grad_norm
                steps += 1
        self.version += 1
        stats = read_stats({**{key: value / steps for key, value in stats_sum.items()}, **lag_stats})
        return {**stats, "grad_norm": grad_norm_sum / steps, **self.counters()}

    def with_replayed(self, batch: Trajectories, env_ids, fresh=None) -> Trajectories:
        """Store ``batch`` in the sequence replay and append replayed trajectories, so that they
        make up ``replay.vtrace_fraction`` of the result. Replayed columns carry the current
        version: V-trace corrects for their behaviour policy (stored log-probs), and the lag mask
        is for fresh data."""
        T, B = batch.rewards.shape
        if env_ids is None or np.shape(env_ids) != (B,):
            raise ValueError(f"replay.vtrace_fraction needs env_ids [{B}], the env of each trajectory")
        states = {}
        if batch.initial_state is not None:  # the replay keeps each sequence's (= slot's) first state
            per_step = np.zeros((T, B, batch.initial_state.shape[1]), np.float32)
            per_step[0] = batch.initial_state.numpy()
            states = {"states": per_step}
        add_trajectories(self.replay, batch, batch.rewards, env_ids, fresh, behaviour_logp=batch.behaviour_logp.numpy(),
                         **states)
        fraction = self.cfg.replay.vtrace_fraction
        wanted = int(round(B * fraction / (1.0 - fraction)))
        wanted -= (B + wanted) % self.lcfg.num_minibatches  # keep the minibatches equal
        replayed = self.replay.sample(wanted) if wanted > 0 else None
        if replayed is None:
            return batch
        return batch.concat(Trajectories(
            obs=torch.from_numpy(replayed.obs), actions=torch.from_numpy(replayed.actions),
            behaviour_logp=torch.from_numpy(replayed.behaviour_logp), rewards=torch.from_numpy(replayed.rewards),
            terminated=torch.from_numpy(replayed.terminated), truncated=torch.from_numpy(replayed.truncated),
            valid=torch.from_numpy(replayed.valid), version=torch.full((T, wanted), self.version, dtype=torch.int64),
            initial_state=None if replayed.initial_state is None else torch.from_numpy(replayed.initial_state)))

    def rewards_and_discounts(self, batch: Trajectories) -> tuple[torch.Tensor, torch.Tensor]:
        """Transformed rewards (with ``normalize_returns``, divided by the discounted return's std)
        and ``gamma * (1 - terminated)``; ``[T, B]``."""
        rewards = self.transformed_rewards(batch.rewards)
        if self.return_scale is not None:
            rewards = rewards * self.return_scale.scale
        return rewards, self.lcfg.gamma * (~batch.terminated).float()

    def evaluate(self, batch: Trajectories) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Current policy on the batch: params ``[T, B, P]``, values ``[T+1, B]``, log-probs of the
        taken actions and entropies, ``[T, B]`` each. A recurrent model unrolls from
        ``batch.initial_state`` (reset where an episode starts); its first ``learner.burn_in``
        steps run without gradient."""
        T, B = batch.rewards.shape
        if getattr(self.model, "is_recurrent", False):
            params, values = self.unroll(batch)
        else:
            network = self.model if self.numpy_mlp is None else self.numpy_mlp
            params, values = network(batch.obs.reshape(-1, *batch.obs.shape[2:]))
        # learner.precision=bfloat16 runs the encoder in bf16; the heads (models.float32_heads), log-probs,
        # V-trace and the losses stay float32.
        params, values = params.float(), values.float()
        params = params.reshape(T + 1, B, -1)[:T]
        target_logp, entropy = self.head.log_prob_and_entropy(
            params.reshape(T * B, -1), batch.actions.reshape(T * B, *batch.actions.shape[2:]),
            compiled=self.compiled_kernels)
        return params, values.reshape(T + 1, B), target_logp.reshape(T, B), entropy.reshape(T, B)

    def unroll(self, batch: Trajectories) -> tuple[torch.Tensor, torch.Tensor]:
        """The recurrent model over all ``T + 1`` observations: (params ``[T+1, B, P]``, values ``[T+1, B]``)."""
        if batch.initial_state is None:
            raise ValueError("a recurrent model trains on Trajectories with initial_state [B, state_size]")
        return unroll(self.model, batch.obs, batch.initial_state, batch.episode_starts(), self.lcfg.burn_in)

    def vtrace_targets(self, batch: Trajectories, target_logp: torch.Tensor, values: torch.Tensor,
                       rewards: torch.Tensor, discounts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V-trace value targets ``vs`` and policy-gradient advantages of ``batch``, both ``[T, B]``."""
        settings = self.loss_settings()
        return vtrace_targets_of(target_logp, batch.behaviour_logp, values, rewards, discounts, batch.valid,
                                 **{k: settings[k] for k in ("clip_rho", "clip_c", "clip_pg_rho", "lambda_")},
                                 torch_scan=self.device_path)

    def batch_start(self, batch: Trajectories, rewards: torch.Tensor, discounts: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(vs, advantages, values)`` of ``batch`` by the network before the batch's first
        gradient step (``[T, B]``, ``[T, B]``, ``[T + 1, B]``): the targets where ``learner.targets
        = "batch"`` reads them (else None), the values where ``learner.value_clip`` does; None
        where neither does."""
        fixed_targets = self.lcfg.targets == "batch"
        if not fixed_targets and not (self.lcfg.algo == "appo" and self.lcfg.value_clip > 0):
            return None
        with torch.no_grad(), self.autocast(), self.timers.time("vtrace_s"):
            _, values, target_logp, _ = self.evaluate(batch)
            if not fixed_targets:  # value clipping alone: the steps re-derive their targets
                return None, None, values
            vs, advantages = self.vtrace_targets(batch, target_logp, values, rewards, discounts)
        return vs, advantages, values

    def update(self, batch: Trajectories, rewards: torch.Tensor, discounts: torch.Tensor, mask: torch.Tensor,
               start: list[torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], float]:
        """One gradient step on a minibatch; ``mask`` ``[T, B]`` selects the steps trained on;
        ``start``: the minibatch's columns of :meth:`batch_start`. Returns the loss statistics (0-d
        tensors, left on the device) and the gradient norm."""
        timers = self.timers
        settings = self.loss_settings()
        with self.autocast():
            with timers.time("forward_backward_s"):
                params, values, target_logp, entropy = self.evaluate(batch)
            # Computed here rather than inside the loss only so that the profiler can time it apart.
            with timers.time("vtrace_s"):
                if start is not None and self.lcfg.targets == "batch":
                    targets = start[0], start[1]
                else:
                    targets = self.vtrace_targets(batch, target_logp.detach(), values.detach(), rewards, discounts)
            if settings.get("value_clip"):
                settings["old_values"] = start[2]
            with timers.time("forward_backward_s"):
                if self.lcfg.uniform_kl_coef > 0:
                    settings.update(uniform_kl=self.head.uniform_kl(params),
                                    uniform_kl_coef=self.lcfg.uniform_kl_coef)
                loss, stats = self.loss(target_logp, batch.behaviour_logp, values, entropy, rewards, discounts,
                                        batch.valid, mask, targets=targets, **settings)
        grad_norm, _ = self.gradient_step(loss)
        return stats, grad_norm
