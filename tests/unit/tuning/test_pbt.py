"""Population-based training (issue 44 item 1): members' exploit (weights, optimizer and normalizer
state, hyperparameters copied exactly; the copier's counters kept) and explore (only pbt.mutable,
by a factor of pbt.perturb or back to the start value), who copies whom by the objective and the
margins, the run directory's lineage and history, start values and jitter, one-line refusals, and
runs that report members and resume the whole population."""
import copy
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from fastrl.cli import sweep_main, train_main
from fastrl.config import PBT_MUTABLE, ConfigError, build_config
from fastrl.envs import probe_env
from fastrl.evaluation.evaluator import EvalStats, MemberEvalStats
from fastrl.files.checkpoint import best_checkpoint_path, load_checkpoint
from fastrl.ipc.arena import EPISODE_RING, Arena
from fastrl.ipc.weights import WeightBuffer
from fastrl.learner.policy_set import PolicyRuntimes, make_policy_learners
from fastrl.models.networks import num_state_values
from fastrl.multiagent.policy_map import policy_map
from fastrl.run.plan import RunError
from fastrl.run.preflight import arena_layout, check_request
from fastrl.run.training import train
from fastrl.tuning.pbt import MAX_GAMMA, Population, member_configs
from tests.unit.learner.test_policy_set import assert_same_state, one_line, read_metrics
from tests.unit.learner.test_vtrace_learner import random_batch
from tests.unit.sampling.test_rollout_worker import countdown_config, run_worker
from tests.unit.tuning.test_sweep import TINY, sweep_args

MUTABLE = PBT_MUTABLE[:5]  # the default pbt.mutable


def pbt_config(population: int = 2, **overrides):
    """cartpole-appo, tiny: one worker of 2 games per member, exploit at every step() (no warm-up,
    period 1), no margin, no reset, normalized observations and returns (normalizer state to copy)."""
    settings = {"env.num_workers": 1, "env.envs_per_worker": 2 * population, "env.num_splits": 1,
                "learner.rollout": 8, "learner.batch_size": 16, "slots_per_env": 4, "model.hidden_sizes": [16],
                "model.normalize_obs": True, "learner.normalize_returns": True, "learner.entropy_coef": 0.01,
                "inference.in_workers": False, "device": "cpu", "pbt.population": population,
                "pbt.warmup_env_steps": 0, "pbt.period_env_steps": 1, "pbt.margin_relative": 0.0,
                "pbt.reset_prob": 0.0}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def make_population(cfg, run_dir=None, updates=(2, 3, 4, 5)):
    """The members' PolicyRuntimes over a private arena, member k trained ``updates[k]`` times on
    batches of its own (its weights, Adam moments and normalizers apart from the others')."""
    spec = probe_env(cfg)
    policies = policy_map(cfg, spec.agents)
    torch.manual_seed(cfg.seed)
    learners = make_policy_learners(cfg, (spec.observation_space, spec.action_space), None, "cpu",
                                    policies.num_policies)
    arena = Arena(arena_layout(cfg, spec, num_state_values(learners[0].model)), shared=False)
    for k, learner in enumerate(learners):
        for u in range(updates[k % len(updates)]):
            batch = random_batch(seed=100 * k + u)
            batch.obs.mul_(k + 1).add_(k)  # each member's observations of their own scale
            learner.train(batch, env_ids=np.arange(16) + 16 * k)
    return PolicyRuntimes(cfg, arena, learners, policies, run_dir), arena


def finish_episodes(arena, returns_by_member: dict[int, list[float]], worker: int = 0, version=None) -> None:
    """Episodes finished on ``worker`` by each member, written into the arena's episode ring as
    the rollout worker writes them, begun by the member's published weights (or ``version``)."""
    for member, returns in returns_by_member.items():
        for value in returns:
            at = arena.episode_count[worker] % EPISODE_RING
            arena.episode_return[worker, at] = value
            arena.episode_length[worker, at] = 10
            arena.episode_actor[worker, at] = member
            arena.episode_version[worker, at] = arena.weight_version[member] if version is None else version
            arena.episode_count[worker] += 1


def finish_scored_episodes(arena, scored_by_member: dict[int, list[tuple[float, float]]], worker: int = 0) -> None:
    """Episodes ``(return, info number)`` finished on ``worker`` by each member, the number in
    the last column of the ring's info (NaN: the env did not report it)."""
    for member, episodes in scored_by_member.items():
        for value, score in episodes:
            arena.episode_info[worker, arena.episode_count[worker] % EPISODE_RING, -1] = score
            finish_episodes(arena, {member: [value]}, worker)


def finish_evaluation(arena, returns: list[float], at_env_steps: int) -> None:
    """An evaluation of every member, written as the evaluator writes it (under its sequence)."""
    arena.eval_stats[EvalStats.SEQ] += 1
    for row, value in zip(arena.eval_member_stats, returns):
        row[MemberEvalStats.RETURN_MEAN], row[MemberEvalStats.AT_ENV_STEPS] = value, at_env_steps
    arena.eval_stats[EvalStats.SEQ] += 1


def snapshot(runtime) -> dict:
    """A member's learner state and hyperparameters, copied."""
    return {"learner": copy.deepcopy(runtime.learner.state_dict()), "cfg": copy.deepcopy(runtime.cfg)}


