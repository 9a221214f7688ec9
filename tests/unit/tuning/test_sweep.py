"""fastrl-sweep: the search space and its one-line refusals, the table and the best profile, a
killed sweep resuming to exactly --trials finished trials with the cut-off one retried, and a
pruned trial leaving no process or shared memory behind."""
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from fastrl.cli import resolve_train_config, sweep_main, train_parser
from fastrl.config import ConfigError, build_config
from fastrl.tuning import search_space as sweep_space
from fastrl.tuning import sweep as sweep_module
from fastrl.tuning.search_space import configured, objective_keys, parse_param
from fastrl.tuning.sweep import BEST_PROFILE, PRUNE_RUNGS, Sweep, SweepSpec, check_spec, open_study
from fastrl.tuning.trial import OUTPUT_FILE, ObjectiveCurve, Rungs, TrialProcess
from tests.support.repo import REPO

TINY = ["device=cpu", "report_every_s=0.2", "env.num_workers=1", "env.envs_per_worker=64", "learner.batch_size=1024"]


def sweep_args(sweep_dir, *args, sets=TINY):
    return ["--sweep-dir", str(sweep_dir), *args, *(a for s in sets for a in ("--set", s))]


def spec_of(sweep_dir, **fields) -> SweepSpec:
    settings = dict(profile="cartpole-appo", params=[parse_param("learner.lr=loguniform:1e-5:1e-2")],
                    objective="episode_return_mean", trials=3, study="sweep", sweep_dir=Path(sweep_dir),
                    overrides=list(TINY), budget_env_steps=20_000)
    return SweepSpec(**{**settings, **fields})


def study_trials(sweep_dir, study="sweep"):
    return optuna.load_study(study_name=study, storage=f"sqlite:///{Path(sweep_dir).resolve()}/sweep.db").trials


def test_each_distribution_becomes_optunas_and_a_value_goes_back_as_set_takes_it():
    lr = parse_param("learner.lr=loguniform:1e-5:1e-2")
    assert lr.distribution() == optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)
    assert float(lr.set_text(0.00123)) == 0.00123
    coef = parse_param("learner.entropy_coef=uniform:0:0.05:0.01")
    assert coef.distribution() == optuna.distributions.FloatDistribution(0, 0.05, step=0.01)
    batch = parse_param("learner.batch_size=int:1024:4096:1024")
    assert batch.distribution() == optuna.distributions.IntDistribution(1024, 4096, step=1024)
    assert batch.set_text(2048) == "2048"
    envs = parse_param("env.envs_per_worker=intlog:16:1024")
    assert envs.distribution() == optuna.distributions.IntDistribution(16, 1024, log=True)
    sizes = parse_param("model.hidden_sizes=choice:[64,64],[128, 128],{a=1,b=2}")
    assert sizes.choices == ("[64,64]", "[128, 128]", "{a=1,b=2}")
    # Through the config: numbers stay numbers (Optuna plots them), lists travel as their --set text.
    cfg = build_config("cartpole-appo", {k: v for k, _, v in (s.partition("=") for s in TINY)})
    spec = spec_of("unused", params=[parse_param("model.hidden_sizes=choice:[64,64],[128,128]"),
                                     parse_param("learner.num_epochs=choice:1,2")])
    _, (sizes, epochs) = check_spec(spec)
    assert sizes.values == ("[64,64]", "[128,128]") and epochs.values == (1, 2)
    assert epochs.distribution() == optuna.distributions.CategoricalDistribution((1, 2))
    assert epochs.set_text(2) == "2" and sizes.set_text("[128,128]") == "[128,128]"
    assert "learner/entropy" in objective_keys(cfg) and "eval_return_mean" not in objective_keys(cfg)
    population = build_config("cartpole-appo", {"pbt.population": 2})
    assert {"member/1/episode_return_mean", "member/0/learner/lr"} <= objective_keys(population)
    informed = build_config("cartpole-appo", {"pbt.population": 2, "pbt.objective": "info/score",
                                              "env.info_keys": ["lives"], "eval.every_s": 60.0})
    assert {"info/score", "info/lives", "member/1/info/score", "member/0/eval_return_mean"} <= objective_keys(informed)
    assert "info/lives" not in objective_keys(cfg)


