"""Timing columns: each process's named columns of ``arena.timings`` and the metrics.jsonl keys
they are reported as (fastrl.profiler reads those keys)."""
import time

import numpy as np

from fastrl.ipc.arena import Arena, trajectory_layout
from fastrl.reporting.metrics import INFERENCE_TIMINGS, WORKER_TIMINGS, BatcherTiming, WorkerTiming, read_timings


def small_arena(num_workers: int) -> Arena:
    return Arena(trajectory_layout(num_slots=4, rollout=2, obs_shape=(1,), obs_dtype=np.float32, action_shape=(),
                                   action_dtype=np.int64, num_workers=num_workers, envs_per_worker=2, num_splits=1,
                                   num_weights=1), shared=False)


def test_timing_report_keys_are_the_documented_ones():
    assert WORKER_TIMINGS == ("env_step_s", "obs_copy_s", "wait_actions_s", "wait_slots_s", "inference_s")
    assert INFERENCE_TIMINGS == ("inference_forward_s", "weight_refresh_s", "wait_requests_s", "inference_batches",
                                 "inference_requests")
    # One key per column, columns 0..k-1 without gaps, all within the arena's row.
    row_length = small_arena(num_workers=1).timings.shape[1]
    for columns in (WorkerTiming, BatcherTiming):
        assert sorted(columns.KEYS) == list(range(len(columns.KEYS)))
        assert len(columns.KEYS) <= row_length


def test_each_column_is_reported_under_its_key():
    arena = small_arena(num_workers=2)
    for w, scale in enumerate((1.0, 10.0)):
        row = WorkerTiming.row(arena, w)
        row[WorkerTiming.ENV_STEP] += 1 * scale
        row[WorkerTiming.OBS_COPY] += 2 * scale
        row[WorkerTiming.WAIT_ACTIONS] += 3 * scale
        row[WorkerTiming.WAIT_SLOTS] += 4 * scale
        row[WorkerTiming.INFERENCE] += 0.5 * scale
    batcher = BatcherTiming.row(arena)
    batcher[BatcherTiming.FORWARD] += 5
    batcher[BatcherTiming.WEIGHT_REFRESH] += 6
    batcher[BatcherTiming.WAIT_REQUESTS] += 7
    batcher[BatcherTiming.BATCHES] += 8
    batcher[BatcherTiming.REQUESTS] += 9
    # Worker columns are summed over the workers; the batcher's row is apart from theirs.
    assert read_timings(arena) == {
        "rollout/env_step_s": 11.0, "rollout/obs_copy_s": 22.0, "rollout/wait_actions_s": 33.0,
        "rollout/wait_slots_s": 44.0, "rollout/inference_s": 5.5, "inference/inference_forward_s": 5.0,
        "inference/weight_refresh_s": 6.0,
        "inference/wait_requests_s": 7.0, "inference/inference_batches": 8.0, "inference/inference_requests": 9.0}


def test_the_reports_kept_in_memory_are_bounded(tmp_path, monkeypatch):
    from fastrl.reporting import metrics

    monkeypatch.setattr(metrics, "HISTORY_REPORTS", 5)
    reporter = metrics.Reporter(small_arena(num_workers=1), tmp_path, frame_skip=1, target_env_steps=0,
                                target_seconds=0.0)
    for _ in range(12):
        reporter.report()
    reporter.close()
    assert len(reporter.history) == 5  # the newest five
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 12  # every report on disk


def test_a_resumed_run_s_eta_counts_what_it_did_before_the_resume():
    """Both budgets count from the start of the run (--help says so): 60 of 100 trained seconds and
    600 env steps were done before the resume."""
    import re

    from fastrl.ipc.arena import Control
    from fastrl.reporting.metrics import Reporter

    def eta(target_env_steps: int, target_seconds: float) -> float:
        arena = small_arena(num_workers=1)
        arena.control[Control.ENV_STEPS_OFFSET] = 600
        arena.env_steps[0] = 100  # this session's steps
        reporter = Reporter(arena, None, frame_skip=1, target_env_steps=target_env_steps,
                            target_seconds=target_seconds, trained_before=60.0)
        record = {"env_steps": reporter.env_steps(), "env_steps_per_s": 10.0, "fps": 10.0,
                  "episode_return_mean": 0.0, "policy_lag_mean": 0.0, "policy_lag_max": 0.0, "learner_updates": 0}
        assert record["env_steps"] == 700
        return float(re.search(r"ETA (\d+)s", reporter.status_line(record)).group(1))

    assert abs(eta(target_env_steps=0, target_seconds=100) - 40) <= 1  # 40 s left, not 100
    assert eta(target_env_steps=1000, target_seconds=0) == 30  # 300 steps left at 10/s, not 900
    assert eta(target_env_steps=1000, target_seconds=100) == 30  # the nearer budget


def test_help_says_how_the_budgets_count_with_resume():
    from fastrl.cli import train_parser

    text = " ".join(train_parser().format_help().split())
    assert "a resumed run counts the steps it did before the resume" in text
    assert "a resumed run counts the time it trained before the resume" in text


def test_a_report_that_stop_when_accepts_counts_as_the_budget_reached():
    from fastrl.reporting.metrics import Reporter

    arena = small_arena(num_workers=1)
    seen = []
    reporter = Reporter(arena, None, frame_skip=1, target_env_steps=1_000, target_seconds=0.0,
                        stop_when=lambda record: seen.append(record["env_steps"]) or record["env_steps"] >= 20)
    arena.env_steps[0] = 10
    reporter.report()
    assert not reporter.budget_reached()
    arena.env_steps[0] = 20
    reporter.report()
    assert reporter.budget_reached()
    reporter.report()  # the final report: the stop stands, and is not asked again
    assert reporter.budget_reached() and seen == [10, 20]


def test_a_report_soon_after_the_last_averages_the_episodes_of_both():
    """The report a run writes as it stops can follow the one before by a moment and hold a couple
    of episodes: on their own they would be the run's last figure (a sweep's value, a benchmark's
    final). A report that follows by less than half the interval averages both reports' episodes."""
    from fastrl.reporting.metrics import Reporter

    arena = small_arena(num_workers=1)

    def finish(*returns: float) -> None:
        for value in returns:
            index = arena.episode_count[0] % arena.episode_return.shape[1]
            arena.episode_return[0, index], arena.episode_length[0, index] = value, 10
            arena.episode_actor[0, index], arena.episode_opponent[0, index] = 0, -1
            arena.episode_count[0] += 1

    reporter = Reporter(arena, None, frame_skip=1, target_env_steps=0, target_seconds=0.0, report_every_s=10.0)

    def report_after(seconds: float) -> float:
        reporter.last_time = time.time() - seconds
        return reporter.report()["episode_return_mean"]

    finish(1.0, 1.0, 1.0, 1.0)
    assert report_after(10.0) == 1.0
    finish(0.0)
    assert report_after(0.5) == 0.8  # the stop report: four episodes before and its own
    finish(0.0, 0.0)
    assert report_after(10.0) == 0.0  # a full interval: its own episodes only
