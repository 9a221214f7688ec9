"""Side by side with Sample Factory on ViZDoom: each one's training frames/s on the same scenario,
resolution and frame skip, alternating, and optionally each one's time to a score.

    python -m venv /work/sf-venv
    /work/sf-venv/bin/pip install torch==2.13.0 sample-factory==2.1.1 vizdoom==1.3.2
    python scripts/bench.py vizdoom --sf-python /work/sf-venv/bin/python --rounds 3 --seconds 300
    python scripts/bench.py vizdoom --scenario basic --rounds 1 --seconds 1200 --score 50

Each round trains fastrl (the scenario's profile plus ``--set``, in a fresh interpreter) and
Sample Factory (``python -m sf_examples.vizdoom.train_vizdoom --device=cpu`` with ``--sf-workers``
x ``--sf-envs-per-worker`` envs, in ``--sf-python``'s environment) for ``--seconds`` each, one
after the other: even rounds fastrl first, odd rounds Sample Factory first, so that neither
always inherits the other's leftovers. Both render 160x120 and resize to the profile's
``env.resize`` with its ``env.frame_skip`` (Sample Factory is given them as --res_h, --res_w and
--env_frameskip; its doom envs render 160x120 for any size up to that, as fastrl chooses too).

A run's frames/s is its steady rate: the frames between its first report at least ``--warmup``
seconds after its first frames and its last report, over the time between them (start-up and the
first updates left out). fastrl's reports are its metrics.jsonl rows (``frames``, ``wall_time``),
Sample Factory's the "Total num frames" lines of its log, timed by their stamps. The median over
rounds of fastrl's frames/s over Sample Factory's is the figure to quote.

``--score S``: each run's time to its first report whose mean episode return is at least S, in the
game's own reward (Sample Factory's doom_basic scales rewards by 0.01 and reports them scaled:
undone here), counted from the start of training: fastrl's ``wall_time``, Sample Factory's time
since its first log line. Sample Factory shapes the health gathering reward, so its reports are not
the game's there: ``--score`` is refused for that scenario. Give ``--seconds`` long enough to get
there.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fastrl.config import build_config
from fastrl.profiler import hardware
from fastrl.reporting.curves import metrics_rows

from .options import add_rounds, add_set, overrides
from .threshold import is_number


@dataclass(frozen=True)
class Scenario:
    profile: str  # fastrl's profile of it
    sf_env: str  # Sample Factory's --env
    # Sample Factory's reward_scaling of its doom spec (its reports are scaled by it); None where it
    # shapes the reward, so that its reports are no game score.
    sf_reward_scale: float | None


SCENARIOS = {
    "basic": Scenario("vizdoom-basic", "doom_basic", 0.01),
    "health": Scenario("vizdoom-health", "doom_health_gathering_supreme", None),
}
DEFAULT_SF_PYTHON = "/work/sf-venv/bin/python"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SF_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
SF_FRAMES = re.compile(r"Total num frames: (\d+)")
SF_REWARD = re.compile(r"Avg episode reward: \[\(0, '(-?[\d.e+-]+)'\)\]")
STAMP_FORMAT = "%Y-%m-%d %H:%M:%S,%f"
SF_STOP_S = 30.0  # how long an interrupted Sample Factory run may take to stop before it is killed

# Bad input stops before any run, with one line.
ERRORS = (ValueError,)  # ConfigError


@dataclass
class Report:
    """One progress report of a run: seconds since it started training, frames so far, and the
    mean return of its recent episodes in the game's reward (None before any)."""

    seconds: float
    frames: int
    episode_return: float | None


def steady_frames_per_s(reports: list[Report], warmup: float) -> float | None:
    """Frames per second between the first report at least ``warmup`` seconds after the first
    frames and the last report; None when fewer than two reports lie there."""
    moving = next((r.seconds for r in reports if r.frames > 0), None)
    if moving is None:
        return None
    steady = [r for r in reports if r.seconds >= moving + warmup]
    if len(steady) < 2 or steady[-1].seconds <= steady[0].seconds:
        return None
    return (steady[-1].frames - steady[0].frames) / (steady[-1].seconds - steady[0].seconds)


def seconds_to_score(reports: list[Report], score: float) -> float | None:
    """Seconds to the first report whose mean return is at least ``score``; None if none is."""
    return next((r.seconds for r in reports if r.episode_return is not None and r.episode_return >= score), None)


