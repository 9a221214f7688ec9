"""The end of a step budget (fastrl.run.parallel._BudgetEnd): the run waits for the learner to train
on the budget's full slots, and not for ever on a learner that does nothing; the learner trains on
the batch its device path holds once the budget is spent (fastrl.learner.process)."""
import numpy as np
import pytest

from fastrl.ipc.arena import Arena, Control, trajectory_layout
from fastrl.learner.process import train_held_batch_past_budget
from fastrl.reporting.metrics import STAT
from fastrl.run import parallel


class FakeReporter:
    def __init__(self):
        self.steps_spent, self.time_is_up, self.stop_asked = True, False, False

    def budget_reached(self):
        return self.steps_spent or self.time_is_up or self.stop_asked

    def time_up(self):
        return self.time_is_up


class Notices:
    def __init__(self):
        self.lines = []

    def notice(self, line):
        self.lines.append(line)


def arena() -> Arena:
    return Arena(trajectory_layout(num_slots=4, rollout=4, obs_shape=(1,), obs_dtype=np.float32, action_shape=(),
                                   action_dtype=np.int64, num_workers=1, envs_per_worker=2, num_splits=1,
                                   num_weights=1), shared=False)


def test_the_run_ends_once_every_worker_parked_and_the_learner_waits_with_every_emitted_slot():
    a, reporter, notices = arena(), FakeReporter(), Notices()
    end = parallel._BudgetEnd(a, notices)
    a.slot_queued[[0, 2]] = 1
    a.control[Control.LEARNER_IDLE_QUEUED] = 1 + 2  # waiting, holding both
    a.worker_parked[:] = 1
    reporter.steps_spent = False
    assert not end.reached(reporter)
    reporter.steps_spent = True
    a.control[Control.LEARNER_IDLE_QUEUED] = 0
    assert not end.reached(reporter)  # the learner is not waiting
    a.control[Control.LEARNER_IDLE_QUEUED] = 1 + 1  # waiting, holding one of the two
    assert not end.reached(reporter)
    a.control[Control.LEARNER_IDLE_QUEUED] = 1 + 2
    a.worker_parked[0] = 0  # a worker may still send a slot
    assert not end.reached(reporter)
    a.worker_parked[0] = 1
    assert end.reached(reporter) and not notices.lines


def test_a_time_budget_or_a_stop_ends_the_run_without_waiting_for_the_learner():
    a, reporter = arena(), FakeReporter()
    reporter.steps_spent, reporter.time_is_up = False, True
    assert parallel._BudgetEnd(a, Notices()).reached(reporter)
    reporter.time_is_up, reporter.stop_asked = False, True
    assert parallel._BudgetEnd(a, Notices()).reached(reporter)


def an_update(a):
    a.learner_stats[0, STAT["learner_updates"]] += 1


def slots_taken_in(a):
    a.control[Control.LEARNER_SLOTS_IN] += 8


def a_replay_written(a):
    a.control[Control.SAVE_BEAT_MS] += 1000


def a_worker_parked(a):
    a.worker_parked[0] = 1


@pytest.mark.parametrize("moves", [an_update, slots_taken_in, a_replay_written, a_worker_parked])
def test_nothing_moving_past_the_budget_is_waited_for_a_while_then_named(monkeypatch, moves):
    clock = [100.0]
    monkeypatch.setattr(parallel.time, "monotonic", lambda: clock[0])
    a, reporter, notices = arena(), FakeReporter(), Notices()
    end = parallel._BudgetEnd(a, notices)
    patience = parallel.BUDGET_END_PATIENCE_S
    assert not end.reached(reporter)
    clock[0] += patience - 1
    moves(a)  # the patience starts again
    assert not end.reached(reporter)
    clock[0] += patience - 1
    a.control[Control.LEARNER_WAITS] += 3  # waits that end with nothing are no progress
    assert not end.reached(reporter)
    clock[0] += 2
    assert end.reached(reporter)
    parked = int(a.worker_parked.sum())
    assert notices.lines == [f"[fastrl] {patience:.0f} s after the step budget was spent, {parked} of 1 workers had "
                             f"stopped and the learner had taken no slot and made no update meanwhile: stopping "
                             f"without the batches it had not trained on"]


class HeldBatch:
    def __init__(self):
        self.flushed = []

    def progress(self):
        return 0.25

    def flush(self, progress):
        self.flushed.append(progress)


def test_the_device_paths_held_batch_is_trained_once_the_budget_is_spent_not_before():
    a, runtime = arena(), HeldBatch()
    a.control[Control.BUDGET_ENV_STEPS] = 100
    a.env_steps[0] = 99
    assert not train_held_batch_past_budget(runtime, a) and runtime.flushed == []
    a.env_steps[0] = 100
    assert train_held_batch_past_budget(runtime, a) and runtime.flushed == [0.25]
    a.control[Control.BUDGET_ENV_STEPS] = 0  # no step budget (a time budget, several ranks)
    assert not train_held_batch_past_budget(runtime, a) and runtime.flushed == [0.25]
