"""The tests of tests/unit/envs/test_image_preprocessing.py's subject that train in this process."""
import json

from fastrl.config import build_config
from fastrl.envs import probe_env
from tests.unit.envs.test_image_preprocessing import IMAGE_ENV


def test_frames_count_env_steps_times_the_frame_skip(tmp_path):
    # A short end-to-end run (worker processes, the batcher, the learner) on preprocessed Dict
    # observations: the CNN reads the stacks, and the reported frames honour the frame skip.
    from fastrl.run.training import train

    cfg = build_config("cartpole-appo", {
        "env.id": IMAGE_ENV, "env.kwargs": {"length": 9, "vary": 3, "dict_obs": True}, "env.frame_skip": 3,
        "env.resize": [9, 12], "env.grayscale": True, "env.frame_stack": 2, "env.num_workers": 1,
        "env.envs_per_worker": 4, "learner.rollout": 8, "learner.batch_size": 32, "train_for_env_steps": 1_500,
        "device": "cpu", "report_every_s": 0.5, "slots_per_env": 3})
    spec = probe_env(cfg)
    assert spec.frame_skip == 3 and spec.observation_space["screen"].shape == (2, 9, 12)
    result = train(cfg, run_dir=tmp_path, quiet=True)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["env_steps"] >= 1_500 and records[-1]["learner_updates"] > 0
    for record in records:
        assert record["frames"] == record["env_steps"] * 3
    # Episodes of 9, 10, 11 raw steps are 3 or 4 env steps; each returns 1 + 2 + ... + length.
    assert 3 <= result.final["episode_length_mean"] <= 4
    assert 45 <= result.final["episode_return_mean"] <= 66
