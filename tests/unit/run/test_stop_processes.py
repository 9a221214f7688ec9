"""stop_processes past its grace: a learner still writing its replay is waited for while its
stamps come, killed when they stop or at the cap; children are real processes, the grace short."""
import multiprocessing
import time

import numpy as np
import pytest

from fastrl.ipc.arena import Control
from fastrl.run import supervisor

GRACE_S = 0.3
SILENCE_S = 0.6
CONTEXT = multiprocessing.get_context("fork")


class SharedControl:
    """An arena's control row in shared memory, so a child's stamps reach the parent."""

    def __init__(self):
        self.raw = CONTEXT.RawArray("q", len([k for k in vars(Control) if k.isupper()]))

    @property
    def control(self):
        return np.frombuffer(self.raw, dtype=np.int64)


class Notices:
    def __init__(self):
        self.lines = []

    def notice(self, text):
        self.lines.append(text)


def saving_learner(raw, beat_for_s, then_sleep_s):
    """Ignore the stop; stamp the save beat every 50 ms for ``beat_for_s``, then hang silent."""
    control = np.frombuffer(raw, dtype=np.int64)
    end = time.time() + beat_for_s
    while time.time() < end:
        control[Control.SAVE_BEAT_MS] = int(time.time() * 1000)
        time.sleep(0.05)
    time.sleep(then_sleep_s)


@pytest.fixture
def short_grace(monkeypatch):
    monkeypatch.setattr(supervisor, "SHUTDOWN_GRACE_S", GRACE_S)
    monkeypatch.setattr(supervisor, "SAVE_SILENCE_S", SILENCE_S)
    monkeypatch.setattr(supervisor, "SAVE_GRACE_MAX_S", 4.0)


def stop(beat_for_s, then_sleep_s):
    arena, notices = SharedControl(), Notices()
    learner = CONTEXT.Process(target=saving_learner, args=(arena.raw, beat_for_s, then_sleep_s),
                              name="fastrl-learner", daemon=True)
    learner.start()
    started = time.time()
    supervisor.stop_processes(arena, {"learner": [learner]}, notices)
    return learner, time.time() - started, notices.lines, arena


def test_a_learner_writing_its_replay_past_the_grace_is_waited_for(short_grace):
    learner, took, lines, arena = stop(beat_for_s=1.5, then_sleep_s=0.0)
    assert learner.exitcode == 0 and took >= 1.4
    assert arena.control[Control.STOP] == 1
    assert len(lines) == 1 and "still writing its replay" in lines[0]


def test_a_learner_whose_stamps_stop_is_killed_after_the_silence(short_grace):
    learner, took, lines, _ = stop(beat_for_s=0.5, then_sleep_s=30.0)
    assert learner.exitcode == -9
    assert 0.5 + SILENCE_S - 0.1 <= took < 3.0
    assert "killed before its final checkpoint or replay was whole" in lines[-1]


def test_a_learner_silent_from_the_start_is_killed_at_the_grace(short_grace):
    learner, took, lines, _ = stop(beat_for_s=0.0, then_sleep_s=30.0)
    assert learner.exitcode == -9 and took < GRACE_S + 1.0
    assert len(lines) == 1 and "did not stop within 0 s; killed" in lines[0]


def test_a_save_that_never_ends_is_killed_at_the_cap(short_grace):
    learner, took, lines, _ = stop(beat_for_s=30.0, then_sleep_s=0.0)
    assert learner.exitcode == -9 and 3.9 <= took < 5.5
    assert "did not stop within 4 s" in lines[-1]
