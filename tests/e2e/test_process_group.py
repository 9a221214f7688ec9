"""The tests of tests/unit/distributed/test_process_group.py's subject that start fastrl's commands or processes."""
import json
import socket
import subprocess
import sys

from fastrl.cli import eval_main, train_main
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def test_two_ranks_keep_identical_weights_sum_their_steps_and_leave_a_portable_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "fastrl.cli", "--profile", "cartpole-appo", "--run-dir", str(run_dir), "--quiet",
           "--train-for-env-steps", "150000", "--set", "device=cpu", "--set", "env.num_workers=1",
           "--set", "env.envs_per_worker=128", "--set", "learner.batch_size=2048", "--set", "report_every_s=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]

    state = load_checkpoint(list_checkpoints(run_dir)[-1])
    assert state["world_size"] == 2
    digests = state["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1], digests  # bit-identical parameters
    assert state["learner"]["updates"] > 0

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = records[-1]
    assert final["world_size"] == 2
    assert final["env_steps"] == sum(final["env_steps_per_rank"]) >= 150_000
    assert all(steps > 0 for steps in final["env_steps_per_rank"])
    assert (run_dir / "processes.json").exists() and (run_dir / "processes.rank1.json").exists()

    # The rank-0 checkpoint continues in a plain single-process run, and evaluates.
    assert train_main(["--resume", "--run-dir", str(run_dir), "--quiet",
                       "--train-for-env-steps", str(state["counters"]["env_steps"] + 50_000),
                       "--set", "env.num_workers=1"]) == 0
    resumed = load_checkpoint(list_checkpoints(run_dir)[-1])
    assert resumed["learner"]["updates"] > state["learner"]["updates"]
    assert resumed["counters"]["env_steps"] >= state["counters"]["env_steps"] + 50_000
    capsys.readouterr()
    assert eval_main([str(run_dir), "--episodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2

def test_two_dqn_ranks_take_the_same_gradient_steps(tmp_path):
    # Each rank keeps its own replay; the ranks must still agree on every gradient step.
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "fastrl.cli", "--profile", "cartpole-dqn", "--run-dir", str(run_dir), "--quiet",
           "--train-for-env-steps", "30000", "--set", "device=cpu", "--set", "env.num_workers=1",
           "--set", "learner.batch_size=512", "--set", "replay.min_fill=2000", "--set", "replay.replay_ratio=2",
           "--set", "report_every_s=1"]  # ratio 2: hundreds of gradient steps, not thousands
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    state = load_checkpoint(list_checkpoints(run_dir)[-1])
    digests = state["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1], digests
    assert state["learner"]["updates"] > 100
