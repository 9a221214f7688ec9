"""scripts/bench.py soak: its summary is the JSON line, and a training run that did not exit cleanly
makes bench.py exit with status 1."""
import json
import shutil
import subprocess
import sys

import pytest

from tests.support.scripts import SCRIPTS, load_benchmark, load_script

soak = load_benchmark("soak")
entry = load_script("bench")


@pytest.mark.parametrize("exit_code,status", [(0, 0), (-9, 1)])
def test_the_status_is_1_when_the_training_run_failed(monkeypatch, capsys, exit_code, status):
    report = {"minutes": 0.1, "kills": 0, "exit_code": exit_code}
    monkeypatch.setattr(soak, "run", lambda args: report)
    assert entry.main(["soak", "--minutes", "0.1"]) == status
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report


def test_a_run_that_cannot_start_is_reported_with_its_exit_code():
    run = subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), "soak", "--minutes", "0.02", "--sample-every",
                          "0.5", "--profile", "nope"], capture_output=True, text=True, timeout=120)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    shutil.rmtree(report["run_dir"], ignore_errors=True)
    assert run.returncode == 1 and report["exit_code"] == 2 and report["kills"] == 0
