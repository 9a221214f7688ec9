"""The parallel run: the arena made, the children started, supervised and reported on until the
budget is spent, then stopped in order.

Process layout of one node::

    runner (this process): arena owner, supervisor, metrics
      rollout worker x W --request ids--> inference batcher --request ids--> back to the worker
      rollout worker x W --full slot ids--> learner --free slot ids--> back to the worker
      learner --weights + version (shared buffer)--> inference batcher

(fastrl.ipc.slots is the protocol the slot and request ids follow.)
"""
from __future__ import annotations

import signal
import time

from ..distributed import process_group as distributed
from ..evaluation.evaluator import EvalResults, evaluator_process
from ..ipc.arena import Arena, Control, get_error, learner_caught_up
from ..ipc.child import make_channels
from ..ipc.start import child_context, child_process
from ..learner import learner_process
from ..reporting.console import Console
from ..reporting.metrics import STAT, MetricsWriteError, Reporter
from ..sampling.batcher import inference_process
from ..sampling.rollout_worker import rollout_process
from ..tuning.pbt import info_due_env_steps
from .plan import RunError, RunPlan, RunResult
from .rank_heartbeat import RankWatch
from .supervisor import Supervisor, stop_processes


class _Interrupted(Exception):
    pass


def _raise_interrupt(signum, frame):
    raise _Interrupted(signal.Signals(signum).name)


def run_parallel(plan: RunPlan, console: Console) -> RunResult:
    """Run ``plan`` in its processes until its budget is spent, a signal stops it, or a child's
    failure does (RunError); the final report and checkpoint are written on every way out."""
    cfg, dist_info = plan.cfg, plan.dist_info
    result = RunResult(plan.run_dir)
    # A terminal's hang-up goes to its whole process group. Ignored from here on, the children
    # (and the resource tracker the arena starts) inherit the ignore through exec; the runner
    # itself switches to a quiet console once they run.
    previous = {signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_IGN)}
    arena = supervisor = reporter = watch = None
    clean = False
    late_error = ""
    try:
        arena = plan.new_arena(shared=True)
        if not dist_info.enabled:
            # Ranks stop together at an agreed report instead (Reporter.report).
            arena.control[Control.BUDGET_ENV_STEPS] = cfg.train_for_env_steps
        eval_results = EvalResults(arena, cfg.eval.opponents, cfg.pbt.population, cfg.best_by_opponents)
        supervisor = _supervised_children(plan, child_context(), arena, console)
        previous.update({sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)})
        for p in supervisor.everyone():
            p.start()
        signal.signal(signal.SIGHUP, lambda signum, frame: console.hung_up())
        supervisor.write_process_file()
        aggregate = None
        if dist_info.enabled:
            distributed.init_group(dist_info, "runner", "cpu", cfg.dist_timeout_s)
            aggregate = distributed.gather_counters
            watch = RankWatch(dist_info, cfg.dist_timeout_s)
        reporter = Reporter(arena, plan.run_dir if dist_info.is_main else None, plan.spec.frame_skip,
                            cfg.train_for_env_steps, cfg.train_for_seconds, console, plan.launched_at, aggregate,
                            *plan.clocks, policy_names=plan.policies.names, members=bool(plan.policies.members),
                            info_keys=cfg.info_keys, info_due_env_steps=info_due_env_steps(cfg),
                            objective=cfg.pbt.objective, league=plan.league_record(arena, dist_info.is_main),
                            stop_when=plan.stop_when, report_every_s=cfg.report_every_s)
        _supervise_until_done(plan, supervisor, reporter, eval_results, watch)
        clean = True
    except _Interrupted as exc:
        console.notice(f"[fastrl] {exc}: stopping, writing a final checkpoint")
        result.stopped_by = str(exc)
    except MetricsWriteError as exc:
        raise RunError(str(exc)) from None
    except OSError as exc:  # processes.json or TensorBoard events on a full disk, too many open pipes
        raise RunError(f"cannot write {exc.filename or 'to the run directory'}: {exc.strerror or exc}") from None
    except RuntimeError as exc:  # RunError too: a child's failure may be a collective's with a peer that went away
        if watch is None or not watch.explains(exc):
            raise
        raise watch.error() from None
    finally:
        # A second Ctrl-C while the children stop must not cut the stop short: they are ignored
        # until the arena is gone (the learner is writing its final checkpoint meanwhile).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        try:
            # A last report is a collective in a distributed run: only when every rank gets there.
            if reporter is not None and reporter.metrics_ok and (clean or not dist_info.enabled):
                reporter.report({**supervisor.restart_counts(), **plan.restart_metrics, **eval_results.new()})
        except (MetricsWriteError, OSError) as exc:
            late_error = str(exc)
        finally:
            try:
                if supervisor is not None:
                    stop_processes(arena, supervisor.procs, console)
                if arena is not None and arena.control[Control.ERROR]:
                    # The learner's final checkpoint is written while the others stop: its error.
                    late_error = get_error(arena)
            finally:
                if reporter is not None:
                    result.reports = list(reporter.history)
                    _close_quietly(reporter)
                if watch is not None:
                    watch.leave()
                if dist_info.enabled:
                    distributed.close_group()
                if arena is not None:
                    arena.close()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
    if late_error:
        raise RunError(late_error)
    return result


