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
    # Files, not pipes: the trainer's own exit is what is timed, not that of a wandb-core left
    # holding the pipes it inherited.
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as errors:
        proc = subprocess.Popen(command, stdout=out, stderr=errors, text=True, env=env)
    try:
        proc.wait(timeout=180)
        ended = time.time()
        services_left = _wandb_services_of(proc.pid)
    finally:
        proc.kill()
        for service in _wandb_services_of(proc.pid):
            service.kill()  # W&B's service process outlives the trainer until its own timeout: not past the test
        server.close()
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 0, err
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    # The budget is checked every 0.25 s and W&B's start (30 s to its timeout) did not hold it up.
    assert final["trained_seconds"] < 2 + 2
    # W&B had close_wait_s to finish and said so in train.log's last line; its service (which tries
    # the server for ~15 s more when told to stop) was stopped before the trainer exited. W&B's
    # exit-hook analytics (a 12 s post to the same server) are turned off first: the order is
    # tests/unit/reporting/test_wandb.py's. The clock is a bound for a hang only: 6 s after the
    # last line is usual on a slow AVX2 host, 16 s was seen there under pytest -n 3.
    log = run_dir / "train.log"
    assert f"Weights & Biases did not finish within {close_wait_s:.0f} s" in log.read_text().splitlines()[-1]
    assert services_left == []
    assert ended - log.stat().st_mtime < 60

def _wandb_services_of(pid) -> list:
    """The live W&B service processes (wandb-core) that the process ``pid`` started."""
    import psutil

    services = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if (cmdline and cmdline[0].endswith("wandb-core") and str(pid) in cmdline
                and process.info["status"] != psutil.STATUS_ZOMBIE):
            services.append(process)
    return services
