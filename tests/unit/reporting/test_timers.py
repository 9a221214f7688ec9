"""Named timers: each block's seconds added to its name, on a clock the test sets."""
import pytest

import fastrl.reporting.timers
from fastrl.reporting.timers import Timers


@pytest.fixture
def clock(monkeypatch):
    """A perf_counter that reads ``now[0]``: the test moves time by hand."""
    now = [100.0]
    monkeypatch.setattr(fastrl.reporting.timers, "perf_counter", lambda: now[0])
    return now


def test_repeated_blocks_of_a_name_accumulate(clock):
    timers = Timers("gather_s", "publish_s")
    assert timers.read() == {"gather_s": 0.0, "publish_s": 0.0}  # declared names are read before any block
    for seconds in (0.5, 1.25):
        with timers.time("gather_s"):
            clock[0] += seconds
        clock[0] += 10.0  # time between blocks counts for no one
    assert timers.read() == {"gather_s": 1.75, "publish_s": 0.0}


def test_nested_blocks_of_other_names_each_count_their_own(clock):
    timers = Timers()
    with timers.time("outer"):
        clock[0] += 1.0
        with timers.time("inner"):
            clock[0] += 2.0
        clock[0] += 4.0
    assert timers.read() == {"outer": 7.0, "inner": 2.0}  # a name never seen before joins at its first block


def test_a_block_inside_an_open_block_of_its_name_is_not_counted_twice(clock):
    timers = Timers("wait_s")
    with timers.time("wait_s"):
        clock[0] += 1.0
        with timers.time("wait_s"):
            clock[0] += 2.0
        assert timers.read() == {"wait_s": 0.0}  # the outer block is still open
        clock[0] += 4.0
    assert timers.read() == {"wait_s": 7.0}
    with timers.time("wait_s"):  # and it opens again afterwards
        clock[0] += 0.5
    assert timers.read() == {"wait_s": 7.5}


def test_a_block_left_by_an_exception_still_counts_and_lets_it_through(clock):
    timers = Timers()
    with pytest.raises(KeyError):
        with timers.time("gather_s"):
            clock[0] += 3.0
            raise KeyError("slot")
    with timers.time("gather_s"):
        clock[0] += 1.0
    assert timers.read() == {"gather_s": 4.0}


def test_read_is_a_copy_the_caller_may_keep():
    timers = Timers("a")
    seen = timers.read()
    seen["a"] = 99.0
    assert timers.read() == {"a": 0.0}