def hyperparameters(cfg, keys=MUTABLE) -> dict:
    flat = {f"learner.{k}": v for k, v in dataclasses.asdict(cfg.learner).items()}
    return {key: flat[key] for key in keys}


def other_settings(cfg, keys=MUTABLE) -> dict:
    """Every config value except ``keys`` (and pbt's own), flat."""
    out = {}
    for section, values in dataclasses.asdict(cfg).items():
        if isinstance(values, dict) and section != "pbt":
            out.update({f"{section}.{k}": v for k, v in values.items() if f"{section}.{k}" not in keys})
        elif section != "pbt":
            out[section] = values
    return out


def test_exploit_copies_weights_optimizer_and_normalizers_exactly_and_keeps_the_copiers_counters():
    cfg = pbt_config(2, **{"pbt.perturb": [1.0], "pbt.start.learner.lr": [1e-4, 2e-3],
                           "pbt.start.learner.value_coef": [0.3, 0.7]})
    runtimes, arena = make_population(cfg)
    population = runtimes.population
    low, top = runtimes.runtimes
    before_low, before_top = snapshot(low), snapshot(top)
    assert before_low["learner"]["updates"] == 2 and before_top["learner"]["updates"] == 3
    finish_episodes(arena, {0: [10.0, 12.0], 1: [50.0, 70.0]})
    assert population.step(env_steps=100) == [(0, 1)]
    state, parent = low.learner.state_dict(), top.learner.state_dict()
    assert_same_state(state["model"], before_top["learner"]["model"], "weights and observation normalizer")
    assert any("normalizer" in name for name in state["model"])
    assert_same_state(state["optimizer"], before_top["learner"]["optimizer"], "Adam's moments and steps")
    assert state["optimizer"]["state"][0]["exp_avg_sq"].abs().sum() > 0
    for key in ("count", "mean", "var"):
        assert state["return_scale"][key] == before_top["learner"]["return_scale"][key] != 0
    # The copier's own env streams keep their running discounted returns.
    assert state["return_scale"]["carry"] == before_low["learner"]["return_scale"]["carry"]
    # Its version moves past max_policy_lag (100), its update counters are its own.
    assert (state["version"], state["updates"]) == (2 + 100 + 1, 2)
    assert hyperparameters(low.cfg) == hyperparameters(before_top["cfg"])  # perturb [1.0]: copied as they are
    assert other_settings(low.cfg) == other_settings(before_low["cfg"])
    assert_same_state(parent, before_top["learner"], "the copied member")
    assert hyperparameters(top.cfg) == hyperparameters(before_top["cfg"])
    # The actors act with the copied weights at once, under the copier's own version.
    flat = np.empty(num_state_values(low.learner.model), np.float32)
    assert WeightBuffer(arena, 0).read_into(flat) == 103
    top.publish()
    np.testing.assert_array_equal(flat, top.flat_np)
    # Its next update uses the copied learning rate, and the counters go on from its own.
    stats = low.learner.train(random_batch(seed=7))
    assert stats["lr"] == pytest.approx(2e-3) and low.learner.version == 104


def test_a_copier_trains_on_and_is_ranked_by_its_copied_weights_only():
    cfg = pbt_config(2, **{"pbt.perturb": [1.0], "pbt.start.learner.max_policy_lag": [3, 5]})
    runtimes, arena = make_population(cfg)
    low = runtimes.runtimes[0]
    finish_episodes(arena, {0: [1.0], 1: [50.0]}, version=0)
    assert runtimes.population.step(env_steps=10) == [(0, 1)]
    # Past the copied lag (5): what the replaced weights (version 2) acted is not trained on.
    assert low.learner.version == 2 + 5 + 1 and low.cfg.learner.max_policy_lag == 5
    stats = low.learner.train(random_batch(seed=7, version=2), env_ids=np.arange(16))
    assert stats["policy_lag_min"] == 6 and stats["grad_norm"] == 0 and stats["value_loss"] == 0
    stats = low.learner.train(random_batch(seed=7, version=8), env_ids=np.arange(16))
    assert stats["policy_lag_min"] == 1 and stats["grad_norm"] > 0
    # Episodes the replaced weights began, finished after the copy, are not the copier's objective.
    finish_episodes(arena, {0: [1.0, 2.0]}, version=2)
    finish_episodes(arena, {0: [40.0]}, version=8)
    runtimes.population.collect()
    assert runtimes.population.objectives()[0] == 40.0


def test_a_worker_records_the_version_of_each_episodes_first_action():
    # Time limit 3: an env's episode k is acted at steps 4k, 4k + 1, 4k + 2 (4k + 3 is the autoreset).
    arena, _ = run_worker(countdown_config(slots_per_env=5), steps_per_env=13, version=lambda step: 100 + step)
    assert arena.episode_count[0] == 12 and set(arena.episode_length[0, :12]) == {3}
    np.testing.assert_array_equal(arena.episode_version[0, :12], [100] * 4 + [104] * 4 + [108] * 4)


