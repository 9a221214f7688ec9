"""The learner's batch: time-major trajectories, and their copy out of the shared arena."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
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


# Trajectories field -> its rows per slot beyond T (obs has T + 1); terminated, truncated and
# valid are stored as 0/1 bytes and read as bool.
_STEP_FIELDS = {"obs": 1, "actions": 0, "behaviour_logp": 0, "rewards": 0, "terminated": 0, "truncated": 0,
                "valid": 0, "version": 0}
_BOOL_FIELDS = ("terminated", "truncated", "valid")


class BatchStaging:
    """Host buffers for one batch of ``B`` trajectory slots, refilled by every :meth:`gather`.

    Each field is one ``np.take`` from the arena straight into its buffer, laid out time-major
    (``[T(+1), B, ...]``): no temporary, no allocation per batch, and numpy drops the GIL while
    it copies (a background thread can gather while the learner trains). ``pin``: page-locked
    buffers, which a CUDA copy can read asynchronously (torch refuses to pin without CUDA)."""

    def __init__(self, arena, batch_size: int, pin: bool = False):
        self.arena = arena
        self.batch_size = batch_size
        self.num_slots, T = arena.rewards.shape
        names = [*_STEP_FIELDS, *(["initial_state"] if "slot_state" in arena.arrays else [])]
        self.sources = {name: self._source(name) for name in names}
        self.buffers = {}
        for name, source in self.sources.items():
            rows = () if name == "initial_state" else (T + _STEP_FIELDS[name],)
            empty = torch.from_numpy(np.empty(0, source.dtype))
            self.buffers[name] = torch.empty((*rows, batch_size, *source.shape[1:]), dtype=empty.dtype,
                                             pin_memory=pin)
        self.batch = Trajectories(**self.buffers)

    def _source(self, name: str) -> np.ndarray:
        """The arena's array of ``name``, rows flattened to ``[N * rows, ...]`` (a view)."""
        if name == "initial_state":
            return self.arena.slot_state
        array = self.arena.arrays[name]
        if name in _BOOL_FIELDS:
            array = array.view(np.bool_)
        return array.reshape(-1, *array.shape[2:])

    def gather(self, slot_ids: np.ndarray) -> Trajectories:
        """Copy the slots ``slot_ids`` ``[B]`` into the buffers; returns the batch over them (the
        same tensors every call: the caller must be done with the last batch)."""
        slots = np.asarray(slot_ids, dtype=np.int64)
        if slots.shape != (self.batch_size,) or slots.min() < 0 or slots.max() >= self.num_slots:
            raise IndexError(f"BatchStaging.gather: need {self.batch_size} slot ids in [0, {self.num_slots}), "
                             f"got {slots.tolist()}")
        for name, source in self.sources.items():
            out = self.buffers[name].numpy()
            if name == "initial_state":
                index = slots
            else:
                rows = len(out)
                index = (slots[None, :] * rows + np.arange(rows)[:, None]).ravel()  # [t, b] -> slot b's row t
            # mode="clip": indices were checked above; the default "raise" buffers ``out`` (a second copy).
            np.take(source, index, axis=0, out=out.reshape(len(index), *source.shape[1:]), mode="clip")
        return self.batch


def gather_trajectories(arena, slot_ids: np.ndarray) -> Trajectories:
    """Copy the trajectory slots ``slot_ids`` ``[B]`` out of the arena into a new time-major batch."""
    return BatchStaging(arena, len(slot_ids)).gather(slot_ids)
