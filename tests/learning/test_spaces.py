"""APPO solves the Dict-observation grid (an image, a position and an action mask)."""
import time

from fastrl.evaluation.episodes import evaluate_run
from fastrl.run.training import train
from tests.integration.test_spaces import small_config
from tests.support.training import assert_all_exited, read_metrics


def test_appo_solves_the_dict_grid(tmp_path):
    # Egocentric 9x9x3 image + one-hot position + action mask. A random legal policy scores ~0.24,
    # the shortest path ~0.85. Measured here: solved (>= 0.8) after ~60-80K env steps.
    cfg = small_config("make_dict_grid", {}, serial=False, **{
        "env.envs_per_worker": 64, "learner.rollout": 16, "learner.batch_size": 512, "learner.num_epochs": 2,
        "learner.num_minibatches": 2, "learner.lr": 2e-3, "learner.gamma": 0.95, "learner.entropy_coef": 0.01,
        "learner.reward_scale": 1.0, "model.kind": "mlp", "model.hidden_sizes": [64],
        "train_for_env_steps": 100_000, "report_every_s": 1.0})
    started = time.perf_counter()
    train(cfg, run_dir=tmp_path, quiet=True)
    elapsed = time.perf_counter() - started
    records = read_metrics(tmp_path)
    first_step = next(r["wall_time"] for r in records if r["env_steps"] > 0)
    # A report's mean is over the episodes since the previous one: the first few are the short ones.
    solved = next((r for prev, r in zip(records, records[1:])
                   if r["episodes"] - prev["episodes"] >= 200 and r["episode_return_mean"] >= 0.7), None)
    print(f"\nDictGridEnv: {elapsed:.1f} s for the whole run, first env step at {first_step:.1f} s; "
          + (f"return >= 0.7 at {solved['wall_time']:.1f} s ({solved['wall_time'] - first_step:.1f} s after the first "
             f"step, {solved['env_steps']} env steps)" if solved else "return never reached 0.7"))
    assert_all_exited(tmp_path)
    assert solved is not None, [(r["env_steps"], r["episode_return_mean"]) for r in records]
    assert records[-1]["episode_return_mean"] >= 0.7
    evaluation = evaluate_run(tmp_path, episodes=64, deterministic=True)
    assert evaluation["episode_return_mean"] >= 0.7, evaluation
