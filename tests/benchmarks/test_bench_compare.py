"""scripts/bench.py compare without training: ABBA order, the baseline run in another checkout's
interpreter, the median ratio, and one-line refusals of bad input."""
import json
import subprocess

import pytest

from tests.support.scripts import load_benchmark, load_script

bench = load_benchmark("compare")
entry = load_script("bench")


def test_rounds_alternate_which_side_runs_first():
    assert [bench.round_order(r) for r in range(4)] == [("base", "variant"), ("variant", "base"),
                                                        ("base", "variant"), ("variant", "base")]


def test_the_baseline_runs_in_its_own_checkout_and_the_median_ratio_is_printed(tmp_path, monkeypatch, capsys):
    old = tmp_path / "old"
    (old / "fastrl").mkdir(parents=True)
    (old / "fastrl" / "__init__.py").write_text("")
    calls = []

    def fake_run(cmd, env, cwd, capture_output, text):
        profile, overrides, seconds, warmup, sampling, startup = json.loads(cmd[-1])
        calls.append((cwd, env.get("PYTHONPATH", ""), overrides))
        rate = 200.0 if "learner.lr" in overrides else 100.0 + len(calls)
        out = json.dumps({"env_steps_per_s": rate, "startup_s": 5.0, "code": str(cwd)})
        return subprocess.CompletedProcess(cmd, 0, stdout=out + "\n", stderr="")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    assert entry.main(["compare", "--set", "learner.lr=0.001", "--base-code", str(old), "--rounds", "3",
                       "--seconds", "1"]) == 0
    sides = ["variant" if "learner.lr" in overrides else "base" for _, _, overrides in calls]
    assert sides == ["base", "variant", "variant", "base", "base", "variant"]
    for cwd, pythonpath, overrides in calls:
        if "learner.lr" in overrides:
            assert cwd is None
        else:
            assert cwd == old.resolve() and pythonpath.split(":")[0] == str(old.resolve())
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # base rates 101, 104, 105 against 200 each round
    assert result["ratios"] == pytest.approx([200 / 101, 200 / 104, 200 / 105])
    assert result["median_ratio"] == pytest.approx(200 / 104)


@pytest.mark.parametrize("argv,message", [
    (["--set", "learner.lr=0.001", "--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["--set", "learner.lrr=0.001"], "unknown config key 'learner.lrr'"),
    (["--set", "learner.lr"], "--set expects section.key=value"),
    (["--set", "learner.lr=0.001", "--base-code", "/nonexistent"], "holds no fastrl package"),
    (["--set", "learner.lr=0.001", "--setup", "pong"], "unknown setup 'pong': available: cartpole-earlier,"),
    (["--set", "learner.lr=0.001", "--setup", "pong-cpu", "--profile", "atari-appo"], "--setup names its profile"),
])
def test_bad_input_stops_with_one_line_before_any_run(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: pytest.fail("a run started"))
    assert entry.main(["compare", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_setup_gives_both_runs_its_profile_and_overrides_and_json_writes_the_figures(tmp_path, monkeypatch,
                                                                                        capsys):
    runs = []

    def fake_run(cmd, env, cwd, capture_output, text):
        profile, overrides, *_ = json.loads(cmd[-1])
        runs.append((profile, overrides))
        out = json.dumps({"env_steps_per_s": 100.0, "startup_s": 5.0, "code": "fastrl"})
        return subprocess.CompletedProcess(cmd, 0, stdout=out + "\n", stderr="")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    figures = tmp_path / "figures" / "compare.json"
    assert entry.main(["compare", "--setup", "pong-cpu", "--set", "learner.precision=auto", "--rounds", "1",
                       "--seconds", "1", "--json", str(figures)]) == 0
    pong = {"device": "cpu", "env.num_workers": 2, "env.envs_per_worker": 16, "learner.rollout": 32,
            "learner.batch_size": 512, "learner.num_epochs": 1, "learner.num_minibatches": 2}
    assert runs == [("atari-appo", pong), ("atari-appo", {**pong, "learner.precision": "auto"})]
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert figures.read_text() == printed + "\n" and json.loads(printed)["median_ratio"] == 1.0
