"""The tests of tests/unit/reporting/test_wandb.py's subject that train in this process."""
import json

from tests.unit.reporting.test_wandb import (
    needs_wandb,
    offline_runs,
    reporter_for,
    wandb_run_dir,
)


def run_config(run):
    return {item.key: json.loads(item.value_json) for item in run.config.update}

@needs_wandb
def test_the_reports_config_and_evaluations_reach_an_offline_run(tmp_path, offline):
    run_dir = wandb_run_dir(tmp_path)
    reporter = reporter_for(run_dir)
    try:
        reporter.report()
        reporter.report({"eval_return_mean": 3.5, "eval_episodes": 10})
        reporter.report()
    finally:
        reporter.close()
    [sessions] = offline_runs(run_dir).values()
    [(run, history)] = sessions
    assert run.display_name == run_dir.name and run.project == "fastrl" and run.run_group == "tests"
    assert len(history) == 3
    assert {"env_steps", "frames", "fps", "learner_updates", "wall_time", "learner/loss",
            "rollout/env_step_s"} <= set(history[0])
    assert history[1]["eval_return_mean"] == 3.5 and history[1]["eval_episodes"] == 10
    config = run_config(run)
    assert config["env"]["id"] == "CartPole-v1" and config["logging"]["wandb"] is True
    assert config["learner"]["algo"] == "appo"  # the whole config, section by section