def test_explore_changes_only_the_mutable_keys_by_a_perturb_factor():
    cfg = pbt_config(2, **{"pbt.perturb": [0.5, 2.0], "pbt.start.learner.lr": [1e-4, 2e-3]})
    runtimes, arena = make_population(cfg)
    low, top = runtimes.runtimes
    parent = hyperparameters(top.cfg)
    before = other_settings(low.cfg)
    finish_episodes(arena, {0: [1.0], 1: [2.0]})
    assert runtimes.population.step(env_steps=5) == [(0, 1)]
    now = hyperparameters(low.cfg)
    assert all(now[key] / parent[key] in (0.5, 2.0) for key in MUTABLE), (now, parent)
    assert other_settings(low.cfg) == before
    assert low.learner.lcfg is low.cfg.learner  # the learner reads the explored values
    # Another step with the same order: a fresh draw per key (10 draws of 2 factors are not all alike).
    ratios = []
    for step in range(2, 7):
        finish_episodes(arena, {0: [1.0], 1: [2.0]})
        parent = hyperparameters(top.cfg)
        assert runtimes.population.step(env_steps=5 * step) == [(0, 1)]
        ratios += [hyperparameters(low.cfg)[key] / parent[key] for key in MUTABLE]
    assert set(np.round(ratios, 9)) == {0.5, 2.0}


def test_a_reset_sets_every_mutable_key_back_to_the_members_start():
    cfg = pbt_config(2, **{"pbt.reset_prob": 1.0, "pbt.perturb": [3.0], "pbt.start.learner.lr": [1e-4, 2e-3],
                           "pbt.start.learner.max_grad_norm": [1.0, 9.0]})
    runtimes, arena = make_population(cfg)
    start = hyperparameters(runtimes.runtimes[0].cfg)
    assert start["learner.lr"] == 1e-4 and start["learner.max_grad_norm"] == 1.0
    finish_episodes(arena, {0: [1.0], 1: [2.0]})
    assert runtimes.population.step(env_steps=5) == [(0, 1)]
    assert hyperparameters(runtimes.runtimes[0].cfg) == start
    assert hyperparameters(runtimes.runtimes[1].cfg)["learner.lr"] == 2e-3


@pytest.mark.parametrize("gamma, factor, expected", [(0.99, 2.0, 0.98), (0.99, 0.5, 0.995), (0.9999, 0.5, MAX_GAMMA),
                                                     (0.6, 5.0, 0.6)])
def test_a_discount_is_perturbed_as_one_minus_its_horizon_and_stays_below_one(gamma, factor, expected):
    cfg = pbt_config(2, **{"pbt.mutable": ["learner.gamma"], "pbt.perturb": [factor], "learner.gamma": gamma})
    runtimes, arena = make_population(cfg)
    finish_episodes(arena, {0: [1.0], 1: [2.0]})
    runtimes.population.step(env_steps=5)
    low = runtimes.runtimes[0]
    # 1 - 0.4 * 5 = -1 is no discount: the copied one is kept.
    assert low.cfg.learner.gamma == pytest.approx(expected) and low.cfg.learner.gamma < 1
    # The return normalizer discounts with the member's discount from its next update on.
    low.learner.train(random_batch(seed=3), env_ids=np.arange(16))
    assert low.learner.return_scale.gamma == low.cfg.learner.gamma


@pytest.mark.parametrize("returns, fraction, copier, parents", [
    ([50.0, 10.0, 90.0, 30.0], 0.25, [1], [2]),
    ([5.0, 80.0, 70.0, 60.0], 0.25, [0], [1]),
    ([-1.0, -9.0, -3.0, -2.0], 0.25, [1], [0]),
    ([50.0, 10.0, 90.0, 30.0], 0.5, [1, 3], [0, 2]),
])
def test_the_bottom_members_copy_a_top_member_by_the_objective(returns, fraction, copier, parents):
    cfg = pbt_config(4, **{"pbt.fraction": fraction, "pbt.perturb": [1.0]})
    runtimes, arena = make_population(cfg)
    before = [snapshot(r) for r in runtimes.runtimes]
    # The objective is the mean of each member's episodes: two each, around ``returns``.
    finish_episodes(arena, {k: [value - 1.0, value + 1.0] for k, value in enumerate(returns)})
    assert runtimes.population.objectives() == [math.nan] * 4  # not collected before the step
    copies = runtimes.population.step(env_steps=10)
    assert runtimes.population.objectives() == [math.nan if k in copier else value for k, value in enumerate(returns)]
    assert sorted(member for member, _ in copies) == copier
    for member, parent in copies:
        assert parent in parents
        assert_same_state(runtimes.runtimes[member].learner.state_dict()["model"], before[parent]["learner"]["model"])
    for k in set(range(4)) - set(copier):
        assert_same_state(runtimes.runtimes[k].learner.state_dict(), before[k]["learner"], f"member {k}")


def test_both_top_members_are_drawn():
    cfg = pbt_config(4, **{"pbt.fraction": 0.5})
    runtimes, arena = make_population(cfg)
    parents = set()
    for step in range(1, 13):
        finish_episodes(arena, {0: [100.0], 1: [0.0], 2: [100.0], 3: [0.0]})
        parents |= {parent for _, parent in runtimes.population.step(env_steps=step)}
    assert parents == {0, 2}


