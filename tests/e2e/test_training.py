"""The tests of tests/unit/run/test_training.py's subject that start fastrl's commands or processes."""
import json
import shutil

import pytest

from fastrl.cli import eval_main, train_main
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from tests.support.training import assert_all_exited, read_metrics


def test_resume_continues_counters_and_weights(cartpole_run, tmp_path):
    run_dir = tmp_path / "run"  # a copy: other tests read the shared run while this one resumes
    shutil.copytree(cartpole_run[0], run_dir)
    before = load_checkpoint(list_checkpoints(run_dir)[-1])
    steps_before = before["counters"]["env_steps"]
    assert train_main(["--resume", "--run-dir", str(run_dir), "--quiet",
                       "--train-for-env-steps", str(steps_before + 150_000)]) == 0
    after = load_checkpoint(list_checkpoints(run_dir)[-1])
    assert after["counters"]["env_steps"] >= steps_before + 150_000
    assert after["learner"]["version"] > before["learner"]["version"]
    assert after["learner"]["updates"] > before["learner"]["updates"]
    resumed = [r for r in read_metrics(run_dir) if r["env_steps"] > steps_before]
    assert resumed and resumed[-1]["learner_updates"] > before["learner"]["updates"]
    assert_all_exited(run_dir)

def test_eval_prints_one_json_line(cartpole_run, capsys):
    run_dir, _ = cartpole_run
    assert eval_main([str(run_dir), "--episodes", "6", "--deterministic"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["episodes"] == 6
    assert result["episode_return_mean"] > 100
    assert result["episode_return_std"] >= 0

@pytest.mark.parametrize("args, message", [
    (["--set", "learner.lrr=1"], "did you mean learner.lr"),
    (["--set", "learner.lr=fast"], "expects float"),
    (["--env", "CartPoel-v1"], "CartPole-v1"),
    (["--profile", "cartpol-appo"], "did you mean cartpole-appo"),
    (["--resume", "--run-dir", "/nonexistent/run"], "does not exist"),
])
def test_bad_input_is_one_clear_line_and_a_nonzero_exit(args, message, tmp_path, capsys):
    code = train_main([*args, "--run-dir", str(tmp_path / "run"), "--quiet"] if "--run-dir" not in args else args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err

def test_eval_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "config.toml").write_text('[env]\nid = "CartPole-v1"\n')
    code = eval_main([str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "no checkpoint" in err and "Traceback" not in err
