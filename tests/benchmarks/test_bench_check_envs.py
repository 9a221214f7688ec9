"""scripts/bench.py check-envs: the rollout each env is given from its speed, and an id that cannot
be made comes back from its subprocess as one row that says why."""
import json
import subprocess
import sys

import gymnasium as gym

from tests.support.scripts import SCRIPTS, load_benchmark

check_envs = load_benchmark("check_envs")
VECTOR = gym.spaces.Box(0, 1, (4,))


def test_a_fast_env_gets_the_most_envs_and_a_slow_one_the_fewest():
    fast = check_envs.rollout_overrides(1e6, VECTOR, "CartPole-v1")
    assert (fast["env.envs_per_worker"], fast["env.num_splits"]) == (check_envs.MAX_ENVS, 4)
    assert fast["learner.batch_size"] == check_envs.ROLLOUT * check_envs.MAX_TRAJECTORIES
    slow = check_envs.rollout_overrides(1e3, VECTOR, "CartPole-v1")
    assert (slow["env.envs_per_worker"], slow["env.num_splits"]) == (8, 2)


def test_large_observations_are_held_to_the_arena_budget():
    images = gym.spaces.Box(0, 255, (4, 84, 84), "uint8")
    envs = check_envs.rollout_overrides(1e6, images, "CartPole-v1")["env.envs_per_worker"]
    step_bytes = 4 * 84 * 84
    assert envs * check_envs.NUM_WORKERS * 2 * (check_envs.ROLLOUT + 1) * step_bytes <= check_envs.ARENA_BYTES


def test_a_turn_based_game_has_splits_of_whole_games():
    players = 2  # ConnectFour-v1
    settings = check_envs.rollout_overrides(1e5, VECTOR, "ConnectFour-v1")
    assert settings["env.num_splits"] % players == 0
    assert settings["env.envs_per_worker"] % settings["env.num_splits"] == 0


def test_an_id_that_cannot_be_made_is_one_row_that_says_why(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), "check-envs", "--ids", "Nope-v0", "--seconds", "1",
                          "--json", str(tmp_path / "envs.json")], check=True, capture_output=True, text=True).stdout
    assert "| Nope-v0 |" in out and "no: env: KeyError: 'Nope-v0'" in out
    report = json.loads(out.strip().splitlines()[-1])
    assert report == json.loads((tmp_path / "envs.json").read_text())
    (row,) = report["rows"]
    assert row["id"] == "Nope-v0" and not row["trained"] and row["error"] == "env: KeyError: 'Nope-v0'"
