"""APPO learns an image cue beside a float leaf through the default image trunk."""
import json

from fastrl import train
from fastrl.config import build_config
from tests.integration.test_image_trunk import IMAGE_CUE


def test_appo_learns_an_image_cue_beside_a_float_leaf_with_the_default_trunk(tmp_path):
    # Random scores 5 of 20. With the ReLU layer runs here reached 13-20 by 22K env steps; the MLP
    # trunk ([32, 32] relu here, [64, 64] tanh by default) stayed at 5 for 30K.
    cfg = build_config("cartpole-appo", {
        **IMAGE_CUE, "env.num_workers": 1, "env.envs_per_worker": 16, "learner.rollout": 16,
        "learner.batch_size": 256, "learner.lr": 1e-3, "serial": True, "report_every_s": 1.0,
        "train_for_env_steps": 22_000})
    train(cfg, run_dir=tmp_path, quiet=True)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["episode_return_mean"] >= 9, [(r["env_steps"], r["episode_return_mean"]) for r in records]