@pytest.mark.parametrize("args, message", [
    (["--param", "learner.lrr=uniform:0:1"], "unknown config key 'learner.lrr' (did you mean learner.lr"),
    (["--param", "learner.lr"], "--param expects KEY=DISTRIBUTION:ARGS, got 'learner.lr'"),
    (["--param", "learner.lr=gauss:0:1"], "--param learner.lr: unknown distribution 'gauss'; use one of uniform, "
                                          "loguniform, int, intlog, choice"),
    (["--param", "learner.lr=uniform:0.1:0.01"], "the range is inverted; give LOW < HIGH"),
    (["--param", "learner.lr=uniform:0.1:0.1"], "the range is empty; give LOW < HIGH"),
    (["--param", "learner.lr=loguniform:0:0.1"], "a log scale needs LOW > 0"),
    (["--param", "learner.lr=uniform:0:0.1"], "learner.lr must be > 0, and 0 is not; narrow the range"),
    (["--param", "learner.lr=uniform:a:b"], "uniform takes float bounds"),
    (["--param", "learner.rollout=uniform:16:32"], "learner.rollout is int: use int or intlog"),
    (["--param", "learner.rollout=int:16:48"], "with learner.rollout=48: learner.batch_size (1024) must be a multiple "
                                               "of learner.rollout (48)"),
    (["--param", "model.activation=choice:relu,sigmoid"], "with model.activation=sigmoid: config key "
                                                          "'model.activation' must be one of"),
    (["--param", "model.activation=choice:"], "needs values separated by commas"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--param", "learner.lr=uniform:0.1:0.2"], "given twice"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--set", "learner.lr=1e-3"],
     "learner.lr is both a --param and a --set: drop one"),
    (["--param", "train_for_env_steps=int:1:9"], "the sweep sets each trial's budget"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--objective", "episode_reward"],
     "--objective episode_reward is not a metrics.jsonl key fastrl writes"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--objective", "eval_return_mean"],
     "--objective eval_return_mean needs evaluation during training: add --set eval.every_s=60"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--objective", "league/win_rate"],
     "is written with self-play: set selfplay.enabled=true"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--objective", "member/1/episode_return_mean"],
     "member/<k>/ figures are written by population-based training: set pbt.population"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--study", "a/b"], "--study 'a/b': use letters, digits"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--prune-warmup", "1"], "--prune-warmup is a fraction"),
    (["--param", "learner.lr=loguniform:1e-5:1e-2", "--storage", "nodb://x"], "cannot open the storage nodb://x"),
    # A value a config check meets with a TypeError (a scalar where a list is read) is refused as any other.
    (["--set", "pbt.population=2", "--param", "pbt.start=choice:{a=1},{b=2}"],
     "--param pbt.start=choice:{a=1},{b=2}: "),
])
def test_bad_input_is_one_line_before_any_trial(tmp_path, capsys, args, message):
    sweep_dir = tmp_path / "sweep"
    code = sweep_main(sweep_args(sweep_dir, "--trials", "2", "--budget-env-steps", "1000", *args))
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("fastrl-sweep: error: ") and message in err, err
    assert not sweep_dir.exists()  # a refused sweep leaves nothing behind, no lock file either


def test_a_type_error_of_a_config_check_is_one_line(monkeypatch):
    def validate(cfg):
        raise TypeError("object of type 'int' has no len()")

    monkeypatch.setattr(sweep_space, "validate", validate)
    cfg = build_config("cartpole-appo")
    with pytest.raises(ConfigError, match=r"^a value of a type the config's checks do not take \(object of type "
                                          r"'int' has no len\(\)\): check the types of the --set and --param values$"):
        configured(cfg, [("learner.lr", "1e-3")])


@pytest.mark.parametrize("where", ["sweep dir", "study dir"])
def test_a_sweep_dir_or_study_dir_that_is_a_file_is_one_line(tmp_path, capsys, where):
    sweep_dir = tmp_path / "sweeps"
    if where == "sweep dir":
        sweep_dir.write_text("a file\n")
        expected = f"--sweep-dir '{sweep_dir}' is a file: pass a folder (one is made if missing)"
    else:
        sweep_dir.mkdir()
        (sweep_dir / "sweep").write_text("a file\n")
        expected = f"'{sweep_dir / 'sweep'}' is a file, where study 'sweep' keeps its trials: move it, or pass " \
                   f"another --study"
    code = sweep_main(sweep_args(sweep_dir, "--trials", "1", "--budget-env-steps", "1000",
                                 "--param", "learner.lr=loguniform:1e-5:1e-2"))
    assert code == 2 and capsys.readouterr().err == f"fastrl-sweep: error: {expected}\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == (["sweeps"] if where == "sweep dir" else ["sweep", "sweeps"])


