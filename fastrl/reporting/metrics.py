"""Metrics: counters in the arena -> one JSON object per report, TensorBoard, W&B, a console line."""
from __future__ import annotations

import json
import math
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import INFO_PREFIX
from ..files.run_dir import make_dir, open_for_append
from ..ipc.arena import Arena, Control, new_episodes, total_env_steps
from .console import Console
from .wandb_logger import open_wandb_logger

# Reports kept in memory for RunResult.reports (metrics.jsonl has every one): about 3 hours at the
# default report_every_s, a few MiB, so a run of weeks does not grow without bound.
HISTORY_REPORTS = 2000

# Slots of arena.learner_stats, written by the learner after every update: name -> meaning. Each is
# the metrics.jsonl key "learner/<name>" (the policy lag and learner_updates are promoted to the top level).
LEARNER_STATS = {
    "learner_updates": "optimizer steps taken (an update skipped for a non-finite loss is not one)",
    "version": "the version of the weights the learner published last: batches trained on",
    "loss": "the total loss of the last batch, averaged over its minibatches",
    "policy_loss": "the policy-gradient part of the loss (APPO, IMPALA)",
    "value_loss": "the value part of the loss; the TD loss for DQN and R2D2",
    "entropy": "the policy's mean entropy over the last batch (APPO, IMPALA; SAC: -mean log pi of its squashed "
               "actions in [-1, 1])",
    "uniform_kl": "KL(uniform over the legal actions || policy), mean over the last batch (APPO, IMPALA with "
                  "learner.uniform_kl_coef > 0): how far the policy is from trying every legal action",
    "grad_norm": "the gradients' global norm before clipping, averaged over the batch's steps",
    "policy_lag_min": "the smallest policy lag in the last batch: learner version minus the version that acted",
    "policy_lag_mean": "the mean policy lag over the last batch's valid steps",
    "policy_lag_max": "the largest policy lag in the last batch",
    "lr": "the learning rate of the last update",
    "skipped_updates": "updates skipped because the loss or a gradient was not finite",
    "trained_env_steps": "env steps the learner has trained on (replayed steps are counted once, as they arrive)",
    "forward_backward_s": "cumulative seconds in the forward and backward passes",
    "vtrace_s": "cumulative seconds computing V-trace targets (APPO, IMPALA)",
    "optimizer_s": "cumulative seconds in the optimizer step",
    "gather_s": "cumulative seconds copying full slots out of the arena into a batch",
    "publish_s": "cumulative seconds publishing the new weights",
    "wait_s": "cumulative seconds blocked until a worker sends full slots",
    "replay_s": "cumulative seconds adding to and sampling from the replay (DQN, R2D2, SAC)",
    "replay_size": "transitions or sequences held by the replay (DQN, R2D2, SAC)",
    "replayed_batches": "batches sampled from the replay since it was made (DQN, R2D2, SAC; a resume starts afresh "
                        "unless replay.checkpoint kept the replay)",
    "replay_ratio_achieved": "replay.replay_ratio as achieved: transitions sampled (R2D2: trained steps) per env step "
                             "the actors took since the replay was made, past replay.min_fill, counting the env "
                             "steps of the rows that feed this learner (a PBT member's games, this rank's envs; "
                             "in self-play the opponents' seats count too, so it reads low)",
    "q_mean": "the mean Q-value of the last sampled batch (DQN, R2D2, SAC)",
    "critic_loss": "SAC: the twin critics' soft TD loss of the last sampled batch",
    "actor_loss": "SAC: the policy's loss, mean(alpha log pi - min Q), of the last sampled batch",
    "temperature": "SAC: the entropy temperature alpha after the last update",
    "temperature_loss": "SAC: the temperature's loss of the last sampled batch (learner.learn_temperature)",
    # the hyperparameters the update used (a pbt member's change over the run)
    "entropy_coef": "learner.entropy_coef as the last update used it (a population's member explores it)",
    "value_coef": "learner.value_coef as the last update used it",
    "ppo_clip": "learner.ppo_clip as the last update used it",
    "max_grad_norm": "learner.max_grad_norm as the last update used it",
    "gamma": "learner.gamma as the last update used it",
}
STAT = {name: i for i, name in enumerate(LEARNER_STATS)}


