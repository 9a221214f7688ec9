"""Console output never stops a run: closed pipes are survived, train.log keeps the lines, bounded."""
import os

from fastrl.reporting.console import Console, write_best_effort


def test_writing_to_a_closed_pipe_is_survived_and_silences_the_stream():
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    os.close(read_end)
    assert write_best_effort(stream, "status") is False
    assert write_best_effort(stream, "again") is True  # now /dev/null: no more errors
    stream.close()


def test_train_log_is_rotated_at_its_size_bound(tmp_path):
    console = Console(tmp_path, quiet=True, max_log_bytes=1000)
    for i in range(100):
        console.status(f"line {i:03d} " + "x" * 40)
    console.close()
    log, previous = tmp_path / "train.log", tmp_path / "train.log.1"
    assert log.stat().st_size <= 1000 + 60 and previous.stat().st_size <= 1000 + 60
    assert log.read_text().splitlines()[-1].startswith("line 099")
