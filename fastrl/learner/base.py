"""What every learner of the family shares: optimizer, counters, learning-rate schedule,
reward transform, policy-lag statistics, the guarded gradient step and the state dict.

A learner subclass adds its networks and its ``train(batch, progress, env_ids, fresh)``; the
process shell (:mod:`fastrl.learner.runtime`) drives any of them the same way.

On an accelerator the host queues work and waits only when it reads a result back, so the
learners read as little as they can: statistics stay 0-d tensors until one read per ``train()``
(:func:`read_stats`), and a gradient step reads one number, its gradient norm, which also says
whether the step was finite (:mod:`fastrl.ipc.sync_counter` counts these reads in the tests).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..config import Config
from ..models.networks import learner_layout
from ..reporting.timers import Timers
from .batch import Trajectories
from .precision import learner_precision, measured_precision


def read_stats(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-d tensors -> floats in one host read (one synchronisation on an accelerator, not one each)."""
    return dict(zip(stats, torch.stack([value.detach().float() for value in stats.values()]).tolist()))


def unroll(model: nn.Module, obs: torch.Tensor, state: torch.Tensor, episode_start: torch.Tensor, burn_in: int = 0
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """A recurrent model over ``obs`` ``[T, B, ...]`` from ``state`` ``[B, S]`` (zeroed where
    ``episode_start`` ``[T, B]``), the first ``burn_in`` steps without gradient: they only warm
    the state. Returns (params ``[T, B, P]``, values ``[T, B]``)."""
    pieces = []
    if burn_in:
        with torch.no_grad():
            params, values, state = model(obs[:burn_in], state, episode_start[:burn_in])
        pieces.append((params, values))
    params, values, _ = model(obs[burn_in:], state, episode_start[burn_in:])
    pieces.append((params, values))
    if len(pieces) == 1:
        return params, values
    return torch.cat([p for p, _ in pieces]), torch.cat([v for _, v in pieces])


def make_adam(model, lr: float, eps: float) -> torch.optim.Adam:
    """Adam over ``model``'s parameters (or a list of parameter groups), fused where torch has the
    kernel (CUDA; the CPU since torch 2.4): one kernel for every parameter and no read of the step
    count on the host. On the CPU a CartPole step's optimizer time is 0.17 ms against 0.40 ms with
    foreach; same maths (tests/unit/learner/test_vtrace_learner.py)."""
    params = list(model.parameters()) if isinstance(model, nn.Module) else model
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except RuntimeError:  # torch < 2.4 on the CPU
        return torch.optim.Adam(params, lr=lr, eps=eps, foreach=True)


class BaseLearner:
    """Owns ``model`` and its Adam optimizer. ``version`` counts batches trained on (it is the
    weights' version the actors see); ``updates`` counts optimizer steps taken, ``skipped_updates``
    those refused for a non-finite loss or gradient.

    ``device_path``: run what suits an accelerator (the subclasses' kernels that stay on the
    device, such as V-trace's torch scan) rather than the CPU's choices (numba kernels). None: when
    ``device`` is not the CPU. True on the CPU lets the tests count that path's host
    synchronisations without a GPU. ``precision`` is ``learner.precision`` resolved here:
    "float32" or "bfloat16" (auto: timed on ``observation_space``, by default the model's
    ``obs_layout.space``; unmeasurable, float32, without either)."""

    # Names of ``timers``, read as 0.0 until first timed: cumulative seconds that the host reports
    # among the learner's metrics (fastrl.reporting.metrics.LEARNER_STATS).
    TIMERS = ("forward_backward_s", "vtrace_s", "optimizer_s")

    def __init__(self, cfg: Config, model: nn.Module, device: torch.device | str = "cpu",
                 device_path: bool | None = None, observation_space=None):
        self.cfg = cfg
        self.lcfg = cfg.learner
        self.device = torch.device(device)
        self.device_path = self.device.type != "cpu" if device_path is None else device_path
        if self.device.type == "cuda":
            # TF32 (fp32 range and sums, 10-bit mantissa products) puts fp32 matmuls and
            # convolutions on the tensor cores of Ampere and later GPUs. The learner's batch shapes
            # are fixed, so cudnn.benchmark's search for the fastest convolutions is paid once.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        self.model = learner_layout(model.to(self.device))
        self.optimizer = make_adam(self.model, self.lcfg.lr, self.lcfg.adam_eps)
        if observation_space is None:
            observation_space = getattr(getattr(self.model, "obs_layout", None), "space", None)
        self.precision = learner_precision(self.lcfg.precision, self.lcfg.algo, self.device,
                                           lambda: measured_precision(cfg, self.model, observation_space))
        self.version = 0
        self.updates = 0
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self.timers = Timers(*self.TIMERS)
        # Data-parallel hook (fastrl.distributed.process_group.GradientAverager): averages gradients across
        # ranks, given whether this rank's are finite; returns whether every rank's were.
        self.grad_sync = None

    def learning_rate(self, progress: float) -> float:
        """Linear decay to 0 over the run when ``lr_decay``; ``progress`` in [0, 1]."""
        if not self.lcfg.lr_decay:
            return self.lcfg.lr
        return self.lcfg.lr * max(0.0, 1.0 - progress)

    def set_learning_rate(self, progress: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(progress)

    def transformed_rewards(self, rewards):
        """Rewards scaled by ``reward_scale``, then clipped to ``[-reward_clip, reward_clip]`` if set;
        a tensor or a numpy array, returned as the same kind."""
        rewards = rewards * self.lcfg.reward_scale
        if self.lcfg.reward_clip > 0:
            rewards = rewards.clip(-self.lcfg.reward_clip, self.lcfg.reward_clip)
        return rewards

    def policy_lag(self, version: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
        """Policy lag (this learner's version minus the acting one, ``version`` ``[T, B]``) over the
        ``valid`` ``[T, B]`` steps: its min, mean and max as 0-d float tensors, 0 without valid
        steps. Nothing is read back (a boolean-mask selection would be)."""
        lag = (self.version - version).float()
        count = valid.sum()
        summary = torch.stack([torch.where(valid, lag, math.inf).amin(), (lag * valid).sum() / count.clamp(min=1),
                               torch.where(valid, lag, -math.inf).amax()])
        summary = torch.where(count > 0, summary, 0.0)
        return dict(zip(("policy_lag_min", "policy_lag_mean", "policy_lag_max"), summary.unbind()))

    def lag_stats(self, batch: Trajectories) -> dict[str, float]:
        """:meth:`policy_lag` over the batch, read."""
        return read_stats(self.policy_lag(batch.version, batch.valid))

    def autocast(self):
        """The context of the forward pass and loss: bfloat16 autocast when ``precision`` is
        bfloat16, else none."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bfloat16")

    def counters(self) -> dict:
        return {"lr": self.optimizer.param_groups[0]["lr"], "learner_updates": self.updates,
                "skipped_updates": self.skipped_updates, "version": self.version}

    def gradient_step(self, loss: torch.Tensor) -> tuple[float, bool]:
        """Backward, cross-rank gradient averaging (``grad_sync``), norm clipping and an optimizer
        step, skipped when the loss or the gradient is not finite: such a step would poison the
        weights the actors use. Returns (gradient norm, NaN if skipped; whether the step was
        taken). One host read on a single rank: the norm, made NaN by a non-finite loss (whose
        gradients can still be finite, e.g. through a NaN that a mask multiplies by 0). The
        backward pass counts as ``forward_backward_s``, the step as ``optimizer_s``."""
        with self.timers.time("forward_backward_s"):
            self.optimizer.zero_grad(set_to_none=True)
            if self.grad_sync is None:
                loss.backward()
                norm = self.clip_gradients()
                grad_norm = float(torch.where(torch.isfinite(loss.detach()), norm, math.nan))
            else:
                # The ranks agree on finiteness (each gives a bool) as they average, before clipping.
                finite = bool(torch.isfinite(loss))
                if finite:
                    loss.backward()
                grad_norm = float(self.clip_gradients()) if self.grad_sync(finite) else math.nan
        stepped = math.isfinite(grad_norm)
        with self.timers.time("optimizer_s"):
            if stepped:
                self.optimizer.step()
                self.updates += 1
                self.consecutive_skips = 0
            else:
                self.count_skip()
                grad_norm = math.nan
        return grad_norm, stepped

    def clip_gradients(self) -> torch.Tensor:
        """Scale the gradients to a total norm of at most ``max_grad_norm``; their norm before, 0-d."""
        return nn.utils.clip_grad_norm_(self.model.parameters(), self.lcfg.max_grad_norm)

    def count_skip(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_updates += 1
        self.consecutive_skips += 1

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "version": self.version, "updates": self.updates, "skipped_updates": self.skipped_updates}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        self.updates = state["updates"]
        self.skipped_updates = state.get("skipped_updates", 0)

    def close(self) -> None:
        """Release what the learner holds beyond its tensors (a replay's threads or files)."""
