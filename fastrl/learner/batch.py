"""The learner's batch: time-major trajectories (fastrl.learner.staging copies them out of the arena)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Trajectories:
    """A learner batch, time-major: ``T`` steps of ``B`` trajectories.

    obs ``[T+1, B, *obs_shape]`` (env dtype; ``obs[T]`` follows the last step), actions
    ``[T, B, *action_shape]``, behaviour_logp ``[T, B]`` log-probs of the actions under the policy
    that chose them (the behaviour policy), rewards ``[T, B]``, terminated / truncated / valid
    ``[T, B]`` bool, version ``[T, B]`` int64 policy version that acted; with a recurrent model,
    initial_state ``[B, state_size]`` the state each trajectory's first step was acted with (the
    learner resets it inside the trajectory where ``valid[t - 1]`` is False: an episode starts at t).
    """

    obs: torch.Tensor
    actions: torch.Tensor
    behaviour_logp: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor
    version: torch.Tensor
    initial_state: torch.Tensor | None = None

    def _map(self, fn) -> "Trajectories":
        """``fn(name, tensor, batch axis)`` applied to every field that is set."""
        return Trajectories(**{f.name: None if getattr(self, f.name) is None else
                               fn(f.name, getattr(self, f.name), 0 if f.name == "initial_state" else 1)
                               for f in fields(self)})

    def to(self, device: torch.device) -> "Trajectories":
        non_blocking = device.type == "cuda"
        return self._map(lambda name, x, axis: x.to(device, non_blocking=non_blocking))

    def columns(self, index: torch.Tensor) -> "Trajectories":
        return self._map(lambda name, x, axis: x[:, index] if axis else x[index])

    def concat(self, other: "Trajectories") -> "Trajectories":
        """This batch with ``other``'s trajectories appended (``other``'s fields cast to ours)."""
        if (self.initial_state is None) != (other.initial_state is None):
            raise ValueError("Trajectories.concat: both batches need an initial_state, or neither")
        return self._map(lambda name, x, axis: torch.cat([x, getattr(other, name).to(x.dtype)], dim=axis))

    def episode_starts(self) -> torch.Tensor:
        """``[T + 1, B]`` bool: step t acts on an episode's first observation (t >= 1; row 0 is
        False: ``initial_state`` is already that of step 0)."""
        starts = torch.zeros(self.obs.shape[0], self.obs.shape[1], dtype=torch.bool, device=self.obs.device)
        starts[1:] = ~self.valid
        return starts

    def is_finite(self) -> bool:
        """No NaN or infinity in the rewards, the behaviour log-probs or float observations."""
        parts = [self.rewards, self.behaviour_logp] + ([self.obs] if self.obs.is_floating_point() else [])
        return all(bool(torch.isfinite(part).all()) for part in parts)

    def validate(self) -> None:
        T, B = self.rewards.shape
        expect = {"obs": (T + 1, B), "actions": (T, B), "behaviour_logp": (T, B), "terminated": (T, B),
                  "truncated": (T, B), "valid": (T, B), "version": (T, B)}
        for name, lead in expect.items():
            shape = tuple(getattr(self, name).shape[:2])
            if shape != lead:
                raise ValueError(f"Trajectories.{name} has leading shape {shape}, expected {lead} "
                                 f"(time-major, T={T}, B={B}, obs has T+1 rows)")