@pytest.mark.parametrize("top, bottom, relative, absolute, copied", [
    (100.0, 96.0, 0.05, 0.0, False),  # a gap of 4 < 5% of 100
    (100.0, 94.0, 0.05, 0.0, True),
    (100.0, 94.0, 0.0, 10.0, False),  # a gap of 6 < 10
    (100.0, 89.0, 0.0, 10.0, True),
    (100.0, 89.0, 0.2, 10.0, False),  # the gap must beat both margins
    (-10.0, -10.4, 0.05, 0.0, False),  # 5% of |top|: 0.5
    (-10.0, -10.6, 0.05, 0.0, True),
    (7.0, 7.0, 0.0, 0.0, False),  # a tie is no gap
])
def test_a_copy_needs_a_gap_beyond_both_margins(top, bottom, relative, absolute, copied):
    cfg = pbt_config(2, **{"pbt.margin_relative": relative, "pbt.margin_absolute": absolute})
    runtimes, arena = make_population(cfg)
    finish_episodes(arena, {0: [bottom], 1: [top]})
    assert runtimes.population.step(env_steps=10) == ([(0, 1)] if copied else [])


@pytest.mark.parametrize("fraction, parents", [(0.25, {3}), (0.5, {2, 3})])
def test_a_control_member_among_the_worst_leaves_its_bottom_slot_to_the_next(fraction, parents):
    cfg = pbt_config(4, **{"pbt.control": True, "pbt.fraction": fraction})
    runtimes, arena = make_population(cfg)
    finish_episodes(arena, {0: [0.0], 1: [10.0], 2: [50.0], 3: [90.0]})
    # With 0.5 the bottom is 1 and 2, the top 2 and 3: member 2, in both, copies no one.
    copies = runtimes.population.step(env_steps=10)
    assert [member for member, _ in copies] == [1] and copies[0][1] in parents


@pytest.mark.parametrize("control", [True, False])
def test_a_control_member_0_never_copies_nor_mutates(control):
    cfg = pbt_config(2, **{"pbt.control": control})
    runtimes, arena = make_population(cfg)
    before = snapshot(runtimes.runtimes[0])
    finish_episodes(arena, {0: [1.0], 1: [50.0]})
    assert runtimes.population.step(env_steps=10) == ([] if control else [(0, 1)])
    unchanged = hyperparameters(runtimes.runtimes[0].cfg) == hyperparameters(before["cfg"])
    assert unchanged == control
    # Member 0 may still be the one copied.
    finish_episodes(arena, {0: [90.0], 1: [1.0]})
    assert runtimes.population.step(env_steps=20) == [(1, 0)]


def test_members_without_episodes_are_not_ranked():
    cfg = pbt_config(4)
    runtimes, arena = make_population(cfg)
    finish_episodes(arena, {2: [30.0]})
    assert runtimes.population.step(env_steps=10) == []  # one member ranked: no bottom and top apart
    finish_episodes(arena, {1: [20.0]})
    # Members 0 and 3 have no episode: the bottom is 1, not one of them.
    assert runtimes.population.step(env_steps=20) == [(1, 2)]


def test_exploits_wait_for_the_warmup_then_come_every_period():
    cfg = pbt_config(2, **{"pbt.warmup_env_steps": 1000, "pbt.period_env_steps": 300})
    runtimes, arena = make_population(cfg)
    copied_at = []
    for env_steps in range(0, 2001, 100):
        finish_episodes(arena, {0: [1.0], 1: [2.0]})
        if runtimes.population.step(env_steps):
            copied_at.append(env_steps)
    assert copied_at == [1000, 1300, 1600, 1900]


def test_the_objective_is_the_newest_episodes_since_the_last_copy():
    cfg = pbt_config(2, **{"pbt.objective_episodes": 3, "pbt.warmup_env_steps": 100})
    runtimes, arena = make_population(cfg)
    population = runtimes.population
    finish_episodes(arena, {0: [100.0, 100.0, 1.0, 2.0, 3.0, 4.0], 1: [50.0, 60.0]})
    assert population.step(env_steps=50) == []  # warming up, the episodes collected
    assert population.objectives() == [3.0, 55.0]  # member 0's newest three: 2, 3, 4
    assert population.step(env_steps=100) == [(0, 1)]
    assert population.objectives() == [math.nan, 55.0]  # a copier starts its objective again
    finish_episodes(arena, {0: [70.0]})
    population.collect()
    assert population.objectives() == [70.0, 55.0]


def test_episodes_are_read_from_every_worker_and_the_ring_wraps():
    cfg = pbt_config(2, **{"env.num_workers": 2, "pbt.objective_episodes": 10_000})
    runtimes, arena = make_population(cfg)
    arena.episode_count[0] = EPISODE_RING - 2  # the ring's end: the next episodes wrap around
    runtimes.population.episodes_seen = arena.episode_count.copy()
    finish_episodes(arena, {0: [1.0, 2.0, 3.0, 4.0]}, worker=0)
    finish_episodes(arena, {1: [8.0], 0: [5.0]}, worker=1)
    runtimes.population.collect()
    assert runtimes.population.objectives() == [3.0, 8.0]


def test_an_info_objective_ranks_by_the_env_number_not_the_return():
    cfg = pbt_config(2, **{"pbt.objective": "info/score", "env.info_keys": ["other"]})
    assert cfg.info_keys == ("other", "score")
    runtimes, arena = make_population(cfg)
    population = runtimes.population
    arena.episode_info[:, :, 0] = 1e6  # another key's column: not the objective
    finish_scored_episodes(arena, {0: [(90.0, 1.0), (80.0, 3.0)], 1: [(5.0, 10.0), (7.0, math.nan)]})
    population.collect()
    assert population.objectives() == [2.0, 10.0]  # an episode without the number adds none
    assert population.step(env_steps=10) == [(0, 1)]  # the higher return copies the higher score


