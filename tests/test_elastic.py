"""Elastic restarts (fastrl.run.elastic) and ranks that go away (fastrl.run.rank_heartbeat), on loopback gloo."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import psutil
import pytest
import torch.distributed as dist

from fastrl.distributed.process_group import DistInfo
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.files.run_dir import ELASTIC_RECORD, RunDirError, check_run_dir
from fastrl.ipc.arena import SHM_DIR, segment_creator
from fastrl.run import elastic
from fastrl.run.plan import RunError
from fastrl.run.rank_heartbeat import RankWatch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def agent_store(monkeypatch):
    """A TCPStore standing in for torchrun's agent's, and the environment torchrun gives a rank."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1",
                        "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(name, value)
    return store


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


def dead_attempts_learner(run_dir, seconds: float) -> subprocess.Popen:
    """The dead attempt's learner, still writing its final checkpoint under the run's lock: a
    checkpoint appears after ``seconds``, then the lock is let go of."""
    learner = subprocess.Popen([sys.executable, "-c", f"""
import time
from pathlib import Path
from fastrl.files.run_dir import RunDirLock
lock = RunDirLock.take(Path({str(run_dir)!r}))
lock.record_pid()
(Path({str(run_dir)!r}) / "checkpoints").mkdir()
print("locked", flush=True)
time.sleep({seconds})
(Path({str(run_dir)!r}) / "checkpoints" / "ckpt_000000004096.pt").write_bytes(b"")
"""], stdout=subprocess.PIPE, text=True)
    assert learner.stdout.readline().strip() == "locked"
    return learner


def test_a_restart_waits_for_the_dead_attempts_last_process_to_let_go_of_the_run_dir(tmp_path, agent_store,
                                                                                     monkeypatch):
    run_dir = tmp_path / "run"
    first_attempt(run_dir, monkeypatch)
    learner = dead_attempts_learner(run_dir, 3.0)
    try:
        with pytest.raises(RunDirError, match="in use by"):
            check_run_dir(run_dir, False, True)
        started = time.monotonic()
        _, flags = restart(monkeypatch, run_dir=run_dir, timeout_s=10.0)  # rank 0 waits for the lock for half
        assert flags == (True, False)  # the checkpoint written meanwhile is resumed, not removed
        assert time.monotonic() - started > 1.0
    finally:
        learner.kill()
        learner.wait()


def test_rank_0_waits_half_the_timeout_for_the_dead_attempt_so_that_the_others_hear_its_decision(
        tmp_path, agent_store, monkeypatch):
    run_dir = tmp_path / "run"
    first_attempt(run_dir, monkeypatch)
    learner = dead_attempts_learner(run_dir, 60.0)
    try:
        started = time.monotonic()
        with pytest.raises(RunError) as refused:
            restart(monkeypatch, run_dir=run_dir, timeout_s=3.0)
        assert 1.4 < time.monotonic() - started < 2.9
        assert str(refused.value) == (f"restart 1: run directory '{run_dir}' is still in use by a running "
                                      f"fastrl-train (pid {learner.pid}) after 1.5 s, half of dist_timeout_s (the "
                                      f"other ranks wait dist_timeout_s for rank 0's decision); raise "
                                      f"dist_timeout_s if the dead attempt's final checkpoint takes longer")
    finally:
        learner.kill()
        learner.wait()


def test_restarts_off_or_no_agent_store_is_not_elastic(agent_store, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert elastic.current_attempt(5.0) is None
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert elastic.current_attempt(5.0) is None


def test_a_restarted_rank_whose_rank_0_never_decides_stops_in_one_line(tmp_path, monkeypatch):
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=1), wait_for_workers=False)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1",
                        "TORCHELASTIC_RESTART_COUNT": "1"}.items():
        monkeypatch.setenv(name, value)
    attempt = elastic.current_attempt(1.0)
    with pytest.raises(RunError, match="rank 0 did not say"):
        attempt.settle(tmp_path, False, False, RANK1)
    del store


