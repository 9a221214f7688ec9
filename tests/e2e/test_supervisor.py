"""The tests of tests/unit/run/test_supervisor.py's subject that start fastrl's commands or processes."""
import multiprocessing
import subprocess
import sys
import time

import psutil

from fastrl.run.supervisor import kill_with_descendants


def start_a_child_and_hang(queue) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    queue.put(child.pid)
    time.sleep(60)

def test_a_killed_straggler_takes_the_processes_it_started_with_it():
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    straggler = context.Process(target=start_a_child_and_hang, args=(queue,))
    straggler.start()
    child = psutil.Process(queue.get(timeout=30))
    kill_with_descendants(straggler)
    assert not straggler.is_alive()
    child.wait(timeout=5)  # gone, not orphaned (psutil.TimeoutExpired otherwise)
