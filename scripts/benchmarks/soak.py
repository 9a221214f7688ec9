"""Soak test: a long CartPole run with a rollout worker SIGKILLed every --kill-every seconds.

Prints, every --sample-every seconds, the run's FPS, restarts, and RSS / open fds per process,
then one JSON summary: growth of RSS and fds per role (first vs last sample, same role), and the
FPS in the window before each kill against the window after it. The exit status is 1 when the
training run did not exit cleanly.

    python scripts/bench.py soak --minutes 30 --kill-every 60
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


def latest_metrics(run_dir: Path) -> dict:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    return json.loads(lines[-1]) if lines else {}


def sample_processes(run_dir: Path) -> dict:
    """role -> list of (pid, rss MiB, open fds)."""
    path = run_dir / "processes.json"
    if not path.exists():
        return {}
    out = {}
    for role, pids in json.loads(path.read_text()).items():
        rows = []
        for pid in pids:
            try:
                p = psutil.Process(pid)
                rows.append((pid, p.memory_info().rss / 2**20, p.num_fds()))
            except psutil.Error:
                pass
        out[role] = rows
    return out


def add_arguments(p) -> None:
    p.add_argument("--minutes", type=float, default=30.0, help="length of the training run (default 30)")
    p.add_argument("--kill-every", type=float, default=60.0, help="seconds between two kills (default 60)")
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between two samples (default 10)")
    p.add_argument("--profile", default="cartpole-appo", help="the profile trained, on the CPU (default cartpole-appo)")


def run(args) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="fastrl-soak-"))
    seconds = args.minutes * 60
    cmd = [sys.executable, "-m", "fastrl.cli", "--profile", args.profile, "--run-dir", str(run_dir), "--quiet",
           "--train-for-seconds", str(seconds), "--set", "device=cpu", "--set", "report_every_s=2",
           "--set", f"max_worker_restarts={int(seconds / args.kill_every) + 5}"]
    trainer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    start = time.time()
    next_kill = start + args.kill_every
    samples, kills = [], []
    victim_index = 0
    try:
        while trainer.poll() is None:
            time.sleep(args.sample_every)
            now = time.time() - start
            record = latest_metrics(run_dir)
            procs = sample_processes(run_dir)
            samples.append({"t": now, "fps": record.get("env_steps_per_s"),
                            "restarts": record.get("worker_restarts", 0), "processes": procs})
            summary = "  ".join(f"{role}: " + ",".join(f"{rss:.0f}MiB/{fds}fd" for _, rss, fds in rows)
                                for role, rows in procs.items())
            print(f"t={now:6.0f}s fps={record.get('env_steps_per_s', 0):9.0f} "
                  f"restarts={record.get('worker_restarts', 0)}  {summary}", flush=True)
            if time.time() >= next_kill and procs.get("rollout"):
                rollout = procs["rollout"]
                pid = rollout[victim_index % len(rollout)][0]
                victim_index += 1
                os.kill(pid, signal.SIGKILL)
                kills.append(time.time() - start)
                next_kill += args.kill_every
    finally:
        if trainer.poll() is None:
            trainer.send_signal(signal.SIGINT)
        trainer.wait(60)

    def window_fps(lo, hi):
        values = [s["fps"] for s in samples if lo <= s["t"] < hi and s["fps"]]
        return sum(values) / len(values) if values else None

    recovery = [{"kill_at": k, "fps_before": window_fps(k - 30, k), "fps_after": window_fps(k + 10, k + 40)}
                for k in kills]
    growth = {}
    running = [s for s in samples if all(s["processes"].get(role) for role in ("learner", "inference", "rollout"))]
    steady = [s for s in running if s["t"] > 60] or running
    for role in ("runner", "learner", "inference", "rollout"):
        first = [r for r in steady[0]["processes"].get(role, [])] if steady else []
        last = [r for r in steady[-1]["processes"].get(role, [])] if steady else []
        if first and last:
            growth[role] = {"rss_mib_first": round(sum(r[1] for r in first), 1),
                            "rss_mib_last": round(sum(r[1] for r in last), 1),
                            "fds_first": sum(r[2] for r in first), "fds_last": sum(r[2] for r in last)}
    return {"minutes": args.minutes, "kills": len(kills), "worker_restarts": samples[-1]["restarts"] if samples else 0,
            "exit_code": trainer.returncode, "growth_after_first_minute": growth, "recovery": recovery,
            "run_dir": str(run_dir)}


def failed(report: dict) -> bool:
    """Whether bench.py exits with status 1: the training run did not exit cleanly."""
    return report["exit_code"] != 0
