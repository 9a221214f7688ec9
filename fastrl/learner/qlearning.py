"""What the replay-based Q-learners (:mod:`.dqn` Ape-X, :mod:`.r2d2`) share: the target network,
the replay-ratio loop, one prioritized gradient step per sampled batch, the refusal of
non-finite batches, and a state dict that carries the target.

A subclass builds its network and its replay, and implements ``loss(sample)`` ->
``(loss, stats, priorities)``: the loss of one sampled batch, its statistics (``stats["loss"]``,
``stats["q_mean"]``) and the batch's new priorities (a ``[batch]`` tensor, before ``PRIORITY_EPS``).
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from ..config import Config
from ..replay.buffer import ReplayRatio
from .base import BaseLearner
from .batch import Trajectories

PRIORITY_EPS = 1e-6  # keeps every valid transition sampleable (a zero priority never is)


class ReplayQLearner(BaseLearner):
    """``model`` (online) and its ``target`` copy, ``replay``; ``batches_per_record`` gradient
    steps are earned per record added once ``replay.min_fill`` records are stored."""

    TIMERS = (*BaseLearner.TIMERS, "replay_s")

    def __init__(self, cfg: Config, model: nn.Module, device, replay, batches_per_record: float,
                 device_path: bool | None = None):
        super().__init__(cfg, model, device, device_path)
        self.rcfg = cfg.replay
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        self.replay = replay
        self.ratio = ReplayRatio(batches_per_record, start=self.rcfg.min_fill)
        self.replayed_batches = 0  # since this replay was made (a resume starts a fresh one)
        self.last_stats: dict = {}

    def stream_ids(self, batch: Trajectories, env_ids) -> np.ndarray:
        """``env_ids`` checked: ``[B]`` ints, the env (replay stream) of each trajectory."""
        B = batch.rewards.shape[1]
        name = type(self).__name__
        if env_ids is None:
            raise ValueError(f"{name}.train needs env_ids [B]: the env of each trajectory (its replay stream)")
        env_ids = np.asarray(env_ids, dtype=np.int64)
        if env_ids.shape != (B,):
            raise ValueError(f"{name}.train: env_ids must have shape [{B}], got {list(env_ids.shape)}")
        return env_ids

    def drop(self, batch: Trajectories, env_ids: np.ndarray) -> dict:
        """Refuse a batch with NaN/Inf data, counted as a skipped update.

        Stored, they would poison every batch that samples them. Their envs' streams restart, as
        after a worker restart: the next records do not follow the stored ones, and no window or
        sequence across the gap would skip the dropped steps."""
        ended = (batch.terminated[-1] | batch.truncated[-1]).cpu().numpy()
        self.replay.restart_streams(env_ids, ended=ended)
        return self.replay_steps({}, dropped=True)

    def replay_steps(self, lag_stats: dict, dropped: bool = False) -> dict:
        """The gradient steps the replay ratio allows now (none for a ``dropped`` batch); this
        batch's statistics.

        With several ranks, ``grad_sync.agree_steps`` first makes the plan common: if any rank
        dropped its batch, every rank counts a skipped update and takes no step (the others keep
        the batch in their replays); else all take the fewest steps any rank may take (the
        others' surplus stays owed to them). So every rank makes the same gradient all-reduces."""
        steps = 0 if dropped else self.ratio.allowed_batches(self.replay.added, self.replayed_batches)
        if self.grad_sync is not None:
            dropped, steps = self.grad_sync.agree_steps(dropped, steps)
        if dropped:
            self.count_skip()
            self.version += 1
            return {**self.last_stats, **self.counters(), "replay_size": len(self.replay)}
        stats = dict(self.last_stats)
        for _ in range(steps):
            step_stats = self.update()
            if step_stats is None:
                if self.grad_sync is None:
                    break
                # Nothing sampleable here, but the peers are stepping: join their all-reduce
                # with no gradient, which makes every rank skip this step.
                self.gradient_step(torch.full((), float("nan")))
                continue
            stats = self.last_stats = step_stats
        self.version += 1
        stats.update(lag_stats, **self.counters(), replay_size=len(self.replay),
                     replayed_batches=self.replayed_batches)
        return stats

    def loss(self, sample) -> tuple[torch.Tensor, dict, torch.Tensor]:
        raise NotImplementedError

    def upload(self, values) -> torch.Tensor:
        """``values`` (a numpy array or a host tensor) on the learner's device: one copy,
        asynchronous from pinned memory; on the device path a copy even on the CPU, where the
        tests count it."""
        return torch.as_tensor(values).to(self.device, non_blocking=self.device.type == "cuda", copy=self.device_path)

    def sample(self):
        """A sampled batch from the replay, None while it is below min_fill."""
        return self.replay.sample(self.rcfg.batch_size)

    def update(self) -> dict | None:
        """One gradient step on a sampled replay batch; None while the replay is below min_fill."""
        timers = self.timers
        with timers.time("replay_s"):
            sample = self.sample()
        if sample is None:
            return None
        self.replayed_batches += 1
        with timers.time("forward_backward_s"):
            loss, stats, priorities = self.loss(sample)
        grad_norm, stepped = self.gradient_step(loss)
        with timers.time("optimizer_s"):
            if stepped and self.updates % self.lcfg.target_update_every == 0:
                self.target.load_state_dict(self.model.state_dict())
        with timers.time("replay_s"):
            # One read for the new priorities and the statistics (each its own read would wait anew).
            read = torch.cat([priorities.detach().reshape(-1).double(),
                              torch.stack([stats["loss"], stats["q_mean"]]).double()]).cpu().numpy()
            priorities, (loss_value, q_mean) = read[:-2] + PRIORITY_EPS, read[-2:].tolist()
            if np.isfinite(priorities).all():
                self.replay.update_priorities(sample.indices, sample.generations, priorities)
        return {"loss": loss_value, "value_loss": loss_value, "grad_norm": grad_norm, "q_mean": q_mean}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "target": self.target.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.target.load_state_dict(state.get("target", state["model"]))

    def close(self) -> None:
        self.replay.close()