def _supervised_children(plan: RunPlan, ctx, arena: Arena, console: Console) -> Supervisor:
    """The run's child processes, made (not started) under a Supervisor that can make them again."""
    cfg, dist_info, main = plan.cfg, plan.dist_info, plan.dist_info.is_main
    # Children build their networks from the config (a user's model travels as it is): the
    # runner writes each child's arguments into a pipe it keeps open itself, so a child that
    # dies before reading megabytes of weights (e.g. a script without the __main__ guard)
    # would leave the parent blocked in Process.start() for ever.
    spaces = (plan.spec.observation_space, plan.spec.action_space)
    in_workers = cfg.inference.in_workers
    channels = make_channels(ctx, cfg.env.num_workers, batcher=not in_workers)

    def make_worker(w: int, generation: int = 0):
        # The runner keeps every pipe end open, so a dead worker never shows up as EOF
        # elsewhere and its replacement reuses the same pipes.
        return child_process(ctx, rollout_process, f"fastrl-rollout-{w}",
                             args=(w, cfg, plan.layout, arena.name, channels.workers[w], generation,
                                   dist_info.rank, spaces if in_workers else None,
                                   plan.model if in_workers else None, plan.policies))

    procs = {
        "learner": [child_process(ctx, learner_process, "fastrl-learner", args=(
            cfg, plan.layout, arena.name, spaces, plan.model, plan.device, channels.learner,
            plan.run_dir if main else None, plan.resume_state, dist_info, plan.lock, plan.policies))],
        # inference.in_workers: each worker acts for itself, no batcher process.
        "inference": [] if in_workers else [child_process(ctx, inference_process, "fastrl-inference", args=(
            cfg, plan.layout, arena.name, spaces, plan.model, plan.inference_device, channels.batcher))],
        "rollout": [make_worker(w) for w in range(cfg.env.num_workers)],
    }
    evaluator_failures, failures_out = ctx.Pipe(duplex=False)

    def make_evaluator():
        return child_process(ctx, evaluator_process, "fastrl-evaluator", args=(
            cfg, plan.layout, arena.name, spaces, plan.model, plan.run_dir, failures_out))

    if cfg.eval.every_s and main:
        procs["evaluator"] = [make_evaluator()]
    process_file = "processes.json" if main else f"processes.rank{dist_info.rank}.json"
    return Supervisor(cfg, arena, make_worker, procs, plan.run_dir, console, process_file, make_evaluator,
                      evaluator_failures)


def _supervise_until_done(plan: RunPlan, supervisor: Supervisor, reporter: Reporter,
                          eval_results: EvalResults, watch: RankWatch | None = None) -> None:
    """Watch the children and report every ``report_every_s`` until the budget is spent (with
    several ranks: until they agree to stop, or ``watch`` finds that one went away)."""
    distributed_run = plan.dist_info.enabled
    budget_end = _BudgetEnd(supervisor.arena, supervisor.console)
    while True:
        if not distributed_run and budget_end.reached(reporter):
            return
        supervisor.watch(timeout=min(0.25, reporter.seconds_to_report()))
        if watch is not None and watch.lost:
            raise watch.error()
        if reporter.report_due():
            reporter.report({**supervisor.restart_counts(), **plan.restart_metrics, **eval_results.new()})
            # Distributed: every rank leaves at the same report, on the same aggregated figures.
            if distributed_run and reporter.stop_agreed:
                return


# How long the end of a step budget waits while nothing moves: no worker parks, the learner takes
# in no slot, makes no update and writes no replay (a learner still loading its model, one stuck in
# an update, an env that never answers). Then the run stops without what it still had to train on.
BUDGET_END_PATIENCE_S = 120.0


class _BudgetEnd:
    """Past the step budget each worker parks after its batch that reached it (Control.BUDGET_ENV_STEPS),
    and the run waits for every worker to have parked and the learner to have trained on the full
    slots they sent (learner_caught_up): a short run would otherwise end before the learner, still
    loading, took any. A time budget, a signal or ``stop_when`` ends the run at once; so does
    BUDGET_END_PATIENCE_S in which nothing moves, with a notice."""

    def __init__(self, arena: Arena, console: Console):
        self.arena = arena
        self.console = console
        self.progress: tuple | None = None
        self.since = 0.0

    def reached(self, reporter: Reporter) -> bool:
        if not reporter.budget_reached():
            return False
        arena = self.arena
        if reporter.time_up() or reporter.stop_asked or (arena.worker_parked.all() and learner_caught_up(arena)):
            return True
        control, now = arena.control, time.monotonic()
        progress = (int(arena.worker_parked.sum()), int(control[Control.LEARNER_SLOTS_IN]),
                    int(control[Control.SAVE_BEAT_MS]), float(arena.learner_stats[:, STAT["learner_updates"]].sum()))
        if progress != self.progress:
            self.progress, self.since = progress, now
            return False
        if now - self.since < BUDGET_END_PATIENCE_S:
            return False
        self.console.notice(f"[fastrl] {BUDGET_END_PATIENCE_S:.0f} s after the step budget was spent, "
                            f"{int(arena.worker_parked.sum())} of {len(arena.worker_parked)} workers had stopped "
                            f"and the learner had taken no slot and made no update meanwhile: stopping without "
                            f"the batches it had not trained on")
        return True


def _close_quietly(reporter: Reporter) -> None:
    """TensorBoard's writer flushes on close: on a full disk that must not mask how the run ended."""
    try:
        reporter.close()
    except OSError:
        pass
