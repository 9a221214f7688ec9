"""Scaling benchmark: the same profile on 1 rank and on N ranks, launched as a user would
(`torchrun ... -m fastrl.cli`), and what one update's gradient all-reduce costs between them.

    python scripts/bench.py scaling --ranks 2 --seconds 40    # two "nodes" over a veth link (root), else loopback
    python scripts/bench.py scaling --ranks 8 --profile atari-appo --link loopback   # one node, 8 GPUs

--link veth runs the N ranks as two nodes of N/2 ranks, each in its own network namespace, the two
joined by a veth pair (benchmarks/netns.py, root needed), with the README's two-node command in
each: the collectives cross a real link and fastrl finds its interface by itself. --link loopback
runs them as one node; auto (the default) takes veth where it can. The single rank runs as one
node. Throughput is the steady rate between the first report --warmup seconds after training
began (fastrl.profiler's steady window) and the last one, read from rank 0's metrics.jsonl (env
steps summed over ranks; updates are gradient steps, the same on every rank). The all-reduce is
timed apart (benchmarks/all_reduce_probe.py: the profile's model, fastrl's GradientAverager, the
same link), so its figure is the link's cost without the wait for a slower rank.

Both "nodes" share this machine's cores: where they are fewer than the runs' processes, the
figures check that N ranks train together and say nothing of a speed-up; the table says so.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from fastrl.profiler import hardware
from fastrl.profiler.diagnosis import ProfileError, steady_window

from . import netns
from .options import add_set

PROBE = Path(__file__).resolve().with_name("all_reduce_probe.py")
LAUNCH_MARGIN_S = 300  # beyond --seconds: start-up, the final checkpoint, a busy machine


class ScalingError(ValueError):
    """A scaling request that cannot be run here; the message names the fix."""


ERRORS = (ScalingError,)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_commands(ranks: int, nodes, argv: list[str]) -> list[list[str]]:
    """The torchrun command of every node for ``ranks`` ranks running ``argv`` (torchrun's
    script and its arguments): one node on loopback when ``nodes`` is None, else the README's
    two-node command in each of ``nodes`` (netns.Node), ``ranks / 2`` ranks each."""
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    port = str(free_port())
    if nodes is None:
        return [[*torchrun, "--nproc-per-node", str(ranks), "--master-port", port, *argv]]
    return [node.command([*torchrun, "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", str(ranks // 2),
                          "--master-addr", nodes[0].address, "--master-port", port, *argv])
            for k, node in enumerate(nodes)]


def launch(commands: list[list[str]], what: str, timeout_s: float) -> None:
    """Run every node's command at once until all exit; SystemExit with the failing one's stderr.
    In the namespaces the host's socket variables would name an interface that is not there."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    with tempfile.TemporaryDirectory(prefix="fastrl-scaling-logs-") as logs:
        paths = [Path(logs) / f"node{k}.log" for k in range(len(commands))]
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(path, "w"),
                                  start_new_session=True) for cmd, path in zip(commands, paths)]
        try:
            codes = [p.wait(timeout=timeout_s) for p in procs]
        except subprocess.TimeoutExpired:
            codes = [p.poll() for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        for code, path in zip(codes, paths):
            if code != 0:
                outcome = "did not end in time" if code is None else f"exited {code}"
                raise SystemExit(f"{what} {outcome}:\n{path.read_text()[-2000:]}")


def run_ranks(ranks: int, nodes, profile: str, seconds: float, warmup: float, overrides: list[str]) -> dict:
    """Env steps/s and updates/s of ``profile`` trained for ``seconds`` on ``ranks`` ranks."""
    with tempfile.TemporaryDirectory(prefix="fastrl-scaling-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = ["-m", "fastrl.cli", "--profile", profile, "--run-dir", str(run_dir), "--quiet",
                "--train-for-seconds", str(seconds), "--set", "report_every_s=2"]
        for item in overrides:
            argv += ["--set", item]
        launch(torchrun_commands(ranks, nodes, argv), f"{ranks} rank(s)", seconds + LAUNCH_MARGIN_S)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    try:
        first, last = steady_window(records, warmup, training=True)
    except ProfileError as exc:
        raise ScalingError(f"{ranks} rank(s): {exc}, or raise --seconds") from None
    elapsed = last["wall_time"] - first["wall_time"]
    rate = (last["env_steps"] - first["env_steps"]) / elapsed
    return {"ranks": ranks, "env_steps_per_s": rate, "fps": rate * (last["frames"] / max(last["env_steps"], 1)),
            "updates_per_s": (last["learner_updates"] - first["learner_updates"]) / elapsed,
            "episode_return_mean": last["episode_return_mean"], "learner_updates": last["learner_updates"]}


def all_reduce_cost(ranks: int, nodes, profile: str, overrides: list[str], rounds: int) -> dict:
    """The probe's figures: the model's parameters, the bytes all-reduced and seconds per update."""
    with tempfile.TemporaryDirectory(prefix="fastrl-scaling-probe-") as tmp:
        out = Path(tmp) / "probe.json"
        argv = [str(PROBE), "--profile", profile, "--rounds", str(rounds), "--out", str(out)]
        for item in overrides:
            argv += ["--set", item]
        launch(torchrun_commands(ranks, nodes, argv), f"the all-reduce probe on {ranks} ranks", LAUNCH_MARGIN_S)
        return json.loads(out.read_text())


def processes_per_rank(profile: str, overrides: list[str]) -> int:
    """A rank's busy processes: rollout workers, the learner and the inference batcher (unless
    workers act for themselves)."""
    from fastrl.config import build_config, parse_override

    cfg = build_config(profile, dict(parse_override(item) for item in overrides))
    return cfg.env.num_workers + 1 + (0 if cfg.inference.in_workers else 1)


def chosen_link(link: str, ranks: int) -> str:
    if link == "auto":
        link = "veth" if not netns.unavailable() and ranks % 2 == 0 else "loopback"
    if link == "veth" and netns.unavailable():
        raise ScalingError(f"--link veth: {netns.unavailable()}; use --link loopback")
    if link == "veth" and ranks % 2:
        raise ScalingError(f"--link veth splits the ranks over two nodes: --ranks must be even, got {ranks}")
    return link


def add_arguments(p) -> None:
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--profile", default="cartpole-appo")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--warmup", type=float, default=10.0,
                   help="seconds from the first report with env steps and an update before measuring")
    p.add_argument("--link", choices=("auto", "veth", "loopback"), default="auto",
                   help="how the N ranks are joined: two network namespaces over a veth pair (root), or one node")
    p.add_argument("--all-reduce-rounds", type=int, default=200, help="all-reduces the probe times")
    add_set(p, "override for both runs and the probe (fastrl-train's --set)")


