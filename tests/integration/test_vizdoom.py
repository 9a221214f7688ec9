"""The tests of tests/unit/envs/test_vizdoom.py's subject that train in this process."""
import json

import numpy as np
import pytest

from fastrl.envs import ImageOptions, make_vec_env
from tests.unit.envs.test_vizdoom import needs_vizdoom


@needs_vizdoom
@pytest.mark.parametrize(("options", "screen"), [
    (ImageOptions(frame_skip=4, resize=(72, 128)), (3, 72, 128)),  # Sample Factory's doom setting
    (ImageOptions(resize=(84, 84), grayscale=True, frame_stack=4), (4, 84, 84)),
    (ImageOptions(frame_skip=2), (240, 320, 3)),  # the scenario's own resolution, as the wrapper gives it
])
def test_observations_after_preprocessing_through_the_vector_env(options, screen):
    env = make_vec_env("VizdoomBasic-v1", num_envs=4, batch_size=2, seed=0, preprocessing=options)
    try:
        assert env.frame_skip == options.frame_skip
        assert env.observation_space["screen"].shape == screen
        env.async_reset()
        for step in range(6):
            obs, rewards, terminated, truncated, ids = env.recv()
            assert obs["screen"].shape == (2, *screen) and obs["screen"].dtype == np.uint8
            assert obs["gamevariables"].shape == (2, 1)
            assert obs["screen"].any()  # a rendered room, not the zero frame of an episode's end
            if step >= 2:  # each split's first recv is its reset
                # basic.cfg: -1 per tic while the monster lives, summed over the repeat
                np.testing.assert_array_equal(rewards, -float(options.frame_skip))
            assert not (terminated.any() or truncated.any())
            env.send(np.zeros(len(ids), dtype=np.int64), ids)
    finally:
        env.close()

@needs_vizdoom
def test_vizdoom_basic_profile_trains_and_counts_frames_by_the_skip(tmp_path):
    from fastrl.config import build_config
    from fastrl.run.training import train

    cfg = build_config("vizdoom-basic", {"serial": True, "env.num_workers": 1, "env.envs_per_worker": 2,
                                         "env.num_splits": 1, "learner.rollout": 8, "learner.batch_size": 16,
                                         "train_for_env_steps": 96, "report_every_s": 0.5})
    train(cfg, run_dir=tmp_path / "run", quiet=True)
    last = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["env_steps"] >= 96 and last["frames"] == 4 * last["env_steps"]
    assert last["learner_updates"] >= 1
