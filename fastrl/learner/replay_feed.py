"""The learners' side of the replay: learner batches fed into its per-env streams in time order,
cut where an env restarted."""
from __future__ import annotations

import numpy as np
import torch

from .batch import Trajectories


def add_trajectories(replay, batch: Trajectories, rewards: torch.Tensor, env_ids, fresh=None, **per_step) -> None:
    """Append the trajectories ``batch`` ``[T, B]`` to ``replay``, column b as T records of stream
    ``env_ids[b]`` (columns in arrival order, so each stream's records stay in time order).

    ``fresh[b]`` marks an env's first trajectory since its worker (re)started: its episode did
    not continue the stream's last record, so the stream is restarted before that column
    (:meth:`fastrl.replay.buffer.TransitionReplay.restart_streams`). ``per_step``: further ``[T, B, ...]``
    numpy arrays for ``add`` (``priorities``, ``behaviour_logp``, ``states``)."""
    T, B = rewards.shape
    env_ids = np.asarray(env_ids, dtype=np.int64)
    fresh = np.zeros(B, bool) if fresh is None else np.asarray(fresh, bool)
    if fresh.shape != (B,):
        raise ValueError(f"fresh must have shape [{B}], got {list(fresh.shape)}")

    def add_columns(a: int, c: int) -> None:
        obs = batch.obs[:T, a:c].transpose(0, 1)
        actions = batch.actions[:, a:c].transpose(0, 1)
        replay.add(np.repeat(env_ids[a:c], T), obs.reshape(-1, *obs.shape[2:]).numpy(),
                   actions.reshape(-1, *actions.shape[2:]).numpy(), rewards[:, a:c].T.reshape(-1).numpy(),
                   batch.terminated[:, a:c].T.reshape(-1).numpy(), batch.truncated[:, a:c].T.reshape(-1).numpy(),
                   **{name: np.ascontiguousarray(np.swapaxes(values[:, a:c], 0, 1)).reshape(-1, *values.shape[2:])
                      for name, values in per_step.items()})

    start = 0
    for b in np.flatnonzero(fresh).tolist():
        if replay.stream_length(env_ids[b]) == 0 and env_ids[b] not in env_ids[start:b]:
            continue  # a stream's very first records: nothing to cut
        add_columns(start, b)
        replay.restart_streams(env_ids[b:b + 1])
        start = b
    add_columns(start, B)
