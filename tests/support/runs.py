"""Runs the tests share, trained once a session (registered for every test by tests/conftest.py):
each costs seconds to minutes, and several test modules read the same one."""
import pytest

from fastrl.config import build_config
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.run.training import train
from tests.unit.evaluation.test_video import toy_config
from tests.unit.files.test_run_dir import tiny_config


@pytest.fixture(scope="session")
def cartpole_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cartpole")
    # 2.4M env steps: at 1.6M one fresh-clone CI run peaked at 169 (others well above 200).
    cfg = build_config("cartpole-appo", {"train_for_env_steps": 2_400_000, "device": "cpu", "report_every_s": 1.0})
    result = train(cfg, run_dir=run_dir, quiet=True)
    return run_dir, result


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A run directory with a config, metrics and a final checkpoint (serial: quick, one process)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(tiny_config(serial=True), run_dir=run_dir, quiet=True)
    assert list_checkpoints(run_dir)
    return run_dir


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A run of a few seconds, and a best.pt made from its checkpoint (as the evaluator writes it)."""
    run_dir = tmp_path_factory.mktemp("painted")
    train(toy_config(), run_dir=run_dir, quiet=True)
    latest = load_checkpoint(list_checkpoints(run_dir)[-1])
    return run_dir, latest


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
