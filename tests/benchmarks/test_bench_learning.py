"""scripts/bench.py learning without training: every profile's promise is read from its [expect]
table (or fails in one line naming the profile), the command line's parts replace it, and
time-to-target and the median over seeds on synthetic reports."""
import argparse
import json
from importlib import resources
from types import SimpleNamespace

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from fastrl.config import ExpectConfig, available_profiles, build_config, to_toml
from fastrl.reporting.metrics import declared
from fastrl.run.plan import RunResult
from tests.support.scripts import load_benchmark, load_script

bench = load_benchmark("learning")
entry = load_script("bench")
Promise, PromiseError = bench.Promise, bench.PromiseError


@pytest.mark.parametrize("name", available_profiles())
def test_every_profile_states_a_promise_the_bench_can_read(name):
    expect = build_config(name).expect
    if not expect.stated:  # not measured yet (the README says so): the bench asks for --target and a budget
        with pytest.raises(PromiseError, match=f"^profile '{name}' states no promise"):
            bench.profile_promise(name, expect)
        return
    promise = bench.profile_promise(name, expect)
    written = tomllib.loads((resources.files("fastrl.profiles") / f"{name}.toml").read_text())["expect"]
    assert promise.metric == written["metric"] and declared(written["metric"])  # a key metrics.jsonl has
    assert promise.threshold == written["threshold"]  # sign included: Pong's returns run from -21 to 21
    assert bool(promise.budget_steps) != bool(promise.budget_seconds)
    assert (promise.budget_steps, promise.budget_seconds) == (written.get("budget_env_steps", 0),
                                                              written.get("budget_seconds", 0))
    assert promise.hardware == written.get("hardware", "") and (promise.hardware or promise.budget_steps)


def profile_file(tmp_path, expect: str):
    path = tmp_path / "my-profile.toml"
    path.write_text(f'train_for_env_steps = 1000\n{expect}\n[env]\nid = "CartPole-v1"\n')
    return path


def test_the_promise_is_the_profiles_expect_table(tmp_path):
    path = profile_file(tmp_path, '[expect]\nmetric = "eval_return_mean"\nthreshold = -20.5\n'
                                  'budget_seconds = 5400\nhardware = "8-core CPU"\n')
    promise = bench.profile_promise("my-profile", build_config(str(path)).expect)
    assert promise == Promise("eval_return_mean", -20.5, budget_seconds=5400.0, hardware="8-core CPU")
    assert promise.describe() == "mean eval_return_mean over the last 10% of 5400 s wall >= -20.5 on 8-core CPU"
    steps = Promise("episode_return_mean", 1500.0, 2_000_000)
    assert steps.describe() == "mean episode_return_mean over the last 10% of 2,000,000 env steps >= 1500"


def test_a_profile_without_a_promise_is_one_line_naming_the_profile(tmp_path):
    with pytest.raises(PromiseError) as info:
        bench.profile_promise("my-profile", ExpectConfig())
    message = str(info.value)
    assert message.startswith("profile 'my-profile' states no promise: add an [expect] table") and "\n" not in message
    assert "--target" in message and "--budget-steps" in message


