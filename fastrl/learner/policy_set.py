"""The run's policies in one learner process: a LearnerRuntime per policy (its own learner,
optimizer, schedule and normalizers, weight set and statistics row), stepped in turn as their
batches fill, and checkpointed together; with self-play, the league the first policy's updates
feed (fastrl.multiagent.league).

One process for every policy, not one each: the policies share the cores the envs need, and a
policy trains only when a batch of its own rows is full, so taking turns loses nothing the
batches themselves do not hold back.

Checkpoint: the first policy's state is the checkpoint's ``learner`` entry, as in a single-policy
run (fastrl-eval and --resume read it there); with several, ``policies`` maps every name to its
``learner`` state and ``trained_env_steps``.
"""
from __future__ import annotations

import numpy as np
import torch

from ..config import Config, set_typed_value
from ..ipc.arena import Arena
from ..multiagent.league import League
from ..multiagent.policy_map import PolicyMap
from ..tuning.pbt import Population, member_configs
from .base import BaseLearner
from .factory import make_learner
from .runtime import LearnerRuntime, restore_learner, restore_run_replays


def policy_configs(cfg: Config, num_policies: int) -> list[Config]:
    """Each policy's config: the run's, or with population-based training each member's own
    (fastrl.tuning.pbt.member_configs), which its learner reads its hyperparameters from."""
    if cfg.pbt.population:
        return member_configs(cfg, num_policies)
    return [cfg] * num_policies


def make_policy_learners(cfg: Config, spaces, model, device: str, num_policies: int) -> list[BaseLearner]:
    """One learner per policy, each on its config (policy_configs); policy p's network is
    initialised from seed ``cfg.seed + p``, so policies start apart (policy 0's draws are a
    single-policy run's)."""
    learners = []
    for p, policy_cfg in enumerate(policy_configs(cfg, num_policies)):
        if p:
            torch.manual_seed(cfg.seed + p)
        learners.append(make_learner(policy_cfg, *spaces, model=model, device=device))
    return learners


def restore_policies(learners: list[BaseLearner], names: tuple[str, ...], state: dict) -> None:
    """Each policy's learner from a checkpoint (one written by a run of the same policies)."""
    restore_learner(learners[0], state)
    saved = state.get("policies", {})
    for name, learner in zip(names[1:], learners[1:]):
        learner.load_state_dict(saved[name]["learner"])


def checkpoint_policies(state: dict, names: tuple[str, ...], population: int = 0) -> str:
    """Why a resume from ``state`` cannot train these policies (``population`` members of
    fastrl.tuning.pbt, or not), and the settings that would: "" when it holds every one, in their order
    (the first policy's state is the checkpoint's ``learner`` entry). A single-policy checkpoint
    fits any single-policy run, whatever the policy's name."""
    saved = tuple(state.get("policies", {}).keys())
    if saved == names or (not saved and len(names) == 1):
        return ""
    saved_population = len(saved) if "pbt" in state else 0
    trained = (f"a population of {saved_population} members" if saved_population else
               f"policies {', '.join(saved)}" if saved else "one policy")
    asked = f"a population of {population} members" if population else ", ".join(names)
    fix = f"pbt.population={saved_population}" if saved_population or population else \
        "its policies.names and policies.mapping"
    return f"trained {trained} (this run has {asked}); resume it with {fix}"


class PolicyRuntimes:
    """The policies' LearnerRuntimes over one arena (see the module)."""

    def __init__(self, cfg: Config, arena: Arena, learners: list[BaseLearner], policies: PolicyMap, run_dir=None,
                 world_size: int = 1, resume_state: dict | None = None):
        self.names = policies.names
        # Each runtime reads its learner's config: a member's own hyperparameters under pbt.
        self.runtimes = [LearnerRuntime(learner.cfg, arena, learner, run_dir, world_size, policy=p)
                         for p, learner in enumerate(learners)]
        rows = policies.run_row_policies(cfg.env.num_workers, cfg.env.envs_per_worker)
        for p, runtime in enumerate(self.runtimes):
            runtime.env_share = float(np.mean(rows == p)) / world_size
        counters = (resume_state or {}).get("counters", {})
        saved = (resume_state or {}).get("policies", {})
        self.runtimes[0].trained_env_steps = counters.get("trained_env_steps", 0)
        for name, runtime in zip(self.names[1:], self.runtimes[1:]):
            runtime.trained_env_steps = saved.get(name, {}).get("trained_env_steps", 0)
        for name, runtime in zip(self.names, self.runtimes):
            for key, value in saved.get(name, {}).get("hyperparameters", {}).items():
                set_typed_value(runtime.cfg, key, value)
        if resume_state is not None and run_dir is not None and cfg.replay.checkpoint:
            restore_run_replays(run_dir, counters["env_steps"], self.runtimes)
        self.population = None
        if cfg.pbt.population:
            self.population = Population(cfg, arena, self.runtimes, self.names, run_dir,
                                         (resume_state or {}).get("pbt"))
        self.league = None
        if cfg.selfplay.enabled:
            self.league = League(arena, policies.num_policies, cfg.selfplay, run_dir)
            self.league.restore(self.runtimes[0].flat.numel())

    @property
    def first(self) -> LearnerRuntime:
        return self.runtimes[0]

    @property
    def timers(self):
        return self.first.timers

    def progress(self) -> float:
        return self.first.progress()

    def publish(self) -> None:
        for runtime in self.runtimes:
            runtime.publish()
        self._snapshot_if_due()

    def consume(self, policy: int, slot_ids: np.ndarray, release, progress: float | None = None) -> None:
        self.runtimes[policy].consume(slot_ids, release, progress)
        if policy == 0:
            self._snapshot_if_due()
        if self.population is not None:
            self.population.step(self.first.env_steps())

    def flush(self, progress: float | None = None) -> None:
        for runtime in self.runtimes:
            runtime.flush(progress)

    def holds_batch(self) -> bool:
        """Whether a policy's device path holds a gathered batch it has not trained on (see flush)."""
        return any(runtime.holds_batch() for runtime in self.runtimes)

    def checkpoint_due(self) -> bool:
        return self.first.checkpoint_due()

    def checkpoint(self):
        more = {}
        if len(self.runtimes) > 1:
            more["policies"] = {name: {"learner": runtime.learner.state_dict(),
                                       "trained_env_steps": runtime.trained_env_steps,
                                       **({"hyperparameters": self.population.hyperparameters(p)}
                                          if self.population is not None else {})}
                                for p, (name, runtime) in enumerate(zip(self.names, self.runtimes))}
        if self.population is not None:
            more["pbt"] = self.population.state_dict()
        return self.first.checkpoint(more, self.runtimes)

    def _snapshot_if_due(self) -> None:
        if self.league is not None:
            first = self.first
            self.league.after_update(first.learner.version, first.flat_np)
