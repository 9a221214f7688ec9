"""scripts/bench.py updates: one SAC update's arithmetic against a count by hand, the report of a
short run, and the refusal of learners it does not measure."""
import argparse

import pytest

from fastrl.config import ConfigError, build_config
from fastrl.envs import probe_env
from tests.support.repo import REPO
from tests.support.scripts import load_benchmark

PROFILE = str(REPO / "profiles" / "mujoco-sac.toml")
OBS, ACTIONS, WIDTH, BATCH = 3, 1, 16, 16  # Pendulum-v1, [16, 16] networks
SMALL = {"env.id": "Pendulum-v1", "env.num_workers": 1, "env.envs_per_worker": 2, "env.num_splits": 1,
         "learner.rollout": 8, "learner.batch_size": 16, "replay.min_fill": 32, "replay.batch_size": BATCH,
         "replay.replay_ratio": 16.0, "model.hidden_sizes": [WIDTH, WIDTH]}


def sac_update_flop() -> int:
    """Multiply-adds per sampled row, 2 FLOP each. A critic member: (obs + action) -> w -> w -> 1;
    the actor: obs -> w -> w -> 2 x action. Inputs that are data (observations, replayed actions)
    need no gradient; the critics' weights take none from the actor's loss."""
    critic = (OBS + ACTIONS) * WIDTH + WIDTH * WIDTH + WIDTH
    actor = OBS * WIDTH + WIDTH * WIDTH + 2 * ACTIONS * WIDTH
    macs = (actor + 2 * critic  # the target: the actor on the next observations, the target critics
            + 2 * critic * 2 + 2 * (critic - (OBS + ACTIONS) * WIDTH)  # the critics' loss: forward, backward
            + actor + 2 * critic * 2  # the actor's loss through the critics, back to the actions
            + actor + (actor - OBS * WIDTH))  # the actor's backward
    return 2 * BATCH * macs


def test_one_sac_update_counts_every_forward_and_backward_matmul():
    bench = load_benchmark("updates")
    cfg = build_config(PROFILE, {"device": "cpu", **SMALL})
    learner = bench.filled_learner(cfg, probe_env(cfg))
    assert len(learner.replay) >= 32
    assert bench.gflop_per_update(learner) * 1e9 == sac_update_flop()


def test_a_short_run_reports_the_rate_the_parts_and_the_floor_per_thread_count():
    bench = load_benchmark("updates")
    args = argparse.Namespace(profile=PROFILE, set=[f"{k}={v}" for k, v in SMALL.items()], threads=[1],
                              updates=5, rounds=1)
    report = bench.run(args)
    row = report["threads"][1]
    assert set(row["parts_s"]) == set(bench.PARTS) and min(row["parts_s"].values()) > 0
    assert 0 < row["floor_s"] < 1 / row["updates_per_s"]
    assert report["gflop_per_update"] * 1e9 == sac_update_flop()


def test_a_learner_without_one_step_transitions_is_refused_in_one_line():
    bench = load_benchmark("updates")
    args = argparse.Namespace(profile="cartpole-appo", set=[], threads=[1], updates=5, rounds=1)
    with pytest.raises(ConfigError, match="use bench.py learner") as caught:
        bench.run(args)
    assert "\n" not in str(caught.value)