class WorkerTiming:
    """Columns of rollout worker w's row ``w`` of ``arena.timings``: cumulative seconds.

    Plain ints, as in ``fastrl.ipc.arena.Control``: the hot loops add to these columns thousands of times a
    second, and ``row[column] += dt`` measured ~0.17 us with a plain int (as with a literal) but
    ~0.30 us with an IntEnum member (Python 3.11, numpy 2.4)."""

    ENV_STEP = 0
    OBS_COPY = 1
    WAIT_ACTIONS = 2
    WAIT_SLOTS = 3
    INFERENCE = 4
    # metrics.jsonl key "rollout/<key>" of each column, summed over the workers
    KEYS = {ENV_STEP: "env_step_s", OBS_COPY: "obs_copy_s", WAIT_ACTIONS: "wait_actions_s",
            WAIT_SLOTS: "wait_slots_s", INFERENCE: "inference_s"}
    HELP = {ENV_STEP: "in env.recv(): the envs stepping",
            OBS_COPY: "writing a batch into its slots (its waits for free slots are wait_slots_s)",
            WAIT_ACTIONS: "blocked until the batcher answers a request",
            WAIT_SLOTS: "blocked until the learner returns slots",
            INFERENCE: "acting for its own batches (inference.in_workers): gather, forward, write back"}

    @staticmethod
    def row(arena: Arena, worker_id: int) -> np.ndarray:
        return arena.timings[worker_id]

    @staticmethod
    def cell(arena: Arena, worker_id: int, column: int) -> np.ndarray:
        """One column of the row as a ``[1]`` view, for a part of the worker that adds to that column alone."""
        return arena.timings[worker_id, column:column + 1]


class BatcherTiming:
    """Columns of the inference batcher's row ``W`` of ``arena.timings``: cumulative seconds, then counts."""

    FORWARD = 0
    WEIGHT_REFRESH = 1
    WAIT_REQUESTS = 2
    BATCHES = 3
    REQUESTS = 4
    # metrics.jsonl key "inference/<key>" of each column
    KEYS = {FORWARD: "inference_forward_s", WEIGHT_REFRESH: "weight_refresh_s", WAIT_REQUESTS: "wait_requests_s",
            BATCHES: "inference_batches", REQUESTS: "inference_requests"}
    HELP = {FORWARD: "gathering observations, the forward pass, writing actions back",
            WEIGHT_REFRESH: "loading newly published weights",
            WAIT_REQUESTS: "blocked until a worker sends a request",
            BATCHES: "forward passes run (a count, not seconds)",
            REQUESTS: "worker requests answered (a count; several go into one forward pass)"}

    @staticmethod
    def row(arena: Arena) -> np.ndarray:
        return arena.timings[arena.env_steps.shape[0]]


# Report keys in column order, as fastrl.profiler groups them.
WORKER_TIMINGS = tuple(WorkerTiming.KEYS.values())
INFERENCE_TIMINGS = tuple(BatcherTiming.KEYS.values())

# Every metrics.jsonl key is declared below, once, with its meaning: docs/metrics.md is generated
# from these tables (python -m fastrl.reporting.metrics_reference > docs/metrics.md; tests/unit/test_docs.py checks it).

# The run's headline figures, in every report.
REPORT = {
    "env_steps": "env steps taken by the run: every rank's, with those before a resume",
    "frames": "env_steps times env.frame_skip",
    "env_steps_per_s": "env steps per second since the previous report, summed over the ranks",
    "fps": "frames per second: env_steps_per_s times env.frame_skip",
    "episode_return_mean": "mean return of the episodes finished since the previous report, kept from the last "
                           "report that had some; null before the first (a self-play snapshot's episodes are not "
                           "counted)",
    "episode_length_mean": "mean length in env steps of the same episodes",
    "episodes": "episodes this rank's workers have finished since its processes started",
    "policy_lag_mean": "learner/policy_lag_mean, promoted: the staleness of the data the learner trains on",
    "policy_lag_min": "learner/policy_lag_min, promoted",
    "policy_lag_max": "learner/policy_lag_max, promoted",
    "learner_updates": "learner/learner_updates, promoted",
    "wall_time": "seconds since train() was called, start-up included, summed over resumes",
    "trained_seconds": "seconds counted against train_for_seconds: from the processes' start, summed over resumes",
}
# The figures of the clock, not of the training: two runs that take the same steps (a serial run
# repeated, docs/reproducibility.md) differ in these alone. Every timer's name ends in "_s".
CLOCK_FIGURES = ("env_steps_per_s", "fps", "wall_time", "trained_seconds", "eval_seconds")