def run(args) -> dict:
    if args.ranks < 2:
        raise ScalingError(f"--ranks is the run to compare with one rank: at least 2, got {args.ranks}")
    link = chosen_link(args.link, args.ranks)
    with netns.two_nodes() if link == "veth" else contextlib.nullcontext() as nodes:
        one = run_ranks(1, None, args.profile, args.seconds, args.warmup, args.set)
        many = run_ranks(args.ranks, nodes, args.profile, args.seconds, args.warmup, args.set)
        cost = all_reduce_cost(args.ranks, nodes, args.profile, args.set, args.all_reduce_rounds)
    speedup = many["env_steps_per_s"] / one["env_steps_per_s"]
    processes = args.ranks * processes_per_rank(args.profile, args.set)
    shared_cores = (os.cpu_count() or 1) < processes
    print(f"{'ranks':>5} {'env steps/s':>12} {'frames/s':>12} {'updates/s':>10} {'all-reduce ms/update':>21}")
    for r, ms in ((one, "-"), (many, f"{cost['all_reduce_s'] * 1e3:.3f}")):
        print(f"{r['ranks']:>5} {r['env_steps_per_s']:>12,.0f} {r['fps']:>12,.0f} {r['updates_per_s']:>10.2f} {ms:>21}")
    print(f"{args.ranks} ranks over {link}: speed-up {speedup:.2f}x; each update all-reduces {cost['bytes']:,} bytes "
          f"({cost['parameters']:,} parameters, {cost['device']})")
    if shared_cores:
        print(f"these {args.ranks} ranks run {processes} processes on {os.cpu_count()} cores of one machine: the "
              f"figures check that they train together, they are not a speed-up (run on separate nodes for that)")
    return {"profile": args.profile, "link": link, "runs": [one, many], "speedup": speedup, "all_reduce": cost,
            "shared_cores": shared_cores, "hardware": hardware()}
