"""The tests of tests/unit/files/test_run_dir.py's subject that train in this process."""
import re
import shutil

import pytest

from fastrl.config import load_run_config
from fastrl.files.checkpoint import list_checkpoints
from fastrl.run.training import RunError, train
from tests.support.runs import tiny_config


def test_a_directory_that_holds_a_run_is_refused_before_the_env_is_even_made(finished_run):
    before = {p.name: p.stat().st_mtime_ns for p in finished_run.iterdir()}
    cfg = tiny_config()
    cfg.env.id = "NoSuchEnv-v0"  # an env probe would fail first if the run dir were checked late
    with pytest.raises(RunError, match="already holds a run: pass --resume to continue it, --overwrite"):
        train(cfg, run_dir=finished_run, quiet=True)
    assert {p.name: p.stat().st_mtime_ns for p in finished_run.iterdir()} == before

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

def test_a_symlinked_metrics_file_is_refused_before_anything_is_written(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's file\n")
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "metrics.jsonl").symlink_to(outside)
    before = {p.name: p.lstat().st_mtime_ns for p in run_dir.iterdir()}
    cfg = load_run_config(run_dir)
    cfg.serial = True
    cfg.train_for_env_steps = 8192
    with pytest.raises(RunError, match=f"'{run_dir / 'metrics.jsonl'}' is a symbolic link to '{outside}', and "
                                       f"fastrl never writes through one: remove it") as info:
        train(cfg, run_dir=run_dir, resume=True, quiet=True)
    assert "\n" not in str(info.value)
    assert outside.read_text() == "someone else's file\n"
    assert {p.name: p.lstat().st_mtime_ns for p in run_dir.iterdir()} == before

def test_budgets_and_clocks_continue_across_a_resume(finished_run, tmp_path):
    import json
    import shutil

    from fastrl.files.checkpoint import load_checkpoint

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
    # So do the learner's counters, from the resumed run's first report on (before its first update).
    updates = [r["learner_updates"] for r in records]
    assert updates[0] < updates[-1] and updates == sorted(updates)
    assert cfg.train_for_seconds <= records[-1]["trained_seconds"] < cfg.train_for_seconds + 2.0
    # The checkpoint keeps the clock in whole milliseconds (arena.control), so it may read up to 1 ms
    # below the float the budget check compared (seen in CI: 3.139 against 3.1390000000000002).
    assert load_checkpoint(list_checkpoints(run_dir)[-1])["counters"]["trained_seconds"] >= cfg.train_for_seconds - 1e-3
