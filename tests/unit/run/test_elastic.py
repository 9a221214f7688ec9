"""Elastic restarts (fastrl.run.elastic) and ranks that go away (fastrl.run.rank_heartbeat), on loopback gloo."""
import json
import os
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from fastrl.distributed.process_group import DistInfo
from fastrl.files.run_dir import ELASTIC_RECORD, RunDirError, check_run_dir
from fastrl.run import elastic
from tests.support.torchrun import free_port

RANK0, RANK1 = DistInfo(0, 2), DistInfo(1, 2)


def first_attempt(run_dir, monkeypatch, resume=False, overwrite=False):
    """What train() does on rank 0 of a first attempt: settle, claim the directory, record the job."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    attempt = elastic.current_attempt(5.0)
    resume, overwrite = attempt.settle(run_dir, resume, overwrite, RANK0)
    check_run_dir(run_dir, resume, overwrite).release()
    (run_dir / "config.toml").write_text("")
    attempt.claim(run_dir, resumed=False)
    return attempt


def restart(monkeypatch, count=1, info=RANK0, run_dir=None, resume=False, overwrite=False, timeout_s=5.0):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(count))
    attempt = elastic.current_attempt(timeout_s)
    return attempt, attempt.settle(run_dir, resume, overwrite, info)


def test_a_restart_of_the_same_job_resumes_from_a_checkpoint_and_the_other_ranks_follow(tmp_path, agent_store,
                                                                                      monkeypatch):
    run_dir = tmp_path / "run"
    first_attempt(run_dir, monkeypatch)
    (run_dir / "checkpoints").mkdir()
    checkpoint = run_dir / "checkpoints" / "ckpt_000000004096.pt"
    checkpoint.write_bytes(b"")
    saved_at = time.time() - 30.0
    os.utime(checkpoint, (saved_at, saved_at))

    attempt, flags = restart(monkeypatch, run_dir=run_dir)
    assert flags == (True, False)  # resume, no --resume given
    check_run_dir(run_dir, *flags).release()  # no "already holds a run"
    metrics = attempt.claim(run_dir, resumed=True)
    assert metrics["restarts"] == 1 and 29.0 < metrics["restart_lost_s"] < 40.0
    record = json.loads((run_dir / ELASTIC_RECORD).read_text())
    assert [{k: entry[k] for k in ("restart", "checkpoint", "lost_s")} for entry in record["restarts"]] == [
        {"restart": 1, "checkpoint": checkpoint.name, "lost_s": metrics["restart_lost_s"]}]
    # Rank 1 takes rank 0's decision from the store, whatever its flags.
    assert restart(monkeypatch, info=RANK1, run_dir=run_dir)[1] == (True, False)

    # A second restart adds its loss to the first's: the first resumed 20 s ago, the checkpoint
    # the second resumes was written 10 s ago.
    record["restarts"][-1]["resumed_at"] -= 20.0
    (run_dir / ELASTIC_RECORD).write_text(json.dumps(record))
    os.utime(checkpoint, (time.time() - 10.0,) * 2)
    attempt, flags = restart(monkeypatch, count=2, run_dir=run_dir)
    assert flags == (True, False)
    metrics = attempt.claim(run_dir, resumed=True)
    assert metrics["restarts"] == 2 and 39.0 < metrics["restart_lost_s"] < 55.0
    # A third that resumes that same checkpoint again lost only what came after the second's resume.
    lost_before = metrics["restart_lost_s"]
    attempt, flags = restart(monkeypatch, count=3, run_dir=run_dir)
    metrics = attempt.claim(run_dir, resumed=True)
    assert metrics["restarts"] == 3 and lost_before <= metrics["restart_lost_s"] < lost_before + 5.0


def test_a_restart_without_a_checkpoint_starts_afresh_and_counts_the_whole_attempt_lost(tmp_path, agent_store,
                                                                                      monkeypatch):
    run_dir = tmp_path / "run"
    first = first_attempt(run_dir, monkeypatch)
    started_at = json.loads((run_dir / ELASTIC_RECORD).read_text())["started_at"]
    attempt, flags = restart(monkeypatch, run_dir=run_dir)
    assert flags == (False, True)  # replace what the dead attempt wrote
    assert restart(monkeypatch, info=RANK1, run_dir=run_dir)[1] == (False, False)
    metrics = attempt.claim(run_dir, resumed=False)
    record = json.loads((run_dir / ELASTIC_RECORD).read_text())
    assert record["job"] == first.job  # still this job's run, started again
    assert record["started_at"] > started_at
    assert metrics["restart_lost_s"] == pytest.approx(record["started_at"] - started_at, abs=1e-2)


def test_another_jobs_run_is_refused_as_without_elastic(tmp_path, agent_store, monkeypatch):
    run_dir = tmp_path / "run"
    first_attempt(run_dir, monkeypatch)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "ckpt_000000004096.pt").write_bytes(b"")
    # A new job (its own store; TORCHELASTIC_RUN_ID "none" as before) whose first attempt was
    # refused, restarted by torchrun: the directory is still not its run.
    port = free_port()
    other = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(port))
    _, flags = restart(monkeypatch, run_dir=run_dir)
    assert flags == (False, False)
    with pytest.raises(RunDirError, match="already holds a run"):
        check_run_dir(run_dir, *flags)
    # The same with this job's store but another run id (--rdzv-id of another job).
    monkeypatch.setenv("MASTER_PORT", str(agent_store.port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "another-job")
    assert restart(monkeypatch, run_dir=run_dir)[1] == (False, False)
    del other


def test_restarts_off_or_no_agent_store_is_not_elastic(agent_store, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert elastic.current_attempt(5.0) is None
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert elastic.current_attempt(5.0) is None
