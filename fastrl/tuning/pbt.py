"""Population-based training: the members of a population, their hyperparameters, and the
exploit-and-explore step the learner process takes every ``pbt.period_env_steps``.

Members are the run's policies (fastrl.multiagent.policy_map: game g of a worker is member g % P), so they
share the rollout workers and the batcher, and each has its own LearnerRuntime: learner,
optimizer, normalizers and hyperparameters (its own copy of the config). The learner process
steps them in turn (fastrl.learner.policy_set), so their updates share its cores rather than
competing with the actors in P processes.

Every period after the warm-up, members are ranked by their objective (``pbt.objective``): the
mean return of their episodes since their last copy (at most the newest
``pbt.objective_episodes``), the mean of an env info number reported at those episodes' ends
(``info/<key>``, recorded by the rollout workers beside the return), or their latest evaluation
of weights published since their last copy (``eval_return_mean``, fastrl.evaluation.evaluator
evaluates every member). A member without one is not ranked. Each member of
the bottom fraction draws a member of the top fraction and, when the top one leads by more than
``pbt.margin_absolute`` and ``pbt.margin_relative`` of its |objective|, copies its weights,
optimizer and normalizer state and its hyperparameters, then multiplies each mutable value by a
factor drawn from ``pbt.perturb`` (or, with ``pbt.reset_prob``, sets it back to its own start
value). With ``pbt.control`` member 0 never copies nor mutates, and takes no bottom member's
place. Every copy is a line of ``RUN_DIR/pbt/lineage.jsonl``; every period's objectives, beside
the hyperparameters that earned them, a line of ``RUN_DIR/pbt/history.jsonl``.
"""
from __future__ import annotations

import copy
import json
import math
from collections import deque
from pathlib import Path

import numpy as np

from ..config import KEYS, Config, PBTConfig, get_value, objective_info_key, set_typed_value
from ..evaluation.evaluator import MemberEvalStats, member_evaluations
from ..files.run_dir import make_dir, open_for_append, write_atomic
from ..ipc.arena import Arena, new_episodes, total_env_steps

MAX_GAMMA = 0.9999  # a perturbed discount stays below 1


def member_configs(cfg: Config, members: int) -> list[Config]:
    """Each member's own config: ``pbt.start`` values applied, and with ``pbt.jitter`` the other
    mutable values of members 1.. multiplied by exp(u), u uniform in [-jitter, jitter] (seeded)."""
    rng = np.random.default_rng((cfg.seed, 0x0B7))
    configs = []
    for k in range(members):
        member = copy.deepcopy(cfg)
        for key, values in cfg.pbt.start.items():
            set_typed_value(member, key, values[k])
        if k and cfg.pbt.jitter:
            for key in cfg.pbt.mutable:
                if key not in cfg.pbt.start:
                    factor = math.exp(rng.uniform(-cfg.pbt.jitter, cfg.pbt.jitter))
                    set_typed_value(member, key, scaled(key, get_value(member, key), factor))
        configs.append(member)
    return configs


def first_exploit_env_steps(settings: PBTConfig) -> int:
    """The run's env steps at the first exploit: the later of the warm-up and the period."""
    return max(settings.warmup_env_steps, settings.period_env_steps)


def info_due_env_steps(cfg: Config) -> int:
    """The run's env steps by which some episode should have reported each info key
    (Config.info_keys), else the Reporter says so: a population's first exploit; without a
    population, 0 (the first report that has episodes)."""
    return first_exploit_env_steps(cfg.pbt) if cfg.pbt.population else 0


def scaled(key: str, value: float, factor: float) -> float:
    """``value`` multiplied by ``factor``; a discount's horizon 1 / (1 - gamma) divided by it instead,
    kept below 1 (a factor applied to gamma itself would pass 1 at once). ``value`` where the
    result is outside ``key``'s range."""
    if key == "learner.gamma":
        new = min(1.0 - (1.0 - value) * factor, MAX_GAMMA)
    else:
        new = value * factor
    try:
        KEYS[key].check(new, None)
    except ValueError:
        return value
    return new


