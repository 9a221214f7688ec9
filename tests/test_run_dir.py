"""Run directories: a run is never started over another, resumes are checked before anything is written."""
import contextlib
import errno
import fcntl
import io
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from fastrl.cli import train_main
from fastrl.config import build_config, load_run_config
from fastrl.files.checkpoint import list_checkpoints, write_checkpoint_file
from fastrl.files.run_dir import RunDirError, check_run_dir, default_run_dir, prepare_run_dir, write_atomic
from fastrl.run.training import RunError, train

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


@pytest.mark.slow
def test_a_directory_that_holds_a_run_is_refused_before_the_env_is_even_made(finished_run):
    before = {p.name: p.stat().st_mtime_ns for p in finished_run.iterdir()}
    cfg = tiny_config()
    cfg.env.id = "NoSuchEnv-v0"  # an env probe would fail first if the run dir were checked late
    with pytest.raises(RunError, match="already holds a run: pass --resume to continue it, --overwrite"):
        train(cfg, run_dir=finished_run, quiet=True)
    assert {p.name: p.stat().st_mtime_ns for p in finished_run.iterdir()} == before


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_resume_with_another_env_is_refused_before_config_toml_changes(finished_run):
    config_before = (finished_run / "config.toml").read_text()
    cfg = load_run_config(finished_run)
    cfg.env.id = "Acrobot-v1"
    cfg.serial = True
    with pytest.raises(RunError, match=r"env\.id: 'CartPole-v1' -> 'Acrobot-v1'") as info:
        train(cfg, run_dir=finished_run, resume=True, quiet=True)
    assert "\n" not in str(info.value) and "--run-dir" in str(info.value)
    assert (finished_run / "config.toml").read_text() == config_before


@pytest.mark.slow
def test_resume_with_its_own_config_continues_from_the_checkpoint(finished_run):
    cfg = load_run_config(finished_run)
    cfg.serial = True
    cfg.train_for_env_steps = 8192
    result = train(cfg, run_dir=finished_run, resume=True, quiet=True)
    assert result.final["env_steps"] >= 8192
    assert list_checkpoints(finished_run)[-1].name >= "ckpt_000000008192.pt"


@pytest.mark.slow
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


def keep_lock_for(lock, seconds):
    """A spawned child given the run directory's lock (as the learner is)."""
    time.sleep(seconds)


def test_a_child_given_the_lock_holds_it_after_the_runner_lets_go_and_is_named(tmp_path):
    lock = check_run_dir(tmp_path, resume=False, overwrite=False)
    child = mp.get_context("spawn").Process(target=keep_lock_for, args=(lock, 60))
    child.start()
    try:
        lock.release()  # the runner is gone; its learner is still writing
        with pytest.raises(RunDirError, match=f"in use by pid {child.pid}, left running by a fastrl-train that has "
                                              f"exited \\(pid {os.getpid()}\\)"):
            check_run_dir(tmp_path, resume=True, overwrite=False)
    finally:
        child.kill()
        child.join()
    check_run_dir(tmp_path, resume=True, overwrite=False).release()


def metrics_lines(run_dir):
    path = run_dir / "metrics.jsonl"
    return path.read_text().splitlines(keepends=True) if path.exists() else []


def has_trained(run_dir):
    return any(json.loads(line)["learner_updates"] > 0 for line in metrics_lines(run_dir) if line.endswith("\n"))


def start_run(run_dir):
    cmd = [sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(run_dir), "--quiet",
           "--train-for-seconds", "60", "--set", "device=cpu", "--set", "env.num_workers=1", "--set",
           "report_every_s=0.2"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_runs_started_on_one_run_dir_one_is_refused_in_one_line_and_the_other_goes_on(tmp_path):
    runs = [start_run(tmp_path), start_run(tmp_path)]
    try:
        deadline = time.time() + 120
        while all(run.poll() is None for run in runs) and time.time() < deadline:
            time.sleep(0.05)
        refused = next(run for run in runs if run.poll() is not None)
        first = next(run for run in runs if run is not refused)
        assert first.poll() is None
        _, err = refused.communicate()
        assert refused.returncode == 2 and err.count("\n") == 1, err
        assert f"in use by a running fastrl-train (pid {first.pid}); stop it first" in err
        deadline = time.time() + 60
        while not (tmp_path / "config.toml").exists() and time.time() < deadline:
            time.sleep(0.05)
        config = (tmp_path / "config.toml").read_text()
        for flags in (["--overwrite"], ["--resume"]):  # in this process, so that it cannot outrun the first
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = train_main(["--profile", "cartpole-appo", "--run-dir", str(tmp_path), "--quiet", "--set",
                                   "device=cpu", "--set", "serial=true", "--train-for-env-steps", "2048", *flags])
            assert code == 2 and err.getvalue().count("\n") == 1, err.getvalue()
            assert f"in use by a running fastrl-train (pid {first.pid})" in err.getvalue()
        assert (tmp_path / "config.toml").read_text() == config
        deadline = time.time() + 90
        while time.time() < deadline and first.poll() is None and not has_trained(tmp_path):
            time.sleep(0.1)
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=90)
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.communicate()
    assert first.returncode == 0, err
    assert json.loads(out)["run_dir"] == str(tmp_path)
    steps = [json.loads(line)["env_steps"] for line in metrics_lines(tmp_path)]
    assert steps and steps == sorted(steps)  # one run's reports, in order
    assert (tmp_path / "config.toml").read_text() == config and list_checkpoints(tmp_path)
    check_run_dir(tmp_path, resume=True, overwrite=False).release()  # free once the first run ended


def test_a_dir_holding_only_processes_json_holds_a_run(tmp_path):
    (tmp_path / "processes.json").write_text(json.dumps({"runner": [12345], "learner": [12346]}))
    with pytest.raises(RunDirError, match="already holds a run: pass --resume to continue it, --overwrite"):
        check_run_dir(tmp_path, resume=False, overwrite=False)


@pytest.mark.slow
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


@pytest.mark.slow
def test_overwrite_with_a_symlinked_checkpoints_folder_deletes_nothing(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    outside = tmp_path / "elsewhere"
    shutil.move(run_dir / "checkpoints", outside)
    (run_dir / "checkpoints").symlink_to(outside, target_is_directory=True)
    kept = sorted(p.name for p in outside.iterdir())
    before = sorted(p.name for p in run_dir.iterdir())
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = train_main(["--profile", "cartpole-appo", "--run-dir", str(run_dir), "--overwrite", "--set",
                           "device=cpu"])
    assert code == 2 and err.getvalue().count("\n") == 1 and "checkpoints' is a symbolic link" in err.getvalue()
    assert sorted(p.name for p in run_dir.iterdir()) == before and sorted(p.name for p in outside.iterdir()) == kept


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

    from .test_metrics import small_arena

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


@pytest.mark.slow
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
