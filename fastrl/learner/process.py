"""The learner process: take a batch of full slots -> agree to stop -> consume it -> checkpoint.

Stopping is one interface with two answers: alone, the run's stop flag; with several ranks
(torch.distributed), an all-reduce before every batch, so that every rank stops after the same
update and no peer is left waiting inside a collective.
"""
from __future__ import annotations

import numpy as np
import torch

from ..config import Config
from ..distributed import process_group as distributed
from ..distributed.process_group import PEER_FAILURE
from ..files.checkpoint import CheckpointError
from ..ipc.arena import Arena, Control, budget_spent, set_error
from ..ipc.child import ProcessExit, ReadablePipes, configure_child, runner_alive
from ..ipc.slots import PolicyQueues, slot_bytes, slot_ids_from
from ..multiagent.policy_map import PolicyMap, policy_map
from ..reporting.timers import Timers
from .policy_set import PolicyRuntimes, make_policy_learners, restore_policies
from .runtime import NonFiniteTraining


class LocalStop:
    """One rank: stop when the runner raises the stop flag."""

    def __init__(self, arena: Arena):
        self.arena = arena

    def before_batch(self, progress: float) -> tuple[bool, float | None]:
        """(stop now, the training progress to use; None: the runtime's own)."""
        return bool(self.arena.control[Control.STOP]), None

    def after_batch(self, learner) -> None:
        pass

    def leaving(self, progress: float) -> bool:
        """Called once on the way out; True if every rank left at the same update."""
        return False


class DistributedStop:
    """Several ranks: every batch begins with the ranks agreeing whether to stop and on training
    progress (the learning-rate schedule); observation statistics follow rank 0's."""

    def __init__(self, arena: Arena, device: torch.device):
        self.arena = arena
        self.device = device
        self.agreed = False
        self.peer_lost = False  # a collective failed: a peer went away, no collective can follow

    def before_batch(self, progress: float) -> tuple[bool, float | None]:
        self.agreed, progress = distributed.agree(bool(self.arena.control[Control.STOP]), progress, self.device)
        return self.agreed, progress

    def after_batch(self, learner) -> None:
        normalizer = getattr(learner.model, "normalizer", None)
        if normalizer is not None:
            distributed.broadcast_buffers(normalizer)  # every rank acts with rank 0's statistics

    def leaving(self, progress: float) -> bool:
        if self.peer_lost:
            return False
        if not self.agreed:
            # Leaving for a local reason (the stop flag between batches): the peers are, or soon
            # will be, in before_batch's all-reduce; meet them there with a stop.
            self.agreed, _ = distributed.agree(True, progress, self.device)
        return self.agreed


class FullSlots:
    """The learner's side of the slot protocol (fastrl.ipc.slots.PolicyQueues) over its ends of the
    slot pipes, one pair per rollout worker (``channels``: full-slot pipes in, free-slot pipes
    out): full slot ids queued per policy in arrival order and taken a batch at a time; slots
    handed back to the worker that owns them once copied out (``release``)."""

    def __init__(self, cfg: Config, arena: Arena, channels, timers: Timers,
                 policies: PolicyMap | None = None):
        full_in, free_out = channels
        self.pipes = ReadablePipes(full_in)
        self.arena = arena
        self.timers = timers
        policies = policy_map(cfg, ()) if policies is None else policies
        row_policy = policies.run_row_policies(cfg.env.num_workers, cfg.env.envs_per_worker)
        self.full = PolicyQueues(arena, cfg.slots_per_worker, cfg.trajectories_per_batch,
                                 lambda w, slot_ids: free_out[w].send_bytes(slot_bytes(slot_ids)), row_policy,
                                 drop_untrained=cfg.selfplay.enabled)
        self.release = self.full.release

    def next_batch(self, idle: bool = True) -> tuple[int, np.ndarray] | None:
        """(policy, the ids ``[trajectories_per_batch]`` int64 of its next batch's slots, oldest
        first). With no batch queued, first waits for workers to send more (``wait_s``;
        ProcessExit when the run stops meanwhile): None when the wait ended without one.
        ``idle``: the learner has nothing else to train on meanwhile (see receive)."""
        batch = self.full.next_batch()
        if batch is None:
            self.receive(idle)
            batch = self.full.next_batch()
        return batch

    def receive(self, idle: bool = True) -> None:
        """Block until a worker sends full slot ids (or the wait times out); queue all that came.
        The wait is marked in the arena for the runner's end of the step budget (Control.LEARNER_WAITS):
        with ``idle`` (no batch held untrained) as one in which the learner has caught up."""
        control = self.arena.control
        control[Control.LEARNER_WAITS] += 1
        if idle:
            control[Control.LEARNER_IDLE_QUEUED] = 1 + self.full.queued()
        try:
            with self.timers.time("wait_s"):
                ready = self.pipes.wait(control)
        finally:
            control[Control.LEARNER_IDLE_QUEUED] = 0
        while ready:
            for conn in ready:
                slot_ids = slot_ids_from(conn.recv_bytes())
                control[Control.LEARNER_SLOTS_IN] += len(slot_ids)
                self.full.put(slot_ids)
            ready = self.pipes.ready()


