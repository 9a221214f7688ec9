"""Starts, supervises and stops a training run (or runs it in one process with ``serial``).

Process layout of one node::

    runner (this process): arena owner, supervisor, metrics
      rollout worker x W --request ids--> inference batcher --request ids--> back to the worker
      rollout worker x W --full slot ids--> learner --free slot ids--> back to the worker
      learner --weights + version (shared buffer)--> inference batcher
"""
from __future__ import annotations

import copy
import json
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from . import distributed
from .checkpoint import (CheckpointError, CheckpointMismatch, load_latest_checkpoint, load_model_state,
                         remove_partial_checkpoints, set_aside_newer_checkpoints)
from .config import Config, to_toml, validate, weights_mismatch
from .console import Console
from .learner.precision import learner_precision
from .distributed import DistInfo
from .envs import EnvSpec, probe_env
from .evaluator import MAX_RESTARTS as EVALUATOR_MAX_RESTARTS
from .evaluator import EvalResults, Evaluator, evaluator_process
from .inference import InferenceBatcher, batcher_epsilons, inference_process
from .main_guard import unguarded_main_call
from .learner import LearnerHost, learner_process, make_learner, restore_learner
from .metrics import MetricsWriteError, Reporter
from .models import build_model, num_state_values
from .process_utils import make_channels
from .resources import ResourceError, check_resources
from .rollout import RolloutWorker, make_worker_env, rollout_process, worker_slot_ids
from .run_dir import RunDirError, RunDirLock, check_run_dir, prepare_run_dir, write_atomic
from .shm import Arena, Control, get_error, remove_stale_segments, trajectory_layout
from .spaces import ActionLayout, ObsLayout
from .video import require_video_extra
from .wandb_logger import require_wandb

SHUTDOWN_GRACE_S = 15.0


@dataclass
class RunResult:
    run_dir: Path | None
    reports: list[dict] = field(default_factory=list)

    @property
    def final(self) -> dict:
        return self.reports[-1] if self.reports else {}


class RunError(RuntimeError):
    """The run could not go on; the message says which process failed and why."""


def resolve_device(name: str, dist_info: DistInfo = DistInfo()) -> str:
    """The config's ``device`` for this rank: ``auto`` -> ``cuda`` if a GPU is visible, else the
    CPU; ``cuda`` -> the rank's own GPU, ``cuda:LOCAL_RANK`` (``cuda:0`` where the launcher lets
    each rank see one GPU); ``cuda:N`` as given, in a single process. Raises RunError where ranks
    would share a GPU (NCCL refuses a group with a duplicate GPU)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if not name.startswith("cuda"):
        return name
    if not torch.cuda.is_available():
        raise RunError(f"device={name} asked for but CUDA is not available; use --set device=cpu")
    count = torch.cuda.device_count()
    if name != "cuda":
        if dist_info.enabled:
            raise RunError(f"device='{name}' under torchrun (WORLD_SIZE={dist_info.world_size}) would put every "
                           f"rank on one GPU; use device='cuda' (each rank takes cuda:LOCAL_RANK)")
        if torch.device(name).index >= count:
            raise RunError(f"device='{name}' but {count} GPU(s) are visible (cuda:0 to cuda:{count - 1}); pick one "
                           f"of those, or check CUDA_VISIBLE_DEVICES")
        return name
    ranks_here = max(dist_info.local_world_size, dist_info.local_rank + 1)
    if count == 1:
        # With CUDA_VISIBLE_DEVICES set, a launcher may give each rank its own GPU; unset, every
        # rank sees the node's only GPU.
        if ranks_here > 1 and not os.environ.get("CUDA_VISIBLE_DEVICES"):
            raise RunError(f"torchrun runs {ranks_here} ranks on this node, which has one GPU: they would share "
                           f"it; use --nproc-per-node 1, or device=cpu")
        return "cuda:0"
    if ranks_here > count:
        raise RunError(f"torchrun runs {ranks_here} ranks on this node but {count} GPUs are visible, so LOCAL_RANK "
                       f"{dist_info.local_rank} has no GPU of its own; use --nproc-per-node {count} (or fewer), or "
                       f"device=cpu")
    return f"cuda:{dist_info.local_rank}"


def arena_layout(cfg: Config, spec: EnvSpec, num_weights: int, state_size: int = 0):
    """The run's arena; ``state_size`` > 0 adds the recurrent state arrays (model.core)."""
    obs, act = ObsLayout(spec.observation_space), ActionLayout(spec.action_space)
    return trajectory_layout(
        num_slots=cfg.num_slots, rollout=cfg.learner.rollout, obs_shape=obs.storage_shape,
        obs_dtype=obs.storage_dtype, action_shape=act.shape, action_dtype=act.dtype, num_workers=cfg.env.num_workers,
        envs_per_worker=cfg.env.envs_per_worker, num_splits=cfg.env.num_splits, num_weights=num_weights,
        state_size=state_size)


