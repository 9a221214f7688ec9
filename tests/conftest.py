"""The suite's rules: a test's kind is its folder, and `slow` follows it (integration, e2e and
benchmarks are slow: `python -m pytest -m "not slow" tests` runs the unit tests alone); the
session fails if any fastrl process or shared-memory segment is left behind, with or without
pytest-xdist's workers (`-n 2`)."""
import os
from pathlib import Path

# Two xdist workers share the cores, and many tests start fastrl processes beside them: torch's
# OpenMP threads must sleep while they wait, not spin on the cores the others need. Read when torch
# loads, so set before anything imports it; subprocesses inherit it. Side by side, two serial
# mujoco-appo runs took 37 s with it against 202 s spinning (docs/sweeps.md#several-trials-at-once);
# the gpu report's syncs section ran past its 42 s budget beside another test without it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import psutil
import pytest

from fastrl.ipc.arena import segment_creator

pytest_plugins = ("tests.support.torchrun", "tests.support.runs")  # agent_store; the shared runs

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
    """Segments of this pid namespace whose creator is gone or is this process: what the suite
    could have leaked (live runs of other processes are not ours to judge)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    ours = set()
    for name in os.listdir("/dev/shm"):
        creator = segment_creator(name)
        if creator is not None and (creator == os.getpid() or not psutil.pid_exists(creator)):
            ours.add(name)
    return ours


def _is_xdist_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


SEGMENTS_BEFORE = pytest.StashKey[set]()


def pytest_sessionstart(session):
    # Shared memory is judged once, by the process that runs the session (pytest-xdist's controller
    # when -n is given): a worker that finishes first would see another's run mid-test.
    if not _is_xdist_worker():
        session.config.stash[SEGMENTS_BEFORE] = _segments()


def pytest_sessionfinish(session, exitstatus):
    if _is_xdist_worker() or SEGMENTS_BEFORE not in session.config.stash:
        return
    left = _segments() - session.config.stash[SEGMENTS_BEFORE]
    if left:
        print(f"\nshared memory left in /dev/shm: {sorted(left)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def no_leftovers():
    """Every process a test started has ended by the end of the session (of each xdist worker)."""
    yield
    me = psutil.Process()
    children = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                and not _lives_with_this_process(p, me)]
    assert not children, f"processes left behind: {[(p.pid, p.cmdline()) for p in children]}"


def _lives_with_this_process(process: psutil.Process, me: psutil.Process) -> bool:
    """multiprocessing's resource tracker, the fork server the runs' children were forked from
    (fastrl.ipc.start), and torch.compile's pool of compile workers (started on a machine of many
    cores; it watches its parent): they serve every run of this process and exit with it. The
    server's own children (a run's processes, forked with its command line) are not excused."""
    command = " ".join(process.cmdline())
    started_here = process.ppid() == me.pid
    return "resource_tracker" in command or started_here and (
        "multiprocessing.forkserver import main" in command or "torch/_inductor/compile_worker" in command)