def test_the_watch_names_a_rank_that_went_silent_not_one_that_left(agent_store, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    watches = [RankWatch(DistInfo(rank, 3), timeout_s=2.0) for rank in range(3)]  # silence_s 1 s
    try:
        time.sleep(0.6)
        watches[2].leave()  # stops and says so
        watches[1]._stop.set()  # stops beating, says nothing: a SIGKILL
        deadline = time.monotonic() + 5.0
        while not watches[0].lost and time.monotonic() < deadline:
            time.sleep(0.1)
        assert watches[0].lost.startswith("rank 1 went away")
        assert "rank 1 went away" in str(watches[0].error())
        assert watches[0].explains(RunError("fastrl-learner (pid 7) exited with code -6"))  # after the loss
        # Which failures make a rank ask the watch (and wait for it) when nobody is known gone yet.
        quiet = RankWatch(DistInfo(0, 1), timeout_s=2.0)
        assert not quiet.explains(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
        started = time.monotonic()
        assert not quiet.explains(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error"))
        assert time.monotonic() - started >= quiet.silence_s
        quiet.leave()
    finally:
        for watch in watches:
            watch.leave()


def torchrun(run_dir, port, extra, *torchrun_args, steps=200_000, checkpoint_every_s=1.0):
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args, "--master-port", str(port),
            "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(run_dir), "--quiet",
            "--train-for-env-steps", str(steps), "--set", "device=cpu", "--set", "env.num_workers=1",
            "--set", "env.envs_per_worker=64", "--set", "learner.batch_size=1024", "--set", "report_every_s=0.5",
            "--set", f"checkpoint_every_s={checkpoint_every_s}", "--set", "keep_checkpoints=20", *extra]


def runner_pid(run_dir, rank: int, timeout_s: float = 60.0) -> tuple[int, dict]:
    """Rank ``rank``'s runner pid once it trains (a checkpoint after its first), and its processes."""
    name = "processes.json" if rank == 0 else f"processes.rank{rank}.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / name).exists() and len(list_checkpoints(run_dir)) >= 2:
            pids = json.loads((run_dir / name).read_text())
            return pids["runner"][0], pids
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} did not start training within {timeout_s} s")


def wait_for_a_checkpoint_after_an_update(run_dir, timeout_s: float = 60.0) -> None:
    """Until a checkpoint was saved after a report with learner updates."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else ""
        records = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]  # whole lines
        updated = [r["env_steps"] for r in records if r["learner_updates"] > 0]
        if updated and int(list_checkpoints(run_dir)[-1].stem[len("ckpt_"):]) > updated[0]:
            return
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint after a learner update within {timeout_s} s")


def all_pids(process_files: list[dict]) -> list[int]:
    return [pid for pids in process_files for group in pids.values() for pid in group]


def leftovers(pids: list[int]) -> tuple[list[int], list[str]]:
    """Of ``pids``, those still running; fastrl segments in /dev/shm that they created."""
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    segments = [name for name in os.listdir(SHM_DIR) if segment_creator(name) in pids]
    return alive, segments


@pytest.mark.slow
def test_a_killed_rank_restarts_the_group_and_the_run_goes_on_from_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    # Rank 1 dies after a checkpoint that follows an update; the budget must leave the restart
    # steps to train after it: two ranks of 64 CartPoles step ~200K env steps a second here.
    budget = 1_000_000
    job = subprocess.Popen(torchrun(run_dir, free_port(), [], "--nproc-per-node", "2", "--max-restarts", "1",
                                    steps=budget, checkpoint_every_s=0.5),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid, _ = runner_pid(run_dir, 1)
        wait_for_a_checkpoint_after_an_update(run_dir)
        os.kill(pid, signal.SIGKILL)
        out, err = job.communicate(timeout=150)
    finally:
        job.kill()
    assert job.returncode == 0, err[-3000:]
    assert "restart 1 of this torchrun job: the run resumes from its newest checkpoint" in err

    # (The restarted run rewrites the checkpoint it resumed, under the same env step count, when it
    # saves before its first step: read what it resumed from the record and the metrics.)
    (entry,) = json.loads((run_dir / ELASTIC_RECORD).read_text())["restarts"]
    resumed_steps = int(entry["checkpoint"][len("ckpt_"):-len(".pt")])
    assert resumed_steps > 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    before = [r for r in records if r["restarts"] == 0]
    after = [r for r in records if r["restarts"] == 1]
    assert before and after and records.index(after[0]) == len(before)
    assert all(r["restart_lost_s"] == entry["lost_s"] > 0 for r in after)
    # Counters, clocks and the learning-rate schedule go on from the checkpoint, not from zero.
    saved_before = [r for r in before if r["env_steps"] < resumed_steps]
    assert all(r["env_steps"] >= resumed_steps for r in after)
    assert after[0]["trained_seconds"] > saved_before[-1]["trained_seconds"]
    assert after[-1]["env_steps"] >= budget
    final = load_checkpoint(list_checkpoints(run_dir)[-1])
    lr0 = final["config"]["learner"]["lr"]
    # The schedule goes on from the resumed env steps (a restarted one would be back near lr0), and
    # reports before the restart's first update show the resumed counters, not zeros.
    assert after[0]["learner_updates"] >= saved_before[-1]["learner_updates"] > 0
    trained = [r for r in after if r["learner_updates"] > saved_before[-1]["learner_updates"]]
    assert trained and trained[0]["learner/lr"] <= lr0 * (1 - resumed_steps / budget) + 1e-9
    assert final["param_digests"][0] == final["param_digests"][1]


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["killed", "frozen"])
def test_without_elastic_a_lost_rank_stops_the_others_within_the_timeout_naming_it(tmp_path, loss):
    """Two torchrun agents, one per "node", as on two machines: node 0's agent knows nothing of
    node 1's rank, so rank 0 finds out by itself. ``killed``: rank 1's runner is SIGKILLed, its
    host closes its sockets (gloo fails at once). ``frozen``: all of node 1 stops (SIGSTOP), as a
    node that lost power or its network: no socket is closed, collectives wait out the timeout.
    The margin is the survivor's own stop (final checkpoint, children joined) on a loaded machine."""
    run_dir, port, timeout_s = tmp_path / "run", free_port(), 6.0
    extra = ["--set", f"dist_timeout_s={timeout_s}"]
    # A budget the ranks cannot finish before the loss: a rank 0 done first would leave node 0's agent
    # in torchrun's exit barrier, waiting for node 1's.
    nodes = [subprocess.Popen(torchrun(run_dir, port, extra, "--nnodes", "2", "--node-rank", str(k),
                                       "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--max-restarts", "0",
                                       steps=10**9),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    node1 = [psutil.Process(nodes[1].pid)]
    try:
        pid, rank1 = runner_pid(run_dir, 1)
        survivor, rank0 = runner_pid(run_dir, 0)
        if loss == "killed":
            os.kill(pid, signal.SIGKILL)
        else:
            node1 += node1[0].children(recursive=True)
            for process in node1:
                process.suspend()
        lost_at = time.monotonic()
        psutil.Process(survivor).wait(timeout=60)
        stopped_s = time.monotonic() - lost_at
        _, err = nodes[0].communicate(timeout=60)
    finally:
        for process in node1:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        for node in nodes:
            node.kill()
            node.communicate()
    assert nodes[0].returncode != 0
    assert "fastrl-train: error: rank 1 went away" in err, err[-3000:]
    assert stopped_s < timeout_s + 12.0, stopped_s
    time.sleep(1.0)  # the killed rank's orphans notice that their runner is gone
    # A frozen node's processes were killed above with their shared memory (on a real node lost,
    # that is another machine's): check what the survivors leave.
    alive, segments = leftovers(all_pids([rank0, rank1] if loss == "killed" else [rank0]))
    assert alive == [] and segments == []


@pytest.mark.slow
def test_sigterm_to_a_ranks_process_group_still_leaves_a_final_checkpoint(tmp_path):
    # torchrun stops a rank (the survivors of a failure, before it restarts them) with SIGTERM to
    # the rank's whole process group: the children must leave the stop to the runner, so that the
    # learner lives to write the final checkpoint the restart resumes from.
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(run_dir), "--quiet",
           "--train-for-env-steps", "10000000", "--set", "env.num_workers=1", "--set", "env.envs_per_worker=64",
           "--set", "learner.batch_size=1024", "--set", "report_every_s=0.5", "--set", "checkpoint_every_s=1000"]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
            if lines and json.loads(lines[-1])["learner_updates"] > 0:
                break
            time.sleep(0.2)
        pids = all_pids([json.loads((run_dir / "processes.json").read_text())])
        os.killpg(run.pid, signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert "SIGTERM: stopping, writing a final checkpoint" in err
    final = load_checkpoint(list_checkpoints(run_dir)[-1])
    assert final["counters"]["env_steps"] > 0 and final["learner"]["updates"] > 0
    assert leftovers(pids) == ([], [])
