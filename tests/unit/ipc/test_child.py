"""The pipes of a run: every worker end reaches the batcher's or the learner's end of its own
worker; what configure_child sets up in every child."""
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from fastrl.ipc.arena import Control
from fastrl.ipc.child import ProcessExit, ReadablePipes, make_channels


def test_each_worker_end_is_joined_to_its_own_batcher_and_learner_end():
    channels = make_channels(mp.get_context("spawn"), num_workers=3)
    batcher, learner = channels.batcher, channels.learner
    try:
        for w, worker in enumerate(channels.workers):
            message = bytes([w])
            worker.requests_out.send_bytes(message)
            assert batcher.requests_in[w].recv_bytes() == message
            batcher.actions_out[w].send_bytes(message)
            assert worker.actions_in.recv_bytes() == message
            worker.full_out.send_bytes(message)
            assert learner.full_in[w].recv_bytes() == message
            learner.free_out[w].send_bytes(message)
            assert worker.free_in.recv_bytes() == message
        full_in, free_out = learner  # the learner process unpacks its ends
        assert full_in is learner.full_in and free_out is learner.free_out
    finally:
        for ends in (*channels.workers, batcher.requests_in, batcher.actions_out, learner.full_in, learner.free_out):
            for conn in ends:
                conn.close()


def test_without_a_batcher_only_the_learner_pipes_are_made():
    # inference.in_workers: no batcher process reads requests, so no pipe waits for one.
    channels = make_channels(mp.get_context("spawn"), num_workers=2, batcher=False)
    learner = channels.learner
    try:
        assert channels.batcher is None
        for w, worker in enumerate(channels.workers):
            assert worker.requests_out is None and worker.actions_in is None
            worker.full_out.send_bytes(bytes([w]))
            assert learner.full_in[w].recv_bytes() == bytes([w])
            learner.free_out[w].send_bytes(bytes([w]))
            assert worker.free_in.recv_bytes() == bytes([w])
    finally:
        for ends in (learner.full_in, learner.free_out, [w.full_out for w in channels.workers],
                     [w.free_in for w in channels.workers]):
            for conn in ends:
                conn.close()


def test_readable_pipes_name_the_ends_with_messages_and_the_closed_ones():
    ctx = mp.get_context("spawn")
    (a_in, a_out), (b_in, b_out) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
    pipes = ReadablePipes([a_in, b_in])
    assert pipes.ready() == []
    b_out.send_bytes(b"1")
    assert pipes.ready() == [b_in]
    a_out.send_bytes(b"2")
    assert set(pipes.ready()) == {a_in, b_in}
    assert b_in.recv_bytes() == b"1" and pipes.ready() == [a_in]
    assert a_in.recv_bytes() == b"2" and pipes.ready() == []
    a_out.close()  # a dead writer: readable, and reading says so
    assert pipes.ready() == [a_in]
    with pytest.raises(EOFError):
        a_in.recv_bytes()
    for conn in (a_in, b_in, b_out):
        conn.close()


def test_readable_pipes_wait_blocks_until_timeout_and_stops_on_the_stop_flag():
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    pipes = ReadablePipes([reader])
    control = np.zeros(8, dtype=np.int64)
    start = time.perf_counter()
    assert pipes.wait(control, timeout_s=0.2) == []
    assert time.perf_counter() - start >= 0.15  # it blocked rather than spun
    writer.send_bytes(b"x")
    assert pipes.wait(control) == [reader]
    control[Control.STOP] = 1
    with pytest.raises(ProcessExit):
        pipes.wait(control, timeout_s=0.0)
    reader.close()
    writer.close()


CHILD_BLAS_THREADS = """
import json, os, numpy
from threadpoolctl import threadpool_info
from fastrl.ipc.child import configure_child
configure_child(False)
print(json.dumps([pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]))
"""


def test_a_child_process_runs_numpys_blas_on_one_thread():
    """OpenBLAS starts one thread per core; in a child they would spin on the envs' cores."""
    # Two threads to start with, whatever this machine's core count: the limit must bring them down.
    env = {**{k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}, "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", CHILD_BLAS_THREADS], env=env, capture_output=True, text=True,
                         check=True).stdout
    threads = json.loads(out)
    assert threads and threads == [1] * len(threads), out


CHILD_STARTS_A_PROCESS = """
import os, signal, subprocess
from fastrl.ipc.child import configure_child
configure_child(False)
os.kill(os.getpid(), signal.SIGTERM)  # the child itself lives on
started = subprocess.Popen(["sleep", "30"])
started.terminate()
print(started.wait(timeout=10))
"""


def test_a_child_survives_sigterm_and_what_it_starts_does_not():
    """The runner stops its children in order, so they outlive a SIGTERM to the process group; the
    processes they start (ViZDoom engines, a factory env's subprocesses) must still stop on one."""
    out = subprocess.run([sys.executable, "-c", CHILD_STARTS_A_PROCESS], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == str(-15)
