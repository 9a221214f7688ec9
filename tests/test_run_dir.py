"""Run directories: a run is never started over another, resumes are checked before anything is written."""
import os
import re
import threading

import pytest

from fastrl.checkpoint import list_checkpoints
from fastrl.cli import train_main
from fastrl.config import build_config, load_run_config
from fastrl.run_dir import RunDirError, check_run_dir, default_run_dir, prepare_run_dir, write_atomic
from fastrl.runner import RunError, train

TINY = {"device": "cpu", "env.num_workers": 1, "env.envs_per_worker": 32, "env.num_splits": 2,
        "learner.batch_size": 512, "train_for_env_steps": 4096, "report_every_s": 0.2}


def tiny_config(**overrides):
    return build_config("cartpole-appo", {**TINY, **overrides})


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run directory with a config, metrics and a final checkpoint (serial: quick, one process)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(tiny_config(serial=True), run_dir=run_dir, quiet=True)
    assert list_checkpoints(run_dir)
    return run_dir


def test_a_directory_that_holds_a_run_is_refused_before_the_env_is_even_made(finished_run):
    before = {p.name: p.stat().st_mtime_ns for p in finished_run.iterdir()}
    cfg = tiny_config()
    cfg.env.id = "NoSuchEnv-v0"  # an env probe would fail first if the run dir were checked late
    with pytest.raises(RunError, match="already holds a run: pass --resume to continue it, --overwrite"):
        train(cfg, run_dir=finished_run, quiet=True)
    assert {p.name: p.stat().st_mtime_ns for p in finished_run.iterdir()} == before


def test_overwrite_removes_only_what_fastrl_wrote(tmp_path):
    for name in ("config.toml", "metrics.jsonl", "train.log", "processes.json", "notes.txt"):
        (tmp_path / name).write_text("old")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt_000000000001.pt").write_text("old")
    prepare_run_dir(tmp_path, resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("resume,overwrite,setup,match", [
    (False, False, "file", "is a file"),
    (True, False, "missing", "does not exist"),
    (True, True, "empty", "pass one of them"),
])
def test_run_dir_mistakes_are_one_line_errors(tmp_path, resume, overwrite, setup, match):
    run_dir = tmp_path / "run"
    if setup == "file":
        run_dir.write_text("not a directory")
    elif setup == "empty":
        run_dir.mkdir()
    with pytest.raises(RunDirError, match=match) as info:
        check_run_dir(run_dir, resume, overwrite)
    assert "\n" not in str(info.value)


def test_a_run_dir_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):  # tests run as root, where chmod cannot take write access away
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("fastrl.run_dir.tempfile.NamedTemporaryFile", refuse)
    with pytest.raises(RunDirError, match=r"cannot write into run directory '.*run' \(Permission denied\); "
                                          r"pass a writable --run-dir") as info:
        check_run_dir(tmp_path / "run", resume=False, overwrite=False)
    assert "\n" not in str(info.value)


def test_a_file_as_run_dir_is_reported_before_the_env_is_probed(tmp_path):
    path = tmp_path / "run"
    path.write_text("x")
    cfg = tiny_config()
    cfg.env.id = "NoSuchEnv-v0"  # the env probe would fail with "Unknown env id" if it came first
    with pytest.raises(RunError, match="is a file; pass another --run-dir") as info:
        train(cfg, run_dir=path, quiet=True)
    assert "NoSuchEnv" not in str(info.value) and "\n" not in str(info.value)