def test_a_resume_under_another_objective_starts_the_recent_values_afresh():
    returns_cfg = pbt_config(2)
    runtimes, arena = make_population(returns_cfg)
    finish_episodes(arena, {0: [100.0], 1: [200.0]})
    runtimes.population.collect()
    saved = runtimes.population.state_dict()
    same, _ = make_population(returns_cfg)
    same.population.restore(saved)
    assert same.population.objectives() == [100.0, 200.0]
    scored, _ = make_population(pbt_config(2, **{"pbt.objective": "info/score"}))
    scored.population.restore(saved)
    assert all(math.isnan(v) for v in scored.population.objectives())  # returns are no scores
    del saved["objective"]  # a checkpoint from before pbt.objective held returns
    scored.population.restore(saved)
    assert all(math.isnan(v) for v in scored.population.objectives())


def test_members_whose_env_never_reported_the_info_number_are_not_ranked():
    cfg = pbt_config(2, **{"pbt.objective": "info/score"})
    runtimes, arena = make_population(cfg)
    finish_scored_episodes(arena, {0: [(1.0, math.nan)], 1: [(50.0, 20.0)]})
    assert runtimes.population.step(env_steps=10) == []
    assert runtimes.population.objectives() == [math.nan, 20.0]
    finish_scored_episodes(arena, {0: [(1.0, 4.0)]})
    assert runtimes.population.step(env_steps=20) == [(0, 1)]


def test_an_eval_objective_ranks_by_the_newest_evaluation_after_each_copy():
    cfg = pbt_config(2, **{"pbt.objective": "eval_return_mean", "eval.every_s": 60.0})
    runtimes, arena = make_population(cfg)
    population = runtimes.population
    finish_episodes(arena, {0: [100.0], 1: [0.0]})  # training episodes: not the objective
    assert population.step(env_steps=10) == [] and population.objectives() == [math.nan, math.nan]
    finish_evaluation(arena, [10.0, 50.0], at_env_steps=40)
    arena.env_steps[0] = 100
    assert population.step(env_steps=100) == [(0, 1)]
    # Member 0's evaluation read the env steps before its copy was published: it may be of the
    # weights it had, so member 0 is unranked until an evaluation after the copy.
    assert population.objectives() == [math.nan, 50.0]
    finish_evaluation(arena, [60.0, 30.0], at_env_steps=100)
    assert population.objectives() == [math.nan, 30.0]
    finish_evaluation(arena, [60.0, 30.0], at_env_steps=101)
    assert population.objectives() == [60.0, 30.0]
    arena.eval_stats[EvalStats.SEQ] += 1  # an evaluation being written: the last complete one holds
    arena.eval_member_stats[:, MemberEvalStats.RETURN_MEAN] = -1.0
    assert population.step(env_steps=200) == [(1, 0)]


def test_a_worker_records_the_info_numbers_of_each_episode_beside_its_return():
    cfg = build_config("cartpole-appo", {
        "env.id": "tests.support.info_envs:ScoredSteps", "env.info_keys": ["score", "never"], "env.num_workers": 1,
        "env.envs_per_worker": 4, "env.num_splits": 2, "learner.rollout": 4, "learner.batch_size": 16,
        "slots_per_env": 8, "device": "cpu"})
    rng = np.random.default_rng(0)
    arena, _ = run_worker(cfg, steps_per_env=30, choose=lambda obs: rng.integers(0, 2, len(obs)))
    count = arena.episode_count[0]
    returns, info = arena.episode_return[0, :count], arena.episode_info[0, :count]
    assert count > 10 and len(set(returns.tolist())) > 3  # episodes of several returns, ended apart
    np.testing.assert_array_equal(info[:, 0], 100.0 - returns)  # the env's score: 100 - its return
    assert np.isnan(info[:, 1]).all()  # a key the env never reports


def test_the_run_directory_keeps_lineage_and_history(tmp_path):
    cfg = pbt_config(2, **{"pbt.start.learner.lr": [1e-4, 2e-3]})
    runtimes, arena = make_population(cfg, run_dir=tmp_path)
    population = runtimes.population
    start = [hyperparameters(r.cfg) for r in runtimes.runtimes]
    finish_episodes(arena, {0: [10.0], 1: [30.0, 40.0]})
    population.step(env_steps=500)
    finish_episodes(arena, {0: [60.0], 1: [5.0]})
    population.step(env_steps=900)
    lineage = [json.loads(line) for line in (tmp_path / "pbt" / "lineage.jsonl").read_text().splitlines()]
    assert [(line["env_steps"], line["member"], line["copied"], line["objective"], line["parent_objective"])
            for line in lineage] == [(500, 0, 1, 10.0, 35.0), (900, 1, 0, 25.0, 60.0)]
    assert lineage[0]["hyperparameters"] != start[1]  # explored after the copy
    assert lineage[1]["hyperparameters"] == hyperparameters(runtimes.runtimes[1].cfg)
    history = [json.loads(line) for line in (tmp_path / "pbt" / "history.jsonl").read_text().splitlines()]
    assert [line["env_steps"] for line in history] == [0, 500, 900]
    assert [m["objective"] for m in history[0]["members"]] == [None, None]
    assert [m["hyperparameters"] for m in history[0]["members"]] == start
    assert [m["objective"] for m in history[1]["members"]] == [10.0, 35.0]
    # Each objective beside the hyperparameters that earned it, not those a copy gave after.
    assert [m["hyperparameters"] for m in history[1]["members"]] == start
    assert [m["objective"] for m in history[2]["members"]] == [60.0, 25.0]  # member 0's since its copy
    assert [m["hyperparameters"] for m in history[2]["members"]] == [lineage[0]["hyperparameters"], start[1]]
    assert [m["member"] for m in history[2]["members"]] == [0, 1]


