"""The tests of tests/unit/profiler/test_profiler.py's subject that start fastrl's commands or processes."""
import json

import psutil
import pytest

from fastrl.cli import profile_main
from tests.unit.profiler.test_profiler import MASKED_CUE_GAME, SMALL

COMPONENT_WORDS = ("learner", "batcher", "workers", "cores")

def set_args(settings: dict) -> list[str]:
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]

def assert_all_exited(pids):
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes still running: {alive}"


def test_profile_measures_every_figure_on_cartpole(tmp_path, capsys):
    out = tmp_path
    argv = ["--profile", "cartpole-appo", *set_args(SMALL), "--seconds", "1", "--warmup-seconds", "0.5",
            "--json", str(out / "prof.json"), "--plot", str(out / "prof.png")]
    assert profile_main(argv) == 0
    table = capsys.readouterr().out
    result = json.loads((out / "prof.json").read_text())

    for key in ("env_fps", "sample_fps", "train_fps", "env_frames_per_s", "sample_frames_per_s",
                "train_frames_per_s"):
        assert result[key] > 0, key
    for key in ("sample_ratio", "train_ratio"):
        assert 0 < result[key] <= 1.5, (key, result[key])
    assert result["train_frames_per_s"] == pytest.approx(result["train_fps"])  # CartPole: 1 frame per step
    # Each run stopped once its 1 s was measured (reports every 0.25 s), not at the end of its 12 s
    # start-up allowance (a run that flowed late may end at its budget with less).
    assert all(result["window_s"][run] < 3.5 for run in ("sample", "train")), result["window_s"]
    assert result["overrides"] == SMALL
    for run in ("sample", "train"):
        bd = result["breakdown"][run]
        for key in ("rollout/env_step", "rollout/wait_actions", "rollout/wait_slots", "inference/forward",
                    "learner/forward_backward", "learner/busy", "policy_lag_mean"):
            assert key in bd, (run, key)
        assert 0 < bd["rollout/busy"] <= 1.2 and 0 < bd["inference/busy"] <= 1.2
    assert result["breakdown"]["train"]["learner/busy"] > 0 and result["breakdown"]["sample"]["learner/busy"] == 0
    for run, names in (("env", {"rollout[0]", "rollout[1]"}),
                       ("train", {"rollout[0]", "rollout[1]", "inference", "learner", "runner"})):
        rows = {p["name"]: p for p in result["processes"][run]}
        assert names <= set(rows), (run, rows)
        assert all(rows[n]["rss_mib"] > 0 and rows[n]["cpu_percent"] is not None for n in names)
    assert result["hardware"]["cpu_count"] >= 1 and result["hardware"]["cpu_model"]
    assert result["bottleneck"] in ("learner", "slots", "inference", "env", "cpu", "latency", "balanced")
    assert any(word in result["diagnosis"] for word in COMPONENT_WORDS), result["diagnosis"]
    assert "raw env" in table and f"diagnosis: {result['diagnosis']}" in table
    assert (out / "prof.png").read_bytes()[:4] == b"\x89PNG"
    assert_all_exited([p["pid"] for run in ("env", "sample", "train") for p in result["processes"][run]
                       if p["role"] != "runner"])

def test_profile_of_a_multi_agent_run_whose_workers_act_breaks_both_down(tmp_path, capsys):
    # One run for two checks (the suite's time): a multi-agent env's agent rows (masked moves:
    # the raw env must draw legal ones), and workers that act for themselves (inference.in_workers),
    # whose acting is counted as the workers' own and no batcher's. AgreementGames is profiled by
    # tests/benchmarks/test_bench_agents.py's real measurement.
    settings = {**MASKED_CUE_GAME, "inference.in_workers": "true"}
    # env.kwargs as --set takes it: a TOML inline table
    inline = {k: "{" + ", ".join(f"{name} = {json.dumps(x)}" for name, x in v.items()) + "}"
              if isinstance(v, dict) else v for k, v in settings.items()}
    argv = ["--profile", "cartpole-appo", *set_args(inline),
            "--seconds", "1", "--warmup-seconds", "0.5", "--json", str(tmp_path / "prof.json")]
    assert profile_main(argv) == 0
    table = capsys.readouterr().out
    result = json.loads((tmp_path / "prof.json").read_text())
    assert result["env_fps"] > 0 and result["sample_fps"] > 0 and result["train_fps"] > 0
    for run in ("sample", "train"):
        bd = result["breakdown"][run]
        assert 0 < bd["rollout/env_step"] and 0 < bd["rollout/busy"] <= 1.2
    assert result["breakdown"]["train"]["learner/busy"] > 0
    assert f"diagnosis: {result['diagnosis']}" in table
    for run in ("sample", "train"):
        bd = result["breakdown"][run]
        assert 0 < bd["rollout/inference"] < bd["rollout/busy"] and bd["inference/busy"] == 0
        assert bd["rollout/wait_actions"] == 0
    assert "inference" not in {p["name"] for p in result["processes"]["train"]}
    assert "no batcher process" in table and "rollout/inference" in table and "inference/forward" not in table
    assert "batcher" not in result["diagnosis"] and "batcher" not in result["sample_diagnosis"]
    assert_all_exited([p["pid"] for run in ("env", "sample", "train") for p in result["processes"][run]
                       if p["role"] != "runner"])