def test_cli_reports_a_file_as_run_dir_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "run"
    path.write_text("x")
    assert train_main(["--run-dir", str(path), "--set", "device=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file" in err and "Traceback" not in err


def test_default_run_dirs_never_collide_within_a_second(tmp_path):
    made = []

    def make():
        made.append(default_run_dir("cartpole-appo", tmp_path))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("old")
    write_atomic(path, "new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["config.toml"]


def test_resume_with_another_model_is_refused_before_config_toml_changes(finished_run):
    config_before = (finished_run / "config.toml").read_text()
    cfg = load_run_config(finished_run)
    trained_with = list(cfg.model.hidden_sizes)
    cfg.model.hidden_sizes = [16]
    cfg.serial = True
    with pytest.raises(RunError, match=re.escape(f"model.hidden_sizes: {trained_with} -> [16]")) as info:
        train(cfg, run_dir=finished_run, resume=True, quiet=True)
    assert "\n" not in str(info.value) and "--run-dir" in str(info.value)
    assert (finished_run / "config.toml").read_text() == config_before


def test_resume_with_another_env_is_refused_before_config_toml_changes(finished_run):
    config_before = (finished_run / "config.toml").read_text()
    cfg = load_run_config(finished_run)
    cfg.env.id = "Acrobot-v1"
    cfg.serial = True
    with pytest.raises(RunError, match=r"env\.id: 'CartPole-v1' -> 'Acrobot-v1'") as info:
        train(cfg, run_dir=finished_run, resume=True, quiet=True)
    assert "\n" not in str(info.value) and "--run-dir" in str(info.value)
    assert (finished_run / "config.toml").read_text() == config_before


def test_resume_with_its_own_config_continues_from_the_checkpoint(finished_run):
    cfg = load_run_config(finished_run)
    cfg.serial = True
    cfg.train_for_env_steps = 8192
    result = train(cfg, run_dir=finished_run, resume=True, quiet=True)
    assert result.final["env_steps"] >= 8192
    assert list_checkpoints(finished_run)[-1].name >= "ckpt_000000008192.pt"


def test_overwrite_keeps_the_old_run_when_the_new_one_cannot_start(finished_run, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    before = sorted(p.name for p in run_dir.iterdir())
    cfg = tiny_config()
    cfg.env.id = "NoSuchEnv-v0"
    with pytest.raises(Exception, match="NoSuchEnv"):
        train(cfg, run_dir=run_dir, quiet=True, overwrite=True)
    assert sorted(p.name for p in run_dir.iterdir()) == before and list_checkpoints(run_dir)


def test_a_directory_a_live_run_works_in_is_refused_even_with_overwrite(tmp_path):
    import json

    (tmp_path / "processes.json").write_text(json.dumps({"runner": [os.getppid()]}))  # a live process
    with pytest.raises(RunDirError, match=f"in use by a running fastrl-train \\(pid {os.getppid()}\\)"):
        check_run_dir(tmp_path, resume=False, overwrite=True)
    with pytest.raises(RunDirError, match="in use"):
        check_run_dir(tmp_path, resume=True, overwrite=False)


def test_a_file_where_the_runs_folder_should_be_is_one_line(tmp_path):
    (tmp_path / "runs").write_text("x")
    with pytest.raises(RunDirError, match="cannot create the runs folder"):
        default_run_dir("cartpole-appo", tmp_path / "runs")


def test_budgets_and_clocks_continue_across_a_resume(finished_run, tmp_path):
    import json
    import shutil

    from fastrl.checkpoint import load_checkpoint

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    counters = load_checkpoint(list_checkpoints(run_dir)[-1])["counters"]
    assert counters["wall_time"] >= counters["trained_seconds"] > 0
    cfg = load_run_config(run_dir)
    cfg.serial = True
    cfg.train_for_env_steps = 0
    cfg.train_for_seconds = counters["trained_seconds"] + 3.0  # three more seconds of training
    train(cfg, run_dir=run_dir, resume=True, quiet=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    walls = [r["wall_time"] for r in records]
    assert walls == sorted(walls)  # wall_time runs on across the resume
    assert cfg.train_for_seconds <= records[-1]["trained_seconds"] < cfg.train_for_seconds + 2.0
    # The checkpoint keeps the clock in whole milliseconds (arena.control), so it may read up to 1 ms
    # below the float the budget check compared (seen in CI: 3.139 against 3.1390000000000002).
    assert load_checkpoint(list_checkpoints(run_dir)[-1])["counters"]["trained_seconds"] >= cfg.train_for_seconds - 1e-3
