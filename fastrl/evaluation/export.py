"""fastrl-export: a run's policy as one self-contained file, TorchScript or ONNX, that maps the
env's observation to the env's action with no fastrl (nor numba, nor envpool) to load it.

The file's contract (docs/evaluation.md shows it in use):

Inputs
    One tensor per array of the observation as the run's env gives it (after fastrl's image
    preprocessing: ``env.resize``, ``env.grayscale``, ``env.frame_stack``), with a leading batch
    axis, in the env's dtype: ``obs`` for a plain Box; for a Dict / Tuple its leaves, named by
    their key paths joined by '.' (``image``, ``action_mask``, ``0``), a MultiDiscrete as one
    array. A recurrent policy also takes ``state``, float32 ``[B, state_size]``: zeros at an
    episode's start, then the ``next_state`` it returned.
Outputs
    ``action``: ``[B, *action_space.shape]`` in the action space's dtype, as ``env.step`` of a
    vector env takes it (``start`` added, Box actions clipped to their bounds, ``env.actions``'
    table applied); a Tuple action space gives one output per part, ``action.0``, ``action.1``,
    .... A recurrent policy also returns ``next_state``, the state to pass with the next step.

The policy acts as ``fastrl-eval --deterministic`` does (argmax, Gaussian means) unless exported
with ``stochastic``; the file holds its own inputs' and outputs' description as JSON (TorchScript:
the extra file ``fastrl.json``; ONNX: the metadata key ``fastrl``). The observations' conversion
(ObsLayout.leaf_values), the network, the step (fastrl.evaluation.episodes.policy_step) and the actions'
layout (ActionLayout.leaves) are fastrl's own; only ActionLayout.to_env's numpy ops are written
again here, as torch ops the file can hold (tests/unit/evaluation/test_export.py checks they agree).
"""
from __future__ import annotations

import json
from pathlib import Path

import gymnasium
import numpy as np
import torch
from torch import nn

from ..config import load_run_config
from ..envs import probe_env
from ..envs.spaces import ActionLayout, ObsLayout
from ..models.networks import action_head
from .episodes import acts_deterministically, load_run_model, policy_step

FORMATS = ("torchscript", "onnx")
METADATA = "fastrl.json"
# A recurrent policy's state in and out (ONNX names each value once).
STATE, NEXT_STATE = "state", "next_state"
ONNX_MISSING = "--format onnx needs onnx and onnxscript: pip install 'fastrl[export]'"


class ExportError(ValueError):
    """A policy that cannot be exported as asked; the message names what and the way out."""


def torch_dtype(dtype) -> torch.dtype:
    """torch's dtype for a numpy ``dtype`` (they share the names of the dtypes spaces use)."""
    return getattr(torch, np.dtype(dtype).name)


def _as_tensor(value, dtype=None) -> torch.Tensor:
    """ObsLayout.leaf_values' ``convert`` for tensors."""
    return value if dtype is None else value.to(torch_dtype(dtype))


