"""The suite's rules: a test's kind is its folder, and `slow` follows it (integration, e2e and
benchmarks are slow: `python -m pytest -m "not slow" tests` runs the unit tests alone); a
session-wide guard fails the suite if any fastrl process or shared-memory segment is left behind."""
import os
from pathlib import Path

import psutil
import pytest

from fastrl.ipc.arena import segment_creator

pytest_plugins = ("tests.support.torchrun",)  # the agent_store fixture

TESTS = Path(__file__).resolve().parent
SLOW_KINDS = ("integration", "e2e", "benchmarks", "learning")  # runs, processes, benchmark scripts: not unit tests


def pytest_addoption(parser):
    parser.addoption("--learning", action="store_true",
                     help="also collect tests/learning, the learning checks (minutes each; `python scripts/bench.py "
                          "learning-checks` runs them)")


def pytest_ignore_collect(collection_path, config):
    if collection_path == TESTS / "learning" and not config.getoption("--learning"):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        kind = item.path.relative_to(TESTS).parts[0]
        if kind in SLOW_KINDS:
            item.add_marker(pytest.mark.slow)


def _segments() -> set[str]:
    """Segments of this pid namespace whose creator is gone or is this test session: what the
    suite could have leaked (live runs of other processes are not ours to judge)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    ours = set()
    for name in os.listdir("/dev/shm"):
        creator = segment_creator(name)
        if creator is not None and (creator == os.getpid() or not psutil.pid_exists(creator)):
            ours.add(name)
    return ours


@pytest.fixture(scope="session", autouse=True)
def no_leftovers():
    before = _segments()
    yield
    me = psutil.Process()
    children = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())]
    assert not children, f"processes left behind: {[(p.pid, p.cmdline()) for p in children]}"
    assert _segments() <= before, f"shared memory left in /dev/shm: {_segments() - before}"
