"""fastrl-export (fastrl.evaluation.export): the exported file's actions against fastrl-eval --deterministic's
on a thousand observations, for an MLP, a CNN on preprocessed images with ``env.actions``, a Dict
observation with an action mask, a Tuple of offset and bounded actions, and an LSTM; TorchScript
and ONNX (onnxruntime); the one-line refusals. The runs are tiny serial trainings: the weights
need not be good, only the two paths equal."""
import json
import sys

import numpy as np
import pytest
import torch

from fastrl.cli import export_main
from fastrl.config import build_config, to_toml
from fastrl.envs.spaces import ActionLayout
from fastrl.evaluation.export import EnvActions
from fastrl.files.checkpoint import save_checkpoint
from tests.e2e.test_cli_errors import one_line_error, small_config, untrained_state
from tests.support.space_envs import ACTION_SPACES


def have_onnx() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


def untrained_run(path, cfg):
    """A run directory as fastrl-train leaves it (config.toml, a checkpoint at 100 env steps) of an
    untrained model of ``cfg``."""
    (path / "config.toml").write_text(to_toml(cfg))
    save_checkpoint(path, untrained_state(cfg), 100, keep=3)
    return path


@pytest.fixture
def run_dir(tmp_path):
    """An untrained CartPole run."""
    (tmp_path / "run").mkdir()
    return untrained_run(tmp_path / "run", small_config(**{"env.id": "CartPole-v1", "env.kwargs": {}}))


def test_the_cli_prints_what_it_wrote(run_dir, tmp_path, capsys):
    out = tmp_path / "exported" / "policy.pt"
    assert export_main([str(run_dir), "--format", "torchscript", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["out"] == str(out) and out.is_file() and result["env_steps"] == 100
    assert result["inputs"] == [{"name": "obs", "shape": ["batch", 4], "dtype": "float32"}]
    assert result["outputs"] == [{"name": "action", "shape": ["batch"], "dtype": "int64"}]


def test_a_missing_checkpoint_is_one_line(run_dir, tmp_path, capsys):
    for ckpt in (run_dir / "checkpoints").glob("*.pt"):
        ckpt.unlink()
    code = export_main([str(run_dir), "--format", "torchscript", "--out", str(tmp_path / "p.pt")])
    one_line_error(capsys, code, 2, "fastrl-export", "no checkpoint in")
    code = export_main([str(run_dir), "--format", "torchscript", "--out", str(tmp_path / "p.pt"), "--best"])
    one_line_error(capsys, code, 2, "fastrl-export", "best.pt': evaluation during training was off")
    assert not (tmp_path / "p.pt").exists()


def test_a_multi_agent_run_is_refused_in_one_line(tmp_path, capsys):
    pytest.importorskip("pettingzoo")
    from tests.unit.evaluation.test_episodes import TIC_TAC_TOE, game_config

    code = export_main([str(untrained_run(tmp_path, game_config(TIC_TAC_TOE))), "--format", "onnx", "--out",
                        str(tmp_path / "p.onnx")])
    one_line_error(capsys, code, 2, "fastrl-export", "exports single-agent policies only")


def test_sampled_q_learner_actions_are_refused_in_one_line(tmp_path, capsys):
    untrained_run(tmp_path, build_config("cartpole-dqn", {"device": "cpu"}))
    code = export_main([str(tmp_path), "--format", "torchscript", "--out", str(tmp_path / "p.pt"), "--stochastic"])
    one_line_error(capsys, code, 2, "fastrl-export", "a dqn policy acts greedily on its Q-values")


def test_onnx_without_its_exporter_is_one_line(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import fails as if not installed
    code = export_main([str(run_dir), "--format", "onnx", "--out", str(tmp_path / "p.onnx")])
    one_line_error(capsys, code, 2, "fastrl-export", "pip install 'fastrl[export]'")


@pytest.mark.parametrize("kind", ["box-2d", "multidiscrete-2d", "multibinary-2d", "tuple"])
def test_env_actions_convert_as_the_backends_do(kind):
    """EnvActions (torch) against ActionLayout.to_env (numpy, what every backend calls) on stored
    actions beyond the bounds too."""
    layout = ActionLayout(ACTION_SPACES[kind]())
    rng = np.random.default_rng(0)
    stored = rng.integers(0, 2, (64, *layout.shape)).astype(layout.dtype)
    if kind in ("box-2d", "tuple"):
        stored = (rng.normal(size=stored.shape) * 30).astype(layout.dtype)
        if kind == "tuple":  # the integer parts' columns hold categories
            stored[:, :1] = rng.integers(0, 3, (64, 1))
            stored[:, 7:11] = rng.integers(0, 2, (64, 4))
    want = layout.to_env(stored)
    got = EnvActions(layout)(torch.as_tensor(stored))
    for g, w in zip(got, want if isinstance(want, tuple) else (want,), strict=True):
        assert g.numpy().dtype == w.dtype
        np.testing.assert_array_equal(g.numpy(), w)
