"""Measurements of ``train()`` runs (steady-state throughput, breakdown, diagnosis) and
``profile``, which measures raw env, sampling and training on the same cores into a ``ProfileResult``."""
from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import Config, validate
from .diagnosis import (
    MIN_WINDOW_S,
    STARTUP_MARGIN,
    Diagnosis,
    LateStart,
    ProfileError,
    breakdown,
    diagnose,
    steady_window,
    window_measured,
)
from .rawenv import measure_env
from .sampling import ProcessSampler, cores_used, cpu_count, hardware

DEFAULT_SECONDS = 10.0
# From the train() call until env steps flow and the first update is done (probe env, fork 4+
# processes from the fork server, build envs): 2.4-2.7 s for cartpole-appo on two idle cores
# (docs/results.md#start-up), the first run of a process paying the server's imports too. A run
# stops once its window is measured, and at the latest after this allowance + warm-up + the
# measured seconds; later runs use what was measured, and a run that starts later than allowed
# is measured once more with more (LateStart).
STARTUP_ESTIMATE_S = 8.0
# A busy machine that made one run start late may make the next later still: under pytest -n 3 on
# 2 cores a run that flowed at 9.3 s had not flowed by 13.2 s on its retry with 1.2 times that.
# The retry is the last try, so it gets twice the start-up seen.
RETRY_MARGIN = 2.0


def log_progress(message: str) -> None:
    print(f"[fastrl-profile] {message}", file=sys.stderr, flush=True)


@dataclass
class RunMeasurement:
    """A ``train()`` run's steady state; ``startup_s`` is how long it took to flow, ``trained_s``
    how long it ran on its budget's clock (``train_for_seconds``) when it stopped."""
    env_steps_per_s: float
    frames_per_s: float
    window_s: float
    startup_s: float
    trained_s: float
    breakdown: dict  # see diagnosis.breakdown
    processes: list[dict]
    cores_used: float
    gpus: list[dict] | None  # see ProcessSampler.gpus; None without a GPU
    diagnosis: Diagnosis


def default_warmup(seconds: float) -> float:
    """Seconds skipped once a run flows (see ``steady_window``)."""
    return min(3.0, max(1.0, seconds / 8))


def check_durations(seconds: float, warmup_s: float) -> None:
    if seconds < MIN_WINDOW_S or warmup_s < 0:
        raise ProfileError(f"--seconds must be >= {MIN_WINDOW_S} and --warmup-seconds >= 0 (got {seconds}, {warmup_s})")


def _report_period(seconds: float) -> float:
    return min(1.0, max(0.25, seconds / 12))


def _read_pids(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "processes.json").read_text())
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return None


def measure_run(cfg: Config, seconds: float, warmup_s: float, sample_only: bool,
                startup_s: float = STARTUP_ESTIMATE_S) -> RunMeasurement:
    """Steady-state throughput and breakdown of a ``train()`` of ``cfg`` (``sample_only``: the
    learner hands slots back untrained) that stops once ``seconds`` of steady state are measured,
    or after ``startup_s + warmup_s + seconds`` (``LateStart`` if it had not flowed in time); the
    result's ``startup_s`` is how long this run took to flow (an allowance for the next)."""
    # Imported here, not above: the runner imports torch, and the raw env processes import this
    # module and, like rollout workers, should not pay for torch.
    from ..run.training import train

    if cfg.serial:
        raise ProfileError("serial=true runs everything in one process; the profiler measures the parallel process "
                           "layout: add --set serial=false")
    run_cfg = copy.deepcopy(cfg)
    run_cfg.sample_only = sample_only
    run_cfg.train_for_seconds, run_cfg.train_for_env_steps = startup_s + warmup_s + seconds, 0
    run_cfg.report_every_s = _report_period(seconds)
    run_cfg.checkpoint_every_s = 1e9  # only the final one, outside the measured window
    validate(run_cfg)
    with tempfile.TemporaryDirectory(prefix="fastrl-profile-") as tmp:
        run_dir = Path(tmp)
        with ProcessSampler(lambda: _read_pids(run_dir)) as sampler:
            t0 = time.time()  # report wall_time counts from the train() call (fastrl.reporting.metrics)
            reports = []

            def measured(report: dict) -> bool:
                reports.append(report)
                return window_measured(reports, warmup_s, seconds, training=not sample_only)

            result = train(run_cfg, run_dir=run_dir, quiet=True, stop_when=measured)
    a, b = steady_window(result.reports, warmup_s, training=not sample_only)
    bd = breakdown(a, b, cfg.env.num_workers)
    processes = sampler.processes(t0 + a["wall_time"], t0 + b["wall_time"])
    used = cores_used(processes)
    return RunMeasurement(env_steps_per_s=bd["env_steps_per_s"], frames_per_s=bd["frames_per_s"],
                          window_s=bd["window_s"], startup_s=a["wall_time"] - warmup_s,
                          trained_s=result.final["trained_seconds"], breakdown=bd,
                          processes=processes, cores_used=used,
                          gpus=sampler.gpus(t0 + a["wall_time"], t0 + b["wall_time"]),
                          diagnosis=diagnose(bd, used, cpu_count()))


