"""The tests of tests/unit/run/test_elastic.py's subject that train in this process."""
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from fastrl.distributed.process_group import DistInfo
from fastrl.run import elastic
from fastrl.run.plan import RunError
from fastrl.run.rank_heartbeat import RankWatch
from tests.support.torchrun import free_port
from tests.unit.run.test_elastic import RANK1


def test_a_restarted_rank_whose_rank_0_never_decides_stops_in_one_line(tmp_path, monkeypatch):
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=1), wait_for_workers=False)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1",
                        "TORCHELASTIC_RESTART_COUNT": "1"}.items():
        monkeypatch.setenv(name, value)
    attempt = elastic.current_attempt(1.0)
    with pytest.raises(RunError, match="rank 0 did not say"):
        attempt.settle(tmp_path, False, False, RANK1)
    del store

def test_the_watch_names_a_rank_that_went_silent_not_one_that_left(agent_store, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    watches = [RankWatch(DistInfo(rank, 3), timeout_s=2.0) for rank in range(3)]  # silence_s 1 s
    try:
        time.sleep(0.6)
        watches[2].leave()  # stops and says so
        watches[1]._stop.set()  # stops beating, says nothing: a SIGKILL
        deadline = time.monotonic() + 5.0
        while not watches[0].lost and time.monotonic() < deadline:
            time.sleep(0.1)
        assert watches[0].lost.startswith("rank 1 went away")
        assert "rank 1 went away" in str(watches[0].error())
        assert watches[0].explains(RunError("fastrl-learner (pid 7) exited with code -6"))  # after the loss
        # Which failures make a rank ask the watch (and wait for it) when nobody is known gone yet.
        quiet = RankWatch(DistInfo(0, 1), timeout_s=2.0)
        assert not quiet.explains(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
        started = time.monotonic()
        assert not quiet.explains(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error"))
        assert time.monotonic() - started >= quiet.silence_s
        quiet.leave()
    finally:
        for watch in watches:
            watch.leave()