def test_without_optuna_the_sweep_is_refused_and_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    code = sweep_main(sweep_args(tmp_path / "sweeps", "--trials", "1", "--budget-env-steps", "1000",
                                 "--param", "learner.lr=loguniform:1e-5:1e-2"))
    assert code == 2 and capsys.readouterr().err == ("fastrl-sweep: error: fastrl-sweep needs optuna: pip install "
                                                     "'fastrl[sweep]'\n")
    assert not (tmp_path / "sweeps").exists()


def test_a_storage_error_while_the_sweep_works_is_one_line(tmp_path, capsys, monkeypatch):
    # Another program holds sweep.db once the study is open: every read waits SQLITE_BUSY_S, then fails.
    monkeypatch.setattr(sweep_module, "SQLITE_BUSY_S", 0.1)
    holders = []

    def open_then_hold(spec):
        study = open_study(spec)
        holders.append(sqlite3.connect(tmp_path / "sweep.db", isolation_level=None))
        holders[-1].execute("BEGIN EXCLUSIVE")
        return study

    monkeypatch.setattr(sweep_module, "open_study", open_then_hold)
    try:
        code = sweep_main(sweep_args(tmp_path, "--trials", "1", "--budget-env-steps", "1000",
                                     "--param", "learner.lr=loguniform:1e-5:1e-2"))
    finally:
        for holder in holders:
            holder.close()
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"fastrl-sweep: error: the storage sqlite:///{tmp_path.resolve()}/sweep.db failed (database "
                          f"is locked); another program may be writing it, or its file system lacks working POSIX "
                          f"locks (NFS): pass --storage with a server database"), err


def test_a_budget_of_zero_is_refused_in_one_line(tmp_path, capsys):
    code = sweep_main(sweep_args(tmp_path, "--trials", "2", "--budget-env-steps", "0",
                                 "--param", "learner.lr=loguniform:1e-5:1e-2"))
    assert code == 2 and "give each trial one budget" in capsys.readouterr().err


def test_a_study_another_sweep_is_running_is_refused(tmp_path, capsys):
    (tmp_path / "sweep").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from fastrl.files.run_dir import RunDirLock; "
                               "RunDirLock.take(sys.argv[1]).record_pid(); print(flush=True); time.sleep(60)",
                               str(tmp_path / "sweep")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        code = sweep_main(sweep_args(tmp_path, "--trials", "3", "--budget-env-steps", "20000", "--param",
                                     "learner.lr=loguniform:1e-5:1e-2"))
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2 and f"is being run by pid {holder.pid}" in err and "pass another --study" in err, err
    assert not (tmp_path / "sweep.db").exists()


def test_a_trial_the_sweep_left_running_is_failed_and_queued_again_with_its_params(tmp_path):
    spec = spec_of(tmp_path)
    cfg, params = check_spec(spec)
    study = open_study(spec)
    sweep = Sweep(spec, cfg, params, study)
    ours = study.ask(sweep.distributions)
    ours.set_user_attr("sweep", sweep.owner)
    elsewhere = study.ask(sweep.distributions)
    elsewhere.set_user_attr("sweep", "another-host:/sweeps/x")
    sweep.retry_cut_off(sweep.owner)
    trials = study.get_trials()
    state = optuna.trial.TrialState
    assert [t.state for t in trials] == [state.FAIL, state.RUNNING, state.WAITING]
    assert trials[2].system_attrs["failed_trial"] == 0 and trials[2].params == ours.params
    # The queued trial is the next one asked for, with the cut-off trial's params.
    again = study.ask(sweep.distributions)
    assert again.number == 2 and again.params == ours.params


