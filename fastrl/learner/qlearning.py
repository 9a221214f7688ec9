"""What the replay learners share. :class:`ReplayLearner` (every learner that trains from the
in-learner replay: :mod:`.dqn` Ape-X, :mod:`.r2d2`, :mod:`.sac`): the replay-ratio loop, one
gradient step per sampled batch with its priorities set after it, the refusal of non-finite
batches, uploads to the device. :class:`ReplayQLearner` (the Q-learners) adds the target network
and a state dict that carries it.

A subclass builds its networks and its replay, and implements ``loss(sample)`` ->
``(loss, stats, priorities)``: the loss of one sampled batch, its statistics (``stats["loss"]``,
``stats["q_mean"]``) and the batch's new priorities (a ``[batch]`` tensor, before ``PRIORITY_EPS``).

The replay ratio: ``replay.replay_ratio`` transitions are sampled per record added once
``replay.min_fill`` records are stored (:class:`fastrl.replay.buffer.ReplayRatio`). Each ``train()`` adds
one batch of trajectories and then takes every gradient step the ratio allows, before the
learner takes its next batch of full slots. So the learner waits when it is ahead (no batch, no
step), and the actors are throttled when they are ahead: the slots they filled wait until the
learner has caught up, and a worker whose envs have no free slot waits. The actors can run
ahead of the learner's updates by at most the steps the slots hold
(``num_workers * envs_per_worker * slots_per_env * learner.rollout``), the limiter's error margin;
``replay_ratio_achieved`` in the metrics measures the ratio against the actors' env steps.
"""
from __future__ import annotations

import copy
from fractions import Fraction

import numpy as np
import torch
from torch import nn

from ..config import Config
from ..replay.buffer import ReplayRatio
from .base import BaseLearner
from .batch import Trajectories

PRIORITY_EPS = 1e-6  # keeps every valid transition sampleable (a zero priority never is)


