"""The tests of tests/unit/test_docs.py's subject that train in this process."""
import json


def test_every_key_a_short_run_writes_is_declared(tmp_path):
    """A serial run with evaluation and an env info key: its metrics.jsonl keys, each declared."""
    from fastrl.config import build_config
    from fastrl.reporting.metrics import declared
    from fastrl.run.training import train

    cfg = build_config("cartpole-appo", {
        "env.id": "fastrl.envs.toy:make_countdown", "env.num_workers": 1, "env.envs_per_worker": 8,
        "env.num_splits": 2, "env.num_threads": 0, "env.info_keys": ["score"], "learner.rollout": 8,
        "learner.batch_size": 64, "model.hidden_sizes": [16], "serial": True, "device": "cpu",
        "train_for_env_steps": 0, "train_for_seconds": 2.0, "report_every_s": 0.25,
        "eval.every_s": 0.5, "eval.episodes": 2})
    train(cfg, run_dir=tmp_path, quiet=True)
    keys = {key for line in (tmp_path / "metrics.jsonl").read_text().splitlines() for key in json.loads(line)}
    assert {"env_steps", "learner/loss", "rollout/env_step_s", "eval_return_mean", "info/score"} <= keys
    assert sorted(key for key in keys if not declared(key)) == []
