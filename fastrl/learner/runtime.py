"""The learner inside a run: turns full arena slots into updates, publishes weights, checkpoints."""
from __future__ import annotations

import time

import numpy as np
import torch

from ..config import Config
from ..files.checkpoint import capture_rng, checkpoint_dir, restore_rng, save_checkpoint, warn
from ..ipc.arena import Control
from ..ipc.device_io import pinned_empty
from ..ipc.weights import WeightBuffer
from ..models.networks import num_state_values, state_to_flat
from ..replay.snapshot import (
    ReplaySnapshotError,
    load_replay,
    newest_saved_replay,
    remove_saved_replays,
    replay_dir,
    save_replays,
    saved_env_steps,
)
from ..reporting.metrics import write_learner_stats
from ..reporting.timers import Timers
from .base import BaseLearner
from .staging import BatchFeed, Gathered


class NonFiniteTraining(RuntimeError):
    """Too many non-finite updates in a row: the run cannot make progress."""


class LearnerRuntime:
    """Wraps any learner of the family for a run: arena in, weights and checkpoints out."""

    def __init__(self, cfg: Config, arena, learner: BaseLearner, run_dir=None, world_size: int = 1, policy: int = 0):
        self.cfg = cfg
        self.arena = arena
        self.learner = learner
        self.run_dir = run_dir
        self.world_size = world_size
        self.policy = policy  # its weight set and learner_stats row (fastrl.multiagent.policy_map)
        self.weights = WeightBuffer(arena, policy)
        # [P] weights as published. On the learner's device path they are gathered on the device
        # and reach this (pinned) buffer in one copy: one wait per publication, not one per tensor.
        self.flat = pinned_empty(num_state_values(learner.model), torch.float32, learner.device)
        self.flat_np = self.flat.numpy()
        self.device_flat = torch.empty_like(self.flat, device=learner.device) if learner.device_path else self.flat
        self.last_checkpoint = time.time()
        # Cumulative seconds, reported beside the learner's own (BaseLearner.TIMERS). wait_s: the
        # learner process blocked until workers send full slots (fastrl.learner.process).
        self.timers = Timers("gather_s", "publish_s", "wait_s")
        self.feed = BatchFeed(arena, learner.device, pipelined=learner.device_path)
        self.trained_env_steps = 0
        self.start_env_steps = self.env_steps()  # where this learner's replay (if any) began
        # The share of the run's env steps whose rows feed this learner: its policy's rows (a PBT
        # member's games, a multi-agent policy's seats), and with several ranks this rank's.
        self.env_share = 1.0 / world_size
        self.extra_state: dict = {}  # saved with every checkpoint (e.g. distributed digests)

    def env_steps(self) -> int:
        """Env steps of the run: this arena's, or with several ranks the count of the last report."""
        if self.world_size > 1:
            return int(self.arena.control[Control.RUN_ENV_STEPS])
        return int(self.arena.env_steps.sum() + self.arena.control[Control.ENV_STEPS_OFFSET])

    def fed_env_steps(self) -> float:
        """Env steps taken since this runtime started by the rows that feed its learner."""
        return (self.env_steps() - self.start_env_steps) * self.env_share

    def trained_seconds(self) -> float:
        """The runner's clocks (fastrl.reporting.metrics.Reporter.tick): what the time budget counts."""
        return float(self.arena.control[Control.TRAINED_MS]) / 1000

    def wall_time(self) -> float:
        return float(self.arena.control[Control.WALL_MS]) / 1000

    def progress(self) -> float:
        """Share of the run's budget done, in [0, 1] (the learning-rate schedule's clock)."""
        cfg = self.cfg
        parts = [0.0]
        if cfg.train_for_env_steps:
            parts.append(self.env_steps() / cfg.train_for_env_steps)
        if cfg.train_for_seconds:
            parts.append(self.trained_seconds() / cfg.train_for_seconds)
        return min(1.0, max(parts))

    def publish(self) -> bool:
        """Publish the current weights; non-finite weights are never sent to the actors."""
        with self.timers.time("publish_s"):
            state_to_flat(self.learner.model, self.device_flat)
            if self.device_flat is not self.flat:
                self.flat.copy_(self.device_flat)  # the publication's one wait for the device
            ok = bool(torch.isfinite(self.flat).all())  # on the host: no second wait
            if ok:
                self.weights.publish(self.flat_np, self.learner.version)
        return ok

    def consume(self, slot_ids: np.ndarray, release, progress: float | None = None) -> None:
        """Train on full slots, or with ``sample_only`` just hand them back."""
        if self.cfg.sample_only:
            release(slot_ids)
        else:
            self.train_on(slot_ids, release, progress)

    def train_on(self, slot_ids: np.ndarray, release, progress: float | None = None) -> dict:
        """Copy ``slot_ids`` out of the arena, hand them back with ``release`` and train: on this
        batch, or on the device path on the previous one while this one is gathered
        (:mod:`fastrl.learner.staging`). Returns the statistics, {} when nothing was trained yet."""
        with self.timers.time("gather_s"):
            previous = self.feed.take_waiting()
            incoming = self.feed.gather(slot_ids)
        stats = {} if previous is None else self.train(previous, progress)
        with self.timers.time("gather_s"):
            gathered = incoming.result()
            release(slot_ids)
            ready = self.feed.arrived(gathered)
        return stats if ready is None else self.train(ready, progress)

    def holds_batch(self) -> bool:
        """Whether the device path holds a gathered batch it has not trained on (see flush)."""
        return self.feed.waiting is not None

    def flush(self, progress: float | None = None) -> dict:
        """Train on the batch the device path still holds (gathered, released, not yet trained
        on), so that a run's last batch is not lost at its end; {} when none is held."""
        waiting = self.feed.take_waiting()
        return {} if waiting is None else self.train(waiting, progress)

    def train(self, gathered: Gathered, progress: float | None) -> dict:
        """One learner step on a gathered batch, then the new weights published."""
        batch = gathered.batch
        stats = self.learner.train(batch, self.progress() if progress is None else progress,
                                   env_ids=gathered.env_ids, fresh=gathered.fresh)
        self.feed.trained(gathered)
        if self.learner.consecutive_skips >= self.cfg.learner.max_consecutive_skips:
            raise NonFiniteTraining(
                f"{self.learner.consecutive_skips} learner updates in a row had a non-finite loss or gradient: "
                f"check the env's observations and rewards for NaN/Inf, lower learner.lr, or set "
                f"learner.reward_clip / model.normalize_obs")
        self.trained_env_steps += batch.rewards.numel()
        self.publish()
        lcfg = self.learner.lcfg
        achieved_ratio = getattr(self.learner, "achieved_ratio", None)  # the replay learners'
        if achieved_ratio is not None:
            stats["replay_ratio_achieved"] = achieved_ratio(self.fed_env_steps())
        stats.update(self.learner.timers.read(), **self.timers.read(), trained_env_steps=self.trained_env_steps,
                     entropy_coef=lcfg.entropy_coef, value_coef=lcfg.value_coef, ppo_clip=lcfg.ppo_clip,
                     max_grad_norm=lcfg.max_grad_norm, gamma=lcfg.gamma)
        write_learner_stats(self.arena, stats, self.policy)
        return stats

    def save_beat(self) -> None:
        """A replay save goes on: the runner's stop waits for it (Control.SAVE_BEAT_MS)."""
        self.arena.control[Control.SAVE_BEAT_MS] = int(time.time() * 1000)

    def checkpoint_due(self) -> bool:
        return (time.time() - self.last_checkpoint >= self.cfg.checkpoint_every_s
                or bool(self.arena.control[Control.CHECKPOINT]))

    def checkpoint(self, more: dict | None = None, runtimes: list[LearnerRuntime] | None = None):
        """Save a checkpoint (rank 0), with ``more`` entries (the other policies'), and with
        ``replay.checkpoint`` the replays of ``runtimes`` (default: this one's) beside it. Raises
        CheckpointError when the checkpoint cannot be written; a replay that cannot is said in one
        line, and the run goes on."""
        if self.run_dir is None:
            return None
        state = {
            "learner": self.learner.state_dict(),
            "counters": {"env_steps": self.env_steps(), "trained_env_steps": self.trained_env_steps,
                         "wall_time": self.wall_time(), "trained_seconds": self.trained_seconds(),
                         "epsilon_late_at_env_steps": int(self.arena.control[Control.EPSILON_LATE_AT])},
            "rng": capture_rng(self.learner.device),
            "config": self.cfg.to_dict(),
            **self.extra_state,
            **(more or {}),
        }
        path = save_checkpoint(self.run_dir, state, state["counters"]["env_steps"], self.cfg.keep_checkpoints)
        if self.cfg.replay.checkpoint:
            # After the checkpoint: a save cut short (a kill past the shutdown grace) loses the
            # replay, never the checkpoint.
            save_run_replays(self.run_dir, state["counters"]["env_steps"], runtimes or [self], beat=self.save_beat)
        else:
            for removed in remove_saved_replays(checkpoint_dir(self.run_dir)):
                warn(f"fastrl: removed {removed}, a replay saved by an earlier part of this run "
                     f"(replay.checkpoint is off now)")
        self.last_checkpoint = time.time()
        self.arena.control[Control.CHECKPOINT] = 0
        return path