@pytest.mark.parametrize("expect, message", [
    ('[expect]\nthreshold = 5\nbudget_env_steps = 100\n', "expect.metric is empty"),
    ('[expect]\nmetric = "episode_return_mean"\nthreshold = 5\n', "needs exactly one budget"),
    ('[expect]\nmetric = "m"\nthreshold = 5\nbudget_env_steps = 100\nbudget_seconds = 60\nhardware = "x"\n',
     "needs exactly one budget"),
    ('[expect]\nmetric = "m"\nthreshold = 5\nbudget_seconds = 60\n', "say which hardware"),
    ('[expect]\nmetric = "m"\ntreshold = 5\nbudget_env_steps = 100\n', "did you mean expect.threshold"),
    ('[expect]\nmetric = "m"\nthreshold = "high"\nbudget_env_steps = 100\n', "expects float"),
    ('[expect]\nmetric = "m"\nthreshold = nan\nbudget_env_steps = 100\n', "'expect.threshold' must be finite"),
    ('[expect]\nmetric = "m"\nthreshold = 5\nbudget_env_steps = -1\n', "'expect.budget_env_steps' must be >= 0"),
])
def test_a_malformed_promise_is_one_line_before_any_training(tmp_path, capsys, expect, message):
    argv = ["--profile", str(profile_file(tmp_path, expect)), "--out-dir", str(tmp_path), "--no-plot"]
    assert entry.main(["learning", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.py learning: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "my-profile").exists()


def test_command_line_parts_replace_the_promises():
    expect = ExpectConfig("episode_return_mean", 18.0, budget_env_steps=10_000_000, hardware="one GPU")
    assert bench.resolve_promise("p", expect) == Promise("episode_return_mean", 18.0, 10_000_000, hardware="one GPU")
    # A budget flag replaces the table's budget (Atari on a CPU gets an hour instead of 10M steps),
    # and with it the hardware the table's budget was about.
    assert bench.resolve_promise("p", expect, budget_seconds=3600.0) == Promise("episode_return_mean", 18.0,
                                                                                budget_seconds=3600.0)
    assert bench.resolve_promise("p", expect, metric="eval_return_mean", target=0.0, budget_steps=1000,
                                 budget_seconds=60.0) == Promise("eval_return_mean", 0.0, 1000, 60.0)
    # A profile without a promise is fine when the command line says everything.
    assert bench.resolve_promise("p", ExpectConfig(), target=5.0, budget_steps=100) == Promise(
        "episode_return_mean", 5.0, 100)
    with pytest.raises(PromiseError, match="profile 'p'"):
        bench.resolve_promise("p", ExpectConfig(), target=5.0)


def test_the_budget_is_the_runs_limit_on_its_own_clock():
    time_budget = bench.run_overrides(Promise("episode_return_mean", 475.0, budget_seconds=60.0), 2,
                                      {"device": "cpu"})
    assert time_budget == {"device": "cpu", "seed": 2, "train_for_seconds": 60.0}  # the profile's step limit stays
    assert bench.run_overrides(Promise("m", 1.0, 2_000_000), 0, {}) == {"seed": 0, "train_for_env_steps": 2_000_000}


def reports(returns, steps_per_report=1000, seconds_per_report=2.0):
    return [{"env_steps": (i + 1) * steps_per_report, "wall_time": 3.0 + i * seconds_per_report,
             "episode_return_mean": r} for i, r in enumerate(returns)]


PROMISE = Promise("episode_return_mean", 475.0, budget_seconds=60.0)  # its last stretch: 6 s, 3 reports


END = Promise("episode_return_mean", 475.0, budget_steps=8000, final_stretch=0.4)  # the last 3,200 env steps


def test_a_promise_is_judged_on_the_mean_of_the_runs_last_stretch():
    # A report every 1,000 env steps: the last 3,200 of a run that ends at 9,000 hold the last 4
    # reports (6,000 to 9,000), 3 of them with a return.
    fell_back = bench.run_outcome(reports([480.0, 500.0, 470.0, 300.0, 460.0, 470.0, 480.0, None, 420.0]), END)
    assert not fell_back["reached"] and fell_back["final_mean"] == pytest.approx((470 + 480 + 420) / 3)
    assert fell_back["stretch_reports"] == 3
    # ... beside the first crossing, which it keeps though it lost the promise.
    assert fell_back["first_env_steps"] == 1000 and fell_back["first_wall_time"] == 3.0
    assert fell_back["final"] == 420.0 and fell_back["max"] == 500.0
    assert fell_back["last_env_steps"] == 9000 and fell_back["last_wall_time"] == 19.0
    ended_strong = bench.run_outcome(reports([float("nan"), 100.0, 300.0, 470.0, 480.0, 490.0, 480.0, 490.0]),
                                     END)
    assert ended_strong["reached"] and ended_strong["final_mean"] == pytest.approx(485.0)
    assert ended_strong["first_env_steps"] == 5000 and ended_strong["first_wall_time"] == 11.0
    never = bench.run_outcome(reports([None, float("nan")]), END)
    assert not never["reached"] and never["final_mean"] is None and never["first_env_steps"] is None
    assert never["final"] is None and never["max"] is None
    assert "mean episode_return_mean over the last 10% of 60 s wall >= 475" in PROMISE.describe()


def test_a_step_budget_measures_the_stretch_in_env_steps():
    steps = Promise("episode_return_mean", 475.0, budget_steps=20_000, final_stretch=0.25)  # the last 5,000
    outcome = bench.run_outcome(reports([480.0] * 10 + [400.0] * 4 + [500.0] * 6), steps)
    assert outcome["stretch_reports"] == 6 and outcome["final_mean"] == 500.0 and outcome["reached"]
    assert bench.profile_promise("p", ExpectConfig("m", 0.9, 100, final_stretch=0.3)).final_stretch == 0.3


def test_a_run_its_other_limit_ended_first_is_judged_on_its_own_last_stretch():
    # A time budget of 60 s, a run that its step limit ended at 19 s: the last 1.9 s, one report.
    outcome = bench.run_outcome(reports([100.0] * 8 + [480.0]), PROMISE)
    assert outcome["stretch_reports"] == 1 and outcome["final_mean"] == 480.0 and outcome["reached"]


def test_an_evaluation_rarer_than_the_stretch_is_judged_on_the_last_one():
    rows = [{"env_steps": 1000, "wall_time": 5.0, "episode_return_mean": 480.0},
            {"env_steps": 2000, "wall_time": 9.0, "episode_return_mean": 490.0, "eval_return_mean": 500.0,
             "eval_at_env_steps": 1200},
            {"env_steps": 9000, "wall_time": 40.0, "episode_return_mean": 20.0}]
    outcome = bench.run_outcome(rows, Promise("eval_return_mean", 475.0, budget_seconds=60.0))
    assert outcome["reached"] and outcome["final_mean"] == 500.0 and outcome["stretch_reports"] == 1
    # The first crossing is at the env steps of the evaluated weights.
    assert outcome["first_env_steps"] == 1200 and outcome["first_wall_time"] == 9.0


def test_window_mean_averages_the_reports_inside_the_env_step_range():
    rows = reports([100.0, float("nan"), 300.0, 500.0, 700.0])  # env steps 1000, 2000, ... 5000
    assert bench.window_mean(rows, "episode_return_mean", (2000, 4000)) == 400.0
    assert bench.window_mean(rows, "episode_return_mean", (1000, 1000)) == 100.0
    assert bench.window_mean(rows, "episode_return_mean", (6000, 9000)) is None
    assert bench.env_step_window("1.4M:1.6M") == (1_400_000, 1_600_000)
    for bad in ("2M:1M", "1M", "a:b"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.env_step_window(bad)


def outcome(final_mean, first_steps=None, first_seconds=None):
    return {"reached": final_mean is not None and final_mean >= 475.0, "final_mean": final_mean,
            "first_env_steps": first_steps, "first_wall_time": first_seconds}


def test_the_promise_holds_when_more_than_half_the_seeds_keep_it_at_their_end():
    every = bench.summarize([outcome(480.0, 3000, 12.0), outcome(490.0, 1000, 8.0), outcome(500.0, 2000, 70.0)],
                            PROMISE)
    assert every == {"seeds": 3, "seeds_reached": 3, "median_final_mean": 490.0, "median_first_env_steps": 2000,
                     "median_first_wall_time": 12.0, "holds": True}
    # Crossing first is not keeping: two seeds crossed early and fell back.
    fell_back = bench.summarize([outcome(400.0, 1000, 5.0), outcome(470.0, 1000, 5.0), outcome(480.0, 3000, 12.0)],
                                PROMISE)
    assert fell_back["seeds_reached"] == 1 and not fell_back["holds"]
    assert fell_back["median_first_env_steps"] == 1000 and fell_back["median_final_mean"] == 470.0
    # A seed that never crossed counts as never in the crossing's median; one with no value leaves no median end.
    one_missed = bench.summarize([outcome(480.0, 3000, 12.0), outcome(None), outcome(490.0, 1000, 50.0)], PROMISE)
    assert one_missed["seeds_reached"] == 2 and one_missed["holds"] and one_missed["median_final_mean"] is None
    assert one_missed["median_first_env_steps"] == 3000 and one_missed["median_first_wall_time"] == 50.0
    # Two seeds: more than half is both.
    assert not bench.summarize([outcome(480.0, 1000, 5.0), outcome(470.0)], PROMISE)["holds"]


def test_no_train_judges_and_plots_runs_already_there(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    for seed, returns in enumerate([[100.0, 480.0, 500.0, 500.0, 500.0, 500.0], [100.0, 200.0, 300.0]]):
        run_dir = tmp_path / "cartpole-appo" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.toml").write_text(to_toml(build_config("cartpole-appo", {"seed": seed})))
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports(returns)))
    assert entry.main(["learning", "--profile", "cartpole-appo", "--seeds", "2", "--no-train",
                       "--out-dir", str(tmp_path), "--window", "2K:3K"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # The runs ended at 13 and 7 s of a 60 s budget: each is judged on its last 10%, its last report.
    assert lines[0] == ("cartpole-appo seed 0: mean episode_return_mean 500 over the last 1 report(s) >= 475 at "
                        "6,000 env steps, 13.0 s wall; first >= at 2,000 env steps, 5.0 s wall; final 500.0, max "
                        "500.0, mean 490.0 over 2,000-3,000 env steps")
    assert lines[1].startswith("cartpole-appo seed 1: mean episode_return_mean 300 over the last 1 report(s) < 475 "
                               "at 3,000 env steps, 7.0 s wall; never >= the threshold")
    result = json.loads(lines[-1])["profiles"][0]
    assert result["seeds_reached"] == 1 and result["median_first_wall_time"] is None and not result["holds"]
    assert (tmp_path / "cartpole-appo.png").read_bytes()[:4] == b"\x89PNG"


def test_first_seed_judges_later_seeds_beside_earlier_ones(tmp_path, capsys):
    for seed, returns in ((1, [100.0, 200.0, 300.0]), (2, [100.0, 480.0, 500.0])):
        run_dir = tmp_path / "cartpole-appo" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.toml").write_text(to_toml(build_config("cartpole-appo", {"seed": seed})))
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports(returns)))
    argv = ["--profile", "cartpole-appo", "--first-seed", "1", "--seeds", "2", "--no-train", "--no-plot",
            "--out-dir", str(tmp_path)]
    assert entry.main(["learning", *argv]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("cartpole-appo seed 1: mean") and "< 475" in lines[0]
    assert lines[1].startswith("cartpole-appo seed 2: ")
    seeds = [r["seed"] for r in json.loads(lines[-1])["profiles"][0]["runs"]]
    assert seeds == [1, 2]
    args = SimpleNamespace(profiles=["cartpole-appo"], first_seed=3, seeds=2, metric=None, target=None,
                           budget_steps=None, budget_seconds=None, out_dir=tmp_path, no_train=False, overwrite=False,
                           resume=False, plot=None, no_plot=True)
    planned = bench.plan(args, {})[0]
    assert [cfg.seed for cfg in planned["configs"]] == [3, 4]
    assert [d.name for d in planned["run_dirs"]] == ["seed3", "seed4"]


@pytest.mark.parametrize("argv, message", [
    (["--set", "seed=3"], "--set seed: the bench sets it"),
    (["--set", "train_for_seconds=10"], "--set train_for_seconds: the bench sets it"),
    (["--metric", "eval_return_mean"], "needs evaluation during training: --set eval.every_s=SECONDS"),
    (["--profile", "mujoco-appo", "--plot", "x.png"], "--plot names one figure"),
    (["--no-train"], "holds no metrics.jsonl; run without --no-train first"),
    (["--resume", "--overwrite"], "--resume continues the runs in --out-dir: it goes with neither --overwrite"),
    (["--resume", "--no-train"], "--resume continues the runs in --out-dir: it goes with neither --no-train"),
])
def test_bad_requests_are_one_line_before_any_training(tmp_path, capsys, argv, message):
    assert entry.main(["learning", "--profile", "cartpole-appo", "--out-dir", str(tmp_path), "--no-plot", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.py learning: error: ") and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["--first-seed", "-1"], "argument --first-seed: must be >= 0, got '-1'"),
    (["--seeds", "0"], "argument --seeds: must be > 0, got '0'"),
])
def test_bad_numbers_are_refused_by_the_command_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        entry.main(["learning", "--profile", "cartpole-appo", "--out-dir", str(tmp_path), *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_an_existing_run_is_not_overwritten_unless_asked(tmp_path, capsys):
    (tmp_path / "cartpole-appo" / "seed1").mkdir(parents=True)
    (tmp_path / "cartpole-appo" / "seed1" / "metrics.jsonl").write_text("")
    assert entry.main(["learning", "--profile", "cartpole-appo", "--seeds", "2", "--out-dir", str(tmp_path),
                       "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "seed1' already holds a run: pass --resume to continue it, --overwrite" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cartpole-appo" / "seed0").exists()  # refused before the first seed trained


def test_runs_that_never_reported_the_metric_are_judged_without_a_curve(tmp_path, capsys):
    run_dir = tmp_path / "cartpole-appo" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(to_toml(build_config("cartpole-appo")))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"env_steps": 0, "wall_time": 15.0,
                                                       "episode_return_mean": None}) + "\n")
    assert entry.main(["learning", "--profile", "cartpole-appo", "--seeds", "1", "--no-train",
                       "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cartpole-appo seed 0: episode_return_mean never reported (0 env steps); never >= the threshold\n" in out
    assert "cartpole-appo: no curve to draw, no run reported episode_return_mean" in out
    assert not (tmp_path / "cartpole-appo.png").exists()


def test_a_seed_stopped_by_a_signal_stops_the_bench_in_one_line(tmp_path, capsys, monkeypatch):
    trained = []

    def stopped_run(cfg, run_dir, **_):
        trained.append(cfg.seed)
        return RunResult(run_dir, [], stopped_by="SIGTERM")

    monkeypatch.setattr(bench, "train", stopped_run)
    code = entry.main(["learning", "--profile", "cartpole-appo", "--seeds", "3", "--no-plot", "--out-dir",
                       str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and trained == [0]  # not the next seed, as if nothing had happened
    assert err == [f"bench.py learning: error: SIGTERM stopped cartpole-appo seed 0 (its run directory keeps what "
                   f"it trained; --resume continues it); the seeds before it are in {tmp_path}"]


def test_resume_continues_a_stopped_seed_starts_a_missing_one_and_leaves_a_finished_one(tmp_path, capsys,
                                                                                    monkeypatch):
    budget = 4000
    for seed, steps in ((0, budget), (1, budget // 2)):  # seed 0 reached the budget, seed 1 was stopped
        run_dir = tmp_path / "cartpole-appo" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.toml").write_text(to_toml(build_config("cartpole-appo", {"seed": seed})))
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                                      reports([100.0] * (steps // 1000))))
    trained = []

    def fake_train(cfg, run_dir, resume=False, overwrite=False, **_):
        trained.append((cfg.seed, resume, cfg.train_for_env_steps))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports([500.0] * 4)))
        return RunResult(run_dir, [])

    monkeypatch.setattr(bench, "train", fake_train)
    assert entry.main(["learning", "--profile", "cartpole-appo", "--seeds", "3", "--budget-steps", str(budget),
                       "--resume", "--no-plot", "--out-dir", str(tmp_path)]) == 0
    assert trained == [(1, True, budget), (2, False, budget)]
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == [f"cartpole-appo seed {k}" for k in range(3)]
    assert "< 475" in lines[0] and ">= 475" in lines[1] and ">= 475" in lines[2]


def test_a_run_is_finished_at_either_of_its_limits(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert not bench.run_finished(run_dir, build_config("cartpole-appo", {"train_for_env_steps": 10}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"env_steps": 3000, "trained_seconds": 20.0}) + "\n")
    by_steps = {"train_for_env_steps": 3000, "train_for_seconds": 0.0}
    assert bench.run_finished(run_dir, build_config("cartpole-appo", by_steps))
    assert not bench.run_finished(run_dir, build_config("cartpole-appo", {**by_steps, "train_for_env_steps": 3001}))
    by_time = {"train_for_env_steps": 0, "train_for_seconds": 20.0}
    assert bench.run_finished(run_dir, build_config("cartpole-appo", by_time))
    assert not bench.run_finished(run_dir, build_config("cartpole-appo", {**by_time, "train_for_seconds": 21.0}))