def test_a_resume_writes_no_line_twice(tmp_path):
    cfg = pbt_config(2, **{"pbt.start.learner.lr": [1e-4, 2e-3]})
    runtimes, arena = make_population(cfg, run_dir=tmp_path)
    finish_episodes(arena, {0: [10.0], 1: [30.0]})
    assert runtimes.population.step(env_steps=500) == [(0, 1)]
    saved = copy.deepcopy(runtimes.population.state_dict())  # the checkpoint
    files = [tmp_path / "pbt" / name for name in ("lineage.jsonl", "history.jsonl")]
    at_checkpoint = [path.read_text() for path in files]
    finish_episodes(arena, {0: [60.0], 1: [5.0]})
    assert runtimes.population.step(env_steps=900) == [(1, 0)]
    with open(files[0], "a") as f:
        f.write('{"env_steps": 9')  # killed while writing
    resumed = Population(cfg, arena, runtimes.runtimes, runtimes.names, tmp_path, saved)
    assert [path.read_text() for path in files] == at_checkpoint
    finish_episodes(arena, {0: [60.0], 1: [5.0]})
    assert resumed.step(env_steps=900) == [(1, 0)]
    for path in files:
        steps = [json.loads(line)["env_steps"] for line in path.read_text().splitlines()]
        assert steps.count(900) == 1 and steps.count(500) == 1, (path.name, steps)


def test_a_resume_that_adds_a_mutable_key_resets_it_to_its_start_value():
    cfg = pbt_config(2, **{"pbt.mutable": ["learner.lr"], "pbt.start.learner.lr": [1e-4, 2e-3]})
    runtimes, arena = make_population(cfg)
    saved = runtimes.population.state_dict()
    more = pbt_config(2, **{"pbt.mutable": ["learner.lr", "learner.entropy_coef"], "pbt.reset_prob": 1.0,
                            "pbt.start.learner.lr": [1e-4, 2e-3], "pbt.start.learner.entropy_coef": [0.02, 0.03]})
    resumed = Population(more, arena, runtimes.runtimes, runtimes.names, None, saved)
    finish_episodes(arena, {0: [1.0], 1: [2.0]})
    assert resumed.step(env_steps=5) == [(0, 1)]
    assert hyperparameters(runtimes.runtimes[0].cfg, ("learner.lr", "learner.entropy_coef")) == \
        {"learner.lr": 1e-4, "learner.entropy_coef": 0.02}


def test_start_values_and_a_seeded_jitter_leave_member_0_as_the_profile_says():
    cfg = pbt_config(4, **{"pbt.jitter": 0.5, "pbt.start.learner.lr": [1e-4, 2e-4, 3e-4, 4e-4],
                           "pbt.mutable": [*MUTABLE, "learner.gamma"]})
    members = member_configs(cfg, 4)
    assert [m.learner.lr for m in members] == [1e-4, 2e-4, 3e-4, 4e-4]  # start values are not jittered
    jittered = [key for key in cfg.pbt.mutable if key != "learner.lr"]
    assert hyperparameters(members[0], jittered) == hyperparameters(cfg, jittered)
    assert other_settings(members[0], ["learner.lr"]) == other_settings(cfg, ["learner.lr"])
    for member in members[1:]:
        assert other_settings(member, cfg.pbt.mutable) == other_settings(cfg, cfg.pbt.mutable)
        for key in ("learner.entropy_coef", "learner.value_coef", "learner.ppo_clip", "learner.max_grad_norm"):
            ratio = hyperparameters(member, [key])[key] / hyperparameters(cfg, [key])[key]
            assert math.exp(-0.5) <= ratio <= math.exp(0.5) and ratio != 1.0, key
        # A discount is jittered as its horizon 1 / (1 - gamma) is.
        horizon = (1 - cfg.learner.gamma) / (1 - member.learner.gamma)
        assert math.exp(-0.5) <= horizon <= math.exp(0.5) and member.learner.gamma < 1
    assert len({m.learner.value_coef for m in members}) == 4
    again = member_configs(cfg, 4)
    assert [hyperparameters(m) for m in again] == [hyperparameters(m) for m in members]  # seeded
    other = member_configs(pbt_config(4, **{"pbt.jitter": 0.5, "seed": 5}), 4)
    assert [m.learner.value_coef for m in other] != [m.learner.value_coef for m in members]
    plain = member_configs(pbt_config(3), 3)
    assert all(hyperparameters(m) == hyperparameters(plain[0]) for m in plain)  # no jitter: the profile's