def measure_run_patiently(cfg: Config, seconds: float, warmup_s: float, sample_only: bool, startup_s: float,
                          log=log_progress) -> RunMeasurement:
    """``measure_run``, once more with a longer start-up allowance if the run started too late."""
    try:
        return measure_run(cfg, seconds, warmup_s, sample_only, startup_s)
    except LateStart as late:
        allowance = max(late.allowance(RETRY_MARGIN), startup_s)
        log(f"start-up took longer than the {startup_s:.0f} s allowed ({late}); once more with {allowance:.0f} s")
        return measure_run(cfg, seconds, warmup_s, sample_only, allowance)


@dataclass
class ProfileResult:
    """Every figure of one profile. ``to_dict()`` is fastrl-profile's --json: its keys (``env_fps``,
    ``sample_fps``, ``train_fps`` ...) are a documented interface. Per-run dicts are keyed "env"
    (raw env), "sample" (sampling) and "train" (training)."""
    profile: str | None
    env_id: str
    overrides: dict
    seconds: float
    warmup_seconds: float
    frame_skip: int
    env_fps: float  # env steps per second
    sample_fps: float
    train_fps: float
    env_frames_per_s: float
    sample_frames_per_s: float
    train_frames_per_s: float
    sample_ratio: float  # sample_fps / env_fps
    train_ratio: float
    window_s: dict[str, float]
    startup_s: dict[str, float]  # "sample", "train"
    breakdown: dict[str, dict]  # "sample", "train": see diagnosis.breakdown
    policy_lag: dict[str, float]  # of training: "mean", "min", "max"
    processes: dict[str, list[dict]]
    cores_used: dict[str, float]
    gpus: dict[str, list[dict]] | None  # "sample", "train"; None without a GPU
    bottleneck: str  # of training, as Diagnosis.bottleneck
    diagnosis: str
    sample_diagnosis: str
    hardware: dict
    config: dict

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def acting_in_workers(self) -> bool:
        """The workers ran the policy themselves (inference.in_workers): no batcher process ran."""
        return bool(self.config.get("inference", {}).get("in_workers", False))


def profile(cfg: Config, seconds: float = DEFAULT_SECONDS, warmup_s: float | None = None,
            profile_name: str | None = None, overrides: dict | None = None, log=log_progress) -> ProfileResult:
    """Raw env, sampling and training throughput of ``cfg``, each measured for about ``seconds``
    after start-up and ``warmup_s``; every figure the CLI prints and writes as JSON."""
    validate(cfg)
    warmup_s = default_warmup(seconds) if warmup_s is None else warmup_s
    check_durations(seconds, warmup_s)
    log(f"raw env: {cfg.env.num_workers} processes x {cfg.env.envs_per_worker} envs, random actions, "
        f"{warmup_s:g} + {seconds:g} s")
    env = measure_env(cfg, seconds, warmup_s)
    log(f"sampling: train() with sample_only, start-up + {warmup_s:g} + {seconds:g} s")
    sample = measure_run_patiently(cfg, seconds, warmup_s, True, STARTUP_ESTIMATE_S, log)
    log(f"training: train(), start-up + {warmup_s:g} + {seconds:g} s")
    startup = max(STARTUP_ESTIMATE_S, sample.startup_s * STARTUP_MARGIN)
    trained = measure_run_patiently(cfg, seconds, warmup_s, False, startup, log)
    limit = env.env_steps_per_s
    return ProfileResult(
        profile=profile_name, env_id=cfg.env.id, overrides=overrides or {},
        seconds=seconds, warmup_seconds=warmup_s, frame_skip=env.frame_skip,
        env_fps=limit, sample_fps=sample.env_steps_per_s, train_fps=trained.env_steps_per_s,
        env_frames_per_s=env.frames_per_s, sample_frames_per_s=sample.frames_per_s,
        train_frames_per_s=trained.frames_per_s,
        sample_ratio=sample.env_steps_per_s / limit, train_ratio=trained.env_steps_per_s / limit,
        window_s={"env": env.window_s, "sample": sample.window_s, "train": trained.window_s},
        startup_s={"sample": sample.startup_s, "train": trained.startup_s},
        breakdown={"sample": sample.breakdown, "train": trained.breakdown},
        policy_lag={k: trained.breakdown[f"policy_lag_{k}"] for k in ("mean", "min", "max")},
        processes={"env": env.processes, "sample": sample.processes, "train": trained.processes},
        cores_used={"env": env.cores_used, "sample": sample.cores_used, "train": trained.cores_used},
        gpus={"sample": sample.gpus, "train": trained.gpus} if trained.gpus is not None else None,
        bottleneck=trained.diagnosis.bottleneck, diagnosis=trained.diagnosis.message,
        sample_diagnosis=sample.diagnosis.message,
        hardware=hardware(), config=cfg.to_dict(),
    )
