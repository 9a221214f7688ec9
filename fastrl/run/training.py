"""Starts, supervises and stops a training run (or runs it in one process with ``serial``).

``train()`` composes the runner's parts: fastrl.run.preflight (the checks before anything starts,
which settle a RunPlan), then fastrl.run.parallel (the processes, watched by fastrl.run.supervisor)
or fastrl.run.serial (everything in this process). ``RunError``, ``RunResult``, ``arena_layout``
and ``resolve_device`` are importable from here, as research code and scripts do.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..config import Config
from ..files.run_dir import first_missing, remove_unused_run_dir
from ..ipc.start import child_context
from ..learner.precision import auto_precision, emulated_bf16_warning, measured_precision
from ..models.networks import build_model
from ..reporting.console import Console
from .elastic import ElasticAttempt, current_attempt
from .parallel import run_parallel
from .plan import RunError, RunPlan, RunResult
from .preflight import arena_layout, check_request, lock_run_dir, plan_run, resolve_device
from .serial import run_serial

__all__ = ["RunError", "RunResult", "arena_layout", "resolve_device", "train"]


def train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False, model: torch.nn.Module | None = None,
          quiet: bool = False, overwrite: bool = False, stop_when: Callable[[dict], bool] | None = None) -> RunResult:
    """Train with ``cfg``. ``run_dir`` receives config.toml, metrics.jsonl, train.log,
    processes.json and checkpoints; ``model`` replaces the built-in actor-critic (see
    fastrl.models.networks). A ``run_dir`` that holds a run needs ``resume`` (continue it) or
    ``overwrite`` (replace it). ``stop_when`` is called with every report (a line of
    metrics.jsonl); the first for which it returns True ends the run before its budget, as the
    budget would (final report and checkpoint), e.g. ``lambda r: r["episode_return_mean"] >= 475``;
    a single node's run only. What the user can get wrong is checked before any process
    starts (and before ``overwrite`` deletes anything) and raises RunError (or ConfigError) with
    one line that says what to do."""
    launched_at = time.time()
    run_dir = Path(run_dir) if run_dir is not None else None
    dist_info = check_request(cfg, run_dir, resume)
    if stop_when is not None and dist_info.enabled:
        raise RunError("stop_when stops a single node's run: with several ranks, end the run by its budget "
                       "(train_for_env_steps / train_for_seconds)")
    if not cfg.serial:
        # The fork server imports torch and the envs' libraries while this process probes the
        # env and plans the run (fastrl.ipc.start): on two cores the two overlap.
        child_context()
    attempt = current_attempt(cfg.dist_timeout_s) if dist_info.enabled else None
    if attempt is not None:
        resume, overwrite = attempt.settle(run_dir, resume, overwrite, dist_info)
    # A refused start leaves no run directory behind: one this call makes goes again on a refusal.
    made_dir = first_missing(run_dir) if run_dir is not None and dist_info.is_main else None
    lock = None
    try:
        lock = lock_run_dir(run_dir, resume, overwrite, dist_info)
        plan = plan_run(cfg, run_dir, resume, overwrite, model, launched_at, dist_info, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        if made_dir is not None:
            remove_unused_run_dir(run_dir, made_dir)
        raise
    try:
        if attempt is not None and dist_info.is_main:
            plan = dataclasses.replace(plan, restart_metrics=_claim(attempt, plan))
        return _run(dataclasses.replace(plan, stop_when=stop_when), quiet)
    finally:
        if lock is not None:
            lock.release()  # after the last write: the children have stopped, the console is closed


def _settle_auto_precision(plan: RunPlan, console: Console) -> RunPlan:
    """``learner.precision=auto`` measured once, here, on the run's network (fastrl.learner.precision),
    and said, in train.log too: the same profile trains in bf16 on one CPU and float32 on another.
    The plan returned names the choice, so the learners do not measure it again."""
    cfg, spec = plan.cfg, plan.spec

    def measure() -> tuple[str, str]:
        # A user's network as given (preflight checked it; the timing runs a copy), else the built-in one.
        model = plan.model if plan.model is not None else build_model(
            spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)
        return measured_precision(cfg, model, spec.observation_space)

    chosen, why = auto_precision(cfg.learner.algo, torch.device(plan.device), measure)
    line = f"[fastrl] learner.precision=auto: {chosen} on {plan.device} ({why})"
    console.status(line)  # to train.log as well, quiet or not
    learner = dataclasses.replace(cfg.learner, precision=chosen)
    return dataclasses.replace(plan, cfg=dataclasses.replace(cfg, learner=learner))


def _claim(attempt: ElasticAttempt, plan: RunPlan) -> dict:
    """The run directory recorded as the elastic job's (fastrl.run.elastic); its restart metrics."""
    try:
        return attempt.claim(plan.run_dir, plan.resume_state is not None)
    except OSError as exc:
        raise RunError(f"cannot write {exc.filename or plan.run_dir}: {exc.strerror or exc}") from None


def _run(plan: RunPlan, quiet: bool) -> RunResult:
    """The planned run, in its processes or (serial) in this one, saying what it does on the console."""
    main = plan.dist_info.is_main
    console = Console(plan.run_dir if main else None, quiet or not main)
    if plan.dist_info.pinned_sockets:
        console.notice(f"[fastrl] rank {plan.dist_info.rank}: {plan.dist_info.pinned_sockets}, the interface that "
                       f"reaches MASTER_ADDR {os.environ['MASTER_ADDR']} (set them yourself to choose another)")
    if plan.restart_metrics.get("restarts"):
        how = "resumes from its newest checkpoint" if plan.resume_state else "starts afresh (no checkpoint yet)"
        console.notice(f"[fastrl] restart {plan.restart_metrics['restarts']} of this torchrun job: the run {how}; "
                       f"wall time lost to restarts: {plan.restart_metrics['restart_lost_s']:.1f} s")
    if plan.cfg.learner.precision == "auto":
        plan = _settle_auto_precision(plan, console)
    emulated = emulated_bf16_warning(plan.cfg.learner.precision, plan.cfg.learner.algo, torch.device(plan.device))
    if emulated:
        console.notice(emulated)
    try:
        return run_serial(plan, console) if plan.cfg.serial else run_parallel(plan, console)
    except RunError as exc:
        console.record(f"[fastrl] the run stopped: {exc}")  # the command prints it; a detached run reads it here
        raise
    finally:
        console.close()
