"""The tests of tests/unit/evaluation/test_export.py's subject that train in this process."""
import json

import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.envs.wrappers.action_subset import ActionSubset
from fastrl.evaluation.episodes import evaluate_policy, load_run_model
from fastrl.evaluation.export import export_run
from fastrl.run.training import train
from tests.unit.evaluation.test_export import have_onnx

OBSERVATIONS = 1000

SMALL = {"env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 1, "learner.rollout": 8,
         "learner.batch_size": 64, "train_for_env_steps": 640, "device": "cpu", "serial": True,
         "report_every_s": 1.0, "model.hidden_sizes": [32]}

DICT_GRID = {"env.id": "fastrl.envs.toy:make_dict_grid", "env.kwargs": {"size": 4, "time_limit": 12}}

RUNS = {
    "mlp": {},
    # Preprocessed to uint8 [2, 10, 12] (grayscale, resized, two frames): a small CNN reads them.
    "cnn": {"env.id": "tests.support.image_envs:make_step_image_env", "env.kwargs": {"length": 6, "vary": 3},
            "env.grayscale": True, "env.resize": [10, 12], "env.frame_stack": 2, "env.actions": [1, 0]},
    # Dict of an HWC image, a Discrete position and an action_mask.
    "dict": DICT_GRID,
    # Tuple of Discrete(start=-1), a bounded 2-D Box, a 2-D MultiDiscrete with starts, a 2-D MultiBinary.
    "tuple": {"env.id": "tests.support.space_envs:make_strict_space_env", "env.kwargs": {"kind": "tuple"}},
    "lstm": {**DICT_GRID, "model.core": "lstm", "model.core_size": 16},
    # SAC's squashed Gaussian: the mean action, tanh-squashed and scaled to Pendulum's [-2, 2].
    "sac": {"env.id": "Pendulum-v1", "learner.algo": "sac", "replay.min_fill": 64, "replay.batch_size": 32,
            "replay.replay_ratio": 4.0, "replay.capacity": 10_000},
}