def measures_the_clock(key: str) -> bool:
    """Whether the metrics.jsonl ``key`` is a figure of the clock: one of CLOCK_FIGURES, or
    seconds (``*_s``: the timers, ``restart_lost_s``), under any prefix (``policy/<name>/``)."""
    name = key.rsplit("/", 1)[-1]
    return name in CLOCK_FIGURES or name.endswith("_s")


# The learner statistics the report moves to the top level (not repeated under learner/).
PROMOTED_LEARNER_STATS = ("learner_updates", "policy_lag_mean", "policy_lag_min", "policy_lag_max")

# An evaluation's figures (eval.every_s), in the first report after it ends.
EVALUATION = {
    "eval_return_mean": "mean return of the evaluation's episodes",
    "eval_return_std": "their standard deviation",
    "eval_length_mean": "their mean length in env steps",
    "eval_episodes": "how many episodes the evaluation played (eval.episodes)",
    "eval_env_steps": "env steps played by every evaluation of this session so far (not training steps)",
    "eval_weights_version": "the version of the weights evaluated",
    "eval_at_env_steps": "training env steps when the evaluated weights were taken",
    "eval_seconds": "how long the evaluation took",
    "eval_best_return": "the best eval_return_mean so far: the one checkpoints/best.pt holds (eval.best_by "
                        "resolved to return; with eval.confirm_best, its second round's)",
    "eval_opponent_score": "the score against eval.opponents: each one's win_rate + draw_rate / 2, averaged",
    "eval_best_opponent_score": "the best eval_opponent_score so far: the one checkpoints/best.pt holds "
                                "(eval.best_by resolved to opponents; with eval.confirm_best, its second round's)",
}
# The results against one scripted opponent of eval.opponents: eval/<opponent>/<key>.
OPPONENT = {
    "win_rate": "share of the games against the opponent that the policy won",
    "draw_rate": "share drawn",
    "loss_rate": "share lost",
    "episodes": "games played against it",
    "episode_return_mean": "the policy's mean return in them (its own seats': the adversaries' in MPE's simple_tag)",
}
OPPONENT_STATS = tuple(OPPONENT)

# Each policy's figures (policy/<name>/<key>, with several policies) or each population member's
# (member/<k>/<key>, with pbt.population > 1); learner/<stat> and info/<key> are repeated there too.
POLICY = {
    "episode_return_mean": "mean return of this policy's episodes since the previous report, kept from the last "
                           "report that had some",
    "episode_length_mean": "their mean length",
    "episodes_recent": "how many of its episodes ended since the previous report",
}

# The self-play league (selfplay.enabled): league/<key>, the first policy's games against snapshots.
LEAGUE = {
    "games": "games against snapshots that ended since the previous report",
    "win_rate": "share of those games won",
    "draw_rate": "share drawn",
    "loss_rate": "share lost",
    "snapshots": "snapshots in the league now",
    "rating": "the policy's openskill rating (its ordinal)",
}


@dataclass(frozen=True)
class Metric:
    """One metrics.jsonl key: ``<...>`` in ``key`` marks a part the run fills in; ``when`` says
    which reports hold it."""

    key: str
    meaning: str
    when: str


