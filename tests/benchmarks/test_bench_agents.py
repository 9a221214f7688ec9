"""scripts/bench.py agents: every grouping of agent rows measured in turn each round, the ratios
against one agent per game, the command that repeats it, and one-line refusals of bad input."""
import itertools
import json
import shlex

import pytest

from tests.support.scripts import load_benchmark, load_script

bench = load_benchmark("agents")
entry = load_script("bench")


def test_every_round_runs_every_grouping_in_the_same_setup_alternating_the_order(monkeypatch, capsys, tmp_path):
    runs = []
    rates = itertools.cycle([100.0, 90.0, 80.0, 60.0, 95.0, 100.0, 100.0, 85.0, 70.0])  # in the runs' order

    def fake_measure(code, profile, settings, args, startup_s):
        runs.append((profile, settings))
        return {"env_steps_per_s": next(rates), "startup_s": 5.0, "code": "fastrl"}

    monkeypatch.setattr(bench, "measure", fake_measure)
    figures = tmp_path / "agents.json"
    assert entry.main(["agents", "--agents", "2", "4", "--rounds", "3", "--seconds", "1", "--set",
                       "env.num_workers=1", "--json", str(figures)]) == 0
    agents = [settings["env.kwargs"]["agents"] for _, settings in runs]
    assert agents == [1, 2, 4, 4, 2, 1, 1, 2, 4]
    for profile, settings in runs:
        assert profile == "cartpole-appo"
        assert {k: v for k, v in settings.items() if k != "env.kwargs"} == {
            "device": "cpu", "env.num_workers": "1", "env.id": "fastrl.envs.toy:AgreementGames"}
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert figures.read_text() == out[-1] + "\n"
    # Single-agent rates 100, 100, 100; 2 agents 90, 95, 85; 4 agents 80, 60, 70.
    assert result["ratios"] == {"2": pytest.approx([0.9, 0.95, 0.85]), "4": pytest.approx([0.8, 0.6, 0.7])}
    assert result["median_ratios"] == {"2": pytest.approx(0.9), "4": pytest.approx(0.7)}
    assert any(line.split() == ["2", "90", "0.90", "target", ">=", "0.8", "met"] for line in out)
    assert any(line.split() == ["4", "70", "0.70", "target", ">=", "0.8", "NOT", "met"] for line in out)
    command = "python scripts/bench.py agents --agents 2 4 --profile cartpole-appo --set env.num_workers=1 " \
              "--rounds 3 --seconds 1 --warmup 2"
    assert result["command"] == command and f"command: {command}" in out
    assert entry.main(shlex.split(command)[2:]) == 0  # the command printed repeats the measurement
    assert runs[9:] == runs[:9] and json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result


def test_env_kwargs_given_reach_every_run_beside_its_agents(monkeypatch):
    runs = []
    monkeypatch.setattr(bench, "measure", lambda code, profile, settings, args, startup_s: runs.append(
        settings["env.kwargs"]) or {"env_steps_per_s": 1.0, "startup_s": 5.0})
    assert entry.main(["agents", "--agents", "3", "--rounds", "1", "--seconds", "1", "--set",
                       "env.kwargs={length = 8, stagger = 1}", "--set", "env.envs_per_worker=1536"]) == 0
    assert runs == [{"length": 8, "stagger": 1, "agents": 1}, {"length": 8, "stagger": 1, "agents": 3}]


@pytest.mark.parametrize("argv,message", [
    (["--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["--agents", "1", "2"], "--agents counts the agents of a multi-agent game, each 2 or more"),
    (["--agents", "3"], "a split of env.envs_per_worker / env.num_splits = 512 rows must hold whole games"),
    (["--set", "env.envs_per_worker=1028", "--agents", "4"], "(splits of 512 or 516 rows)"),
    (["--set", "learner.lrr=0.001"], "unknown config key 'learner.lrr'"),
    (["--setup", "pong-cpu", "--profile", "atari-appo"], "--setup names its profile"),
    (["--seconds", "0.1"], "--seconds must be >= 0.5"),
])
def test_bad_input_stops_with_one_line_before_any_run(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(bench, "measure", lambda *a, **k: pytest.fail("a run started"))
    assert entry.main(["agents", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_tiny_measurement_trains_each_grouping_in_its_own_processes(capsys, monkeypatch):
    # A 6 s start-up allowance for the first run, not the 12 s a loaded machine needs: a run that
    # flows later is measured again with the allowance it needed, and later runs take the measured one.
    monkeypatch.setattr(bench, "STARTUP_ESTIMATE_S", 6.0)
    assert entry.main(["agents", "--agents", "2", "--rounds", "1", "--seconds", "0.5", "--warmup", "0", "--set",
                       "env.num_workers=1", "--set", "env.envs_per_worker=64", "--set", "learner.batch_size=512",
                       "--set", "learner.rollout=8"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["rows_per_batch"] == 32
    assert all(rate[0] > 0 for rate in result["rates"].values()) and len(result["ratios"]["2"]) == 1