class ReplayLearner(BaseLearner):
    """``model`` and ``replay``; ``batches_per_record`` gradient steps are earned per record added
    once ``replay.min_fill`` records are stored. A subclass implements ``update()``: one gradient
    step on a sampled batch, its statistics, or None while nothing can be sampled."""

    TIMERS = (*BaseLearner.TIMERS, "replay_s")

    def __init__(self, cfg: Config, model: nn.Module, device, replay, batches_per_record: float,
                 device_path: bool | None = None):
        super().__init__(cfg, model, device, device_path)
        self.rcfg = cfg.replay
        self.replay = replay
        self.ratio = ReplayRatio(batches_per_record, start=self.rcfg.min_fill)
        self.replayed_batches = 0  # since this replay was made (carried across a resume with replay.checkpoint)
        self.replay_env_steps_before = 0  # env steps its ratio counted before this run (a restored replay's)
        # Batches the limiter leaves out of its count: those sampled under another ratio before a
        # resume that changed it (restore_replay_counters).
        self.batches_offset = 0
        self.last_stats: dict = {}
        self.prioritized = True  # each step sets its batch's new priorities

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

    def update_normalizer(self, batch: Trajectories) -> None:
        """The model's observation statistics (``model.normalize_obs``) updated with the batch's
        valid steps, as they arrive (a replayed step is not counted again)."""
        normalizer = getattr(self.model, "normalizer", None)
        if normalizer is not None:
            normalizer.update(batch.obs[:-1][batch.valid].to(self.device))

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
        steps = 0 if dropped else self.ratio.allowed_batches(self.replay.added,
                                                             self.replayed_batches - self.batches_offset)
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
        """(the loss of one sampled batch, its statistics, its new priorities ``[batch]``)."""
        raise NotImplementedError

    def refresh_targets(self) -> None:
        """What follows each gradient step taken (a target network's refresh)."""

    def update(self) -> dict | None:
        """One gradient step on a sampled replay batch; None while the replay is below min_fill.
        Its statistics are the 0-d tensors of the loss's, and the gradient norm."""
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
            if stepped:
                self.refresh_targets()
        with timers.time("replay_s"):
            # One read for the new priorities and the statistics (each its own read would wait anew).
            scalars = {name: value for name, value in stats.items() if value.dim() == 0}
            parts = [torch.stack([value.detach().double() for value in scalars.values()])]
            if self.prioritized:
                parts.append(priorities.detach().reshape(-1).double())
            read = torch.cat(parts).cpu().numpy()
            priorities = read[len(scalars):] + PRIORITY_EPS
            if self.prioritized and np.isfinite(priorities).all():
                self.replay.update_priorities(sample.indices, sample.generations, priorities)
        return {**dict(zip(scalars, read[:len(scalars)].tolist())), "grad_norm": grad_norm}

    def achieved_ratio(self, env_steps: int) -> float:
        """``replay.replay_ratio`` as achieved: the sampled quantity it counts (transitions, or
        R2D2's trained steps) per env step of the ``env_steps`` the actors took for this learner
        (its rows') since this replay was made, past ``replay.min_fill``; 0 before then."""
        env_steps += self.replay_env_steps_before
        if env_steps <= self.ratio.start:
            return 0.0
        return self.rcfg.replay_ratio * self.replayed_batches / float(self.ratio.ratio) / (env_steps - self.ratio.start)

    def replay_counters(self, env_steps: int) -> dict:
        """The replay ratio's counts, saved with the replay (fastrl.replay.snapshot) so that a resumed
        run goes on with the ratio where it was; ``env_steps``: taken by the actors in this run."""
        return {"replayed_batches": self.replayed_batches,
                "limited_batches": self.replayed_batches - self.batches_offset,  # what the limiter counts
                "ratio_env_steps": self.replay_env_steps_before + env_steps,
                "ratio": [self.ratio.ratio.numerator, self.ratio.ratio.denominator], "ratio_start": self.ratio.start}

    def restore_replay_counters(self, counters: dict) -> None:
        """The counts of :meth:`replay_counters`, with the replay they came with. Where the ratio's
        settings changed since (``replay_ratio``, ``batch_size``, ``min_fill``), the limiter counts
        the new ratio from the restored records on: the saved count under another ratio would make
        the learner stall until the records caught up, or take every batch it was owed at once."""
        self.replayed_batches = int(counters.get("replayed_batches", 0))
        saved = (Fraction(*counters["ratio"]), counters.get("ratio_start")) if "ratio" in counters else None
        if saved is not None and saved != (self.ratio.ratio, self.ratio.start):
            self.batches_offset = self.replayed_batches - self.ratio.allowed_batches(self.replay.added, 0)
        else:
            self.batches_offset = self.replayed_batches - int(counters.get("limited_batches", self.replayed_batches))
        self.replay_env_steps_before = int(counters.get("ratio_env_steps", 0))

    def upload(self, values) -> torch.Tensor:
        """``values`` (a numpy array or a host tensor) on the learner's device: one copy,
        asynchronous from pinned memory; on the device path a copy even on the CPU, where the
        tests count it."""
        return torch.as_tensor(values).to(self.device, non_blocking=self.device.type == "cuda", copy=self.device_path)

    def sample(self):
        """A sampled batch from the replay, None while it is below min_fill."""
        return self.replay.sample(self.rcfg.batch_size)

    def close(self) -> None:
        self.replay.close()


class ReplayQLearner(ReplayLearner):
    """A :class:`ReplayLearner` whose ``model`` (online) has a ``target`` copy, refreshed every
    ``learner.target_update_every`` steps."""

    def __init__(self, cfg: Config, model: nn.Module, device, replay, batches_per_record: float,
                 device_path: bool | None = None):
        super().__init__(cfg, model, device, replay, batches_per_record, device_path)
        self.target = copy.deepcopy(self.model).requires_grad_(False)

    def refresh_targets(self) -> None:
        """After each gradient step: copy the online network into the target every
        ``learner.target_update_every`` steps (its observation statistics included)."""
        if self.updates % self.lcfg.target_update_every == 0:
            self.target.load_state_dict(self.model.state_dict())

    def state_dict(self) -> dict:
        return {**super().state_dict(), "target": self.target.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.target.load_state_dict(state.get("target", state["model"]))