def _metrics() -> tuple[Metric, ...]:
    every, evaluating = "every report", "after an evaluation (eval.every_s)"
    policy = "several policies: policy/<name>/; a population: member/<k>/"
    learner = {name: meaning for name, meaning in LEARNER_STATS.items() if name not in PROMOTED_LEARNER_STATS}
    rows = [Metric(key, meaning, every) for key, meaning in REPORT.items()]
    rows += [Metric(f"learner/{name}", meaning, "every report (the first policy's learner)")
             for name, meaning in learner.items()]
    rows += [Metric(f"rollout/{WorkerTiming.KEYS[c]}", f"cumulative seconds {meaning}, summed over the workers", every)
             for c, meaning in WorkerTiming.HELP.items()]
    rows += [Metric(f"inference/{BatcherTiming.KEYS[c]}",
                     meaning if c in (BatcherTiming.BATCHES, BatcherTiming.REQUESTS)
                     else f"cumulative seconds {meaning}",
                     every) for c, meaning in BatcherTiming.HELP.items()]
    rows.append(Metric(f"{INFO_PREFIX}<key>", "mean of the number info[<key>] at the end of the episodes that reported "
                       "it since the previous report, kept from the last report that had one", "env.info_keys"))
    rows += [Metric(key, meaning, evaluating) for key, meaning in EVALUATION.items()]
    rows.append(Metric("eval_video", "the path of the evaluation's new clip inside the run directory",
                       "after an evaluation that recorded a clip (eval.video_every_s)"))
    rows += [Metric(f"eval/<opponent>/{key}", meaning, "after an evaluation, for each of eval.opponents")
             for key, meaning in OPPONENT.items()]
    rows += [Metric(f"<policy>/{key}", meaning, policy) for key, meaning in POLICY.items()]
    rows += [Metric("<policy>/learner/<stat>", "that policy's learner/<stat> (learner_updates and the policy lag "
                    "included)", policy),
             Metric(f"<policy>/{INFO_PREFIX}<key>", f"{INFO_PREFIX}<key> over that policy's episodes",
                    f"{policy}; env.info_keys")]
    rows += [Metric(f"member/<k>/{key}", f"{key} of member k's weights", "a population, after an evaluation")
             for key in ("eval_return_mean", "eval_length_mean")]
    rows += [Metric(f"league/{key}", meaning, "self-play (selfplay.enabled)") for key, meaning in LEAGUE.items()]
    rows.append(Metric("league/snapshot_ratings", "each snapshot's openskill rating, keyed by its version",
                       "self-play (selfplay.enabled)"))
    rows += [Metric(f"league/scripted/<opponent>/{key}", meaning.replace("against the opponent", "against it in the "
                    "league"), "self-play, for each of selfplay.scripted_opponents") for key, meaning in
             {**{k: v for k, v in OPPONENT.items() if k != "episodes"},
              "games": "games against it that ended since the previous report"}.items()]
    rows += [Metric("worker_restarts", "rollout workers restarted after a crash in this session", "a parallel run"),
             Metric("evaluator_restarts", "times the evaluator was restarted in this session", "a run that evaluates"),
             Metric("restarts", "restarts of this torchrun job so far", "torchrun with --max-restarts"),
             Metric("restart_lost_s", "wall time the job's restarts lost: work done since the checkpoint each "
                    "resumed", "torchrun with --max-restarts"),
             Metric("epsilon_late_at_env_steps", "env steps of the main rank (of the run, on one node) when its "
                    "actors took up learner.epsilon_late (learner.epsilon_late_after_steps, and "
                    "learner.epsilon_late_return_episodes' gate); each rank switches on its own episodes",
                    "dqn and r2d2, once the late exploration rate is in use"),
             Metric("world_size", "ranks in the run", "a distributed run"),
             Metric("env_steps_per_rank", "each rank's env steps, a list", "a distributed run")]
    return tuple(rows)


METRICS = _metrics()


def declared(key: str) -> bool:
    """Whether ``key`` (a key of a metrics.jsonl line) matches a key of METRICS."""
    return any(_pattern(metric.key).fullmatch(key) for metric in METRICS)


def _pattern(key: str) -> re.Pattern:
    """``<policy>`` matches ``policy/<name>`` or ``member/<k>``, ``<stat>`` a name of LEARNER_STATS,
    any other ``<...>`` one part of a path."""
    special = {"<policy>": "(policy/[^/]+|member/[0-9]+)", "<stat>": f"({'|'.join(LEARNER_STATS)})"}
    parts = re.split(r"(<[a-z]+>)", key)
    regex = "".join(special.get(part, "[^/]+") if part.startswith("<") else re.escape(part) for part in parts)
    return re.compile(regex)


def read_timings(arena: Arena) -> dict:
    """Cumulative component seconds: summed over rollout workers, and the batcher's own."""
    W = arena.env_steps.shape[0]
    out = {f"rollout/{key}": float(arena.timings[:W, column].sum()) for column, key in WorkerTiming.KEYS.items()}
    batcher = BatcherTiming.row(arena)
    out.update({f"inference/{key}": float(batcher[column]) for column, key in BatcherTiming.KEYS.items()})
    return out


def write_learner_stats(arena: Arena, stats: dict, policy: int = 0) -> None:
    row = arena.learner_stats[policy]
    for name, value in stats.items():
        if name in STAT:
            row[STAT[name]] = value