def test_a_study_made_anew_never_runs_a_trial_in_an_old_trial_s_folder(tmp_path):
    spec = spec_of(tmp_path)
    cfg, params = check_spec(spec)
    study_dir = tmp_path / "sweep"
    old = study_dir / "trial-0000"  # the trial 0 of a study whose storage was deleted
    old.mkdir(parents=True)
    (old / OUTPUT_FILE).write_text("the old trial's output\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (study_dir / "trial-0001").symlink_to(elsewhere)
    sweep = Sweep(spec, cfg, params, open_study(spec))
    dirs = [Path(sweep._next_trial().user_attrs["run_dir"]) for _ in range(3)]
    assert dirs[0].parent == study_dir and dirs[0].name.startswith("trial-0000-")
    assert dirs[1].parent == study_dir and dirs[1].name.startswith("trial-0001-") and not dirs[1].is_symlink()
    assert dirs[2] == study_dir / "trial-0002"
    assert all(d.is_dir() and not any(d.iterdir()) for d in dirs)
    assert (old / OUTPUT_FILE).read_text() == "the old trial's output\n" and not any(elsewhere.iterdir())


def test_a_trial_s_log_is_a_new_file_never_an_old_one_nor_written_through_a_link(tmp_path):
    command = [sys.executable, "-c", "print('new')"]
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    linked, old = tmp_path / "linked", tmp_path / "old"
    for run_dir in (linked, old):
        run_dir.mkdir()
    (linked / OUTPUT_FILE).symlink_to(victim)
    (old / OUTPUT_FILE).write_text("old\n")
    for run_dir in (linked, old):
        with pytest.raises(FileExistsError):
            TrialProcess(command, run_dir)
    assert victim.read_text() == "keep\n" and (old / OUTPUT_FILE).read_text() == "old\n"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    proc = TrialProcess(command, fresh)
    proc.reap()
    assert proc.returncode == 0 and (fresh / OUTPUT_FILE).read_text() == "new\n"


def test_best_toml_replaces_a_link_and_never_writes_through_it(tmp_path):
    spec = spec_of(tmp_path)
    cfg, params = check_spec(spec)
    study = open_study(spec)
    study.add_trial(completed({"learner.lr": 1e-3}, 30.0))
    victim = tmp_path / "victim.toml"
    victim.write_text("keep\n")
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / BEST_PROFILE).symlink_to(victim)
    path = Sweep(spec, cfg, params, study).result().best_profile
    assert victim.read_text() == "keep\n" and not path.is_symlink() and "lr = 0.001" in path.read_text()
    assert [p.name for p in path.parent.iterdir()] == [BEST_PROFILE]  # no temporary file left


def completed(params, value, **kw):
    dist = {"learner.lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)}
    return optuna.trial.create_trial(params=params, distributions=dist, value=value, **kw)


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_the_table_lists_every_trial_and_the_best_profile_is_one_fastrl_train_takes(tmp_path, direction):
    spec = spec_of(tmp_path, direction=direction)
    cfg, params = check_spec(spec)
    study = open_study(spec)
    state = optuna.trial.TrialState
    study.add_trial(completed({"learner.lr": 1e-3}, 30.0, user_attrs={"run_dir": "D/trial-0000"}))
    study.add_trial(completed({"learner.lr": 1e-5}, None, state=state.PRUNED, intermediate_values={1000: 9.5},
                              user_attrs={"run_dir": "D/trial-0001"}))
    study.add_trial(completed({"learner.lr": 2e-3}, None, state=state.FAIL,
                              user_attrs={"run_dir": "D/trial-0002", "error": "fastrl-train exited with 2: boom"}))
    study.add_trial(completed({"learner.lr": 4e-3}, None, state=state.FAIL, user_attrs={"run_dir": "D/trial-0003"}))
    study.add_trial(completed({"learner.lr": 4e-3}, 40.0, user_attrs={"run_dir": "D/trial-0004"},
                              system_attrs={"failed_trial": 3, "retry_history": [3]}))
    result = Sweep(spec, cfg, params, study).result()
    lines = result.table.splitlines()
    assert lines[0].split() == ["trial", "state", "episode_return_mean", "learner.lr", "run", "dir", "note"]
    rows = [line.split() for line in lines[1:]]
    assert [r[:2] for r in rows] == [["0", "complete"], ["1", "pruned"], ["2", "fail"], ["3", "fail"],
                                     ["4", "complete"]]
    assert rows[0][2:5] == ["30", "0.001", "D/trial-0000"] and rows[1][2:7] == ["(9.5", "at", "1,000)", "1e-05",
                                                                              "D/trial-0001"]
    assert lines[3].endswith("D/trial-0002  fastrl-train exited with 2: boom")
    assert lines[4].endswith("D/trial-0003  cut off; retried as 4")
    best = 4 if direction == "maximize" else 0
    assert lines[1 + best].endswith("  best") and sum(line.endswith("  best") for line in lines) == 1
    assert result.best_profile == tmp_path / "sweep" / BEST_PROFILE
    assert f"best: trial {best}" in result.summary and "optuna-dashboard sqlite:///" in result.summary
    # What fastrl-train makes of it: the profile's values, every --set, the best params, and the
    # profile's own budget (the sweep's was for comparing trials).
    trained = resolve_train_config(train_parser().parse_args(["--profile", str(result.best_profile)]))
    assert trained.learner.lr == (4e-3 if best == 4 else 1e-3)
    assert (trained.env.num_workers, trained.env.envs_per_worker, trained.learner.batch_size) == (1, 64, 1024)
    assert trained.train_for_env_steps == build_config("cartpole-appo").train_for_env_steps


def test_three_failed_trials_in_a_row_stop_the_sweep_in_one_line(tmp_path, capsys):
    # Each choice fits the profile alone; together (16 trajectories a batch in 32 minibatches) no trial can run.
    code = sweep_main(sweep_args(tmp_path, "--trials", "2", "--budget-env-steps", "20000",
                                 "--param", "learner.rollout=choice:64",
                                 "--param", "learner.num_minibatches=choice:32"))
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if not line.startswith("[fastrl-sweep] ")]
    assert code == 2 and out == "" and len(errors) == 1, err
    assert errors[0].startswith("fastrl-sweep: error: 3 trials in a row failed, the last (trial 2) as its config is "
                                "refused: learner.batch_size / learner.rollout (16 trajectories) must be divisible "
                                "by learner.num_minibatches (32)")
    assert [t.state for t in study_trials(tmp_path)] == [optuna.trial.TrialState.FAIL] * 3


