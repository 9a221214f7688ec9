"""The serial run: every component in this process, in lockstep, for debugging with pdb or a
profiler (``serial = true``). The same classes as the parallel run's processes (RolloutWorker,
InferenceBatcher, LearnerRuntime), over a private arena."""
from __future__ import annotations

import copy

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..evaluation.evaluator import MAX_RESTARTS, EvalResults, Evaluator, failure_line, given_up_notice, restarted_notice
from ..ipc.slots import SlotsExhausted, serial_slots
from ..learner.policy_set import PolicyRuntimes, make_policy_learners, restore_policies
from ..reporting.console import Console
from ..reporting.metrics import MetricsWriteError, Reporter, WorkerTiming
from ..sampling.batcher import InferenceBatcher, exploration
from ..sampling.rollout_worker import RolloutWorker, make_worker_env, worker_policies
from ..tuning.pbt import info_due_env_steps
from .plan import RunError, RunPlan, RunResult


def run_serial(plan: RunPlan, console: Console) -> RunResult:
    """Run ``plan`` in this process until its budget is spent; the final checkpoint and report are
    written on the way out."""
    threads = torch.get_num_threads()
    # As the learner process does: torch's default (every core) runs 2-5x slower.
    torch.set_num_threads(plan.cfg.learner.torch_threads)
    try:
        with threadpool_limits(1, user_api="blas"):  # as every child process (configure_child)
            return _serial_steps(plan, console)
    finally:
        torch.set_num_threads(threads)


def _serial_steps(plan: RunPlan, console: Console) -> RunResult:
    cfg, run_dir, spec = plan.cfg, plan.run_dir, plan.spec
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    arena = plan.new_arena(shared=False)
    policies = plan.policies
    learners = make_policy_learners(cfg, (spec.observation_space, spec.action_space), plan.model, plan.device,
                                    policies.num_policies)
    learner = learners[0]
    if plan.resume_state is not None:
        restore_policies(learners, policies.names, plan.resume_state)
    runtime = PolicyRuntimes(cfg, arena, learners, policies, run_dir, resume_state=plan.resume_state)
    batcher = InferenceBatcher(arena, copy.deepcopy(learner.model), spec.action_space,
                               torch.device(plan.inference_device), numpy_mlp=cfg.inference.numpy_mlp,
                               algo=cfg.learner.algo, **exploration(cfg))
    row_policy = policies.run_row_policies(cfg.env.num_workers, cfg.env.envs_per_worker)
    worker_slots, full = serial_slots(arena, cfg.env.num_workers, cfg.slots_per_worker, cfg.trajectories_per_batch,
                                      lambda w: WorkerTiming.cell(arena, w, WorkerTiming.WAIT_SLOTS), row_policy,
                                      drop_untrained=cfg.selfplay.enabled)
    envs = [make_worker_env(cfg, w) for w in range(cfg.env.num_workers)]
    workers = [RolloutWorker(w, cfg, arena, envs[w], slots.take(cfg.env.envs_per_worker), slots.take,
                             slots.emit, *worker_policies(cfg, arena, policies, envs[w], w))
               for w, slots in enumerate(worker_slots)]
    reporter = Reporter(arena, run_dir, spec.frame_skip, cfg.train_for_env_steps, cfg.train_for_seconds, console,
                        plan.launched_at, None, *plan.clocks, policy_names=policies.names,
                        members=bool(policies.members), info_keys=cfg.info_keys,
                        info_due_env_steps=info_due_env_steps(cfg), objective=cfg.pbt.objective,
                        league=plan.league_record(arena), stop_when=plan.stop_when,
                        report_every_s=cfg.report_every_s,
                        report_every_env_steps=cfg.serial_report_every_env_steps)
    runtime.publish()
    evaluations = InlineEvaluations(cfg.serial_evaluate_every_reports,
                                    lambda: Evaluator(cfg, arena, copy.deepcopy(learner.model), run_dir),
                                    console) if cfg.eval.every_s else None
    eval_results = EvalResults(arena, cfg.eval.opponents, cfg.pbt.population, cfg.best_by_opponents)
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
            while (batch := full.next_batch()) is not None:
                runtime.consume(*batch, full.release)
            if reporter.report_due():
                if evaluations is not None:
                    evaluations.evaluate_if_due()
                reporter.report({**evaluation_counts(evaluations), **eval_results.new()})
            if runtime.checkpoint_due():
                runtime.checkpoint()
        runtime.flush()  # the device path's last batch (fastrl.learner.staging)
    except (MetricsWriteError, SlotsExhausted) as exc:
        raise RunError(str(exc)) from None
    finally:
        for worker in workers:
            worker.env.close()
        try:
            runtime.checkpoint()
            if reporter.metrics_ok:
                reporter.report({**evaluation_counts(evaluations), **eval_results.new()})
        finally:
            reporter.close()
    return RunResult(run_dir, list(reporter.history))


class InlineEvaluations:
    """The serial run's evaluations, in line at every ``every_reports``-th report (training waits
    meanwhile: this mode is for debugging, not speed). Reports come at fixed env steps, so two
    runs with one seed evaluate at the same steps. As expendable as the parallel run's evaluator
    process: a failed evaluation is followed by a new Evaluator (new envs) up to MAX_RESTARTS
    times, then training goes on without evaluation; each step says so in the notices the
    supervisor gives."""

    def __init__(self, every_reports: int, make_evaluator, console: Console):
        self.every_reports = every_reports
        self.make_evaluator = make_evaluator
        self.console = console
        self.evaluator: Evaluator | None = None
        self.restarts = 0
        self.given_up = False
        self.reports = 0

    def evaluate_if_due(self) -> None:
        """Called at each report: evaluates at every ``every_reports``-th."""
        self.reports += 1
        if self.given_up or self.reports % self.every_reports:
            return
        try:
            # Its own torch RNG stream: an evaluation must not change the draws training makes
            # after it (docs/reproducibility.md).
            with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []):
                if self.evaluator is None:
                    self.evaluator = self.make_evaluator()
                self.evaluator.evaluate()
        except Exception as exc:  # an observer's failure never stops training; Ctrl-C still does
            self.evaluator = None
            self._failed(f"the evaluator failed ({failure_line(exc)})")

    def _failed(self, failure: str) -> None:
        if self.restarts >= MAX_RESTARTS:
            self.given_up = True
            self.console.notice(given_up_notice(failure, MAX_RESTARTS))
            return
        self.restarts += 1
        self.console.notice(restarted_notice(failure, "a new evaluator with new envs", self.restarts, MAX_RESTARTS))


def evaluation_counts(evaluations: InlineEvaluations | None) -> dict:
    """The metrics' evaluator_restarts, as the parallel run reports them, when the run evaluates."""
    return {"evaluator_restarts": evaluations.restarts} if evaluations is not None else {}