def saved_learner_stats(learner_state: dict) -> dict:
    """The counters a checkpoint's learner state holds (BaseLearner.state_dict), as its
    learner_stats would show them (BaseLearner.counters)."""
    return {"lr": learner_state["optimizer"]["param_groups"][0]["lr"], "learner_updates": learner_state["updates"],
            "skipped_updates": learner_state.get("skipped_updates", 0), "version": learner_state["version"]}


def read_learner_stats(arena: Arena, policy: int = 0) -> dict:
    row = arena.learner_stats[policy]
    return {name: float(row[i]) for name, i in STAT.items()}


class MetricsWriteError(RuntimeError):
    """metrics.jsonl could not be written (a full disk, say); the message names the path and the error."""


class Reporter:
    """Builds a report from the arena every ``report_every_s``; appends it to metrics.jsonl, and
    keeps the run's two clocks, both summed over resumes (``*_before``: the resumed checkpoint's):

    - ``wall_time``: seconds since the run was launched (``train()`` called), start-up included;
    - trained seconds, what ``train_for_seconds`` counts: from when this session's processes were
      started (the Reporter is made right after), so the env probe and spawning are not counted.
      It does not wait for the first env step: the profiler plans its runs as start-up allowance
      + warm-up + measured seconds on this clock.

    ``tick()`` publishes both in the arena, where the learner reads them for its checkpoints and
    learning-rate schedule, so every part of a run agrees on them.

    ``stop_when`` (a single node's run) is called with every report once it is written; once it
    returns True the budget counts as reached: the run stops as it would at its budget.

    ``report_due()`` says when the run's loop reports next: every ``report_every_s``, or with
    ``report_every_env_steps`` (a serial run's) at the first check at or past each multiple of it,
    so that a run whose steps repeat writes its reports at the same steps (docs/reproducibility.md).

    A report that follows the one before by less than half of the period (the one a run writes as
    it stops, most often) averages the episodes of both: on its own it could hold two episodes,
    and a sweep's value, a benchmark's final figure and the last status line read it."""

    def __init__(self, arena: Arena, run_dir: Path | None, frame_skip: int, target_env_steps: int,
                 target_seconds: float, console: Console | None = None, launched_at: float | None = None,
                 aggregate=None, wall_before: float = 0.0, trained_before: float = 0.0,
                 policy_names: tuple[str, ...] = ("main",), league=None, members: bool = False,
                 info_keys: tuple[str, ...] = (), info_due_env_steps: int = 0,
                 objective: str = "episode_return_mean", stop_when=None, report_every_s: float = 0.0,
                 report_every_env_steps: int = 0):
        self.arena = arena
        self.report_every_s = report_every_s
        self.report_every_env_steps = report_every_env_steps
        self.previous_episodes: tuple[np.ndarray, ...] | None = None  # the last report's own episodes
        self.policy_names = tuple(policy_names)
        # A population's members report as member/<k>/..., other policies as policy/<name>/...
        self.members = members
        self.policy_prefixes = tuple(f"member/{k}/" if members else f"policy/{name}/"
                                     for k, name in enumerate(self.policy_names))
        self.league = league  # fastrl.multiagent.league.LeagueRecord with self-play
        self.policy_means = {name: (math.nan, math.nan) for name in self.policy_names}
        # Env info numbers recorded with each episode (Config.info_keys): their means, the run's
        # and each policy's, kept from the last report that had some. A key no episode has reported
        # by ``info_due_env_steps`` (a population's first exploit) is named once in a notice.
        self.info_keys = tuple(info_keys)
        self.info_means = np.full(len(self.info_keys), np.nan)
        self.policy_info_means = {name: np.full(len(self.info_keys), np.nan) for name in self.policy_names}
        self.info_due_env_steps = info_due_env_steps
        self.info_checked = not self.info_keys
        # What the status line's best member is best at (pbt.objective), each member's latest figure.
        self.objective = objective
        self.member_objectives = [math.nan] * len(self.policy_names)
        self.frame_skip = frame_skip
        self.target_env_steps = target_env_steps
        self.target_seconds = target_seconds
        self.console = console if console is not None else Console(None, quiet=True)
        # wall_time counts from the train() call: process start-up is part of the user's wait.
        self.start = launched_at if launched_at is not None else time.time()
        self.wall_before = wall_before
        self.trained_before = trained_before
        self.training_started = time.time()
        self.last_time = time.time()
        self.last_steps = self.env_steps()
        self.next_report_s = self.last_time + report_every_s
        self.next_report_steps = self._next_multiple(self.last_steps)
        self.episodes_seen = self.arena.episode_count.copy()
        self.return_mean = math.nan
        self.length_mean = math.nan
        self.path = Path(run_dir) / "metrics.jsonl" if run_dir else None
        self.tb = _tensorboard_writer(run_dir) if run_dir else None
        self.history: deque[dict] = deque(maxlen=HISTORY_REPORTS)
        self.metrics_ok = True  # False once metrics.jsonl could not be written
        # Distributed runs: all ranks' counter vectors -> [world_size, k] (fastrl.distributed.process_group).
        self.aggregate = aggregate
        self.stop_agreed = False
        self.stop_when = stop_when
        self.stop_asked = False
        # W&B starts on its own thread: nothing here waits for its server (fastrl.reporting.wandb_logger).
        self.wandb = open_wandb_logger(run_dir, self.console.notice) if run_dir else None

    def env_steps(self) -> int:
        return total_env_steps(self.arena)

    def wall_time(self) -> float:
        return self.wall_before + time.time() - self.start

    def trained_seconds(self) -> float:
        """Seconds counted against ``train_for_seconds``: this session's since its processes were
        started, and the run's before the resume."""
        return self.trained_before + time.time() - self.training_started

    def tick(self) -> None:
        """Publish both clocks in the arena (for the learner's checkpoints and LR schedule)."""
        self.arena.control[Control.WALL_MS] = int(self.wall_time() * 1000)
        self.arena.control[Control.TRAINED_MS] = int(self.trained_seconds() * 1000)

    def time_up(self) -> bool:
        return bool(self.target_seconds) and self.trained_seconds() >= self.target_seconds

    def budget_reached(self) -> bool:
        """This rank's own view: its steps (with the resumed count) or the time budget."""
        self.tick()
        return bool(self.target_env_steps and self.env_steps() >= self.target_env_steps) or self.time_up() or \
            self.stop_asked

    def _next_multiple(self, steps: int) -> int:
        every = self.report_every_env_steps
        return (steps // every + 1) * every if every else 0

    def report_due(self) -> bool:
        """Whether the next report is due (see the class): by env steps or by the clock."""
        if self.report_every_env_steps:
            return self.env_steps() >= self.next_report_steps
        return time.time() >= self.next_report_s

    def seconds_to_report(self) -> float:
        """How long the run's loop may wait before the next report by the clock is due."""
        return max(0.0, self.next_report_s - time.time())

    def _short(self, seconds: float, steps: int) -> bool:
        """Whether a report ``seconds`` and ``steps`` after the one before comes within half a period."""
        if self.report_every_env_steps:
            return steps < self.report_every_env_steps / 2
        return seconds < self.report_every_s / 2

    def recent_episodes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Episodes finished since the last report (at most the ring's size per worker): returns,
        lengths, the weight set that played each (a policy, or a self-play snapshot), the
        snapshot version its policy played against (-1: none), and their env info numbers
        ``[episodes, len(info_keys)]`` (NaN: not reported)."""
        self.episodes_seen, indices = new_episodes(self.arena, self.episodes_seen)
        columns = (self.arena.episode_return, self.arena.episode_length, self.arena.episode_actor,
                   self.arena.episode_opponent, *((self.arena.episode_info,) if self.info_keys else ()))
        parts: list[list[np.ndarray]] = [[] for _ in columns]
        for w, index in enumerate(indices):
            for part, column in zip(parts, columns):
                part.append(column[w, index])
        returns, lengths, actors, opponents, *info = (np.concatenate(part) for part in parts)
        return returns, lengths, actors, opponents, info[0] if info else np.empty((len(returns), 0))

    def policy_episodes(self, returns: np.ndarray, lengths: np.ndarray, actors: np.ndarray, info: np.ndarray) -> dict:
        """``policy/<name>/...`` figures of each policy: its episodes (means kept from the last
        report that had some) and its learner's statistics."""
        out = {}
        for p, (name, prefix) in enumerate(zip(self.policy_names, self.policy_prefixes)):
            mine = actors == p
            if mine.any():
                self.policy_means[name] = (float(returns[mine].mean()), float(lengths[mine].mean()))
            out[prefix + "episode_return_mean"], out[prefix + "episode_length_mean"] = self.policy_means[name]
            out[prefix + "episodes_recent"] = int(mine.sum())
            out.update(self.info_figures(*info_totals(info[mine]), self.policy_info_means[name], prefix))
            out.update({f"{prefix}learner/{k}": v for k, v in read_learner_stats(self.arena, p).items()})
        return out

    def info_figures(self, sums: np.ndarray, counts: np.ndarray, means: np.ndarray, prefix: str = "") -> dict:
        """``<prefix>info/<key>``: each key's mean over the episodes that reported it (info_totals);
        ``means`` keeps each from the last report that had one, and is updated here."""
        known = counts > 0
        means[known] = sums[known] / counts[known]
        return {f"{prefix}{INFO_PREFIX}{key}": float(mean) for key, mean in zip(self.info_keys, means)}

    def check_info_reported(self, steps: int, episodes: int) -> None:
        """One notice per env info key that no episode reported by ``info_due_env_steps``: the
        figures (and a pbt.objective of info/<key>) stay unknown, the run goes on."""
        if self.info_checked or steps < self.info_due_env_steps or not episodes:
            return
        self.info_checked = True
        for key, mean in zip(self.info_keys, self.info_means):
            if not math.isfinite(mean):
                self.console.notice(f"[fastrl] warning: none of the {episodes} episodes so far reported a number "
                                    f"info[{key!r}] at its end, so {INFO_PREFIX}{key} is unknown (members are not "
                                    f"ranked by it): check the name against the env's info, or drop it from "
                                    f"env.info_keys / pbt.objective")

    def report(self, extra: dict | None = None) -> dict:
        """One report. In a distributed run this is a collective: every rank calls it in step,
        and ``stop_agreed`` tells all of them the same answer (time up anywhere, or the summed
        env steps reached the target). Raises MetricsWriteError if metrics.jsonl cannot be written."""
        self.tick()
        time_up = self.time_up()
        now = time.time()
        steps = self.env_steps()
        rate = (steps - self.last_steps) / max(now - self.last_time, 1e-9)
        short = self._short(now - self.last_time, steps - self.last_steps)
        self.last_time, self.last_steps = now, steps
        if now >= self.next_report_s:
            self.next_report_s += self.report_every_s
        self.next_report_steps = self._next_multiple(steps)
        fresh = self.recent_episodes()
        returns, lengths, actors, opponents, info = fresh
        # The league counts each game once: only this report's own games.
        ours = actors < len(self.policy_names)
        league = self.league.record(opponents[ours], returns[ours]) if self.league is not None else {}
        if short and self.previous_episodes is not None:
            returns, lengths, actors, opponents, info = (np.concatenate(pair) for pair in
                                                         zip(self.previous_episodes, fresh))
        self.previous_episodes = fresh
        by_policy = self.policy_episodes(returns, lengths, actors, info)
        # A self-play snapshot's episodes are the opponent's: the run's figures are its policies'.
        ours = actors < len(self.policy_names)
        returns, lengths = returns[ours], lengths[ours]
        local = np.array([steps, rate, returns.sum(), len(returns), lengths.sum(), float(time_up),
                          *np.concatenate(info_totals(info[ours]))])
        table = local[None] if self.aggregate is None else self.aggregate(local)
        steps, rate, return_sum, episodes, length_sum, any_time_up, *info_sums_counts = table.sum(axis=0)
        steps, rate = int(steps), float(rate)
        if episodes:
            self.return_mean, self.length_mean = float(return_sum / episodes), float(length_sum / episodes)
        self.stop_agreed = bool(any_time_up) or bool(self.target_env_steps and steps >= self.target_env_steps)
        self.arena.control[Control.RUN_ENV_STEPS] = steps
        learner = read_learner_stats(self.arena)
        record = {
            "env_steps": steps, "frames": steps * self.frame_skip, "env_steps_per_s": rate,
            "fps": rate * self.frame_skip, "episode_return_mean": self.return_mean,
            "episode_length_mean": self.length_mean, "episodes": int(self.arena.episode_count.sum()),
            "policy_lag_mean": learner["policy_lag_mean"], "policy_lag_min": learner["policy_lag_min"],
            "policy_lag_max": learner["policy_lag_max"], "learner_updates": int(learner["learner_updates"]),
            "wall_time": self.wall_before + now - self.start, "trained_seconds": self.trained_seconds(),
        }
        record.update({f"learner/{k}": v for k, v in learner.items()
                       if k not in ("learner_updates", "policy_lag_mean", "policy_lag_min", "policy_lag_max")})
        keys = len(self.info_keys)
        record.update(self.info_figures(np.array(info_sums_counts[:keys]), np.array(info_sums_counts[keys:]),
                                        self.info_means))
        if len(self.policy_names) > 1:
            record.update(by_policy)
        record.update(league)
        if self.aggregate is not None:
            record.update(world_size=len(table), env_steps_per_rank=[int(v) for v in table[:, 0]])
        if self.arena.control[Control.EPSILON_LATE_AT]:
            record["epsilon_late_at_env_steps"] = int(self.arena.control[Control.EPSILON_LATE_AT])
        record.update(read_timings(self.arena))
        record.update(extra or {})
        self.check_info_reported(steps, record["episodes"])
        if self.members:
            for k, prefix in enumerate(self.policy_prefixes):
                value = record.get(prefix + self.objective, math.nan)
                if math.isfinite(value):
                    self.member_objectives[k] = value
        self.history.append(record)
        if self.path and self.metrics_ok:
            self._append(record)
        if self.tb:
            for key, value in record.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tb.add_scalar(key, value, steps)
            self.tb.flush()
        if self.wandb:
            self.wandb.log(record)
            if "eval_video" in record and self.path is not None:
                self.wandb.log_video(self.path.parent / record["eval_video"], steps)
        self.console.status(self.status_line(record))
        self.stop_asked = self.stop_asked or (self.stop_when is not None and bool(self.stop_when(record)))
        return record

    def _append(self, record: dict) -> None:
        try:
            with open_for_append(self.path) as f:
                f.write(json.dumps(finite_or_null(record)) + "\n")
        except OSError as exc:
            self.metrics_ok = False  # one error, not one per report while the run stops
            raise MetricsWriteError(f"cannot write {self.path}: {exc.strerror or exc}; free space (or fix the "
                                    f"path), then continue the run with --resume") from None

    def status_line(self, r: dict) -> str:
        """The console line; its ETA is the nearer of the two budgets, both counted from the
        start of the run (a resumed run counts what it did before)."""
        target = f"/{self.target_env_steps:,}" if self.target_env_steps else ""
        etas = []
        if self.target_env_steps and r["env_steps_per_s"] > 0:
            etas.append((self.target_env_steps - r["env_steps"]) / r["env_steps_per_s"])
        if self.target_seconds:
            etas.append(self.target_seconds - self.trained_seconds())
        eta = f"  ETA {max(0.0, min(etas)):.0f}s" if etas else ""
        evaluated = f"  eval {r['eval_return_mean']:.2f}" if "eval_return_mean" in r else ""
        if self.members:
            best = max(range(len(self.policy_names)), key=lambda k: _or_low(self.member_objectives[k]))
            by = "" if self.objective == "episode_return_mean" else f" {self.objective}"
            evaluated += f"  best member {best}{by} {self.member_objectives[best]:.2f}"
        return (f"[fastrl] steps {r['env_steps']:,}{target}  fps {r['fps']:,.0f}  "
                f"return {r['episode_return_mean']:.2f}{evaluated}  "
                f"lag {r['policy_lag_mean']:.1f}/{r['policy_lag_max']:.0f}  "
                f"updates {r['learner_updates']}{eta}")

    def close(self) -> None:
        if self.wandb:
            self.wandb.close()
        if self.tb:
            self.tb.close()


def info_totals(info: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sums and counts ``[keys]`` of the env info numbers ``info`` ``[episodes, keys]`` that
    were reported (finite; NaN: the env did not report the key at that episode's end)."""
    reported = np.isfinite(info)
    return np.where(reported, info, 0.0).sum(axis=0), reported.sum(axis=0)


def _or_low(value: float) -> float:
    """A figure to rank by: NaN (no episode yet) ranks last."""
    return value if math.isfinite(value) else -math.inf


def finite_or_null(record: dict) -> dict:
    """JSON has no NaN: report unknown figures (no episode finished yet) as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def _tensorboard_writer(run_dir):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is the optional extra fastrl[tb]
        return None
    return SummaryWriter(log_dir=str(make_dir(Path(run_dir) / "tb")))