class Population:
    """The exploit-and-explore step over the members' LearnerRuntimes (see the module).
    ``run_dir`` None: nothing written (a test, or a rank other than 0)."""

    def __init__(self, cfg: Config, arena: Arena, runtimes: list, names: tuple[str, ...], run_dir: Path | None,
                 saved: dict | None = None):
        self.settings = cfg.pbt
        self.arena = arena
        self.runtimes = runtimes
        self.names = names
        self.dir = make_dir(Path(run_dir) / "pbt") if run_dir is not None else None
        # What a member's hyperparameters are: what explore changes, and what members start apart in.
        self.keys = list(dict.fromkeys([*cfg.pbt.mutable, *cfg.pbt.start]))
        # What a reset sets each mutable key back to (a resumed run's pbt.mutable may name keys its
        # checkpoint has no start value for: they start where this config starts them).
        self.start_values = [{key: get_value(member, key) for key in cfg.pbt.mutable}
                             for member in member_configs(cfg, len(runtimes))]
        self.objective = cfg.pbt.objective
        self.recent = [deque(maxlen=cfg.pbt.objective_episodes) for _ in runtimes]
        self.episodes_seen = arena.episode_count.copy()
        # The version of each member's first weights since its last copy: an episode begun with an
        # older one was played, in part, by the weights the copy replaced.
        self.copied_version = [0] * len(runtimes)
        # What a member's recent episodes add to its objective ([W, ring] per episode), or None when
        # its evaluations are the objective.
        info_key = objective_info_key(cfg.pbt.objective)
        self.episode_values = (arena.episode_info[:, :, cfg.info_keys.index(info_key)] if info_key else
                               arena.episode_return if cfg.pbt.objective == "episode_return_mean" else None)
        self.evaluated = None  # the newest evaluation read (member_evaluations), [members, 4]
        # The run's env steps when each member last published copied weights: an evaluation that
        # read the counter no later than that may have evaluated the weights it had before.
        self.copied_at = [-1] * len(runtimes)
        self.rng = np.random.default_rng((cfg.seed, 0xE4B))
        self.next_exploit = first_exploit_env_steps(cfg.pbt)
        if saved:
            self.restore(saved)
        else:
            self.write_history(0, [math.nan] * len(runtimes), self.members_hyperparameters())

    def state_dict(self) -> dict:
        return {"next_exploit": self.next_exploit, "rng": json.dumps(self.rng.bit_generator.state),
                "start_values": self.start_values, "objective": self.objective,
                "recent": [list(r) for r in self.recent]}

    def restore(self, saved: dict) -> None:
        self.next_exploit = saved["next_exploit"]
        self.rng.bit_generator.state = json.loads(saved["rng"])
        self.start_values = [{key: kept.get(key, start[key]) for key in start}
                             for start, kept in zip(self.start_values, saved["start_values"])]
        # Recent values of another objective (a resume that changed pbt.objective; checkpoints from
        # before the key held returns) would be ranked beside this one's: start them afresh.
        if saved.get("objective", "episode_return_mean") == self.objective:
            for recent, values in zip(self.recent, saved["recent"]):
                recent.extend(values)
        if self.dir is not None:
            # Exploits after the checkpoint wrote lines that the resumed run writes again.
            for name in ("lineage.jsonl", "history.jsonl"):
                _keep_lines_before(self.dir / name, self.next_exploit)

    def hyperparameters(self, member: int) -> dict:
        return {key: get_value(self.runtimes[member].cfg, key) for key in self.keys}

    def members_hyperparameters(self) -> list[dict]:
        return [self.hyperparameters(k) for k in range(len(self.runtimes))]

    def collect(self) -> None:
        """Take the episodes finished since the last call into their members' recent values (an
        episode whose env did not report the objective's info number adds none, nor one begun
        before its member's last copy)."""
        self.episodes_seen, indices = new_episodes(self.arena, self.episodes_seen)
        if self.episode_values is None:
            return
        for w, index in enumerate(indices):
            for actor, version, value in zip(self.arena.episode_actor[w, index].tolist(),
                                             self.arena.episode_version[w, index].tolist(),
                                             self.episode_values[w, index].tolist()):
                if actor < len(self.recent) and version >= self.copied_version[actor] and math.isfinite(value):
                    self.recent[actor].append(value)

    def objectives(self) -> list[float]:
        """Each member's objective; NaN where it has none yet (not ranked)."""
        if self.episode_values is None:
            return self.evaluations()
        return [float(np.mean(r)) if r else math.nan for r in self.recent]

    def evaluations(self) -> list[float]:
        """Each member's mean return in the newest evaluation, NaN where that evaluation may
        predate the member's last copy (or there is none)."""
        newest = member_evaluations(self.arena)
        if newest is not None:
            self.evaluated = newest
        if self.evaluated is None:
            return [math.nan] * len(self.runtimes)
        return [float(row[MemberEvalStats.RETURN_MEAN]) if row[MemberEvalStats.AT_ENV_STEPS] > copied else math.nan
                for row, copied in zip(self.evaluated, self.copied_at)]

    def step(self, env_steps: int) -> list[tuple[int, int]]:
        """At a period's end, exploit and explore; the (member, copied from) pairs of this step."""
        self.collect()
        if env_steps < self.next_exploit:
            return []
        self.next_exploit = env_steps + self.settings.period_env_steps
        objectives = self.objectives()
        earned = self.members_hyperparameters()  # what the objectives were earned with, before the copies
        copies = self.exploit(objectives)
        for member, parent in copies:
            self.write_lineage(env_steps, member, parent, objectives)
            self.recent[member].clear()
        self.write_history(env_steps, objectives, earned)
        return copies

    def exploit(self, objectives: list[float]) -> list[tuple[int, int]]:
        ranked = [k for k in np.argsort(objectives).tolist() if math.isfinite(objectives[k])]
        count = max(1, int(self.settings.fraction * len(self.runtimes)))
        if len(ranked) < 2 * count:
            return []  # too few members with episodes to tell a bottom from a top
        top = ranked[-count:]
        # The control member takes no bottom slot: when it ranks among the worst, the next worst copy.
        bottom = [k for k in ranked if not (self.settings.control and k == 0)][:count]
        copies = []
        for member in bottom:
            if member in top:
                continue
            parent = int(self.rng.choice(top))
            gap = objectives[parent] - objectives[member]
            if gap <= self.settings.margin_absolute or gap <= self.settings.margin_relative * abs(objectives[parent]):
                continue
            self.copy_member(parent, member)
            self.explore(member)
            self.runtimes[member].publish()
            self.copied_at[member] = total_env_steps(self.arena)
            copies.append((member, parent))
        return copies

    def copy_member(self, source: int, target: int) -> None:
        """Weights, optimizer, normalizers and hyperparameters of ``source`` into ``target``, which
        keeps its own update counters and its envs' running discounted returns (the return
        normalizer's streams are the envs it trains on). Its version moves on by more than its
        ``max_policy_lag``: trajectories acted by the replaced weights, still queued or in flight,
        are then too stale to train on, as a different behaviour policy's are (the lag mask,
        fastrl.learner.vtrace), and its versions stay in order."""
        learner, parent = self.runtimes[target].learner, self.runtimes[source].learner
        for key in self.keys:
            set_typed_value(self.runtimes[target].cfg, key, get_value(self.runtimes[source].cfg, key))
        state = copy.deepcopy(parent.state_dict())
        self.copied_version[target] = learner.version + learner.lcfg.max_policy_lag + 1
        state.update(version=self.copied_version[target], updates=learner.updates,
                     skipped_updates=learner.skipped_updates)
        if "return_scale" in state:
            state["return_scale"]["carry"] = learner.return_scale.state_dict()["carry"]
        learner.load_state_dict(state)

    def explore(self, member: int) -> None:
        cfg = self.runtimes[member].cfg
        for key in self.settings.mutable:
            value = get_value(cfg, key)
            if self.rng.random() < self.settings.reset_prob:
                new = self.start_values[member][key]
            else:
                new = scaled(key, value, float(self.rng.choice(self.settings.perturb)))
            set_typed_value(cfg, key, new)

    def write_lineage(self, env_steps: int, member: int, parent: int, objectives: list[float]) -> None:
        if self.dir is None:
            return
        line = {"env_steps": env_steps, "member": member, "copied": parent,
                "objective": _finite(objectives[member]), "parent_objective": _finite(objectives[parent]),
                "hyperparameters": self.hyperparameters(member)}
        with open_for_append(self.dir / "lineage.jsonl") as f:
            f.write(json.dumps(line) + "\n")

    def write_history(self, env_steps: int, objectives: list[float], hyperparameters: list[dict]) -> None:
        """Each member's objective beside the hyperparameters it was earned with (before this
        step's copies: a copier's new ones are in lineage.jsonl)."""
        if self.dir is None:
            return
        line = {"env_steps": env_steps, "members": [
            {"member": k, "objective": _finite(objectives[k]), "hyperparameters": hyperparameters[k]}
            for k in range(len(self.runtimes))]}
        with open_for_append(self.dir / "history.jsonl") as f:
            f.write(json.dumps(line) + "\n")


def _keep_lines_before(path: Path, env_steps: int) -> None:
    """Keep the lines of ``path`` (lineage or history) written before ``env_steps``; a line cut
    short by a kill goes too."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            written_at = json.loads(line)["env_steps"]
        except (json.JSONDecodeError, TypeError, KeyError):
            continue
        if written_at < env_steps:
            kept.append(line)
    if kept != lines:
        write_atomic(path, "".join(f"{line}\n" for line in kept))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
