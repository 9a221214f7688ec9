"""scripts/bench.py replay on a small replay: its figures, and with --save the snapshot's."""
import argparse

from tests.support.scripts import load_benchmark

replay_bench = load_benchmark("replay")


def test_a_small_vector_replay_reports_its_rates_and_its_snapshot(tmp_path):
    args = argparse.Namespace(capacity=4096, obs="vector", compress="", memmap="", envs=8, steps_per_chunk=4,
                              batch=64, n_step=1, threads=1, seconds=0.05, save=tmp_path)
    report = replay_bench.run(args)
    assert report["capacity"] == 4096 and report["bytes_per_transition"] > 17 * 4
    assert report["add_per_s"] > 0 and report["sample_batches_per_s"] > 0
    assert report["loaded_all"] is True and report["save_s"] >= 0 and report["load_s"] >= 0
    assert 4096 * 17 * 4 / 2 ** 20 <= report["saved_mib"] < 10
    assert list(tmp_path.iterdir()) == []  # the files are removed after