def load_resume_state(run_dir: Path, cfg: Config, template: torch.nn.Module) -> dict:
    """The newest checkpoint of ``run_dir`` that fits ``cfg`` and ``template`` (checked on a copy)."""
    probe = copy.deepcopy(template)

    def check(state: dict) -> None:
        differs = weights_mismatch(state.get("config", {}), cfg)
        if differs:
            raise CheckpointMismatch(f"--resume: the run in '{run_dir}' was trained with other settings ({differs}); "
                                     f"drop those overrides to continue it, or start a new run with another --run-dir")
        load_model_state(probe, state)

    remove_partial_checkpoints(run_dir)
    path, state = load_latest_checkpoint(run_dir, check=check)
    set_aside_newer_checkpoints(run_dir, path)
    return state


def train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False, model: torch.nn.Module | None = None,
          quiet: bool = False, overwrite: bool = False) -> RunResult:
    """Train with ``cfg``. ``run_dir`` receives config.toml, metrics.jsonl, train.log,
    processes.json and checkpoints; ``model`` replaces the built-in actor-critic (see
    fastrl.models). A ``run_dir`` that holds a run needs ``resume`` (continue it) or
    ``overwrite`` (replace it). What the user can get wrong is checked before any process
    starts (and before ``overwrite`` deletes anything) and raises RunError (or ConfigError) with
    one line that says what to do."""
    launched_at = time.time()
    validate(cfg)
    if cfg.logging.wandb:
        require_wandb()
    if cfg.eval.video_every_s:
        require_video_extra()
    dist_info = DistInfo.from_env()
    run_dir = Path(run_dir) if run_dir is not None else None
    if dist_info.enabled and (run_dir is None or cfg.serial):
        raise RunError("a torchrun launch needs --run-dir DIR (the same on every rank) and no serial mode")
    if resume and run_dir is None:
        raise RunError("resume needs the run directory of the run to continue (--run-dir DIR)")
    unguarded = None if cfg.serial else unguarded_main_call()
    if unguarded:
        raise RunError(f"fastrl.train() is called at the top level of {unguarded}, outside `if __name__ == "
                       f"\"__main__\":`, and every process fastrl starts re-runs that script: put the call under "
                       f"that guard")
    try:
        lock = check_run_dir(run_dir, resume, overwrite, dist_info.is_main) if run_dir is not None else None
    except RunDirError as exc:
        raise RunError(str(exc)) from None
    try:
        return _prepare_and_run(cfg, run_dir, resume, model, quiet, overwrite, launched_at, dist_info, lock)
    finally:
        if lock is not None:
            lock.release()  # after the last write: the children have stopped, the console is closed


def _prepare_and_run(cfg: Config, run_dir: Path | None, resume: bool, model: torch.nn.Module | None, quiet: bool,
                     overwrite: bool, launched_at: float, dist_info: DistInfo, lock: RunDirLock | None) -> RunResult:
    """train() once the run directory is checked and locked: the remaining checks, then the run."""
    try:
        device = resolve_device(cfg.device, dist_info)
        inference_device = resolve_device(cfg.inference.device, dist_info) if cfg.inference.device else device
        spec = probe_env(cfg)
        template = build_model(spec.observation_space, spec.action_space, cfg.model, model, cfg.learner.algo)
        resume_state = load_resume_state(run_dir, cfg, template) if resume else None
        layout = arena_layout(cfg, spec, num_state_values(template), getattr(template, "state_size", 0))
        remove_stale_segments()  # a killed run's arena must not count against /dev/shm
        check_resources(cfg, layout.nbytes, spec.observation_space, dist_info.local_world_size,
                        shared=not cfg.serial)
        config_text = to_toml(cfg)
        if run_dir is not None and dist_info.is_main:
            prepare_run_dir(run_dir, resume, overwrite)
            write_atomic(run_dir / "config.toml", config_text)
    except (RunDirError, ResourceError, CheckpointError) as exc:
        raise RunError(str(exc)) from None
    except OSError as exc:
        raise RunError(f"cannot write {exc.filename or run_dir}: {exc.strerror or exc}") from None
    console = Console(run_dir if dist_info.is_main else None, quiet or not dist_info.is_main)
    if cfg.learner.precision == "auto":
        # The same profile trains in bf16 on one CPU and float32 on another: say which, in train.log too.
        chosen = learner_precision("auto", cfg.learner.algo, torch.device(device))
        line = f"[fastrl] learner.precision=auto: {chosen} on this machine"
        console.status(line)
        console.record(line)
    counters = resume_state["counters"] if resume_state else {}
    clocks = (counters.get("wall_time", 0.0), counters.get("trained_seconds", counters.get("wall_time", 0.0)))
    try:
        if cfg.serial:
            return _serial_run(cfg, run_dir, spec, layout, model, device, resume_state, console, launched_at, clocks,
                               dist_info, inference_device)
        return _process_run(cfg, run_dir, spec, layout, model, device, resume_state, console, launched_at, clocks,
                            dist_info, inference_device, lock)
    except RunError as exc:
        console.record(f"[fastrl] the run stopped: {exc}")  # the command prints it; a detached run reads it here
        raise
    finally:
        console.close()