needs_onnx = pytest.mark.skipif(not have_onnx(), reason="onnx, onnxscript and onnxruntime are not installed "
                                                        "(pip install 'fastrl[export]')")

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run directories of tiny trainings, by kind."""
    root = tmp_path_factory.mktemp("export_runs")
    for kind, settings in RUNS.items():
        train(build_config("cartpole-appo", {**SMALL, **settings}), run_dir=root / kind, quiet=True)
    return {kind: root / kind for kind in RUNS}

class StopRecording(Exception):
    pass

class Recorder:
    """fastrl-eval's episode env (``env``), recording each batch as ``recv()`` gives it (``obs``,
    ``ids``, ``done``) and the actions its envs receive for it, as the backend converts them
    (``VecEnv._env_actions``, after ``env.actions``' table): ``actions`` rows in ``ids`` order."""

    def __init__(self, env):
        self.env = env
        self.batches, self.actions = [], []
        backend = env.env if isinstance(env, ActionSubset) else env
        convert = backend._env_actions
        backend._env_actions = lambda stored: self._keep(convert(stored))

    def _keep(self, actions):
        self.actions.append(tuple(np.array(a) for a in actions) if isinstance(actions, tuple) else (np.array(actions),))
        return actions

    def recv(self):
        obs, rewards, terminated, truncated, ids = self.env.recv()
        copied = {k: np.array(v) for k, v in obs.items()} if isinstance(obs, dict) else np.array(obs)
        self.batches.append((copied, np.array(ids), terminated | truncated))
        return obs, rewards, terminated, truncated, ids

    def __getattr__(self, name):
        return getattr(self.env, name)

    def observed(self) -> int:
        return sum(len(ids) for _, ids, _ in self.batches)

def eval_actions(run_dir):
    """fastrl-eval --deterministic on the run's latest checkpoint for at least OBSERVATIONS
    observations: the recorded batches and, paired with them, the actions the envs received."""
    from fastrl.envs import make_episode_env

    cfg, model, _ = load_run_model(run_dir)
    recorder = Recorder(make_episode_env(cfg, 8, seed=7))

    def keep_going():
        if recorder.observed() >= OBSERVATIONS + 8:
            raise StopRecording

    with pytest.raises(StopRecording):
        evaluate_policy(cfg, model, episodes=10**6, deterministic=True, env=recorder, keep_going=keep_going)
    n = len(recorder.actions)  # the last batch's actions may not have left
    return recorder.batches[:n], recorder.actions

def file_inputs(obs, names: list[str]) -> dict:
    """The file's inputs of a batch: each named leaf of ``obs`` (key paths joined by '.')."""
    out = {}
    for name in names:
        value = obs
        if name != "obs" or isinstance(obs, dict):
            for key in name.split("."):
                value = value[int(key) if isinstance(value, tuple) else key]
        out[name] = np.asarray(value)
    return out

class TorchScriptFile:
    def __init__(self, path):
        files = {"fastrl.json": ""}
        self.module = torch.jit.load(str(path), _extra_files=files)
        self.meta = json.loads(files["fastrl.json"])

    def __call__(self, inputs: dict) -> dict:
        with torch.no_grad():
            out = self.module({k: torch.as_tensor(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in out.items()}

class OnnxFile:
    def __init__(self, path):
        import onnx
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
        self.meta = json.loads(props["fastrl"])

    def __call__(self, inputs: dict) -> dict:
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(None, inputs)))

LOADERS = {"torchscript": TorchScriptFile, "onnx": OnnxFile}

def file_actions(policy, batches) -> list[tuple]:
    """The file's actions for each recorded batch, a recurrent one stepping each env row's state
    (zeros at an episode's start, as fastrl-eval's) batch by batch; a feed-forward one in one call
    over every observation (another batch size than the trace's)."""
    names = [i["name"] for i in policy.meta["inputs"] if i["name"] != "state"]
    action_names = [o["name"] for o in policy.meta["outputs"] if o["name"] != "next_state"]
    state_size = policy.meta["state_size"]
    if not state_size:
        per_batch = [file_inputs(obs, names) for obs, _, _ in batches]
        every = policy({name: np.concatenate([b[name] for b in per_batch]) for name in names})
        bounds = np.cumsum([0, *[len(ids) for _, ids, _ in batches]])
        return [tuple(every[a][lo:hi] for a in action_names) for lo, hi in zip(bounds[:-1], bounds[1:])]
    state = np.zeros((8, state_size), np.float32)
    started, after_done = np.zeros(8, bool), np.zeros(8, bool)
    out = []
    for obs, ids, done in batches:
        state[ids[~started[ids] | after_done[ids]]] = 0.0
        started[ids], after_done[ids] = True, done
        result = policy({**file_inputs(obs, names), "state": state[ids]})
        state[ids] = result["next_state"]
        out.append(tuple(result[a] for a in action_names))
    return out

def assert_same_actions(got: list[tuple], want: list[tuple]):
    assert len(got) == len(want) and sum(len(g[0]) for g in got) >= OBSERVATIONS
    for got_batch, want_batch in zip(got, want):
        for g, w in zip(got_batch, want_batch, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            # Float actions (SAC's) come rounding apart: onnxruntime has its own kernels, and a
            # feed-forward file runs every observation in one call, where a CPU's GEMM may sum in
            # another order for another batch size (1e-6 relative on an Intel Xeon with avx512).
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(g, w)

@pytest.mark.parametrize("fmt", ["torchscript", pytest.param("onnx", marks=needs_onnx)])
@pytest.mark.parametrize("kind", list(RUNS))
def test_the_file_acts_as_fastrl_eval_deterministic(runs, tmp_path, kind, fmt):
    out = tmp_path / f"policy.{fmt}"
    result = export_run(runs[kind], fmt, out)
    assert result["out"] == str(out) and result["deterministic"]
    batches, actions = eval_actions(runs[kind])
    assert_same_actions(file_actions(LOADERS[fmt](out), batches), actions)

@pytest.mark.parametrize("fmt", ["torchscript", pytest.param("onnx", marks=needs_onnx)])
def test_stochastic_actions_vary_and_keep_to_the_mask(runs, tmp_path, fmt):
    out = tmp_path / f"policy.{fmt}"
    assert not export_run(runs["dict"], fmt, out, stochastic=True)["deterministic"]
    batches, _ = eval_actions(runs["dict"])
    obs = batches[0][0]
    policy = LOADERS[fmt](out)
    repeated = {name: np.repeat(value[:1], 500, axis=0) for name, value in file_inputs(obs, ["image", "position",
                                                                                          "action_mask"]).items()}
    actions = policy(repeated)["action"]
    legal = np.flatnonzero(obs["action_mask"][0])
    assert set(actions) <= set(legal) and len(set(actions)) == len(legal) > 1
