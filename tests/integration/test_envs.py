"""The tests of tests/unit/envs/test_envs.py's subject that train in this process."""
import numpy as np
import pytest

from fastrl.envs import make_vec_env
from tests.unit.envs.test_envs import run_steps


def test_atari_gymnasium_preprocessing_looks_like_envpool_pong():
    pytest.importorskip("cv2", reason="Atari on gymnasium needs opencv-python-headless")
    frames = {}
    for env_id in ["Pong-v5", "ALE/Pong-v5"]:
        with make_vec_env(env_id, 2, 2, seed=0) as env:
            assert env.observation_space.shape == (4, 84, 84)
            assert env.observation_space.dtype == np.uint8
            assert env.action_space.n == 6 and env.frame_skip == 4
            streams = run_steps(env, 30)
        assert all(obs.dtype == np.uint8 for obs, *_ in streams[0])
        frames[env_id] = np.stack([obs for stream in streams.values() for obs, *_ in stream])
    envpool_frames, gym_frames = frames["Pong-v5"], frames["ALE/Pong-v5"]
    # Same game start (Pong's first frames do not depend on the random no-ops); afterwards
    # the ball differs, so compare statistics only.
    np.testing.assert_array_equal(envpool_frames[0], gym_frames[0])
    assert abs(envpool_frames.mean() - gym_frames.mean()) < 0.5
    assert abs(envpool_frames.std() - gym_frames.std()) < 0.5