def fastrl_reports(run_dir: Path) -> list[Report]:
    """The reports in a fastrl run's metrics.jsonl."""
    return [Report(row["wall_time"], row["frames"],
                   row["episode_return_mean"] if is_number(row.get("episode_return_mean")) else None)
            for row in metrics_rows(run_dir)]


def sf_reports(log: str, reward_scale: float | None) -> list[Report]:
    """The progress reports in a Sample Factory log: each "Fps is ..." line's frames, with the
    "Avg episode reward" line that follows it (divided by ``reward_scale``; None without one)."""
    reports, start = [], None
    for line in ANSI.sub("", log).splitlines():
        stamp = SF_STAMP.match(line)
        if not stamp:
            continue
        now = datetime.strptime(stamp.group(1), STAMP_FORMAT).timestamp()
        start = now if start is None else start
        if frames := SF_FRAMES.search(line):
            reports.append(Report(now - start, int(frames.group(1)), None))
        elif (reward := SF_REWARD.search(line)) and reports and reward_scale is not None:
            reports[-1].episode_return = float(reward.group(1)) / reward_scale
    return reports


def train_fastrl(profile: str, settings: dict, seconds: float, work: Path) -> list[Report]:
    run_dir = work / "fastrl"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "fastrl.cli", "--profile", profile, "--run-dir", str(run_dir), "--quiet",
               "--train-for-seconds", str(seconds), "--train-for-env-steps", str(10**12),
               *(f"--set={key}={value}" for key, value in settings.items())]
    # The engine writes _vizdoom.ini and _vizdoom/ into its working directory.
    out = subprocess.run(command, cwd=work, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench.py vizdoom: fastrl's run failed:\n{out.stderr[-3000:]}")
    return fastrl_reports(run_dir)


def train_sample_factory(args, scenario: Scenario, resize: list[int], frame_skip: int, work: Path) -> list[Report]:
    """Sample Factory's reports of a run stopped ``args.seconds`` after its start. Its
    --train_for_seconds never stops a run (2.1.1 never adds to the seconds it compares), so the bench
    interrupts it as Ctrl-C would, then ends its process group: its doom engines outlive its
    workers otherwise."""
    train_dir = work / "sf"
    shutil.rmtree(train_dir, ignore_errors=True)
    command = [args.sf_python, "-m", "sf_examples.vizdoom.train_vizdoom", f"--env={scenario.sf_env}",
               "--device=cpu", f"--num_workers={args.sf_workers}", f"--num_envs_per_worker={args.sf_envs_per_worker}",
               f"--res_h={resize[0]}", f"--res_w={resize[1]}", f"--env_frameskip={frame_skip}",
               "--train_for_env_steps=1000000000000", "--experiment=bench", f"--train_dir={train_dir}", "--seed=0",
               *args.sf_arg]
    log_path = work / "sf.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHONPATH": ""})
        try:
            process.wait(timeout=args.seconds)
            failed = True  # it ended before its time: an error
        except subprocess.TimeoutExpired:
            failed = False
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=SF_STOP_S)
            except subprocess.TimeoutExpired:
                pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log_path.read_text(errors="replace")
    if failed:
        sys.exit(f"bench.py vizdoom: Sample Factory's run ended before its {args.seconds:g} s:\n{text[-3000:]}")
    return sf_reports(text, scenario.sf_reward_scale)


def round_order(r: int) -> tuple[str, str]:
    return ("fastrl", "sample-factory") if r % 2 == 0 else ("sample-factory", "fastrl")


def add_arguments(p) -> None:
    p.add_argument("--scenario", choices=SCENARIOS, default="basic",
                   help=", ".join(f"{name}: fastrl's {s.profile}, Sample Factory's {s.sf_env}"
                                  for name, s in SCENARIOS.items()))
    add_set(p, "an override of fastrl's profile (repeat for several); not env.resize or env.frame_skip, which "
               "both runs share")
    add_rounds(p, 3, "fastrl / Sample Factory pairs, alternating which runs first")
    p.add_argument("--seconds", type=float, default=300.0, help="training seconds of each run")
    p.add_argument("--warmup", type=float, default=60.0,
                   help="seconds after each run's first frames left out of its frames/s")
    p.add_argument("--score", type=float, help="also time each run to this mean episode return (the game's reward)")
    p.add_argument("--sf-python", default=DEFAULT_SF_PYTHON,
                   help=f"the python of a venv with sample-factory 2.1.1 and vizdoom (default {DEFAULT_SF_PYTHON})")
    p.add_argument("--sf-workers", type=int, default=2, help="Sample Factory's --num_workers")
    p.add_argument("--sf-envs-per-worker", type=int, default=4, help="Sample Factory's --num_envs_per_worker")
    p.add_argument("--sf-arg", action="append", default=[], metavar="--NAME=VALUE",
                   help="another argument of Sample Factory's train_vizdoom (repeat for several)")