class EnvActions(nn.Module):
    """Stored actions ``[B, *layout.shape]`` (fastrl.envs.spaces: flat, zero-based) -> the env's, by
    ActionLayout.to_env's rules (each declared space's shape and dtype, its ``start`` added, a Box
    clipped to its sensible bounds), or with ``actions`` (``env.actions``, the env's own actions
    the policy chooses among: fastrl.envs.wrappers.action_subset) action ``i`` as ``actions[i]``: a tuple of
    ``[B, *env shape]`` tensors, one per declared space."""

    def __init__(self, layout: ActionLayout, actions: tuple[int, ...] = ()):
        super().__init__()
        self.leaves = layout.leaves
        self.parts = isinstance(layout.space, gymnasium.spaces.Tuple)
        self.bounded = [isinstance(leaf.space, gymnasium.spaces.Box) for leaf in self.leaves]
        self.shifted = [leaf.start is not None for leaf in self.leaves]
        for i, leaf in enumerate(self.leaves):
            dtype = torch_dtype(leaf.dtype)
            if self.bounded[i]:
                self.register_buffer(f"low{i}", torch.as_tensor(leaf.low).to(dtype))
                self.register_buffer(f"high{i}", torch.as_tensor(leaf.high).to(dtype))
            if self.shifted[i]:
                self.register_buffer(f"start{i}", torch.as_tensor(leaf.start).to(dtype))
        self.register_buffer("table", torch.as_tensor(actions, dtype=torch.int64) if actions else None)

    def forward(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.table is not None:
            return (self.table[actions],)
        out = []
        for i, leaf in enumerate(self.leaves):
            values = actions[:, leaf.columns] if self.parts else actions
            values = values.reshape(values.shape[0], *leaf.env_shape).to(torch_dtype(leaf.dtype))
            if self.bounded[i]:
                # min and max rather than clamp: ONNX's Clip takes scalar bounds only.
                values = torch.minimum(torch.maximum(values, getattr(self, f"low{i}")), getattr(self, f"high{i}"))
            if self.shifted[i]:
                values = values + getattr(self, f"start{i}")
            out.append(values)
        return tuple(out)


class ExportedPolicy(nn.Module):
    """What the file holds: ``forward({input name: tensor})`` -> ``{output name: tensor}`` (see
    the module docstring) around ``model``, a run's network for the env's ``observation_space``
    and ``action_space`` (those of its VecEnv: after preprocessing and ``env.actions``)."""

    def __init__(self, model: nn.Module, observation_space, action_space, env_actions: tuple[int, ...] = (),
                 deterministic: bool = True, algo: str = "appo"):
        super().__init__()
        self.model = model.eval()
        self.observation_space = observation_space
        self.obs_layout = ObsLayout(observation_space)
        self.paths = dict(self.obs_layout.env_leaves())
        self.head = action_head(action_space, algo)
        self.actions = EnvActions(ActionLayout(action_space), tuple(env_actions))
        self.deterministic = deterministic
        self.state_size = model.state_size if getattr(model, "is_recurrent", False) else 0
        parts = len(self.actions.leaves) if self.actions.parts else 0
        self.action_names = [f"action.{i}" for i in range(parts)] or ["action"]
        taken = sorted(set(self.paths) & {*self.output_names, *[STATE] * bool(self.state_size)})
        if taken:
            raise ExportError(f"the observation has a leaf named {taken[0]!r}, a name the file gives its "
                              f"{'state input' if taken[0] == STATE else 'outputs'}: rename that key of the env's "
                              f"observation to export the policy")

    @property
    def input_names(self) -> list[str]:
        return [*self.paths, *[STATE] * bool(self.state_size)]

    @property
    def output_names(self) -> list[str]:
        return [*self.action_names, *[NEXT_STATE] * bool(self.state_size)]

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        first = inputs[next(iter(self.paths))]
        if self.obs_layout.packed:
            obs = self.obs_layout.leaf_values(_nested(self.paths, inputs), first.shape[0], _as_tensor)
        else:
            obs = first
        state = inputs[STATE] if self.state_size else None
        # A new episode is a zero state, which the caller passes: nothing to reset here.
        starts = torch.zeros_like(state[:, 0], dtype=torch.bool) if self.state_size else None
        actions, new_state = policy_step(self.model, self.head, obs, self.deterministic, state, starts)
        out = dict(zip(self.action_names, self.actions(actions)))
        if self.state_size:
            out[NEXT_STATE] = new_state
        return out

    def example_inputs(self, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
        """``batch_size`` random observations of the space (and zero states) as the file takes them."""
        out = {}
        for name, path in self.paths.items():
            space = self.observation_space
            for key in path:
                space = space[key]
            space.seed(seed)
            out[name] = np.stack([np.asarray(space.sample()) for _ in range(batch_size)])
        if self.state_size:
            out[STATE] = np.zeros((batch_size, self.state_size), np.float32)
        return out

    def description(self) -> dict:
        """The inputs and outputs (name, per-row shape, dtype), as the file's metadata holds them."""
        example = self.example_inputs(1)
        with torch.no_grad():
            outputs = self({name: torch.as_tensor(value) for name, value in example.items()})
        return {"inputs": [_described(name, torch.as_tensor(value)) for name, value in example.items()],
                "outputs": [_described(name, value) for name, value in outputs.items()],
                "deterministic": self.deterministic, "state_size": self.state_size}



def _described(name: str, value: torch.Tensor) -> dict:
    return {"name": name, "shape": ["batch", *value.shape[1:]], "dtype": str(value.dtype).removeprefix("torch.")}


def _nested(paths: dict[str, tuple], inputs: dict[str, torch.Tensor]):
    """The inputs nested as the observation (dicts by key, tuple positions as keys too): what
    ObsLayout.leaf_values looks key paths up in."""
    root: dict = {}
    for name, path in paths.items():
        if not path:
            return inputs[name]
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = inputs[name]
    return root


def export_run(run_dir: Path, fmt: str, out: Path, best: bool = False, stochastic: bool = False) -> dict:
    """fastrl-export: the run's latest (or ``best``) policy written to ``out`` as ``fmt``
    (torchscript | onnx); what fastrl-export prints: the file, its format, its inputs and outputs,
    and where the weights come from (as fastrl-eval names them).

    Raises ExportError (one line) for a format it does not write, a multi-agent run, sampled
    actions of a Q-learner, or a missing ONNX exporter; ConfigError / CheckpointError, as
    fastrl-eval does, for a run without config or checkpoint."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    cfg = load_run_config(run_dir)
    spec = probe_env(cfg)
    if len(spec.agents) > 1:
        raise ExportError(f"{cfg.env.id!r} is a multi-agent env ({', '.join(spec.agents)}), and fastrl-export "
                          f"exports single-agent policies only; evaluate it with fastrl-eval")
    if stochastic and acts_deterministically(cfg, False):
        raise ExportError(f"--stochastic: a {cfg.learner.algo} policy acts greedily on its Q-values, which are not "
                          f"logits to sample from; drop --stochastic")
    cfg, model, source = load_run_model(run_dir, best)
    policy = ExportedPolicy(model, spec.observation_space, spec.action_space, tuple(cfg.env.actions),
                            not stochastic, cfg.learner.algo).eval()
    meta = {**policy.description(), "env": cfg.env.id, "algo": cfg.learner.algo, **source}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    (write_onnx if fmt == "onnx" else write_torchscript)(policy, out, meta)
    return {"out": str(out), "format": fmt, **meta}


def write_torchscript(policy: ExportedPolicy, out: Path, meta: dict) -> None:
    """``policy`` traced into a TorchScript file at ``out``, ``meta`` as its extra file fastrl.json."""
    example = {name: torch.as_tensor(value) for name, value in policy.example_inputs(2).items()}
    with torch.no_grad():
        traced = torch.jit.trace(policy, (example,), strict=False, check_trace=False)
    torch.jit.save(traced, str(out), _extra_files={METADATA: json.dumps(meta)})


def write_onnx(policy: ExportedPolicy, out: Path, meta: dict) -> None:
    """``policy`` exported to an ONNX file at ``out`` (batch axis dynamic), ``meta`` under the
    metadata key ``fastrl``."""
    try:
        import onnx  # noqa: F401  (torch.onnx's exporter needs both)
        import onnxscript  # noqa: F401
    except ImportError:
        raise ExportError(ONNX_MISSING) from None
    example = {name: torch.as_tensor(value) for name, value in policy.example_inputs(2).items()}
    batch = torch.export.Dim("batch")
    with torch.no_grad():
        # As keyword arguments: a dict last in ``args`` would be taken for them.
        program = torch.onnx.export(policy, (), kwargs={"inputs": example}, input_names=policy.input_names,
                                    output_names=policy.output_names,
                                    dynamic_shapes={"inputs": {name: {0: batch} for name in example}}, dynamo=True,
                                    verbose=False)
    program.model.metadata_props["fastrl"] = json.dumps(meta)
    program.save(str(out))
