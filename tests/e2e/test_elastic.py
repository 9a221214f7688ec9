"""The tests of tests/unit/run/test_elastic.py's subject that start fastrl's commands or processes."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.files.run_dir import ELASTIC_RECORD, RunDirError, check_run_dir
from fastrl.run.plan import RunError
from tests.support.processes import segments_of, still_running
from tests.support.torchrun import free_port
from tests.unit.run.test_elastic import first_attempt, restart


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

def torchrun(run_dir, port, extra, *torchrun_args, steps=200_000, checkpoint_every_s=1.0):
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args, "--master-port", str(port),
            "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(run_dir), "--quiet",
            "--train-for-env-steps", str(steps), "--set", "device=cpu", "--set", "env.num_workers=1",
            "--set", "env.envs_per_worker=64", "--set", "learner.batch_size=1024", "--set", "report_every_s=0.5",
            "--set", f"checkpoint_every_s={checkpoint_every_s}", "--set", "keep_checkpoints=20", *extra]

def runner_pid(run_dir, rank: int, timeout_s: float = 150.0) -> tuple[int, dict]:
    """Rank ``rank``'s runner pid once it trains (a checkpoint after its first), and its processes.
    A deadline, not a wait: two torchrun agents starting their ranks' processes beside pytest -n 3 on
    two slow cores (AVX2, ~2.5x slower than most hosts here) took over 60 s."""
    name = "processes.json" if rank == 0 else f"processes.rank{rank}.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / name).exists() and len(list_checkpoints(run_dir)) >= 2:
            pids = json.loads((run_dir / name).read_text())
            return pids["runner"][0], pids
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} did not start training within {timeout_s} s ({name} "
                         f"{'written' if (run_dir / name).exists() else 'missing'}, "
                         f"{len(list_checkpoints(run_dir))} checkpoints)")

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
    return still_running(pids), segments_of(*pids)

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