def check_args(args, scenario: Scenario, settings: dict) -> tuple[list[int], int]:
    """The profile's (resize, frame_skip), which both runs share; ValueError (one line) for bad input."""
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if not 0 <= args.warmup < args.seconds:
        raise ValueError(f"--warmup ({args.warmup}) must be >= 0 and below --seconds ({args.seconds})")
    if args.score is not None and scenario.sf_reward_scale is None:
        raise ValueError(f"--score: Sample Factory's {scenario.sf_env} shapes its reward, so its returns are not the "
                         f"game's; leave --score out for --scenario {args.scenario}")
    if shared := sorted({"env.resize", "env.frame_skip"} & set(settings)):
        raise ValueError(f"--set {', '.join(shared)}: both runs take these from the profile {scenario.profile}; "
                         f"leave them out")
    if not Path(args.sf_python).is_file():
        raise ValueError(f"--sf-python {args.sf_python} does not exist: make a venv with python -m venv /work/sf-venv "
                         f"&& /work/sf-venv/bin/pip install torch==2.13.0 sample-factory==2.1.1 vizdoom==1.3.2")
    env = build_config(scenario.profile, settings).env  # bad keys or values stop here, before any run
    if len(env.resize) != 2:
        raise ValueError(f"profile {scenario.profile} sets no env.resize: Sample Factory's doom envs always resize")
    return env.resize, env.frame_skip


def run(args) -> dict:
    scenario = SCENARIOS[args.scenario]
    settings = overrides(args.set)
    resize, frame_skip = check_args(args, scenario, settings)
    rates: dict[str, list[float | None]] = {"fastrl": [], "sample-factory": []}
    to_score: dict[str, list[float | None]] = {"fastrl": [], "sample-factory": []}
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-vizdoom-") as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            for name in round_order(r):
                started = time.monotonic()
                if name == "fastrl":
                    reports = train_fastrl(scenario.profile, settings, args.seconds, work)
                else:
                    reports = train_sample_factory(args, scenario, resize, frame_skip, work)
                rates[name].append(steady_frames_per_s(reports, args.warmup))
                if args.score is not None:
                    to_score[name].append(seconds_to_score(reports, args.score))
                score = (f", to return {args.score:g} in {_seconds(to_score[name][-1])}"
                         if args.score is not None else "")
                print(f"round {r} {name}: {_rate(rates[name][-1])} frames/s after {args.warmup:.0f} s{score} "
                      f"({time.monotonic() - started:.0f} s in all)", flush=True)
            if rates["fastrl"][-1] and rates["sample-factory"][-1]:
                ratios.append(rates["fastrl"][-1] / rates["sample-factory"][-1])
                print(f"round {r}: fastrl / Sample Factory {ratios[-1]:.2f}", flush=True)
    print(f"hardware: {hardware()}")
    median = statistics.median(ratios) if ratios else None
    print(f"{args.scenario} at {resize[0]}x{resize[1]}, frame skip {frame_skip}: fastrl ({scenario.profile}) / "
          f"Sample Factory ({scenario.sf_env}, {args.sf_workers}x{args.sf_envs_per_worker} envs) training frames/s, "
          f"median {'none' if median is None else f'{median:.2f}'} over {len(ratios)} rounds")
    return {"scenario": args.scenario, "profile": scenario.profile, "sf_env": scenario.sf_env, "resize": resize,
            "frame_skip": frame_skip, "seconds": args.seconds, "warmup": args.warmup, "fastrl_set": settings,
            "frames_per_s": rates, "ratios": ratios, "median_ratio": median, "score": args.score,
            "seconds_to_score": to_score if args.score is not None else None, "hardware": hardware()}


def _rate(value: float | None) -> str:
    return "no steady" if value is None else f"{value:,.0f}"


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f} s"
