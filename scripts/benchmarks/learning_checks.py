"""The learning checks of tests/learning/: each trains a small run to a score within a budget
(a memory task only a recurrent core solves, an image cue, a Dict grid, CartPole with a batcher,
DQN, SAC on Pendulum, a cooperative game, tic-tac-toe's values). They take minutes, so the suite
leaves them out and this benchmark runs them, one pytest session, and prints each check's outcome
and wall time.

    python scripts/bench.py learning-checks
    python scripts/bench.py learning-checks -k recurrent
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULT = re.compile(r"^(tests/learning/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)")
DURATION = re.compile(r"^\s*([\d.]+)s call\s+(tests/learning/\S+)")


def add_arguments(p) -> None:
    p.add_argument("-k", dest="keyword", default=None, help="only the checks whose names match (pytest's -k)")


def run(args) -> dict:
    command = [sys.executable, "-m", "pytest", "tests/learning", "--learning", "-v", "-p", "no:cacheprovider",
               "--durations=0", "--durations-min=0"]
    if args.keyword:
        command += ["-k", args.keyword]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    outcome = {m.group(1): m.group(2) for m in map(RESULT.match, done.stdout.splitlines()) if m}
    seconds = {m.group(2): float(m.group(1)) for m in map(DURATION.match, done.stdout.splitlines()) if m}
    print(f"{'check':<100} {'outcome':>8} {'s':>7}")
    for check, result in outcome.items():
        print(f"{check:<100} {result:>8} {seconds.get(check, float('nan')):>7.1f}")
    if not outcome:
        print(done.stdout[-2000:] + done.stderr[-2000:])
    return {"checks": outcome, "seconds": seconds, "wall_s": round(time.monotonic() - started, 1),
            "exit_code": done.returncode}


def failed(report: dict) -> bool:
    return report["exit_code"] != 0