def train_held_batch_past_budget(runtime: PolicyRuntimes, arena: Arena) -> bool:
    """The device path holds the batch it gathered last until the next one comes. Past the step
    budget none will: train on it now, as the runner waits for that (fastrl.run.parallel). Before
    the budget the held batch waits for the next, as it always has (its effect on a GPU's timing
    mid-run is not measured). One node only: ranks train only on the batches they agreed on."""
    if not budget_spent(arena):
        return False
    runtime.flush(runtime.progress())
    return True


def learner_process(cfg: Config, layout, arena_name: str, spaces, model, device: str, channels,
                    run_dir, resume_state: dict | None, dist_info=None, run_dir_lock=None,
                    policies: PolicyMap | None = None) -> None:
    """Main loop of the learner process. ``channels``: (full-slot pipes in, free-slot pipes out),
    one per rollout worker. With ``dist_info`` (several ranks) only rank 0 gets a ``run_dir`` to
    checkpoint into (fastrl.distributed.process_group). ``run_dir_lock`` is the runner's lock on ``run_dir``
    (fastrl.files.run_dir.RunDirLock): received, this process holds it too until it exits, so the final
    checkpoint it writes after the runner was killed still belongs to this run. ``policies``: the
    run's (fastrl.learner.policy_set trains each); None, one policy."""
    configure_child(cfg.retain_freed_memory)
    torch.set_num_threads(cfg.learner.torch_threads)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    arena = Arena.attach(layout, arena_name)
    if device.startswith("cuda"):
        # Before the model is built: CUDA work that names no device (pinned host memory, a user
        # model's device="cuda", torch.cuda calls without an index) runs on the current one, and
        # left at cuda:0 every rank would open a context there. NCCL uses the current device too.
        torch.cuda.set_device(torch.device(device))
    policies = policy_map(cfg, ()) if policies is None else policies
    learners = make_policy_learners(cfg, spaces, model, device, policies.num_policies)
    if resume_state is not None:
        restore_policies(learners, policies.names, resume_state)
    parallel = dist_info is not None and dist_info.enabled
    if parallel:
        distributed.init_group(dist_info, "learner", device, cfg.dist_timeout_s)
        for learner in learners:
            distributed.join_data_parallel(learner, dist_info.world_size)
    learner = learners[0]
    stopping = DistributedStop(arena, learner.device) if parallel else LocalStop(arena)
    runtime = PolicyRuntimes(cfg, arena, learners, policies, run_dir, dist_info.world_size if parallel else 1,
                             resume_state)
    slots = FullSlots(cfg, arena, channels, runtime.timers, policies)
    checkpoint_failed = False
    runtime.publish()
    try:
        while True:
            holding = runtime.holds_batch()
            batch = slots.next_batch(idle=not holding)
            if batch is not None:
                policy, slot_ids = batch
                # Checked before every batch: queued batches could outlast the shutdown grace.
                stop, progress = stopping.before_batch(runtime.progress())
                if stop:
                    raise ProcessExit
                runtime.consume(policy, slot_ids, slots.release, progress)
                stopping.after_batch(learners[policy])
            elif holding and not parallel:
                train_held_batch_past_budget(runtime, arena)
            if runtime.checkpoint_due():
                runtime.checkpoint()
    except ProcessExit:
        # With several ranks a flush would be an extra all-reduce that a rank stopping from its
        # own wait (not from the agreement) does not join: there the last batch is dropped, as
        # it is when the parent is gone.
        if not parallel and runner_alive():
            try:
                runtime.flush(runtime.progress())
            except NonFiniteTraining as exc:
                set_error(arena, str(exc))
    except (NonFiniteTraining, CheckpointError) as exc:
        checkpoint_failed = isinstance(exc, CheckpointError)
        set_error(arena, str(exc))
    except RuntimeError as exc:
        if not (parallel and distributed.is_peer_failure(exc)):
            raise
        # The runner names the rank that went away (fastrl.run.rank_heartbeat); the weights are those of
        # the last update every rank made, so the final checkpoint below is sound.
        stopping.peer_lost = True
        set_error(arena, f"{PEER_FAILURE} ({str(exc).splitlines()[0][:200]})")
    finally:
        try:
            if stopping.leaving(runtime.progress()):
                # Every rank reached the same final update: record that their weights agree.
                runtime.first.extra_state["param_digests"] = distributed.gather_digests(learner.model)
                runtime.first.extra_state["world_size"] = dist_info.world_size
        finally:
            if not checkpoint_failed:
                try:
                    runtime.checkpoint()
                except CheckpointError as exc:
                    set_error(arena, str(exc))
        if parallel:
            distributed.close_group()
        arena.close()