@pytest.mark.parametrize("settings, message", [
    ({"pbt.population": 1}, "pbt.population=1 is a single run"),
    ({"pbt.population": 0, "pbt.start.learner.lr": [1e-3, 2e-3]}, "set pbt.population too"),
    ({"pbt.mutable": ["learner.adam_eps"]}, "pbt.mutable 'learner.adam_eps' cannot be perturbed"),
    ({"pbt.mutable": ["learner.tau"]}, "pbt.mutable 'learner.tau' is not read by learner.algo=appo's updates"),
    ({"pbt.start.learner.temperature": [1.0, 2.0]}, "pbt.start.learner.temperature is not read by "
                                                    "learner.algo=appo's members"),
    ({"pbt.perturb": []}, "pbt.perturb is empty"),
    ({"pbt.start.learner.lr": [1e-3, 2e-3, 3e-3]}, "pbt.start.learner.lr has 3 values for 2 members"),
    ({"pbt.start.learner.lr": [1e-3, -1.0]}, "learner.lr"),
    ({"pbt.start.unknown.key": [1, 2]}, "pbt.start.unknown.key"),
    ({"pbt.start.model.hidden_sizes": [[16], [32]]}, "pbt.start.model.hidden_sizes"),
    ({"pbt.start.env.id": ["CartPole-v1", "Acrobot-v1"]}, "pbt.start.env.id"),
    ({"pbt.start.learner.batch_size": [16, 32]}, "pbt.start.learner.batch_size"),
    ({"pbt.start.seed": [1, 2]}, "pbt.start.seed"),
    # The table form, as --set 'pbt.start={...}' gives it, is checked key by key too.
    ({"pbt.start": '{"learner.lr" = 1e-3}'}, "pbt.start.learner.lr takes one value per member ([v0, v1, ...]), "
                                              "got 0.001"),
    ({"pbt.start": '{"unknown.key" = [1, 2]}'}, "pbt.start.unknown.key: members start apart only in keys"),
    ({"pbt.start": '{"learner.lr" = [1e-3, -1.0]}'}, "'learner.lr' must be"),
    ({"pbt.start": '{"learner.lr" = [1e-3, 2e-3, 3e-3]}'}, "pbt.start.learner.lr has 3 values for 2 members"),
    ({"pbt.start": "3"}, "config key 'pbt.start' expects dict, got 3"),
    ({"policies.names": ["hero"]}, "leave [policies] at its defaults"),
    ({"selfplay.enabled": True}, "selfplay.enabled=false"),
    ({"pbt.objective": "win_rate"}, "pbt.objective='win_rate' is not an objective: use episode_return_mean or "
                                    "eval_return_mean, or info/<key>"),
    ({"pbt.objective": "info/"}, "pbt.objective='info/' is not an objective"),
    ({"pbt.objective": "eval_return_mean"}, "evaluations during training, which are off: set eval.every_s > 0"),
    ({"env.info_keys": ["a b"]}, "env.info_keys 'a b'"),
    ({"env.info_keys": ["score", "score"]}, "env.info_keys lists a key twice"),
])
def test_bad_pbt_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ConfigError) as error:
        pbt_config(2, **settings)
    assert message in one_line(error)


def test_a_start_table_sets_what_its_keys_would_and_replaces_the_table():
    by_key = pbt_config(2, **{"pbt.start.learner.value_coef": "[0.3,0.7]", "pbt.start.learner.num_epochs": "[1,2]"})
    by_table = pbt_config(2, **{"pbt.start.learner.lr": "[1e-4,2e-3]",
                                "pbt.start": '{"learner.value_coef" = [0.3, 0.7], "learner.num_epochs" = [1, 2]}'})
    assert by_table.pbt.start == by_key.pbt.start == {"learner.value_coef": [0.3, 0.7], "learner.num_epochs": [1, 2]}
    assert pbt_config(2, **{"pbt.start.learner.lr": "[1e-4,2e-3]", "pbt.start": "{}"}).pbt.start == {}


