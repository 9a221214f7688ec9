"""R2D2 (Kapturowski et al. 2019, "Recurrent Experience Replay in Distributed Reinforcement
Learning"): the Ape-X actors with a recurrent dueling Q-network and a sequence replay that keeps
the recurrent state each sequence started with.

The actors are the rollout workers and the batcher: epsilon-greedy on the recurrent Q-network,
one epsilon per env (:func:`fastrl.sampling.batcher.apex_epsilons`), each env's state in the arena.
Every full trajectory slot enters a :class:`~fastrl.replay.buffer.SequenceReplay` with the state its
first step was acted with; sequences of ``replay.sequence_length`` steps start every
``learner.rollout`` steps, at slot starts, so R2D2's overlapping 80-step sequences every 40 steps
are ``replay.sequence_length = 80`` with ``learner.rollout = 40``. New sequences enter with the
largest priority seen (PER).

Each gradient step samples ``replay.batch_size`` sequences by priority and unrolls the online and
the target network from the stored state over the whole sequence (the state is zeroed where an
episode starts inside it). The first ``replay.burn_in`` steps only warm the state: no gradient,
no loss. The other steps regress on n-step double-Q targets under the invertible value rescaling
``h``: ``y_t = h(G_t + gamma^m h^-1(Q_target(s_{t+m}, argmax_a Q_online(s_{t+m}, a))))``
(``learner.double_q = false``: ``max_a Q_target(s_{t+m}, a)``), windows cut at episode ends and at
the sequence end (:func:`fastrl.kernels.nstep_targets`). The loss is
the importance-weighted Huber loss; new priorities are ``0.9 max|delta| + 0.1 mean|delta|`` over a
sequence's trained steps. The target network is copied every ``learner.target_update_every`` steps.

The replay is checkpointed only with ``replay.checkpoint`` (as the dqn learner's); without it a
resumed run refills it first.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..config import Config
from ..ipc.device_io import BatchTransfer
from ..kernels import nstep_targets
from ..models.networks import build_model
from ..replay.buffer import SequenceBatch, SequenceReplay
from .base import unroll
from .batch import Trajectories
from .losses import inverse_value_rescale, sequence_priorities, td_loss, value_rescale
from .qlearning import ReplayQLearner
from .replay_feed import add_trajectories


class R2D2Learner(ReplayQLearner):
    """Recurrent Ape-X: the online network ``model``, its ``target`` copy and a prioritized
    :class:`~fastrl.replay.buffer.SequenceReplay` with stored states; driven like every learner of the family."""

    def __init__(self, cfg: Config, observation_space, action_space, model: nn.Module | None = None,
                 device: torch.device | str = "cpu", device_path: bool | None = None):
        model = build_model(observation_space, action_space, cfg.model, model, algo="r2d2")
        if not getattr(model, "is_recurrent", False):
            raise ValueError("learner.algo=r2d2 needs a recurrent model: set model.core=lstm or gru")
        rcfg, layout = cfg.replay, model.obs_layout
        replay = SequenceReplay(
            rcfg, sequence_length=rcfg.sequence_length, sequence_stride=cfg.learner.rollout,
            num_streams=cfg.total_envs, obs_shape=layout.storage_shape, obs_dtype=layout.storage_dtype,
            action_shape=(), action_dtype=np.int64, seed=cfg.seed, state_size=model.state_size)
        # replay.replay_ratio trained steps sampled per env step added.
        trained_steps = rcfg.sequence_length - rcfg.burn_in
        super().__init__(cfg, model, device, replay, rcfg.replay_ratio / (rcfg.batch_size * trained_steps),
                         device_path)
        # On the device path a sampled batch's arrays (observations sampled straight into it) share
        # one staging buffer, pinned on CUDA, and reach the device in one copy. Reusing it is safe:
        # every update ends by reading its new priorities back, after all its copies.
        self.transfer = BatchTransfer(self.device, staged=self.device_path)
        self.staged_sample: SequenceBatch | None = None  # the last sample drawn into the staging buffer

    def train(self, batch: Trajectories, progress: float = 0.0, env_ids: np.ndarray | None = None,
              fresh: np.ndarray | None = None) -> dict:
        """Add the trajectories ``batch`` (with ``initial_state``) to the replay, then take the
        gradient steps the replay ratio allows; returns statistics."""
        batch.validate()
        T, B = batch.rewards.shape
        env_ids = self.stream_ids(batch, env_ids)
        if batch.initial_state is None:
            raise ValueError("R2D2Learner.train needs Trajectories with initial_state [B, state_size]")
        lag_stats = self.lag_stats(batch)
        self.set_learning_rate(progress)
        if not (batch.is_finite() and bool(torch.isfinite(batch.initial_state).all())):
            return self.drop(batch, env_ids)
        with self.timers.time("replay_s"):
            rewards = self.transformed_rewards(batch.rewards)
            self.update_normalizer(batch)
            misaligned = [e for e in env_ids.tolist() if self.replay.stream_length(e) % T]
            if misaligned:  # history records (frame stacks that are not reset stacks) shift the starts
                raise RuntimeError(f"R2D2: replay streams {misaligned[:4]} do not start sequences at slot starts "
                                   f"(their first observation was not a reset stack); use replay.frame_stack=1 "
                                   f"or an env whose reset fills the stack")
            states = np.zeros((T, B, self.model.state_size), np.float32)
            states[0] = batch.initial_state.numpy()  # the replay keeps the states at sequence starts
            add_trajectories(self.replay, batch, rewards, env_ids, fresh,
                             behaviour_logp=batch.behaviour_logp.numpy(), states=states)
        return self.replay_steps(lag_stats)

    def input_specs(self, batch_size: int) -> list[tuple[tuple, np.dtype]]:
        """Shapes and dtypes of a sampled batch's device inputs, in :meth:`device_inputs` order."""
        L, state_size = self.replay.horizon, self.model.state_size
        return [(self.replay.obs_shape_of(batch_size), self.replay.obs_dtype), ((batch_size, state_size), np.float32),
                ((L + 1, batch_size), np.bool_), ((L, batch_size), np.float32), ((L, batch_size), np.float32),
                ((L, batch_size), np.float32), ((L, batch_size), np.int64), ((L, batch_size), np.int64),
                ((batch_size,), np.float32)]

    def sample(self) -> SequenceBatch | None:
        """Sequences drawn by priority. On the device path their observations land in the staging
        buffer: such a sample is valid until the next call."""
        if not self.transfer.staged:
            return self.replay.sample(self.rcfg.batch_size)
        out = self.transfer.host_arrays(self.input_specs(self.rcfg.batch_size))[0]
        self.staged_sample = self.replay.sample(self.rcfg.batch_size, out=out)
        return self.staged_sample

    def device_inputs(self, sample: SequenceBatch) -> list[torch.Tensor]:
        """(obs, initial state, episode starts ``[L + 1, B]``, trained-step mask, n-step returns,
        bootstrap discounts, bootstrap steps, actions, importance weights) on the device: on the
        device path one copy from the staging buffer, on the CPU tensors over the host arrays."""
        L, B = sample.rewards.shape
        rewards = sample.rewards  # transformed as they entered the replay
        discounts = (self.lcfg.gamma * ~sample.terminated).astype(rewards.dtype)
        returns, boot_discounts, ends = nstep_targets(rewards, discounts, self.rcfg.n_step, valid=sample.valid)
        if not self.transfer.staged:  # the CPU reads the sample's observations where they are
            arrays = [sample.obs, *self.transfer.host_arrays(self.input_specs(B)[1:])]
        else:
            arrays = self.transfer.host_arrays(self.input_specs(B))
            if sample is not self.staged_sample:
                arrays[0][...] = sample.obs  # a caller's own sample, not drawn into the staging buffer
        _, state, starts, mask, *rest = arrays
        state[...] = sample.initial_state
        starts[0] = False
        starts[1:] = ~sample.valid
        mask[...] = sample.valid
        mask[:self.rcfg.burn_in] = 0.0  # burn-in steps only warm the state
        for target, values in zip(rest, (returns, boot_discounts, ends, sample.actions, sample.weights)):
            target[...] = values
        return self.transfer.to_device(arrays)

    def loss(self, sample: SequenceBatch) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """(loss, stats, new sequence priorities ``[B]``) of one sampled batch of sequences."""
        obs, state, starts, mask, returns, boot_discounts, ends, actions, weights = self.device_inputs(sample)
        q_online, _ = unroll(self.model, obs, state, starts, self.rcfg.burn_in)  # [L + 1, B, A]
        L = returns.shape[0]
        with torch.no_grad():
            q_target, _, _ = self.target(obs, state, starts)
            best = (q_online.detach() if self.lcfg.double_q else q_target).argmax(-1, keepdim=True)
            bootstrap = inverse_value_rescale(q_target.gather(-1, best).squeeze(-1))  # [L + 1, B]
            targets = value_rescale(returns + boot_discounts * bootstrap.gather(0, ends))
        taken = q_online[:L].gather(-1, actions[..., None]).squeeze(-1)  # [L, B]
        loss, stats = td_loss(taken, targets, weights.expand(L, -1), mask=mask)
        return loss, {**stats, "value_loss": stats["loss"]}, sequence_priorities(stats["td"], mask)
