"""Runs the tests share, trained once a session (registered for every test by tests/conftest.py):
each costs seconds to minutes, and several test modules read the same one."""
import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fastrl.config import build_config
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.run.plan import RunResult
from fastrl.run.training import train
from tests.support.training import read_metrics

PAINTED = "fastrl.envs.toy:make_painted_countdown"
LENGTH = 7  # steps per episode: L + 1 frames (the first observation, then one per step)
TINY = {"device": "cpu", "env.num_workers": 1, "env.envs_per_worker": 32, "env.num_splits": 2,
        "learner.batch_size": 512, "train_for_env_steps": 4096, "report_every_s": 0.2}


def tiny_config(**overrides):
    """A CartPole run of a few seconds: one worker, 4,096 env steps."""
    return build_config("cartpole-appo", {**TINY, **overrides})


def toy_config(env_id=PAINTED, env_kwargs=None, **overrides):
    """A serial run of 2,000 env steps of ``env_id`` (the painted countdown: frames that show the step)."""
    settings = {"env.id": env_id, "env.kwargs": {"length": LENGTH} if env_kwargs is None else env_kwargs,
                "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 2, "learner.rollout": 8,
                "learner.batch_size": 64, "slots_per_env": 3, "train_for_env_steps": 2_000, "device": "cpu",
                "report_every_s": 1.0, "serial": True, "model.kind": "mlp", "model.hidden_sizes": [32]}
    return build_config("cartpole-appo", {**settings, **overrides})


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """``make(path)``'s directory, made once for the whole session: pytest-xdist's workers each
    hold their own session fixtures, so without this every worker that runs one of its tests
    would train the run again. The workers' temp folders share a parent; a lock there lets the
    first make it while the others wait on the lock (blocked, not polling). Tests read it and
    copy it before they change it: another worker may be reading it at the same time."""
    base = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = base.parent
    path, made = base / name, base / f"{name}.made"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            shutil.rmtree(path, ignore_errors=True)  # what a worker that failed half-way left
            make(path)
            made.touch()
    return path


def train_cartpole(run_dir: Path) -> None:
    # 2.4M env steps: at 1.6M one fresh-clone CI run peaked at 169 (others well above 200).
    cfg = build_config("cartpole-appo", {"train_for_env_steps": 2_400_000, "device": "cpu", "report_every_s": 1.0})
    train(cfg, run_dir=run_dir, quiet=True)


@pytest.fixture(scope="session")
def cartpole_run(tmp_path_factory):
    """A CartPole run that learned (2.4M env steps, ~20 s), shared by every xdist worker: copy it
    before changing it. Its RunResult is rebuilt from metrics.jsonl, the reports train() returns."""
    run_dir = made_once(tmp_path_factory, "cartpole", train_cartpole)
    return run_dir, RunResult(run_dir, read_metrics(run_dir))


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
    from fastrl.reporting import wandb_logger

    monkeypatch.setenv("WANDB_MODE", "offline")
    # A deadline, not a wait: W&B's offline writer finishes in about a second, but on a slow AVX2
    # host under pytest -n 3 it had not written the run's record after the run's 10 s. A test of
    # the timeout sets its own.
    monkeypatch.setattr(wandb_logger, "CLOSE_WAIT_S", 60.0)
