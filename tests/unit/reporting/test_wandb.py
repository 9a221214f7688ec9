"""Weights & Biases, offline (WANDB_MODE=offline, no network): the reports, config, evaluations and
videos reach the W&B run; --resume continues the same W&B run; W&B failing never stops a run; a
missing wandb package stops it before it starts, in one line."""
import importlib.util
import json
import struct
import sys
import threading
import time

import pytest

from fastrl.cli import train_main
from fastrl.config import build_config, to_toml
from fastrl.reporting import wandb_logger
from fastrl.reporting.console import Console
from fastrl.reporting.metrics import Reporter
from fastrl.reporting.wandb_logger import RUN_ID_FILE, WANDB_DIR
from tests.unit.reporting.test_metrics import small_arena

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="the [wandb] extra is not installed")
TOY = "fastrl.envs.toy:"
LOG_BLOCK = 32768  # the .wandb file is a leveldb-style log: 7-byte record headers in 32 KiB blocks
FULL, LAST = 1, 4  # record kinds that complete a record


def wandb_records(path):
    """The protobuf records of an offline run's ``run-<id>.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if LOG_BLOCK - pos % LOG_BLOCK < 7:  # too little room for a header: the block is padded
            pos += LOG_BLOCK - pos % LOG_BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_runs(run_dir):
    """{W&B run id: (its run record, its history rows as dicts)} of every offline run folder."""
    runs = {}
    for log in sorted((run_dir / WANDB_DIR).glob("offline-run-*/run-*.wandb")):
        run, history = None, []
        for record in wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = record.run
            elif kind == "history":
                history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                for item in record.history.item})
        runs.setdefault(run.run_id, []).append((run, history))
    return runs


def wandb_run_dir(tmp_path, **overrides):
    """A run directory as train() leaves it before the Reporter starts: config.toml with W&B on."""
    cfg = build_config("cartpole-appo", {"logging.wandb": True, "logging.wandb_group": "tests", **overrides})
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.toml").write_text(to_toml(cfg))
    return tmp_path


def reporter_for(run_dir):
    return Reporter(small_arena(num_workers=1), run_dir, frame_skip=1, target_env_steps=0, target_seconds=0.0,
                    console=Console(run_dir, quiet=True))


@needs_wandb
def test_a_resumed_run_logs_to_the_same_wandb_run(tmp_path, offline):
    run_dir = wandb_run_dir(tmp_path)
    for _ in range(2):
        reporter = reporter_for(run_dir)
        reporter.report()
        reporter.close()
    saved_id = (run_dir / WANDB_DIR / RUN_ID_FILE).read_text().strip()
    runs = offline_runs(run_dir)
    assert list(runs) == [saved_id] and len(runs[saved_id]) == 2  # one folder per session, one W&B run


@needs_wandb
def test_a_video_is_logged_as_mp4(tmp_path, offline):
    pytest.importorskip("imageio_ffmpeg")
    from fastrl.evaluation.video import write_video
    from tests.support.runs import PAINTED, toy_config
    from tests.unit.evaluation.test_video import untrained_model

    cfg = toy_config(PAINTED)
    video = write_video(cfg, untrained_model(cfg), tmp_path / "clip.mp4", episodes=1)["video"]
    run_dir = wandb_run_dir(tmp_path / "run")
    reporter = reporter_for(run_dir)
    reporter.wandb.log_video(video, env_steps=100)
    reporter.close()
    [sessions] = offline_runs(run_dir).values()
    [(_, history)] = sessions
    assert history[0]["env_steps"] == 100 and history[0]["eval/video/_type"] == "video-file"
    assert list((run_dir / WANDB_DIR).glob("offline-run-*/files/media/videos/eval/*.mp4"))


@needs_wandb
def test_a_wandb_failure_warns_once_and_the_reports_go_on(tmp_path, offline, monkeypatch):
    import wandb

    def broken(*args, **kwargs):
        raise RuntimeError("the W&B service went away")

    started = wandb.init

    def init_whose_log_breaks(**kwargs):
        run = started(**kwargs)
        monkeypatch.setattr(run, "log", broken)
        return run

    monkeypatch.setattr(wandb, "init", init_whose_log_breaks)
    run_dir = wandb_run_dir(tmp_path)
    reporter = reporter_for(run_dir)
    try:
        for _ in range(3):
            reporter.report()
    finally:
        reporter.close()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3
    notices = [line for line in (run_dir / "train.log").read_text().splitlines() if "Weights & Biases" in line]
    assert len(notices) == 1 and "the W&B service went away" in notices[0]


@needs_wandb
def test_wandb_that_cannot_start_warns_once_and_the_reports_go_on(tmp_path, offline, monkeypatch):
    import wandb

    def refuse(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)
    run_dir = wandb_run_dir(tmp_path)
    reporter = reporter_for(run_dir)
    reporter.report()
    reporter.close()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    notices = [line for line in (run_dir / "train.log").read_text().splitlines() if "Weights & Biases" in line]
    assert len(notices) == 1 and "Weights & Biases could not start" in notices[0]


def test_logging_wandb_without_the_package_stops_before_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    run_dir = tmp_path / "run"
    code = train_main(["--env", TOY + "make_countdown", "--set", "logging.wandb=true", "--run-dir", str(run_dir),
                       "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "pip install 'fastrl[wandb]'" in err
    assert not run_dir.exists()  # refused before the run directory (or any process) was touched


@needs_wandb
def test_reports_wandb_cannot_keep_up_with_are_dropped_and_counted_without_waiting(tmp_path, offline, monkeypatch):
    import wandb

    entered, released = threading.Event(), threading.Event()

    def init_that_hangs(**kwargs):
        entered.set()
        released.wait(60)
        raise TimeoutError("no answer from the W&B server")

    monkeypatch.setattr(wandb, "init", init_that_hangs)
    monkeypatch.setattr(wandb_logger, "QUEUE_SIZE", 4)
    monkeypatch.setattr(wandb_logger, "CLOSE_WAIT_S", 0.5)
    run_dir = wandb_run_dir(tmp_path)
    reporter = reporter_for(run_dir)
    try:
        assert entered.wait(30)
        started = time.monotonic()
        for _ in range(10):
            reporter.report()
        reporter.close()
        assert time.monotonic() - started < 5  # nothing waited for W&B beyond the close's 0.5 s
    finally:
        released.set()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 10
    notices = [line for line in (run_dir / "train.log").read_text().splitlines() if "Weights & Biases" in line]
    assert len(notices) == 3
    assert "not keeping up" in notices[0] and "missed 6 report(s)" in notices[1]
    assert "did not finish within 0 s" in notices[2] and str(run_dir / WANDB_DIR) in notices[2]


def test_abandoning_wandb_turns_its_analytics_off_before_its_teardown(monkeypatch):
    """The 12 s hold at exit: a W&B left behind reports its failed init to the same silent server
    from an exit hook unless its analytics are off before the teardown starts (tests/e2e/
    test_wandb.py runs the silent server; this is the order, checked without a clock)."""
    calls = []
    monkeypatch.setattr(wandb_logger, "_disable_wandb_analytics", lambda: calls.append("analytics off"))
    monkeypatch.setattr(wandb_logger, "_teardown_quietly", lambda wandb: calls.append("teardown"))
    wandb_logger._abandon(object())
    for thread in threading.enumerate():
        if thread.name == "fastrl-wandb-teardown":
            thread.join(10)
    assert calls == ["analytics off", "teardown"]


@needs_wandb
def test_the_analytics_switch_fastrl_turns_off_is_in_the_installed_wandb():
    import wandb
    from packaging.version import Version
    if Version(wandb.__version__) >= Version("0.25"):  # older releases send no such analytics
        assert importlib.util.find_spec("wandb.analytics.opentelemetry.opentelemetry_proxy") is not None