def test_fastrl_train_refuses_a_scalar_start_table_in_one_line(tmp_path, capsys):
    code = train_main(["--profile", "cartpole-appo", "--serial", "--set", "pbt.population=2", "--set",
                       'pbt.start={"learner.lr" = 1e-3}', "--run-dir", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "pbt.start.learner.lr takes one value per member" in err
    assert not (tmp_path / "run").exists()


def test_a_sweep_of_a_member_start_value_is_refused_in_one_line(tmp_path, capsys):
    code = sweep_main(sweep_args(tmp_path / "sweep", "--trials", "2", "--budget-env-steps", "1000", "--param",
                                 "pbt.start.learner.lr=loguniform:1e-5:1e-2", sets=[*TINY, "pbt.population=2"]))
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--param pbt.start.learner.lr: pbt.start gives each member a value and a trial draws one; sweep " \
           "learner.lr (every member starts from it, pbt.jitter spreads them) or give pbt.start with --set" in err
    assert "expects list" not in err and not list((tmp_path / "sweep").glob("*/trial-*"))


def test_a_member_start_names_the_keys_a_member_may_start_with():
    with pytest.raises(ConfigError) as error:
        pbt_config(2, **{"pbt.start.model.hidden_sizes": [[16], [32]]})
    assert "learner.num_epochs" in one_line(error) and "learner.lr" in str(error.value)
    cfg = pbt_config(2, **{"pbt.start.learner.num_epochs": [1, 2], "pbt.start.learner.reward_scale": [0.1, 1.0]})
    assert [(m.learner.num_epochs, m.learner.reward_scale) for m in member_configs(cfg, 2)] == [(1, 0.1), (2, 1.0)]


def test_a_copy_takes_the_parents_start_keys_too():
    cfg = pbt_config(2, **{"pbt.perturb": [1.0], "pbt.start.learner.num_epochs": [1, 2]})
    runtimes, arena = make_population(cfg)
    finish_episodes(arena, {0: [1.0], 1: [2.0]})
    assert runtimes.population.step(env_steps=5) == [(0, 1)]
    assert runtimes.runtimes[0].cfg.learner.num_epochs == 2
    assert runtimes.population.hyperparameters(0)["learner.num_epochs"] == 2  # checkpointed with the member


def test_dqn_members_are_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        build_config("cartpole-dqn", {"pbt.population": 2})
    assert "learner.algo=dqn is not supported with pbt.population" in one_line(error)


def test_fastrl_train_refuses_fewer_games_a_worker_than_members(tmp_path, capsys):
    code = train_main(["--profile", "cartpole-appo", "--serial", "--set", "pbt.population=4", "--set",
                       "env.envs_per_worker=2", "--set", "env.num_splits=1", "--set", "slots_per_env=4",
                       "--set", "learner.rollout=8", "--set", "learner.batch_size=16", "--run-dir",
                       str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "pbt.population=4 members share each worker's 2 games" in err and "env.envs_per_worker >= 4" in err


def test_a_torchrun_launch_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(RunError) as error:
        check_request(pbt_config(2), tmp_path, resume=False)
    assert "a torchrun launch is not supported with it yet" in one_line(error)


def run_config(**overrides):
    """A serial population of 3 on CartPole with exploits every 400 env steps."""
    return pbt_config(3, **{"serial": True, "train_for_env_steps": 3_000, "report_every_s": 0.1,
                            "pbt.period_env_steps": 400, "pbt.warmup_env_steps": 400, "pbt.perturb": [0.8, 1.25],
                            "pbt.start.learner.lr": [1e-5, 1e-3, 3e-3], **overrides})


def test_the_status_line_names_the_best_member(tmp_path, capsys):
    train(run_config(train_for_env_steps=1_000), run_dir=tmp_path, quiet=False)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[fastrl] steps")]
    records = read_metrics(tmp_path)
    last = records[-1]
    best = max(range(3), key=lambda k: last[f"member/{k}/episode_return_mean"] or -math.inf)
    assert f"best member {best} {last[f'member/{best}/episode_return_mean']:.2f}" in lines[-1]


def test_a_population_ranked_by_an_env_info_number_reports_it_per_member_and_copies_by_it(tmp_path, capsys):
    cfg = pbt_config(2, **{"env.id": "tests.support.info_envs:ScoredSteps", "env.info_keys": ["never"],
                           "pbt.objective": "info/score", "serial": True, "train_for_env_steps": 2_000,
                           "report_every_s": 0.1, "pbt.period_env_steps": 500, "pbt.warmup_env_steps": 500})
    train(cfg, run_dir=tmp_path, quiet=False)
    err = capsys.readouterr().err
    records = read_metrics(tmp_path)
    # Every episode's score is 100 minus its return: the means over the same episodes add up to 100.
    for prefix in ("", "member/0/", "member/1/"):
        reported = [r for r in records if r[f"{prefix}info/score"] is not None]
        assert reported, prefix
        for r in reported:
            assert r[f"{prefix}info/score"] + r[f"{prefix}episode_return_mean"] == pytest.approx(100.0)
    assert all(r["info/never"] is None and r["member/0/info/never"] is None for r in records)
    lineage = [json.loads(line) for line in (tmp_path / "pbt" / "lineage.jsonl").read_text().splitlines()]
    assert lineage
    for line in lineage:  # ranked by the score, which no return reaches
        assert 90.0 <= line["objective"] < line["parent_objective"] <= 100.0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "info['never']" in warnings[0] and "info/never is unknown" in warnings[0]
    status = [line for line in err.splitlines() if line.startswith("[fastrl] steps")][-1]
    assert "best member" in status and "info/score 9" in status


def test_a_population_ranked_by_its_evaluations_evaluates_every_member(tmp_path):
    cfg = pbt_config(2, **{"pbt.objective": "eval_return_mean", "eval.every_s": 0.3, "eval.episodes": 2,
                           "eval.num_envs": 2, "serial": True, "train_for_env_steps": 3_000, "report_every_s": 0.05,
                           "pbt.period_env_steps": 500, "pbt.warmup_env_steps": 500})
    train(cfg, run_dir=tmp_path, quiet=True)
    records = read_metrics(tmp_path)
    evaluated = {k: {r[f"member/{k}/eval_return_mean"] for r in records if f"member/{k}/eval_return_mean" in r}
                 for k in range(2)}
    assert evaluated[0] and evaluated[1]
    assert all(r["member/0/eval_return_mean"] == r["eval_return_mean"] for r in records if "eval_return_mean" in r)
    lineage = [json.loads(line) for line in (tmp_path / "pbt" / "lineage.jsonl").read_text().splitlines()]
    assert lineage
    for line in lineage:
        assert line["parent_objective"] in evaluated[line["copied"]]
    best = load_checkpoint(best_checkpoint_path(tmp_path))["eval"]  # the best member's best evaluation
    assert best["eval_return_mean"] >= max(evaluated[0] | evaluated[1]) and best["member"] in (0, 1)
