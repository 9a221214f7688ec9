"""Run directories: a run is never started over another, resumes are checked before anything is written."""
import errno
import fcntl
import json
import os
import re
import stat
import subprocess
import sys
import threading

import pytest

from fastrl.cli import train_main
from fastrl.files.checkpoint import write_checkpoint_file
from fastrl.files.run_dir import (
    LOCK_FILE,
    RunDirError,
    check_run_dir,
    default_run_dir,
    first_missing,
    prepare_run_dir,
    remove_unused_run_dir,
    write_atomic,
)
from fastrl.run.training import RunError, train
from tests.support.runs import tiny_config


def test_overwrite_removes_only_what_fastrl_wrote(tmp_path):
    for name in ("config.toml", "metrics.jsonl", "train.log", "train.log.1", "elastic.json", "processes.json",
                 "processes.rank1.json", ".config.toml.k2j4.tmp", ".processes.json.x1.tmp", "notes.txt",
                 ".notes.txt.tmp"):
        (tmp_path / name).write_text("old")
    for folder, name in (("checkpoints", "ckpt_000000000001.pt"), ("league", "snapshot-000000000004.pt"),
                         ("league", "record.json"), ("pbt", "lineage.jsonl"), ("pbt", "history.jsonl"),
                         ("tb", "events.out.tfevents.1"), ("videos", "eval-000000004096.mp4"),
                         ("wandb", "run_id"), ("mine", "notes.txt")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / name).write_text("old")
    prepare_run_dir(tmp_path, resume=False, overwrite=True)
    # Nothing of the old run survives into the new one: a new self-play run would play the old
    # league's snapshots, a new population go on with the old lineage.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.txt.tmp", "mine", "notes.txt"]


@pytest.mark.parametrize("name", ["league", "pbt"])
def test_overwrite_refuses_a_linked_league_or_pbt_folder_and_deletes_nothing(tmp_path, name):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "record.json").write_text("someone else's")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.toml").write_text("old")
    (run_dir / name).symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunDirError, match=f"'{run_dir / name}' is a symbolic link to '{outside}'"):
        check_run_dir(run_dir, resume=False, overwrite=True)
    with pytest.raises(RunDirError, match="is a symbolic link"):
        prepare_run_dir(run_dir, resume=False, overwrite=True)
    assert (outside / "record.json").read_text() == "someone else's" and (run_dir / "config.toml").exists()


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


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_file_system_without_flock_is_one_line_naming_it_and_leaves_no_run_dir(tmp_path, monkeypatch, capsys,
                                                                                 code):
    def no_flock(fd, operation):  # NFS without lockd, Lustre mounted without -o flock
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.raises(RunDirError) as info:
        check_run_dir(tmp_path, resume=False, overwrite=False)
    message = str(info.value)
    assert "\n" not in message and "does not support flock" in message and "--run-dir on a local disk" in message
    assert re.search(r"its file system \(\S+ at /\S*\)", message), message

    run_dir = tmp_path / "new" / "run"
    assert train_main(["--profile", "cartpole-appo", "--run-dir", str(run_dir), "--set", "device=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fastrl-train: error: cannot lock run directory '{run_dir}'")
    assert not run_dir.exists()


def test_a_refused_start_removes_the_run_dir_it_made_and_never_one_that_was_there(tmp_path):
    cfg = tiny_config(serial=True)
    cfg.env.id = "NoSuchEnv-v0"  # refused once the directory is made and locked, by the env probe
    made, there = tmp_path / "made" / "run", tmp_path / "there"
    there.mkdir()
    for run_dir in (made, there):
        with pytest.raises(Exception, match="NoSuchEnv-v0"):
            train(cfg, run_dir=run_dir, quiet=True)
    assert not made.exists() and there.is_dir()


def test_a_run_dir_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):  # tests run as root, where chmod cannot take write access away
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("fastrl.files.run_dir.tempfile.NamedTemporaryFile", refuse)
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


@pytest.mark.parametrize("writer", ["write_atomic", "write_checkpoint_file"])
def test_atomic_writes_fsync_the_file_then_rename_then_fsync_the_folder(tmp_path, monkeypatch, writer):
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", stat.S_ISDIR(os.fstat(fd).st_mode))),
                                                 fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda *args: (events.append(("replace",)), replace(*args)))
    if writer == "write_atomic":
        write_atomic(tmp_path / "config.toml", "new")
    else:
        write_checkpoint_file(tmp_path / "ckpt_000000000001.pt", {"counters": {"env_steps": 1}})
    # Without the folder's fsync a crash after the rename can bring back the old file, or none.
    assert events == [("fsync", False), ("replace",), ("fsync", True)]


