"""scripts/bench.py learning-checks: it collects tests/learning (which the suite leaves out), and
reports each check's outcome and time; a failed check makes bench.py exit with status 1."""
import json
import subprocess

from tests import conftest
from tests.support.scripts import load_benchmark, load_script

checks = load_benchmark("learning_checks")
entry = load_script("bench")

PYTEST_OUTPUT = """tests/learning/test_sac.py::test_sac_learns_pendulum PASSED [ 50%]
tests/learning/test_spaces.py::test_appo_solves_the_dict_grid FAILED [100%]
============================= slowest durations ==============================
41.20s call     tests/learning/test_sac.py::test_sac_learns_pendulum
12.50s call     tests/learning/test_spaces.py::test_appo_solves_the_dict_grid
"""


def test_each_check_s_outcome_and_time_are_reported_and_a_failure_exits_1(monkeypatch, capsys):
    calls = []

    def fake_pytest(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, PYTEST_OUTPUT, "")

    monkeypatch.setattr(checks.subprocess, "run", fake_pytest)
    assert entry.main(["learning-checks", "-k", "sac or grid"]) == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["checks"] == {"tests/learning/test_sac.py::test_sac_learns_pendulum": "PASSED",
                                "tests/learning/test_spaces.py::test_appo_solves_the_dict_grid": "FAILED"}
    assert report["seconds"]["tests/learning/test_sac.py::test_sac_learns_pendulum"] == 41.2
    assert "--learning" in calls[0] and calls[0][calls[0].index("-k") + 1] == "sac or grid"


class Options:
    def __init__(self, learning: bool):
        self.learning = learning

    def getoption(self, name):
        assert name == "--learning"
        return self.learning


def test_the_suite_leaves_the_learning_checks_out_and_the_option_brings_them_in():
    assert conftest.pytest_ignore_collect(conftest.TESTS / "learning", Options(False)) is True
    assert conftest.pytest_ignore_collect(conftest.TESTS / "learning", Options(True)) is None
    assert conftest.pytest_ignore_collect(conftest.TESTS / "unit", Options(False)) is None
    assert len(list((conftest.TESTS / "learning").glob("test_*.py"))) >= 6