def save_run_replays(run_dir, env_steps: int, runtimes: list[LearnerRuntime], warn=warn, beat=None) -> bool:
    """The replays of ``runtimes``' learners (those that keep one), with their ratio counters, as
    the replays of the checkpoint at ``env_steps``. Where the disk refuses, one line says so and
    the run goes on (its checkpoint is written): a resume from it would refill the replay.
    ``beat``: called as each part is written (fastrl.replay.snapshot.save_replay)."""
    replays = {}
    for runtime in runtimes:
        replay = getattr(runtime.learner, "replay", None)
        if replay is not None:
            counters = getattr(runtime.learner, "replay_counters", None)
            replays[str(runtime.policy)] = replay, ({} if counters is None else counters(int(runtime.fed_env_steps())))
    try:
        save_replays(checkpoint_dir(run_dir), env_steps, replays, beat)
    except OSError as exc:
        warn(f"fastrl: cannot write the replay beside the checkpoint at {env_steps} env steps in "
             f"{checkpoint_dir(run_dir)} ({exc.strerror or exc}; a save needs room for two replays): training goes "
             f"on, and a resume from that checkpoint would take an older saved replay or refill; free space")
        return False
    return True


def restore_run_replays(run_dir, env_steps: int, runtimes: list[LearnerRuntime], warn=warn) -> int:
    """Load the replays saved with the newest checkpoint at or before ``env_steps`` (the resumed
    one's, or the one before where its replay's save was cut short) into ``runtimes``' learners;
    where one is missing or does not fit, say so in one line and let that replay refill. Returns
    the number loaded."""
    directory = newest_saved_replay(checkpoint_dir(run_dir), env_steps)
    loaded = 0
    for runtime in runtimes:
        learner = runtime.learner
        if getattr(learner, "replay", None) is None:
            continue
        if directory is None or not (directory / str(runtime.policy)).is_dir():
            warn(f"fastrl: no replay was saved with the checkpoint at {env_steps} env steps or an earlier one "
                 f"(replay.checkpoint was off): policy {runtime.policy}'s replay refills to replay.min_fill")
            continue
        try:
            counters = load_replay(learner.replay, directory / str(runtime.policy))
        except ReplaySnapshotError as exc:
            warn(f"fastrl: the saved replay cannot be used ({exc}): policy {runtime.policy}'s replay refills to "
                 f"replay.min_fill")
            continue
        restore = getattr(learner, "restore_replay_counters", None)
        if restore is not None:
            restore(counters)
        if directory != replay_dir(checkpoint_dir(run_dir), env_steps):
            warn(f"fastrl: policy {runtime.policy} resumes with the replay saved at {saved_env_steps(directory)} "
                 f"env steps: the one of the checkpoint at {env_steps} was not written whole")
        loaded += 1
    return loaded


def restore_learner(learner: BaseLearner, state: dict) -> None:
    """Weights, optimizer, counters and RNG from a checkpoint dict."""
    learner.load_state_dict(state["learner"])
    restore_rng(state.get("rng", {}), learner.device)
