"""The tests of tests/unit/evaluation/test_video.py's subject that start fastrl's commands or processes."""
import os
import signal
import subprocess
import sys
import time

from tests.unit.evaluation.test_video import OLD_VIDEO, needs_imageio


@needs_imageio
def test_sigterm_to_fastrl_eval_video_leaves_the_file_it_would_replace_as_it_was(trained_run, tmp_path):
    path = tmp_path / "episodes.mp4"
    path.write_bytes(OLD_VIDEO)
    command = [sys.executable, "-c", "import sys; from fastrl.cli import eval_main; sys.exit(eval_main())",
               str(trained_run[0]), "--episodes", "100000", "--video", str(path)]  # hours of frames
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while len(os.listdir(tmp_path)) == 1 and path.read_bytes() == OLD_VIDEO:  # until frames are written
            assert time.time() < deadline and proc.poll() is None, "fastrl-eval never started writing"
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and out == ""
    assert err.strip().splitlines() == ["fastrl-eval: stopped by SIGTERM; no result"]
    assert path.read_bytes() == OLD_VIDEO and os.listdir(tmp_path) == ["episodes.mp4"]
