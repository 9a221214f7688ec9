"""What every learner of the family shares: optimizer, counters, learning-rate schedule,
reward transform, policy-lag statistics, the guarded gradient step and the state dict.

A learner subclass adds its networks and its ``train(batch, progress, env_ids, fresh)``; the
process shell (:mod:`fastrl.learner.host`) drives any of them the same way.
"""
from __future__ import annotations

import math
import time

import torch
from torch import nn

from ..config import Config
from .batch import Trajectories


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


class BaseLearner:
    """Owns ``model`` and its Adam optimizer. ``version`` counts batches trained on (it is the
    weights' version the actors see); ``updates`` counts optimizer steps taken, ``skipped_updates``
    those refused for a non-finite loss or gradient."""

    def __init__(self, cfg: Config, model: nn.Module, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.lcfg = cfg.learner
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lcfg.lr, eps=self.lcfg.adam_eps)
        self.version = 0
        self.updates = 0
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self.timings = {"forward_backward_s": 0.0, "vtrace_s": 0.0, "optimizer_s": 0.0}
        # Data-parallel hook (fastrl.distributed.GradientAverager): averages gradients across
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

    def transformed_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """Rewards scaled by ``reward_scale``, then clipped to ``[-reward_clip, reward_clip]`` if set."""
        rewards = rewards * self.lcfg.reward_scale
        if self.lcfg.reward_clip > 0:
            rewards = rewards.clamp(-self.lcfg.reward_clip, self.lcfg.reward_clip)
        return rewards

    def lag_stats(self, batch: Trajectories) -> dict:
        """Policy lag (this learner's version minus the acting one) over the batch's valid steps."""
        lag = (self.version - batch.version)[batch.valid].float()
        if not lag.numel():
            return {"policy_lag_min": 0.0, "policy_lag_mean": 0.0, "policy_lag_max": 0.0}
        return {"policy_lag_min": float(lag.min()), "policy_lag_mean": float(lag.mean()),
                "policy_lag_max": float(lag.max())}

    def counters(self) -> dict:
        return {"lr": self.optimizer.param_groups[0]["lr"], "learner_updates": self.updates,
                "skipped_updates": self.skipped_updates, "version": self.version}

    def gradient_step(self, loss: torch.Tensor) -> tuple[float, float]:
        """Backward, cross-rank gradient averaging (``grad_sync``), norm clipping and an optimizer
        step, skipped when the loss or the gradient is not finite: such a step would poison the
        weights the actors use. Returns (gradient norm, NaN if skipped; the ``perf_counter`` time
        when the backward pass and clipping were done)."""
        self.optimizer.zero_grad(set_to_none=True)
        finite = bool(torch.isfinite(loss))
        grad_norm = float("nan")
        if finite:
            loss.backward()
        if self.grad_sync is not None:
            finite = self.grad_sync(finite)
        if finite:
            grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), self.lcfg.max_grad_norm))
            finite = math.isfinite(grad_norm)
        backward_done = time.perf_counter()
        if finite:
            self.optimizer.step()
            self.updates += 1
            self.consecutive_skips = 0
        else:
            self.count_skip()
            grad_norm = float("nan")
        return grad_norm, backward_done

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
