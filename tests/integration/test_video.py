"""The tests of tests/unit/evaluation/test_video.py's subject that train in this process."""
import pytest

from fastrl.config import build_config
from fastrl.evaluation.video import record_frames
from tests.unit.evaluation.test_video import untrained_model


@pytest.mark.parametrize("env_id, backend", [("Pong-v5", "envpool"), ("ALE/Pong-v5", "gymnasium")])
def test_atari_frames_are_the_colour_screen_not_the_grey_stack(env_id, backend):
    if backend == "gymnasium":
        pytest.importorskip("ale_py")
        pytest.importorskip("cv2")
    cfg = build_config("atari-appo", {"env.id": env_id, "env.backend": backend, "env.kwargs": {"max_episode_steps": 5},
                                      "device": "cpu"})
    frames, result = record_frames(cfg, untrained_model(cfg), episodes=1)
    assert frames.shape == (6, 210, 160, 3) and result["episode_length_mean"] == 5
