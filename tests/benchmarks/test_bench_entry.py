"""scripts/bench.py, the entry point: run as a script it skips the interpreter's final collection
(as fastrl's commands do, fastrl.ipc.fast_exit); its main() called in a process registers nothing."""
import atexit
import subprocess
import sys

import pytest

from tests.support.repo import REPO
from tests.support.scripts import load_script


def test_bench_py_skips_the_final_collection_when_run_and_registers_nothing_when_main_is_called(monkeypatch):
    script = f"""
import atexit, gc, runpy, sys
registered = []
register = atexit.register
atexit.register = lambda fn, *args: registered.append(fn) or register(fn, *args)
sys.argv = ["bench.py", "--help"]
try:
    runpy.run_path({str(REPO / "scripts" / "bench.py")!r}, run_name="__main__")
except SystemExit:
    pass
print("freeze registered:", registered.count(gc.freeze))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.splitlines()[-1] == "freeze registered: 1"
    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    with pytest.raises(SystemExit):
        load_script("bench").main(["--help"])
    assert registered == []  # the tests call main() in one process again and again
