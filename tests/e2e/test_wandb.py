"""The tests of tests/unit/reporting/test_wandb.py's subject that start fastrl's commands or processes."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

from tests.unit.reporting.test_wandb import TOY, needs_wandb, offline_runs


@needs_wandb
def test_fastrl_train_logs_to_wandb_and_resume_continues_the_run(tmp_path):
    run_dir = tmp_path / "run"
    train = [sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo", "--env", TOY + "make_countdown",
             "--run-dir", str(run_dir), "--quiet", "--set", "logging.wandb=true", "--set", "report_every_s=0.5",
             "--set", "env.num_workers=1", "--set", "env.envs_per_worker=8", "--set", "learner.batch_size=64",
             "--set", "model.kind=mlp", "--set", "device=cpu"]
    env = {**os.environ, "WANDB_MODE": "offline"}
    # The resumed budget is far above the first: a budget is checked every 0.25 s, and this toy
    # env steps so fast that the first session can end thousands of steps past its 3,000.
    for args in (["--train-for-env-steps", "3000"], ["--resume", "--train-for-env-steps", "30000"]):
        out = subprocess.run(train + args, capture_output=True, text=True, timeout=180, env=env)
        assert out.returncode == 0, out.stderr
        assert len(out.stdout.strip().splitlines()) == 1  # W&B printed nothing to stdout
    [(run_id, sessions)] = offline_runs(run_dir).items()
    assert len(sessions) == 2
    steps = [row["env_steps"] for _, history in sessions for row in history]
    assert steps[-1] >= 30000 and max(steps[:len(sessions[0][1])]) < 30000

class SilentServer:
    """A TCP server that accepts connections and never answers: a W&B server that hangs."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.connections = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def _accept(self):
        try:
            while True:
                self.connections.append(self.socket.accept()[0])
        except OSError:
            pass  # closed

    def close(self):
        for connection in [self.socket, *self.connections]:
            connection.close()

@needs_wandb
def test_a_wandb_server_that_never_answers_delays_neither_the_budget_nor_the_exit(tmp_path):
    server = SilentServer()
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo", "--env", TOY + "make_countdown",
               "--run-dir", str(run_dir), "--quiet", "--train-for-seconds", "2", "--set", "logging.wandb=true",
               "--set", "report_every_s=0.5", "--set", "env.num_workers=1", "--set", "env.envs_per_worker=8",
               "--set", "learner.batch_size=64", "--set", "model.kind=mlp", "--set", "device=cpu"]
    # The run waits 2 s for W&B at its end, not the whole CLOSE_WAIT_S: a hook the interpreter loads at
    # start-up (sitecustomize) sets it; what is checked is that nothing waits beyond it.
    close_wait_s = 2.0
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        f"import fastrl.reporting.wandb_logger\nfastrl.reporting.wandb_logger.CLOSE_WAIT_S = {close_wait_s}\n")
    env = {**os.environ, "WANDB_MODE": "online", "WANDB_BASE_URL": server.url, "WANDB_API_KEY": "0" * 40,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=180)
        ended = time.time()
    finally:
        proc.kill()
        _kill_wandb_services_of(proc.pid)
        server.close()
    assert proc.returncode == 0, err
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    # The budget is checked every 0.25 s and W&B's start (30 s to its timeout) did not hold it up.
    assert final["trained_seconds"] < 2 + 2
    # W&B had close_wait_s to finish, said so in train.log's last line, and then neither W&B's own
    # exit hooks (its analytics post to the same server: 12 s) nor its service (which tries the
    # server for ~15 s more when told to stop) held the process for its server. About 1 s is
    # usual, 8.07 s was seen on a slow AVX2 host under pytest -n 3; the bound is kept just below
    # the shortest hold it must catch (the 12 s analytics post).
    log = run_dir / "train.log"
    assert f"Weights & Biases did not finish within {close_wait_s:.0f} s" in log.read_text().splitlines()[-1]
    assert ended - log.stat().st_mtime < 11

def _kill_wandb_services_of(pid):
    """W&B's service process outlives the trainer until its own timeout: not past the test."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and cmdline[0].endswith("wandb-core") and str(pid) in cmdline:
            process.kill()
