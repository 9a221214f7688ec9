"""The learner: V-trace APPO (default) and IMPALA on batches of full trajectories.

Usable on its own: build a :class:`Learner`, assemble a :class:`Trajectories` batch yourself and
call :meth:`Learner.train`.

Autoreset and truncation. Gymnasium 1.x and envpool autoreset on the step *after* a done: that
step's action is ignored and its "transition" goes from the final observation to the reset
observation. Such steps carry ``valid = False``; the learner gives them ``log_rho = -inf`` so that
rho = c = 0 there, which makes ``vs_t = V(x_t)`` and cuts the trace. The final observation stays in
the trajectory, so a truncated step bootstraps from the current value of the real final
observation: ``r_t + gamma * V(x_final)``, with discount ``gamma * (1 - terminated_t)``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn

from .config import Config
from .kernels.torch_ops import vtrace_torch
from .models import action_head, build_model


@dataclass
class Trajectories:
    """A learner batch, time-major: ``T`` steps of ``B`` trajectories.

    obs ``[T+1, B, *obs_shape]`` (env dtype; ``obs[T]`` follows the last step), actions
    ``[T, B, *action_shape]``, logp ``[T, B]`` behaviour log-probs, rewards ``[T, B]``,
    terminated / truncated / valid ``[T, B]`` bool, version ``[T, B]`` int64 policy version that
    acted.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor
    version: torch.Tensor

    def to(self, device: torch.device) -> "Trajectories":
        non_blocking = device.type == "cuda"
        return Trajectories(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                               for f in fields(self)})

    def columns(self, index: torch.Tensor) -> "Trajectories":
        return Trajectories(**{f.name: getattr(self, f.name)[:, index] for f in fields(self)})

    def validate(self) -> None:
        T, B = self.rewards.shape
        expect = {"obs": (T + 1, B), "actions": (T, B), "logp": (T, B), "terminated": (T, B),
                  "truncated": (T, B), "valid": (T, B), "version": (T, B)}
        for name, lead in expect.items():
            shape = tuple(getattr(self, name).shape[:2])
            if shape != lead:
                raise ValueError(f"Trajectories.{name} has leading shape {shape}, expected {lead} "
                                 f"(time-major, T={T}, B={B}, obs has T+1 rows)")


def gather_trajectories(arena, slot_ids: np.ndarray) -> Trajectories:
    """Copy the trajectory slots ``slot_ids`` ``[B]`` out of the arena into a time-major batch
    (one copy per field: the broadcast index ``[t, slot]`` lays rows out time-major directly)."""
    T = arena.rewards.shape[1]
    slots = np.asarray(slot_ids)[None, :]
    steps = np.arange(T + 1)[:, None]

    def take(array, rows):
        return torch.from_numpy(array[slots, steps[:rows]])

    return Trajectories(
        obs=take(arena.obs, T + 1), actions=take(arena.actions, T), logp=take(arena.logp, T),
        rewards=take(arena.rewards, T), terminated=take(arena.terminated, T).bool(),
        truncated=take(arena.truncated, T).bool(), valid=take(arena.valid, T).bool(),
        version=take(arena.version, T))


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / count


def gradient_step(learner, loss: torch.Tensor, max_grad_norm: float) -> tuple[float, float]:
    """Backward, cross-rank gradient averaging (``learner.grad_sync``), norm clipping and an
    optimizer step, skipped when the loss or the gradient is not finite: such a step would
    poison the weights the actors use. Counts ``updates`` / ``skipped_updates`` /
    ``consecutive_skips`` on ``learner``. Returns (gradient norm, NaN if skipped; the
    ``perf_counter`` time when the backward pass and clipping were done)."""
    learner.optimizer.zero_grad(set_to_none=True)
    finite = bool(torch.isfinite(loss))
    grad_norm = float("nan")
    if finite:
        loss.backward()
    if learner.grad_sync is not None:
        finite = learner.grad_sync(finite)
    if finite:
        grad_norm = float(nn.utils.clip_grad_norm_(learner.model.parameters(), max_grad_norm))
        finite = math.isfinite(grad_norm)
    backward_done = time.perf_counter()
    if finite:
        learner.optimizer.step()
        learner.updates += 1
        learner.consecutive_skips = 0
    else:
        learner.optimizer.zero_grad(set_to_none=True)
        learner.skipped_updates += 1
        learner.consecutive_skips += 1
        grad_norm = float("nan")
    return grad_norm, backward_done