def test_the_curve_is_read_as_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    curve = ObjectiveCurve(path, "eval_return_mean", "eval_at_env_steps")
    assert curve.read() == [] and curve.last is None
    rows = [{"env_steps": 900, "episode_return_mean": None},
            {"env_steps": 1900, "eval_return_mean": 3.0, "eval_at_env_steps": 1500},
            {"env_steps": 2900, "eval_return_mean": float("nan"), "eval_at_env_steps": 2500}]
    path.write_text("".join(json.dumps(r).replace("NaN", "null") + "\n" for r in rows) + '{"env_steps": 39')
    assert curve.read() == [(1500.0, 3.0)]
    with open(path, "a") as f:
        f.write('00, "eval_return_mean": 5.0, "eval_at_env_steps": 3500}\n')
    assert curve.read() == [(3500.0, 5.0)] and curve.last == 5.0
    assert curve.tail_mean(1000) == 5.0  # the points 2,000 apart: the last covers the whole span


def test_a_trial_s_value_weights_each_report_by_the_steps_it_covers():
    # The last report comes 32 env steps after the one before (a run's stop): it counts for 32.
    curve = ObjectiveCurve("unused", "episode_return_mean", "env_steps")
    curve.points = [(5_800_000.0, 0.40), (6_000_000.0, 0.50), (6_300_000.0, 0.48), (6_300_032.0, 0.0)]
    expected = (200_000 * 0.50 + 300_000 * 0.48 + 32 * 0.0) / 500_032
    assert curve.tail_mean(500_032) == pytest.approx(expected)
    assert curve.tail_mean(1_000_000) == pytest.approx(expected)  # the first report covers no known stretch
    assert curve.tail_mean(100_000) == pytest.approx((99_968 * 0.48) / 100_000)
    assert ObjectiveCurve("unused", "k", "env_steps").tail_mean(10) is None
    single = ObjectiveCurve("unused", "k", "env_steps")
    single.points = [(100.0, 3.0)]
    assert single.tail_mean(10) == 3.0


def test_rungs_are_the_same_steps_in_every_trial_each_given_the_last_report_at_or_before_it():
    rungs = Rungs(10_000, PRUNE_RUNGS)
    assert rungs.steps == list(range(500, 10_001, 500))
    assert rungs.passed(400, 1.0) == [] and rungs.passed(1600, 2.0) == [(500, 1.0), (1000, 1.0), (1500, 1.0)]
    assert rungs.passed(1700, 3.0) == [] and rungs.passed(2000, 4.0) == [(2000, 4.0)]
    assert rungs.passed(2600, 5.0) == [(2500, 4.0)]
    assert Rungs(10, PRUNE_RUNGS).steps == list(range(1, 11))  # whole seconds of a short time budget


def test_a_late_report_gives_its_value_to_no_earlier_rung():
    rungs = Rungs(500_000, PRUNE_RUNGS)
    assert rungs.passed(180_000, 9.0) == []  # 25K..175K: no report at or before them
    assert rungs.passed(200_000, 7.0) == [(200_000, 7.0)]
    slow = Rungs(500_000, PRUNE_RUNGS)
    assert slow.passed(10_000, 1.0) == []
    assert slow.passed(180_000, 9.0) == [(step, 1.0) for step in range(25_000, 175_001, 25_000)]
