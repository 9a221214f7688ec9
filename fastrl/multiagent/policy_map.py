"""Which policy acts for, and trains on, each agent row: ``[policies]`` (names, mapping) applied to
the env's agents, or with population-based training the members, one per game in turn. A game's
agents are consecutive rows of a worker (fastrl/envs/multiagent/pettingzoo_backend.py), so row ``r``
is agent ``r % n`` of its game; a single-agent env has one agent, ``SINGLE_AGENT``."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..config import Config, ConfigError
from ..user_code import first_line, load_callable

SINGLE_AGENT = "agent"  # the agent id of a single-agent env's rows (what a mapping callable is given)
AGENT_INDEX = re.compile(r"_\d+$")  # PettingZoo names agents KIND_INDEX: adversary_0, agent_1
ACTOR_DTYPE = np.int16  # arena.env_actor: a weight set's index


@dataclass(frozen=True)
class PolicyMap:
    """``names``: the run's policies, in weight-set order; ``agents``: a game's agents, in row
    order; ``agent_policy[i]``: the index in ``names`` of agent ``i``'s policy."""

    names: tuple[str, ...]
    agents: tuple[str, ...]
    agent_policy: tuple[int, ...]
    members: int = 0  # population-based training: game g of a worker is member g % members's

    @property
    def num_policies(self) -> int:
        return len(self.names)

    def row_policies(self, num_rows: int) -> np.ndarray:
        """``[num_rows]`` policy index of each row of a worker (whole games)."""
        if self.members:
            return ((np.arange(num_rows) // len(self.agents)) % self.members).astype(ACTOR_DTYPE)
        return np.tile(np.asarray(self.agent_policy, ACTOR_DTYPE), num_rows // len(self.agents))

    def run_row_policies(self, num_workers: int, envs_per_worker: int) -> np.ndarray:
        """``[num_workers * envs_per_worker]`` policy index of every env row of a run, as
        ``arena.slot_env`` numbers them (what routes a full slot to its policy's learner)."""
        return np.tile(self.row_policies(envs_per_worker), num_workers)

    def agents_of(self, policy: int) -> list[str]:
        return [agent for agent, p in zip(self.agents, self.agent_policy) if p == policy]


def policy_map(cfg: Config, agents: tuple[str, ...]) -> PolicyMap:
    """``cfg.policies`` applied to ``agents`` (a game's, in row order; () for a single-agent env);
    ConfigError (one line) for a mapping that names no policy of the run, or leaves one unused."""
    agents = tuple(agents) or (SINGLE_AGENT,)
    pcfg = cfg.policies
    names = tuple(pcfg.names)
    if cfg.pbt.population:
        members = cfg.pbt.population
        return PolicyMap(tuple(f"member_{k}" for k in range(members)), agents, (0,) * len(agents), members)
    if pcfg.mapping == "per_agent":
        if names != ("main",) and names != agents:
            raise ConfigError(f"policies.mapping=per_agent names each policy after its agent ({', '.join(agents)}): "
                              f"leave policies.names at its default")
        return PolicyMap(agents, agents, tuple(range(len(agents))))
    if pcfg.mapping == "shared":
        return PolicyMap(names[:1], agents, (0,) * len(agents))
    if pcfg.mapping == "by_kind":
        kinds = tuple(dict.fromkeys(agent_kind(agent) for agent in agents))
        if names != ("main",) and sorted(names) != sorted(kinds):
            raise ConfigError(f"policies.mapping=by_kind names each policy after its agents' kind ({', '.join(kinds)}):"
                              f" leave policies.names at its default, or list those kinds in the order you want")
        # Listed kinds set the policies' order: the first is the one evaluated during training.
        order = kinds if names == ("main",) else names
        return PolicyMap(order, agents, tuple(order.index(agent_kind(agent)) for agent in agents))
    fn = load_callable(pcfg.mapping, "policies.mapping", "fn(agent_id) returning a policy name", ConfigError)
    chosen = []
    for agent in agents:
        try:
            name = fn(agent)
        except Exception as exc:  # the user's code: its failure is theirs to fix, said in one line
            raise ConfigError(f"policies.mapping {pcfg.mapping} failed for agent {agent!r} ({first_line(exc)}); "
                              f"give module:fn with fn(agent_id) returning a policy name") from None
        if name not in names:
            raise ConfigError(f"policies.mapping {pcfg.mapping} sends agent {agent!r} to {name!r}, which is not one "
                              f"of policies.names ({', '.join(names)}): add it there or fix the mapping")
        chosen.append(names.index(name))
    unused = [name for p, name in enumerate(names) if p not in chosen]
    if unused:
        raise ConfigError(f"policies.mapping {pcfg.mapping} sends no agent to {', '.join(unused)}: a policy "
                          f"nothing plays never trains; drop it from policies.names")
    return PolicyMap(names, agents, tuple(chosen))


def agent_kind(agent: str) -> str:
    """An agent's name without its index: adversary_0 -> adversary (policies.mapping=by_kind)."""
    return AGENT_INDEX.sub("", agent)


def check_policy_spaces(env_id: str, policies: PolicyMap, agent_spaces: tuple) -> None:
    """Where the agents' observation spaces differ (``agent_spaces``, each agent's; their rows
    are padded to one, fastrl.envs.multiagent.pettingzoo_games.row_spaces), each policy must act
    for agents of one space: a network fed predators' and prey's padded vectors in the same
    inputs would read each as the other. ConfigError (one line) naming the policy, its agents'
    spaces and the fix."""
    if not agent_spaces:
        return
    for p, name in enumerate(policies.names):
        mine = [k for k in range(len(policies.agents)) if policies.members or policies.agent_policy[k] == p]
        spaces = dict.fromkeys(str(agent_spaces[k]) for k in mine)
        if len(spaces) > 1:
            groups = "; ".join(f"{', '.join(policies.agents[k] for k in mine if str(agent_spaces[k]) == space)}: "
                               f"{space}" for space in spaces)
            fix = ("population-based training's members each play every agent: set pbt.population=0"
                   if policies.members else "give agents of each space their own policy: policies.mapping=by_kind "
                   "(or per_agent, or module:fn)")
            raise ConfigError(f"{env_id!r}: policy {name!r} would act for agents with different observation spaces "
                              f"({groups}); {fix}")


def check_slots_per_policy(cfg: Config, num_policies: int) -> None:
    """Each policy's learner waits for a batch of its own slots while all share the workers' slot
    pools: the pools must hold every policy's batch short of one slot, plus one, or a run could
    stall with every pool queued for batches none of which is complete."""
    queued = cfg.total_envs * (cfg.slots_per_env - 1)
    needed = num_policies * (cfg.trajectories_per_batch - 1) + 1
    if num_policies > 1 and needed > queued:
        raise ConfigError(f"{num_policies} policies each need {cfg.trajectories_per_batch} trajectories a batch, and "
                          f"the envs can queue only {queued} at once (num_workers x envs_per_worker x "
                          f"(slots_per_env - 1)); raise slots_per_env, add envs or lower learner.batch_size")
