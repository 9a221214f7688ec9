"""A training run as settled before anything starts (RunPlan), what it returns (RunResult) and how
it fails (RunError): the terms the runner's parts (fastrl.run.preflight, fastrl.run.parallel,
fastrl.run.serial, fastrl.run.supervisor) share."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config
from ..distributed.process_group import DistInfo
from ..envs import EnvSpec
from ..files.run_dir import RunDirLock
from ..ipc.arena import Arena, ArenaLayout, Control
from ..multiagent.league import LeagueRecord
from ..multiagent.policy_map import PolicyMap
from ..reporting.metrics import saved_learner_stats, write_learner_stats


class RunError(RuntimeError):
    """The run could not go on; the message says which process failed and why."""


class ChildExited(RunError):
    """A child that is not restarted (the learner, the batcher) exited while the run went on."""


@dataclass
class RunResult:
    """What train() returns: the run's reports (metrics.jsonl's lines) and, for a parallel run that
    SIGINT or SIGTERM stopped before its budget (final report and checkpoint written), the
    signal's name in ``stopped_by``, so that code training runs one after another can stop too.
    A serial run stopped by Ctrl-C raises KeyboardInterrupt instead."""
    run_dir: Path | None
    reports: list[dict] = field(default_factory=list)
    stopped_by: str = ""

    @property
    def final(self) -> dict:
        return self.reports[-1] if self.reports else {}


@dataclass(frozen=True)
class RunPlan:
    """What fastrl.run.preflight settled, handed to the parallel or the serial run.

    ``model`` is the user's network (None: the built-in one, built from ``cfg.model``);
    ``device`` and ``inference_device`` are resolved for this rank (fastrl.run.preflight.resolve_device);
    ``resume_state`` is the checkpoint a resumed run continues from (None: a new run);
    ``launched_at`` is when train() was called (``time.time()``); ``lock`` is the lock on
    ``run_dir`` (None without one), which the learner process shares; ``policies`` the run's
    policies over the env's agents; ``restart_metrics`` what an elastic torchrun job reports of its
    restarts (fastrl.run.elastic), on its main rank; ``stop_when`` train()'s (see fastrl.reporting.metrics.Reporter)."""

    cfg: Config
    run_dir: Path | None
    spec: EnvSpec
    layout: ArenaLayout
    model: object | None
    device: str
    inference_device: str
    resume_state: dict | None
    launched_at: float
    dist_info: DistInfo
    lock: RunDirLock | None
    policies: PolicyMap
    restart_metrics: dict = field(default_factory=dict)
    stop_when: Callable[[dict], bool] | None = None

    @property
    def clocks(self) -> tuple[float, float]:
        """(wall time, trained seconds) the run had before a resume: where the Reporter's clocks start."""
        counters = self.resume_state["counters"] if self.resume_state else {}
        return counters.get("wall_time", 0.0), counters.get("trained_seconds", counters.get("wall_time", 0.0))

    def league_record(self, arena: Arena, main: bool = True) -> LeagueRecord | None:
        """With self-play, the runner's record of the league in ``arena`` (written by the main rank)."""
        if not self.cfg.selfplay.enabled:
            return None
        return LeagueRecord(arena, self.policies.num_policies, self.cfg.selfplay, self.run_dir if main else None,
                            self.policies.names[0])

    def new_arena(self, shared: bool) -> Arena:
        """The run's arena (private memory unless ``shared``), its counters carried over from a resume."""
        arena = Arena(self.layout, shared=shared)
        arena.weight_version[:] = -1  # no weights published yet, in any weight set
        if self.resume_state is not None:
            # The run's count before the resume, shared out so that the ranks' counts sum to it.
            counters = self.resume_state["counters"]
            done, ranks = counters["env_steps"], self.dist_info.world_size
            arena.control[Control.ENV_STEPS_OFFSET] = done // ranks + (done % ranks if self.dist_info.is_main else 0)
            arena.control[Control.RUN_ENV_STEPS] = done
            if self.cfg.learner.epsilon_late_after_steps:  # a late exploration stage begun stays begun
                arena.control[Control.EPSILON_LATE_AT] = counters.get("epsilon_late_at_env_steps", 0)
            arena.control[Control.WALL_MS] = int(counters.get("wall_time", 0.0) * 1000)
            arena.control[Control.TRAINED_MS] = int(counters.get("trained_seconds", counters.get("wall_time", 0.0))
                                                    * 1000)
            # Reports before the learner's first update (it loads for seconds) show the resumed
            # counters, lr and a population member's hyperparameters, not zeros.
            saved = self.resume_state.get("policies", {})
            for policy, name in enumerate(self.policies.names):
                entry = saved.get(name, {})
                learner = self.resume_state["learner"] if policy == 0 else entry["learner"]
                trained = counters.get("trained_env_steps", 0) if policy == 0 else entry.get("trained_env_steps", 0)
                hyperparameters = {k.split(".")[-1]: v for k, v in entry.get("hyperparameters", {}).items()}
                write_learner_stats(arena, {**hyperparameters, **saved_learner_stats(learner),
                                            "trained_env_steps": trained}, policy)
        return arena