class Learner:
    """Owns the model, optimizer and update rule. ``version`` counts published updates."""

    def __init__(self, cfg: Config, observation_space, action_space, model: nn.Module | None = None,
                 device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.lcfg = cfg.learner
        self.device = torch.device(device)
        self.model = build_model(observation_space, action_space, cfg.model, model, cfg.learner.algo).to(self.device)
        self.head = action_head(action_space)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lcfg.lr, eps=self.lcfg.adam_eps)
        self.version = 0
        self.updates = 0
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self.timings = {"forward_backward_s": 0.0, "vtrace_s": 0.0, "optimizer_s": 0.0}
        # Data-parallel hook (fastrl.distributed.GradientAverager): averages gradients across
        # ranks, given whether this rank's are finite; returns whether every rank's were.
        self.grad_sync = None
        # IMPALA-paper replay: replay.vtrace_fraction of every batch are replayed trajectories.
        self.replay = None
        if cfg.replay.vtrace_fraction > 0:
            from .dqn import make_replay_config
            from .replay import SequenceReplay

            self.replay = SequenceReplay(
                make_replay_config(cfg), num_streams=cfg.total_envs, obs_shape=tuple(observation_space.shape),
                obs_dtype=observation_space.dtype, frame_stack=cfg.replay.frame_stack,
                action_shape=tuple(action_space.shape or ()), action_dtype=action_space.dtype, seed=cfg.seed)

    def learning_rate(self, progress: float) -> float:
        """Linear decay to 0 over the run when ``lr_decay``; ``progress`` in [0, 1]."""
        if not self.lcfg.lr_decay:
            return self.lcfg.lr
        return self.lcfg.lr * max(0.0, 1.0 - progress)

    def train(self, batch: Trajectories, progress: float = 0.0, env_ids: np.ndarray | None = None,
              fresh: np.ndarray | None = None) -> dict:
        """One learner step on ``batch`` (all epochs and minibatches); returns statistics.

        ``env_ids`` ``[B]`` (each trajectory's env) is needed only with ``replay.vtrace_fraction``:
        the batch is then stored for replay and completed with replayed trajectories; ``fresh``
        ``[B]`` marks an env's first trajectory after its worker restarted (see
        :func:`fastrl.dqn.add_trajectories`)."""
        batch.validate()
        valid_lag = (self.version - batch.version)[batch.valid].float()
        if self.replay is not None:
            batch = self.with_replayed(batch, env_ids, fresh)
        batch = batch.to(self.device)
        lcfg = self.lcfg
        lag = (self.version - batch.version).float()
        loss_mask = batch.valid & (lag <= lcfg.max_policy_lag)
        normalizer = getattr(self.model, "normalizer", None)
        if normalizer is not None:
            normalizer.update(batch.obs[:-1][batch.valid])
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(progress)

        rewards, discounts = self.rewards_and_discounts(batch)

        B = batch.rewards.shape[1]
        stats_sum: dict[str, float] = {}
        steps = 0
        for _ in range(lcfg.num_epochs):
            order = torch.randperm(B, device=self.device) if lcfg.num_minibatches > 1 else None
            for chunk in range(lcfg.num_minibatches):
                if order is None:
                    index = slice(None)
                else:
                    size = B // lcfg.num_minibatches
                    index = order[chunk * size:(chunk + 1) * size]
                step_stats = self._update(batch.columns(index) if order is not None else batch,
                                          rewards[:, index], discounts[:, index], loss_mask[:, index])
                for key, value in step_stats.items():
                    stats_sum[key] = stats_sum.get(key, 0.0) + value
                steps += 1
        self.version += 1
        stats = {key: value / steps for key, value in stats_sum.items()}
        stats.update(
            policy_lag_min=float(valid_lag.min()) if valid_lag.numel() else 0.0,
            policy_lag_mean=float(valid_lag.mean()) if valid_lag.numel() else 0.0,
            policy_lag_max=float(valid_lag.max()) if valid_lag.numel() else 0.0,
            lr=self.optimizer.param_groups[0]["lr"], learner_updates=self.updates,
            skipped_updates=self.skipped_updates, version=self.version)
        return stats

    def with_replayed(self, batch: Trajectories, env_ids, fresh=None) -> Trajectories:
        """Store ``batch`` in the sequence replay and append replayed trajectories, so that they
        make up ``replay.vtrace_fraction`` of the result. Replayed columns carry the current
        version: V-trace corrects for their behaviour policy (stored log-probs), and the lag mask
        is for fresh data."""
        T, B = batch.rewards.shape
        if env_ids is None or np.shape(env_ids) != (B,):
            raise ValueError(f"replay.vtrace_fraction needs env_ids [{B}], the env of each trajectory")
        from .dqn import add_trajectories

        add_trajectories(self.replay, batch, batch.rewards, env_ids, fresh, logp=batch.logp.numpy())
        fraction = self.cfg.replay.vtrace_fraction
        wanted = int(round(B * fraction / (1.0 - fraction)))
        wanted -= (B + wanted) % self.lcfg.num_minibatches  # keep the minibatches equal
        replayed = self.replay.sample(wanted) if wanted > 0 else None
        if replayed is None:
            return batch
        extra = Trajectories(
            obs=torch.from_numpy(replayed.obs), actions=torch.from_numpy(replayed.actions),
            logp=torch.from_numpy(replayed.logp), rewards=torch.from_numpy(replayed.rewards),
            terminated=torch.from_numpy(replayed.terminated), truncated=torch.from_numpy(replayed.truncated),
            valid=torch.from_numpy(replayed.valid), version=torch.full((T, wanted), self.version, dtype=torch.int64))
        return Trajectories(**{f.name: torch.cat([getattr(batch, f.name), getattr(extra, f.name).to(
            getattr(batch, f.name).dtype)], dim=1) for f in fields(batch)})

    def rewards_and_discounts(self, batch: Trajectories) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled (and optionally clipped) rewards, and ``gamma * (1 - terminated)``; ``[T, B]``."""
        rewards = batch.rewards * self.lcfg.reward_scale
        if self.lcfg.reward_clip > 0:
            rewards = rewards.clamp(-self.lcfg.reward_clip, self.lcfg.reward_clip)
        return rewards, self.lcfg.gamma * (~batch.terminated).float()

    def evaluate(self, batch: Trajectories) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Current policy on the batch: params ``[T, B, P]``, values ``[T+1, B]``, log-probs ``[T, B]``."""
        T, B = batch.rewards.shape
        params, values = self.model(batch.obs.reshape(-1, *batch.obs.shape[2:]))
        params = params.reshape(T + 1, B, -1)[:T]
        logp = self.head.log_prob(params.reshape(T * B, -1),
                                  batch.actions.reshape(T * B, *batch.actions.shape[2:])).reshape(T, B)
        return params, values.reshape(T + 1, B), logp

    @torch.no_grad()
    def vtrace_targets(self, batch: Trajectories, logp: torch.Tensor, values: torch.Tensor, rewards: torch.Tensor,
                       discounts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V-trace value targets ``vs`` and policy-gradient advantages, both ``[T, B]``."""
        lcfg = self.lcfg
        T = rewards.shape[0]
        # rho = c = 0 on the autoreset step: vs = V there and the trace is cut (module docstring).
        log_rhos = (logp - batch.logp).masked_fill(~batch.valid, -math.inf)
        return vtrace_torch(log_rhos, discounts, rewards, values[:T], values[T],
                            clip_rho_threshold=lcfg.clip_rho, clip_pg_rho_threshold=lcfg.clip_pg_rho,
                            clip_c_threshold=lcfg.clip_c, lambda_=lcfg.vtrace_lambda)

    def _update(self, batch: Trajectories, rewards, discounts, mask) -> dict:
        lcfg = self.lcfg
        start = time.perf_counter()
        T, B = rewards.shape
        params, values, logp = self.evaluate(batch)
        log_ratio = logp - batch.logp
        vtrace_start = time.perf_counter()
        vs, pg_adv = self.vtrace_targets(batch, logp.detach(), values.detach(), rewards, discounts)
        vtrace_time = time.perf_counter() - vtrace_start

        maskf = mask.float()
        count = maskf.sum().clamp(min=1.0)
        if lcfg.algo == "appo":
            adv = pg_adv
            if lcfg.normalize_advantages:
                mean = _masked_mean(adv, maskf, count)
                std = torch.sqrt(_masked_mean((adv - mean).square(), maskf, count) + 1e-8)
                adv = (adv - mean) / std
            ratio = torch.exp(log_ratio.clamp(max=20.0))
            surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - lcfg.ppo_clip, 1 + lcfg.ppo_clip) * adv)
            policy_loss = -_masked_mean(surrogate, maskf, count)
        else:
            policy_loss = -_masked_mean(pg_adv * logp, maskf, count)
        value_loss = 0.5 * _masked_mean((vs - values[:T]).square(), maskf, count)
        entropy = _masked_mean(self.head.entropy(params.reshape(T * B, -1)).reshape(T, B), maskf, count)
        loss = policy_loss + lcfg.value_coef * value_loss - lcfg.entropy_coef * entropy

        grad_norm, backward_done = gradient_step(self, loss, lcfg.max_grad_norm)
        end = time.perf_counter()
        self.timings["forward_backward_s"] += backward_done - start - vtrace_time
        self.timings["vtrace_s"] += vtrace_time
        self.timings["optimizer_s"] += end - backward_done
        return {"loss": float(loss.detach()), "policy_loss": float(policy_loss.detach()),
                "value_loss": float(value_loss.detach()), "entropy": float(entropy.detach()),
                "grad_norm": grad_norm}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "version": self.version, "updates": self.updates, "skipped_updates": self.skipped_updates}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        self.updates = state["updates"]
        self.skipped_updates = state.get("skipped_updates", 0)


def make_learner(cfg: Config, observation_space, action_space, model: nn.Module | None = None,
                 device: torch.device | str = "cpu"):
    """The learner ``cfg.learner.algo`` names: :class:`Learner` (appo, impala) or
    :class:`fastrl.dqn.DQNLearner` (dqn)."""
    if cfg.learner.algo == "dqn":
        from .dqn import DQNLearner

        return DQNLearner(cfg, observation_space, action_space, model=model, device=device)
    return Learner(cfg, observation_space, action_space, model=model, device=device)


class NonFiniteTraining(RuntimeError):
    """Too many non-finite updates in a row: the run cannot make progress."""


class LearnerHost:
    """The learner inside a run: turns full slots into updates, publishes weights, checkpoints."""

    def __init__(self, cfg: Config, arena, learner: Learner, run_dir=None, wall_time_before: float = 0.0,
                 world_size: int = 1):
        from .models import num_state_values
        from .shm import WeightBuffer

        self.cfg = cfg
        self.arena = arena
        self.learner = learner
        self.run_dir = run_dir
        self.world_size = world_size
        self.weights = WeightBuffer(arena)
        self.flat = torch.empty(num_state_values(learner.model), dtype=torch.float32)
        self.start = time.time()
        self.wall_time_before = wall_time_before
        self.last_checkpoint = time.time()
        self.timings = {"gather_s": 0.0, "publish_s": 0.0, "wait_s": 0.0}
        self.trained_env_steps = 0
        self.extra_state: dict = {}  # saved with every checkpoint (e.g. distributed digests)

    def env_steps(self) -> int:
        """Env steps of the run: this arena's, or with several ranks the count of the last report."""
        from .shm import Control

        if self.world_size > 1:
            return int(self.arena.control[Control.RUN_ENV_STEPS])
        return int(self.arena.env_steps.sum() + self.arena.control[Control.ENV_STEPS_OFFSET])

    def progress(self) -> float:
        cfg = self.cfg
        parts = [0.0]
        if cfg.train_for_env_steps:
            parts.append(self.env_steps() / cfg.train_for_env_steps)
        if cfg.train_for_seconds:
            parts.append((self.wall_time_before + time.time() - self.start) / cfg.train_for_seconds)
        return min(1.0, max(parts))

    def publish(self) -> bool:
        """Publish the current weights; non-finite weights are never sent to the actors."""
        from .models import state_to_flat

        start = time.perf_counter()
        state_to_flat(self.learner.model, self.flat)
        ok = bool(torch.isfinite(self.flat).all())
        if ok:
            self.weights.publish(self.flat.numpy(), self.learner.version)
        self.timings["publish_s"] += time.perf_counter() - start
        return ok

    def consume(self, slot_ids: np.ndarray, release, progress: float | None = None) -> None:
        """Train on full slots, or with ``sample_only`` just hand them back."""
        if self.cfg.sample_only:
            release(slot_ids)
        else:
            self.train_on(slot_ids, release, progress)

    def train_on(self, slot_ids: np.ndarray, release, progress: float | None = None) -> dict:
        """Copy ``slot_ids`` out of the arena, hand them back with ``release`` and train."""
        from .metrics import write_learner_stats

        start = time.perf_counter()
        batch = gather_trajectories(self.arena, slot_ids)
        # Read before the slots are reused: each trajectory's env (replay stream), and whether it
        # is the env's first since its worker (re)started (its stream restarts there).
        env_ids = self.arena.slot_env[slot_ids].astype(np.int64)
        fresh = self.arena.slot_fresh[slot_ids].astype(bool)
        release(slot_ids)
        self.timings["gather_s"] += time.perf_counter() - start
        stats = self.learner.train(batch, self.progress() if progress is None else progress, env_ids=env_ids,
                                   fresh=fresh)
        if self.learner.consecutive_skips >= self.cfg.learner.max_consecutive_skips:
            raise NonFiniteTraining(
                f"{self.learner.consecutive_skips} learner updates in a row had a non-finite loss or gradient: "
                f"check the env's observations and rewards for NaN/Inf, lower learner.lr, or set "
                f"learner.reward_clip / model.normalize_obs")
        self.trained_env_steps += batch.rewards.numel()
        self.publish()
        stats.update(self.learner.timings, **self.timings, trained_env_steps=self.trained_env_steps)
        write_learner_stats(self.arena, stats)
        return stats

    def checkpoint_due(self) -> bool:
        from .shm import Control

        return (time.time() - self.last_checkpoint >= self.cfg.checkpoint_every_s
                or bool(self.arena.control[Control.CHECKPOINT]))

    def checkpoint(self):
        """Save a checkpoint (rank 0); raises CheckpointError when it cannot be written."""
        from .checkpoint import capture_rng, save_checkpoint
        from .shm import Control

        if self.run_dir is None:
            return None
        state = {
            "learner": self.learner.state_dict(),
            "counters": {"env_steps": self.env_steps(), "trained_env_steps": self.trained_env_steps,
                         "wall_time": self.wall_time_before + time.time() - self.start},
            "rng": capture_rng(),
            "config": self.cfg.to_dict(),
            **self.extra_state,
        }
        path = save_checkpoint(self.run_dir, state, state["counters"]["env_steps"], self.cfg.keep_checkpoints)
        self.last_checkpoint = time.time()
        self.arena.control[Control.CHECKPOINT] = 0
        return path


def restore_learner(learner: Learner, state: dict) -> None:
    """Weights, optimizer, counters and RNG from a checkpoint dict."""
    from .checkpoint import restore_rng

    learner.load_state_dict(state["learner"])
    restore_rng(state.get("rng", {}))


def learner_process(cfg: Config, layout, arena_name: str, spaces, model, device: str, channels,
                    parent_pid: int, run_dir, resume_state: dict | None, dist_info=None) -> None:
    """Main loop of the learner process: collect full slots, train, return slots, publish.

    With ``dist_info`` (several ranks), every step begins with the ranks agreeing whether to
    stop, and only rank 0 gets a ``run_dir`` to checkpoint into (fastrl.distributed)."""
    from collections import deque

    from . import distributed
    from .checkpoint import CheckpointError
    from .process_utils import ProcessExit, configure_child, wait_readable
    from .shm import Arena, Control, set_error

    configure_child(parent_pid)
    torch.set_num_threads(cfg.learner.torch_threads)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    arena = Arena.attach(layout, arena_name)
    full_in, free_out = channels
    learner = make_learner(cfg, *spaces, model=model, device=device)
    wall_before = 0.0
    if resume_state is not None:
        restore_learner(learner, resume_state)
        wall_before = resume_state["counters"].get("wall_time", 0.0)
    parallel = dist_info is not None and dist_info.enabled
    normalizer = getattr(learner.model, "normalizer", None)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))  # NCCL object collectives use the current device
    if parallel:
        distributed.init_group(dist_info, "learner", device, cfg.dist_timeout_s)
        distributed.broadcast_parameters(learner.model)
        learner.grad_sync = distributed.GradientAverager(learner.model, dist_info.world_size)
    host = LearnerHost(cfg, arena, learner, run_dir, wall_before, dist_info.world_size if parallel else 1)
    host.trained_env_steps = (resume_state or {}).get("counters", {}).get("trained_env_steps", 0)
    per_worker = cfg.env.envs_per_worker * cfg.slots_per_env
    queue: deque[int] = deque()
    needed = cfg.trajectories_per_batch
    agreed_stop = False
    checkpoint_failed = False
    progress = None

    def release(slot_ids: np.ndarray) -> None:
        arena.slot_queued[slot_ids] = 0
        owners = slot_ids // per_worker
        for w in np.unique(owners):
            free_out[w].send_bytes(slot_ids[owners == w].astype(np.int32).tobytes())

    host.publish()
    try:
        while True:
            waited = time.perf_counter()
            ready = wait_readable(full_in, arena.control, parent_pid)
            host.timings["wait_s"] += time.perf_counter() - waited
            for conn in ready:
                while conn.poll():
                    queue.extend(np.frombuffer(conn.recv_bytes(), dtype=np.int32).tolist())
            while len(queue) >= needed:
                if not parallel and arena.control[Control.STOP]:
                    raise ProcessExit  # stop now: queued batches could outlast the shutdown grace
                if parallel:
                    agreed_stop, progress = distributed.agree(bool(arena.control[Control.STOP]), host.progress(),
                                                              learner.device)
                    if agreed_stop:
                        raise ProcessExit
                slot_ids = np.array([queue.popleft() for _ in range(needed)], dtype=np.int64)
                host.consume(slot_ids, release, progress)
                if parallel and normalizer is not None:
                    distributed.broadcast_buffers(normalizer)  # every rank acts with rank 0's statistics
            if host.checkpoint_due():
                host.checkpoint()
    except ProcessExit:
        if parallel and not agreed_stop:
            agreed_stop, _ = distributed.agree(True, host.progress(), learner.device)
    except (NonFiniteTraining, CheckpointError) as exc:
        checkpoint_failed = isinstance(exc, CheckpointError)
        set_error(arena, str(exc))
    finally:
        try:
            if parallel and agreed_stop:
                # Every rank reached the same final update: record that their weights agree.
                host.extra_state["param_digests"] = distributed.gather_digests(learner.model)
                host.extra_state["world_size"] = dist_info.world_size
        finally:
            if not checkpoint_failed:
                try:
                    host.checkpoint()
                except CheckpointError as exc:
                    set_error(arena, str(exc))
        if parallel:
            distributed.close_group()
        arena.close()