def hold_lock(run_dir, seconds):
    """Another process that holds ``run_dir``'s lock (as a running fastrl-train does) for ``seconds``."""
    code = ("import sys, time; from fastrl.files.run_dir import check_run_dir; "
            "lock = check_run_dir(sys.argv[1], False, True); print('held', flush=True); time.sleep(float(sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_directory_a_live_run_works_in_is_refused_even_with_overwrite(tmp_path):
    holder = hold_lock(tmp_path, 60)
    try:
        for resume, overwrite in ((False, True), (True, False)):
            with pytest.raises(RunDirError, match=f"in use by a running fastrl-train \\(pid {holder.pid}\\); stop it "
                                                  f"first, or pass another --run-dir"):
                check_run_dir(tmp_path, resume=resume, overwrite=overwrite)
    finally:
        holder.kill()
        holder.wait()
    check_run_dir(tmp_path, resume=False, overwrite=True).release()  # the kernel dropped the dead holder's lock


def test_a_dir_holding_only_processes_json_holds_a_run(tmp_path):
    (tmp_path / "processes.json").write_text(json.dumps({"runner": [12345], "learner": [12346]}))
    with pytest.raises(RunDirError, match="already holds a run: pass --resume to continue it, --overwrite"):
        check_run_dir(tmp_path, resume=False, overwrite=False)


def test_overwrite_checks_every_path_before_it_deletes_one(tmp_path):
    (tmp_path / "config.toml").write_text("old")
    (tmp_path / "tb").write_text("a file where fastrl keeps a folder")
    with pytest.raises(RunDirError, match="'.*tb' is a file where fastrl keeps a folder; move it out"):
        prepare_run_dir(tmp_path, resume=False, overwrite=True)
    assert (tmp_path / "config.toml").read_text() == "old"


def test_the_writers_never_follow_a_link_made_during_the_run(tmp_path):
    from fastrl.files.checkpoint import CheckpointError, save_checkpoint
    from fastrl.reporting.console import Console
    from fastrl.reporting.metrics import MetricsWriteError, Reporter
    from fastrl.reporting.wandb_logger import _save_run_id

    from ..reporting.test_metrics import small_arena

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("kept\n")
    (outside / "ckpt_000000000001.pt").write_text("kept\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("metrics.jsonl", "train.log"):
        (run_dir / name).symlink_to(outside / "target.txt")
    (run_dir / "checkpoints").symlink_to(outside, target_is_directory=True)
    (run_dir / "wandb").mkdir()
    (run_dir / "wandb" / "run_id").symlink_to(outside / "target.txt")

    reporter = Reporter(small_arena(num_workers=1), run_dir, frame_skip=1, target_env_steps=0, target_seconds=0.0)
    with pytest.raises(MetricsWriteError, match="metrics.jsonl' is a symbolic link"):
        reporter.report()
    reporter.close()
    console = Console(run_dir, quiet=True)
    console.status("a line")
    assert console.log is None
    with pytest.raises(CheckpointError, match="checkpoints' is a symbolic link"):
        save_checkpoint(run_dir, {"learner": {}, "counters": {}}, env_steps=2, keep=1)
    _save_run_id(run_dir, "abc123")  # replaces the link itself
    assert (run_dir / "wandb" / "run_id").read_text() == "abc123\n" and not (run_dir / "wandb" / "run_id").is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["ckpt_000000000001.pt", "target.txt"]
    assert (outside / "target.txt").read_text() == "kept\n"


def test_a_file_where_the_runs_folder_should_be_is_one_line(tmp_path):
    (tmp_path / "runs").write_text("x")
    with pytest.raises(RunDirError, match="cannot create the runs folder"):
        default_run_dir("cartpole-appo", tmp_path / "runs")


def test_a_refused_start_removes_the_folders_it_made_and_keeps_those_it_found(tmp_path):
    (tmp_path / "kept").mkdir()
    run_dir = tmp_path / "kept" / "made" / "deeper" / "run"
    made = first_missing(run_dir)
    assert made == tmp_path / "kept" / "made"
    run_dir.mkdir(parents=True)
    (run_dir / LOCK_FILE).touch()
    remove_unused_run_dir(run_dir, made)
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and not list((tmp_path / "kept").iterdir())


def test_a_refused_start_keeps_a_made_folder_that_now_holds_something_else(tmp_path):
    run_dir = tmp_path / "made" / "run"
    made = first_missing(run_dir)
    run_dir.mkdir(parents=True)
    (tmp_path / "made" / "notes.txt").write_text("mine")
    remove_unused_run_dir(run_dir, made)
    assert not run_dir.exists() and (tmp_path / "made" / "notes.txt").read_text() == "mine"
