"""Scaling benchmark: the same profile on 1 rank and on N ranks (torchrun on this machine).

    python scripts/bench.py scaling --ranks 2 --seconds 40
    python scripts/bench.py scaling --ranks 8 --profile atari-appo   # one node, 8 GPUs

Each run is launched exactly as a user would (`torch.distributed.run ... -m fastrl.cli`);
throughput is the steady rate between the first report after --warmup seconds and the last one,
read from rank 0's metrics.jsonl (env steps summed over ranks). On a machine with fewer cores than
ranks x processes the ranks share the cores, so expect no gain there: the figure says so honestly.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from fastrl.profiler import hardware

from .options import add_set


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(ranks: int, profile: str, seconds: float, warmup: float, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="fastrl-scaling-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-port", str(free_port()), "-m", "fastrl.cli", "--profile", profile, "--run-dir", str(run_dir),
               "--quiet", "--train-for-seconds", str(seconds), "--set", "report_every_s=2"]
        for item in overrides:
            cmd += ["--set", item]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{ranks} rank(s) failed:\n{out.stderr[-2000:]}")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in records if r["wall_time"] >= warmup]
    first, last = steady[0], steady[-1]
    rate = (last["env_steps"] - first["env_steps"]) / (last["wall_time"] - first["wall_time"])
    return {"ranks": ranks, "env_steps_per_s": rate, "fps": rate * (last["frames"] / max(last["env_steps"], 1)),
            "episode_return_mean": last["episode_return_mean"], "learner_updates": last["learner_updates"]}


def add_arguments(p) -> None:
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--profile", default="cartpole-appo")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--warmup", type=float, default=15.0, help="seconds from launch before measuring")
    add_set(p, "override for both runs (fastrl-train's --set)")


def run(args) -> dict:
    one = run_ranks(1, args.profile, args.seconds, args.warmup, args.set)
    many = run_ranks(args.ranks, args.profile, args.seconds, args.warmup, args.set)
    speedup = many["env_steps_per_s"] / one["env_steps_per_s"]
    print(f"{'ranks':>5} {'env steps/s':>12} {'frames/s':>12} {'updates':>8}")
    for r in (one, many):
        print(f"{r['ranks']:>5} {r['env_steps_per_s']:>12,.0f} {r['fps']:>12,.0f} {r['learner_updates']:>8}")
    print(f"speed-up with {args.ranks} ranks: {speedup:.2f}x")
    return {"profile": args.profile, "runs": [one, many], "speedup": speedup, "hardware": hardware()}