def _new_arena(layout, resume_state, shared: bool, dist_info: DistInfo = DistInfo()) -> Arena:
    arena = Arena(layout, shared=shared)
    arena.weight_version[0] = -1
    if resume_state is not None:
        # The run's count before the resume, shared out so that the ranks' counts sum to it.
        counters = resume_state["counters"]
        done, ranks = counters["env_steps"], dist_info.world_size
        arena.control[Control.ENV_STEPS_OFFSET] = done // ranks + (done % ranks if dist_info.is_main else 0)
        arena.control[Control.RUN_ENV_STEPS] = done
        arena.control[Control.WALL_MS] = int(counters.get("wall_time", 0.0) * 1000)
        arena.control[Control.TRAINED_MS] = int(counters.get("trained_seconds", counters.get("wall_time", 0.0)) * 1000)
    return arena


class _Interrupted(Exception):
    pass


def _raise_interrupt(signum, frame):
    raise _Interrupted(signal.Signals(signum).name)


class Supervisor:
    """Watches the children: restarts crashed rollout workers, and the evaluator (an observer: up
    to EVALUATOR_MAX_RESTARTS times, then the run goes on without it); stops the run on anything
    else. ``evaluator_failures`` is the read end of the pipe every evaluator says its failure on."""

    def __init__(self, cfg: Config, arena: Arena, make_worker, procs: dict, run_dir: Path | None,
                 console: Console, process_file: str = "processes.json", make_evaluator=None,
                 evaluator_failures=None):
        self.cfg = cfg
        self.console = console
        self.arena = arena
        self.make_worker = make_worker
        self.procs = procs
        self.run_dir = run_dir
        self.process_file = process_file
        self.make_evaluator = make_evaluator
        self.evaluator_failures = evaluator_failures
        self.restart_times: deque[float] = deque()
        self.restarts = {"rollout": 0, "evaluator": 0}
        self.generations = [0] * len(procs["rollout"])

    def restart_counts(self) -> dict:
        """The metrics' restart counters (evaluator_restarts where this rank evaluates)."""
        counts = {"worker_restarts": self.restarts["rollout"]}
        if "evaluator" in self.procs:
            counts["evaluator_restarts"] = self.restarts["evaluator"]
        return counts

    def everyone(self) -> list:
        return [p for group in self.procs.values() for p in group]

    def write_process_file(self) -> None:
        """processes.json: every pid of the run by role, the runner's too (for the profiler and
        scripts/soak.py; the directory's lock is what marks it in use, fastrl.run_dir)."""
        if self.run_dir is not None:
            pids = {role: [p.pid for p in group] for role, group in self.procs.items()}
            write_atomic(self.run_dir / self.process_file, json.dumps({**pids, "runner": [os.getpid()]}))

    def watch(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a child to exit; handle it. Raises RunError to stop the run."""
        dead = wait([p.sentinel for p in self.everyone()], timeout=timeout)
        if self.arena.control[Control.ERROR]:
            raise RunError(get_error(self.arena))
        for p in [p for p in self.everyone() if p.sentinel in dead]:
            p.join(1.0)  # reap it, so that exitcode is known
            if p in self.procs["rollout"]:
                self.restart_worker(self.procs["rollout"].index(p), p)
            elif p in self.procs.get("evaluator", ()):
                self.restart_evaluator(p)
            else:
                raise RunError(f"{p.name} (pid {p.pid}) exited with code {p.exitcode}; the run stopped "
                               f"(the last checkpoint is kept)")

    def restart_worker(self, w: int, dead) -> None:
        now = time.time()
        self.restart_times.append(now)
        while self.restart_times and now - self.restart_times[0] > self.cfg.restart_window_s:
            self.restart_times.popleft()
        if len(self.restart_times) > self.cfg.max_worker_restarts:
            raise RunError(f"rollout workers crashed {len(self.restart_times)} times within "
                           f"{self.cfg.restart_window_s:.0f} s (last: {dead.name}, exit code {dead.exitcode}); "
                           f"stopping (raise max_worker_restarts to tolerate more, or fix the env)")
        self.generations[w] += 1
        self._replace("rollout", w, dead, self.make_worker(w, self.generations[w]), f"exited with code {dead.exitcode}")

    def restart_evaluator(self, dead) -> None:
        """Start a new evaluator, or after EVALUATOR_MAX_RESTARTS go on without one (one notice)."""
        why = self._evaluator_failure(dead)
        if self.restarts["evaluator"] >= EVALUATOR_MAX_RESTARTS:
            self.procs["evaluator"] = []
            self.write_process_file()
            self.console.notice(f"[fastrl] {dead.name} (pid {dead.pid}) {why} after {EVALUATOR_MAX_RESTARTS} restarts; "
                                f"training goes on without evaluation (best.pt keeps the best so far)")
            return
        self._replace("evaluator", 0, dead, self.make_evaluator(), why, limit=EVALUATOR_MAX_RESTARTS)

    def _evaluator_failure(self, dead) -> str:
        """The line a dead evaluator sent (fastrl.evaluator.failure_line), else how it ended."""
        said = None
        while self.evaluator_failures.poll():
            said = self.evaluator_failures.recv()
        if said is not None:
            return f"failed ({said})"
        if dead.exitcode is not None and dead.exitcode < 0:
            return f"was killed by {signal.Signals(-dead.exitcode).name}"
        return f"exited with code {dead.exitcode}"

    def _replace(self, role: str, index: int, dead, replacement, why: str, limit: int | None = None) -> None:
        replacement.start()
        self.procs[role][index] = replacement
        self.restarts[role] += 1
        self.write_process_file()
        of = f" of {limit}" if limit is not None else ""
        self.console.notice(f"[fastrl] {dead.name} (pid {dead.pid}) {why}; restarted as pid {replacement.pid} "
                            f"(restart {self.restarts[role]}{of})")


def _process_run(cfg, run_dir, spec, layout, model, device, resume_state, console: Console, launched_at,
                 clocks: tuple[float, float], dist_info: DistInfo, inference_device: str,
                 lock: RunDirLock | None) -> RunResult:
    ctx = mp.get_context("spawn")
    main = dist_info.is_main
    parent = os.getpid()
    result = RunResult(run_dir)
    # A terminal's hang-up goes to its whole process group. Ignored from here on, the children
    # (and the resource tracker the arena starts) inherit the ignore through exec; the runner
    # itself switches to a quiet console once they run.
    previous = {signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_IGN)}
    arena = procs = reporter = supervisor = None
    clean = False
    late_error = ""
    try:
        arena = _new_arena(layout, resume_state, shared=True, dist_info=dist_info)
        eval_results = EvalResults(arena)

        # Children build their networks from the config (a user's model travels as it is): spawn
        # writes each child's arguments into a pipe the parent itself keeps open, so a child that
        # dies before reading megabytes of weights (e.g. a script without the __main__ guard)
        # would leave the parent blocked in Process.start() for ever.
        spaces = (spec.observation_space, spec.action_space)
        in_workers = cfg.inference.in_workers
        channels = make_channels(ctx, cfg.env.num_workers, batcher=not in_workers)

        def make_worker(w: int, generation: int = 0):
            # The runner keeps every pipe end open, so a dead worker never shows up as EOF
            # elsewhere and its replacement reuses the same pipes.
            return ctx.Process(target=rollout_process, name=f"fastrl-rollout-{w}",
                               args=(w, cfg, layout, arena.name, channels.workers[w], parent, generation,
                                     dist_info.rank, spaces if in_workers else None, model if in_workers else None))

        procs = {
            "learner": [ctx.Process(target=learner_process, name="fastrl-learner", args=(
                cfg, layout, arena.name, spaces, model, device,
                channels.learner, parent, run_dir if main else None, resume_state, dist_info, lock))],
            # inference.in_workers: each worker acts for itself, no batcher process.
            "inference": [] if in_workers else [ctx.Process(target=inference_process, name="fastrl-inference", args=(
                cfg, layout, arena.name, spaces, model, inference_device, channels.batcher, parent))],
            "rollout": [make_worker(w) for w in range(cfg.env.num_workers)],
        }
        evaluator_failures, failures_out = ctx.Pipe(duplex=False)

        def make_evaluator():
            return ctx.Process(target=evaluator_process, name="fastrl-evaluator", args=(
                cfg, layout, arena.name, spaces, model, run_dir, parent, failures_out))

        if cfg.eval.every_s and main:
            procs["evaluator"] = [make_evaluator()]
        process_file = "processes.json" if main else f"processes.rank{dist_info.rank}.json"
        supervisor = Supervisor(cfg, arena, make_worker, procs, run_dir, console, process_file, make_evaluator,
                                evaluator_failures)
        previous.update({sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)})
        for p in supervisor.everyone():
            p.start()
        signal.signal(signal.SIGHUP, lambda signum, frame: console.hung_up())
        supervisor.write_process_file()
        aggregate = None
        if dist_info.enabled:
            distributed.init_group(dist_info, "runner", "cpu", cfg.dist_timeout_s)
            aggregate = distributed.gather_counters
        reporter = Reporter(arena, run_dir if main else None, spec.frame_skip, cfg.train_for_env_steps,
                            cfg.train_for_seconds, console, launched_at, aggregate, *clocks)
        next_report = time.time() + cfg.report_every_s
        while True:
            if not dist_info.enabled and reporter.budget_reached():
                break
            supervisor.watch(timeout=min(0.25, max(0.0, next_report - time.time())))
            if time.time() >= next_report:
                reporter.report({**supervisor.restart_counts(), **eval_results.new()})
                next_report += cfg.report_every_s
                # Distributed: every rank leaves at the same report, on the same aggregated figures.
                if dist_info.enabled and reporter.stop_agreed:
                    break
        clean = True
    except _Interrupted as exc:
        console.notice(f"[fastrl] {exc}: stopping, writing a final checkpoint")
    except MetricsWriteError as exc:
        raise RunError(str(exc)) from None
    except OSError as exc:  # processes.json or TensorBoard events on a full disk, too many open pipes
        raise RunError(f"cannot write {exc.filename or 'to the run directory'}: {exc.strerror or exc}") from None
    finally:
        # A second Ctrl-C while the children stop must not cut the stop short: they are ignored
        # until the arena is gone (the learner is writing its final checkpoint meanwhile).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        try:
            # A last report is a collective in a distributed run: only when every rank gets there.
            if reporter is not None and reporter.metrics_ok and (clean or not dist_info.enabled):
                reporter.report({**supervisor.restart_counts(), **eval_results.new()})
        except (MetricsWriteError, OSError) as exc:
            late_error = str(exc)
        finally:
            try:
                if procs is not None:
                    _stop_processes(arena, procs, console)
                if arena is not None and arena.control[Control.ERROR]:
                    # The learner's final checkpoint is written while the others stop: its error.
                    late_error = get_error(arena)
            finally:
                if reporter is not None:
                    result.reports = list(reporter.history)
                    _close_quietly(reporter)
                if dist_info.enabled:
                    distributed.close_group()
                if arena is not None:
                    arena.close()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
    if late_error:
        raise RunError(late_error)
    return result


def _close_quietly(reporter: Reporter) -> None:
    """TensorBoard's writer flushes on close: on a full disk that must not mask how the run ended."""
    try:
        reporter.close()
    except OSError:
        pass


def _stop_processes(arena: Arena, procs: dict, console: Console) -> None:
    """Stop flag first; the learner gets time for its final checkpoint; stragglers are killed."""
    arena.control[Control.STOP] = 1
    deadline = time.time() + SHUTDOWN_GRACE_S
    for role in ("rollout", "inference", "evaluator", "learner"):
        for p in procs.get(role, ()):
            if p.pid is not None:
                p.join(max(0.1, deadline - time.time()))
    for group in procs.values():
        for p in group:
            if p.pid is not None and p.is_alive():
                console.notice(f"[fastrl] {p.name} (pid {p.pid}) did not stop within {SHUTDOWN_GRACE_S:.0f} s; "
                               f"killed" + (" before its final checkpoint" if p.name == "fastrl-learner" else ""))
                p.kill()
                p.join(5)


def _serial_run(cfg, run_dir, spec, layout, model, device, resume_state, console: Console, launched_at,
                clocks: tuple[float, float], dist_info: DistInfo, inference_device: str) -> RunResult:
    """Every component in this process, in lockstep: for debugging with pdb or a profiler."""
    threads = torch.get_num_threads()
    # As the learner process does: torch's default (every core) measured 2-5x slower here.
    torch.set_num_threads(cfg.learner.torch_threads)
    try:
        with threadpool_limits(1, user_api="blas"):  # as every child process (configure_child)
            return _serial_steps(cfg, run_dir, spec, layout, model, device, resume_state, console, launched_at,
                                 clocks, dist_info, inference_device)
    finally:
        torch.set_num_threads(threads)


def _serial_steps(cfg, run_dir, spec, layout, model, device, resume_state, console: Console, launched_at,
                  clocks: tuple[float, float], dist_info: DistInfo, inference_device: str) -> RunResult:
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    arena = _new_arena(layout, resume_state, shared=False)
    learner = make_learner(cfg, spec.observation_space, spec.action_space, model=model, device=device)
    if resume_state is not None:
        restore_learner(learner, resume_state)
    host = LearnerHost(cfg, arena, learner, run_dir)
    batcher = InferenceBatcher(arena, copy.deepcopy(learner.model), spec.action_space, torch.device(inference_device),
                               batcher_epsilons(cfg), numpy_mlp=cfg.inference.numpy_mlp)
    spare = []
    workers = []
    for w in range(cfg.env.num_workers):
        owned = worker_slot_ids(cfg, w)
        spare.append(deque(owned[cfg.env.envs_per_worker:].tolist()))
        workers.append(RolloutWorker(w, cfg, arena, make_worker_env(cfg, w), owned[:cfg.env.envs_per_worker],
                                     _take_from(spare[w]), lambda slots: queue.extend(slots.tolist())))
    per_worker = cfg.env.envs_per_worker * cfg.slots_per_env

    def release(slot_ids):
        for slot in slot_ids.tolist():
            spare[slot // per_worker].append(slot)

    reporter = Reporter(arena, run_dir, spec.frame_skip, cfg.train_for_env_steps, cfg.train_for_seconds, console,
                        launched_at, None, *clocks)
    queue: deque[int] = deque()
    host.publish()
    # Serial mode evaluates in line (training waits meanwhile): it is for debugging, not speed.
    evaluator = Evaluator(cfg, arena, copy.deepcopy(learner.model), run_dir) if cfg.eval.every_s else None
    eval_results = EvalResults(arena)
    next_eval = time.time() + cfg.eval.every_s
    next_report = time.time() + cfg.report_every_s
    try:
        for worker in workers:
            worker.start()
        while not reporter.budget_reached():
            ready_workers, ready_requests = [], []
            for w, worker in enumerate(workers):
                while worker.can_recv():
                    request = worker.recv_batch()
                    ready_workers.append(w)
                    ready_requests.append(request)
            batcher.refresh_weights()
            batcher.infer(np.array(ready_workers), np.array(ready_requests))
            for w, request in zip(ready_workers, ready_requests):
                workers[w].act(request)
            while len(queue) >= cfg.trajectories_per_batch:
                slot_ids = np.array([queue.popleft() for _ in range(cfg.trajectories_per_batch)], dtype=np.int64)
                host.consume(slot_ids, release)
            if evaluator is not None and time.time() >= next_eval:
                evaluator.evaluate()
                next_eval = time.time() + cfg.eval.every_s
            if time.time() >= next_report:
                reporter.report(eval_results.new())
                next_report += cfg.report_every_s
            if host.checkpoint_due():
                host.checkpoint()
        host.flush()  # the device path's last batch (fastrl.learner.feed)
    except MetricsWriteError as exc:
        raise RunError(str(exc)) from None
    finally:
        for worker in workers:
            worker.env.close()
        try:
            host.checkpoint()
            if reporter.metrics_ok:
                reporter.report(eval_results.new())
        finally:
            reporter.close()
    return RunResult(run_dir, list(reporter.history))


def _take_from(spare: deque):
    def take(n: int) -> np.ndarray:
        if len(spare) < n:
            raise RunError("serial mode ran out of free trajectory slots; raise slots_per_env")
        return np.array([spare.popleft() for _ in range(n)], dtype=np.int32)

    return take
