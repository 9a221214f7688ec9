"""The Ape-X DQN learner (fastrl.learner.dqn): its replay and target network as configured, the
replay ratio, target refreshes, arrival priorities by hand, double Q, checkpoints; restarted and
dropped streams in its replay; several ranks meeting in the same collectives; one copy of the
sampled frames to the device."""
import io
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist

from fastrl.config import build_config
from fastrl.distributed import process_group as distributed
from fastrl.learner import PRIORITY_EPS, DQNLearner, Trajectories, VTraceLearner, make_learner
from fastrl.models.networks import DuelingQNetwork
from tests.support.device_copies import DeviceCopies
from tests.support.small_learners import (
    ACTION_SPACE,
    OBS_SPACE,
    E,
    T,
    dqn_config,
    make_dqn,
    perturb,
    reference_windows,
    same_weights,
    stream_batches,
    vtrace_replay_config,
)

# ---------------------------------------------------------------- the DQN learner


def test_the_replays_and_make_learner_follow_the_config():
    cfg = dqn_config(**{"learner.gamma": 0.95, "replay.n_step": 5, "replay.alpha": 0.7})
    learner = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    rc = learner.replay.settings
    assert ((rc.capacity, rc.min_fill, rc.alpha, rc.beta, rc.n_step, learner.replay.gamma)
            == (256, 64, 0.7, 0.4, 5, 0.95))
    assert rc.compress == "" and rc.memmap_dir == ""  # "": off
    sequences = make_learner(vtrace_replay_config(0.5, 1), OBS_SPACE, ACTION_SPACE).replay
    assert sequences.horizon == sequences.stride == T
    assert isinstance(learner, DQNLearner) and isinstance(learner.model, DuelingQNetwork)
    assert learner.replay.num_streams == E and learner.replay.horizon == 5
    assert not any(p.requires_grad for p in learner.target.parameters())
    assert type(make_learner(build_config("cartpole-appo"), OBS_SPACE, ACTION_SPACE)) is VTraceLearner


def test_a_non_finite_reward_is_dropped_and_counted_as_a_skipped_update():
    learner = make_dqn()
    (batch, env_ids), = stream_batches(1)
    batch.rewards[2, 1] = float("nan")
    learner.train(batch, env_ids=env_ids)
    assert learner.version == 1
    assert (learner.skipped_updates, learner.consecutive_skips) == (1, 1)
    assert len(learner.replay) == 0  # nothing that could poison later batches was stored
    assert all(torch.isfinite(p).all() for p in learner.model.parameters())


def test_arrival_priorities_are_n_step_double_q_td_errors():
    learner = make_dqn(**{"learner.reward_scale": 0.5})
    perturb(learner.target)  # online and target differ: double Q matters
    (batch, env_ids), = stream_batches(1, seed=3, p_terminate=0.15, p_truncate=0.1)
    gamma, n = learner.cfg.learner.gamma, learner.cfg.replay.n_step
    with torch.no_grad():
        flat = batch.obs.reshape(-1, 4)
        online = learner.model(flat)[0].double().reshape(T + 1, E, 2).numpy()
        target = learner.target(flat)[0].double().reshape(T + 1, E, 2).numpy()
    rewards = 0.5 * batch.rewards.double().numpy()
    returns, discounts, ends = reference_windows(rewards, batch.terminated.numpy(), batch.truncated.numpy(), gamma, n)
    expected = np.zeros((T, E))
    for t in range(T):
        for b in range(E):
            end = ends[t, b]
            bootstrap = target[end, b, online[end, b].argmax()]
            td = returns[t, b] + discounts[t, b] * bootstrap - online[t, b, batch.actions[t, b]]
            expected[t, b] = abs(td) + PRIORITY_EPS
    got = learner.arrival_priorities(batch, learner.transformed_rewards(batch.rewards))
    assert got.dtype == np.float64 and got.shape == (T, E)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    # train() hands them to the replay: record t of env e sits in slot e * L + t and holds p^alpha
    # once record t + n is written, if its action was taken (no gradient step yet: min_fill).
    learner.train(batch, env_ids=env_ids)
    assert learner.updates == 0
    alpha, ring = learner.cfg.replay.alpha, learner.replay.ring_len
    for col, env in enumerate(env_ids):
        tree = learner.replay.priorities(env * ring + np.arange(T))
        sampleable = batch.valid[:, col].numpy() & (np.arange(T) <= T - 1 - n)
        np.testing.assert_allclose(tree, np.where(sampleable, expected[:, col] ** alpha, 0.0), rtol=1e-5,
                                   atol=1e-6)


def test_max_arrival_priority_stores_the_largest_priority_seen_without_a_forward_pass(monkeypatch):
    learner = make_dqn(**{"replay.arrival_priority": "max"})
    monkeypatch.setattr(learner, "arrival_priorities", lambda *a: pytest.fail("max needs no TD errors"))
    learner.replay._max_priority = 3.0  # as if an update had set a priority of 3
    (batch, env_ids), = stream_batches(1, seed=3, p_terminate=0.15, p_truncate=0.1)
    learner.train(batch, env_ids=env_ids)
    alpha, ring, n = learner.cfg.replay.alpha, learner.replay.ring_len, learner.cfg.replay.n_step
    for col, env in enumerate(env_ids):
        sampleable = batch.valid[:, col].numpy() & (np.arange(T) <= T - 1 - n)
        np.testing.assert_allclose(learner.replay.priorities(env * ring + np.arange(T)),
                                   np.where(sampleable, 3.0 ** alpha, 0.0))


def test_bfloat16_runs_the_encoder_in_bf16_and_the_q_heads_targets_and_loss_in_float32():
    full, half = make_dqn(), make_dqn(**{"learner.precision": "bfloat16"})
    perturb(full.target)
    half.model.load_state_dict(full.model.state_dict())
    half.target.load_state_dict(full.target.state_dict())
    (batch, env_ids), = stream_batches(1, seed=3, p_terminate=0.15)
    obs = batch.obs.reshape(-1, 4)
    with half.autocast():
        features = half.model.encode(obs)
        q, best = half.model(obs)
    assert features.dtype == torch.bfloat16 and q.dtype == best.dtype == torch.float32
    rewards = full.transformed_rewards(batch.rewards)
    exact, rounded = full.arrival_priorities(batch, rewards), half.arrival_priorities(batch, rewards)
    assert rounded.dtype == np.float64 and not np.array_equal(exact, rounded)  # the encoder did run in bf16
    np.testing.assert_allclose(rounded, exact, rtol=0.05, atol=0.02)
    for learner in (full, half):  # the same records: both replays (seeded alike) draw the same sample
        for batch, env_ids in stream_batches(3, p_terminate=0.3):
            learner.replay.add(np.repeat(env_ids, T), batch.obs[:T].transpose(0, 1).reshape(-1, 4).numpy(),
                               batch.actions.T.reshape(-1).numpy(), batch.rewards.T.reshape(-1).numpy(),
                               batch.terminated.T.reshape(-1).numpy(), batch.truncated.T.reshape(-1).numpy())
    (exact_loss, _, exact_td), (rounded_loss, _, rounded_td) = full.loss(full.sample()), half.loss(half.sample())
    assert rounded_loss.dtype == rounded_td.dtype == torch.float32
    assert rounded_loss.item() == pytest.approx(exact_loss.item(), rel=0.05)
    torch.testing.assert_close(rounded_td, exact_td, rtol=0.05, atol=0.02)
    rounded_loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in half.model.parameters())


def test_train_needs_env_ids_of_the_right_shape():
    learner = make_dqn()
    (batch, env_ids), = stream_batches(1)
    with pytest.raises(ValueError, match="needs env_ids"):
        learner.train(batch)
    with pytest.raises(ValueError, match=r"env_ids must have shape \[4\], got \[3\]"):
        learner.train(batch, env_ids=env_ids[:3])
    with pytest.raises(ValueError, match=r"env_ids must have shape \[4\]"):
        learner.train(batch, env_ids=env_ids[None])
    assert learner.version == 0 and learner.replay.added == 0


def test_state_dict_round_trip_restores_networks_and_counters():
    learner = make_dqn()
    for batch, env_ids in stream_batches(4):
        learner.train(batch, env_ids=env_ids)
    assert learner.updates == 4 and learner.version == 4  # 4 % 3: the target lags the model
    assert not same_weights(learner.model, learner.target)
    buffer = io.BytesIO()
    torch.save(learner.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)

    restored = make_dqn(seed=123)
    assert not same_weights(restored.model, learner.model)
    restored.load_state_dict(state)
    assert same_weights(restored.model, learner.model) and same_weights(restored.target, learner.target)
    assert (restored.version, restored.updates, restored.skipped_updates) == (4, 4, 0)
    mine, theirs = learner.optimizer.state_dict()["state"], restored.optimizer.state_dict()["state"]
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k]["exp_avg"], theirs[k]["exp_avg"]) for k in mine)

    # A checkpoint without a target network (older runs) starts the target from the model.
    legacy = {k: v for k, v in state.items() if k != "target"}
    older = make_dqn(seed=7)
    older.load_state_dict(legacy)
    assert same_weights(older.target, learner.model)


def constant_q(learner):
    """Q independent of the observation: online [0.5, -0.5], target [-1, 1]."""
    with torch.no_grad():
        for net, bias in ((learner.model, [1.0, 0.0]), (learner.target, [0.0, 2.0])):
            net.policy.weight.zero_()
            net.value.weight.zero_()
            net.value.bias.zero_()
            net.policy.bias.copy_(torch.tensor(bias))


@pytest.mark.parametrize("double_q, bootstrap", [(True, -1.0), (False, 1.0)])
def test_double_q_lets_the_online_network_pick_and_the_target_rate(double_q, bootstrap):
    learner = make_dqn(**{"learner.double_q": double_q})
    constant_q(learner)
    next_obs = torch.randn(6, 4)
    torch.testing.assert_close(learner.bootstrap_values(next_obs), torch.full((6,), bootstrap))

    # Arrival priorities use the same rule: 1-step, no dones, zero rewards, action 0 (Q = 0.5).
    learner.rcfg.n_step = 1
    batch = Trajectories(
        obs=torch.randn(3, 1, 4), actions=torch.zeros(2, 1, dtype=torch.int64), behaviour_logp=torch.zeros(2, 1),
        rewards=torch.zeros(2, 1), terminated=torch.zeros(2, 1, dtype=torch.bool),
        truncated=torch.zeros(2, 1, dtype=torch.bool), valid=torch.ones(2, 1, dtype=torch.bool),
        version=torch.zeros(2, 1, dtype=torch.int64))
    gamma = learner.cfg.learner.gamma
    np.testing.assert_allclose(learner.arrival_priorities(batch, batch.rewards),
                               np.full((2, 1), abs(gamma * bootstrap - 0.5) + PRIORITY_EPS), rtol=1e-6)

    # Random networks: compare with the formula row by row.
    perturb(learner.model, scale=0.5, seed=2)
    perturb(learner.target, scale=0.5, seed=3)
    obs = torch.randn(64, 4)
    with torch.no_grad():
        online, target = learner.model(obs)[0], learner.target(obs)[0]
    picked = target.gather(-1, (online if double_q else target).argmax(-1, keepdim=True)).squeeze(-1)
    torch.testing.assert_close(learner.bootstrap_values(obs), picked)


# --- a worker restart: the env's stream restarts in the replay --------------------------------


def test_a_fresh_trajectory_restarts_only_its_own_stream_in_arrival_order():
    learner = make_dqn()
    (first, ids_first), (second, ids_second) = stream_batches(2)
    learner.train(first, env_ids=ids_first, fresh=np.ones(E, bool))  # run start: nothing to cut
    L, n = learner.replay.ring_len, learner.cfg.replay.n_step
    assert learner.replay.stream_length(0) == T
    assert learner.replay._valid[:T].sum() == first.valid[:, ids_first == 0].sum()
    fresh = ids_second == 0  # env 0's worker restarted: its second trajectory begins a new episode
    learner.train(second, env_ids=ids_second, fresh=fresh)
    valid = learner.replay._valid
    assert not valid[T - n:T].any()  # env 0's last n records before the restart
    assert valid[T] and learner.replay._first[T]  # its first record after the restart
    for env in range(1, E):  # every other stream continues untouched
        column = int(np.flatnonzero(ids_second == env)[0])
        assert np.array_equal(valid[env * L + T:env * L + 2 * T], second.valid[:, column].numpy())
        first_column = int(np.flatnonzero(ids_first == env)[0])
        assert valid[env * L + T - n:env * L + T].tolist() == first.valid[T - n:, first_column].tolist()


# --- a dropped batch: its envs' streams restart in the replay ---------------------------------


def test_a_dropped_batch_restarts_its_envs_streams_so_no_window_spans_the_gap():
    learner = make_dqn()
    gamma = learner.cfg.learner.gamma
    (first, ids0), (dropped, ids1), (third, ids2) = stream_batches(3, seed=5)
    ended_env = int(ids1[2])  # its last dropped step ends an episode: the next record is an autoreset step
    dropped.terminated[-1, 2], dropped.truncated[-1, 2] = True, False
    third.valid[0, int(np.flatnonzero(ids2 == ended_env)[0])] = False
    # The truth, per env and stream time: obs -> (env, time), rewards, dones, valid.
    where, rewards, done, valid = {}, np.zeros((E, 3 * T)), np.zeros((E, 3 * T), bool), np.zeros((E, 3 * T), bool)
    for k, (batch, env_ids) in enumerate(((first, ids0), (dropped, ids1), (third, ids2))):
        for col, env in enumerate(env_ids):
            times = slice(k * T, (k + 1) * T)
            for t in range(T + 1):
                where[batch.obs[t, col].numpy().tobytes()] = (env, k * T + t)
            rewards[env, times] = batch.rewards[:, col].numpy()
            done[env, times] = (batch.terminated[:, col] | batch.truncated[:, col]).numpy()
            valid[env, times] = batch.valid[:, col].numpy()
    dropped.rewards[3, 1] = float("nan")

    learner.train(first, env_ids=ids0)
    learner.train(dropped, env_ids=ids1)
    assert learner.skipped_updates == 1 and len(learner.replay) == T * E
    learner.train(third, env_ids=ids2)
    assert learner.updates == 0 and len(learner.replay) == 2 * T * E  # min_fill reached, no step yet

    sample = learner.replay.sample(4000, rng=0)
    starts = {where[o.tobytes()] for o in sample.obs}
    assert len(starts) > 20 and all(valid[env, t] and t // T != 1 for env, t in starts)
    assert (ended_env, 2 * T) not in starts  # the autoreset step after the gap is never a transition
    for b in range(len(sample.indices)):
        env, t = where[sample.obs[b].tobytes()]
        m = int(sample.bootstrap_steps[b])
        assert where[sample.next_obs[b].tobytes()] == (env, t + m), (env, t, m)  # no window spans the gap
        assert not done[env, t:t + m - 1].any()
        np.testing.assert_allclose(sample.returns[b], sum(gamma ** k * rewards[env, t + k] for k in range(m)),
                                   rtol=1e-5)


# --- several ranks: the same collectives on every rank -----------------------------------------


class ThreadRanks:
    """torch.distributed.all_reduce between threads, one thread per rank, logging each rank's
    collectives. A rank that makes a collective its peers do not waits at the barrier and times
    out: the hang of a real multi-rank run, turned into an error."""

    def __init__(self, world_size: int, timeout_s: float = 5.0):
        self.barrier = threading.Barrier(world_size, timeout=timeout_s)
        self.local = threading.local()
        self.inputs = [None] * world_size
        self.log = [[] for _ in range(world_size)]  # per rank: (op, shape) of each all-reduce

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM):
        rank = self.local.rank
        self.log[rank].append((str(op), tuple(tensor.shape)))
        self.inputs[rank] = tensor.clone()
        self.barrier.wait()
        stacked = torch.stack(self.inputs)
        reduced = stacked.amax(0) if op == dist.ReduceOp.MAX else stacked.sum(0)
        self.barrier.wait()  # every rank has read the inputs before one writes its next
        tensor.copy_(reduced)

    def run(self, *per_rank) -> None:
        """Call ``per_rank[r]()`` on rank ``r``'s thread; re-raise the first error."""
        errors = []

        def target(rank, work):
            self.local.rank = rank
            try:
                work()
            except BaseException as exc:
                errors.append(exc)
                self.barrier.abort()  # the peers' waits fail at once

        threads = [threading.Thread(target=target, args=(rank, work)) for rank, work in enumerate(per_rank)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]


def two_synced_dqn_ranks(monkeypatch):
    """Two DQN learners from the same weights (as after broadcast_parameters), each with the real
    GradientAverager over a ThreadRanks all-reduce."""
    ranks = ThreadRanks(2)
    monkeypatch.setattr(dist, "all_reduce", ranks.all_reduce)
    learners = [make_dqn(seed=0), make_dqn(seed=0)]
    for learner in learners:
        learner.grad_sync = distributed.GradientAverager(learner.model, world_size=2)
    return ranks, learners


def feed(learner, batches):
    return lambda: [learner.train(batch, env_ids=env_ids) for batch, env_ids in batches]


def test_dqn_ranks_make_the_same_collectives_when_one_drops_a_batch(monkeypatch):
    ranks, learners = two_synced_dqn_ranks(monkeypatch)
    batches = [stream_batches(6, seed=0), stream_batches(6, seed=1)]
    batches[1][3][0].rewards[2, 1] = float("nan")  # rank 1 drops its 4th batch, and lags 32 records from then on
    ranks.run(*(feed(learner, rank_batches) for learner, rank_batches in zip(learners, batches)))

    # Per batch one plan (a MAX), then one gradient all-reduce (a SUM) per agreed step. Rank 0 skips
    # rank 1's dropped batch with it, then takes the 2 steps rank 1 may take where its own ratio allows 4.
    assert ranks.log[0] == ranks.log[1]
    assert [op for op, _ in ranks.log[0]].count(str(dist.ReduceOp.MAX)) == 6 and len(ranks.log[0]) == 6 + 6
    first, second = learners
    assert learners[0].replay.added == learners[1].replay.added + T * E
    assert first.ratio.allowed_batches(first.replay.added, first.replayed_batches) == 2  # owed to rank 0
    for learner in learners:
        assert (learner.updates, learner.skipped_updates, learner.version) == (6, 1, 6)
    assert same_weights(first.model, second.model) and same_weights(first.target, second.target)


def test_a_rank_with_nothing_to_sample_still_meets_its_peers_step(monkeypatch):
    ranks, learners = two_synced_dqn_ranks(monkeypatch)
    sample, calls = learners[1].replay.sample, []

    def miss_once(size, **kwargs):
        calls.append(size)
        return None if len(calls) == 1 else sample(size, **kwargs)

    monkeypatch.setattr(learners[1].replay, "sample", miss_once)
    ranks.run(*(feed(learner, stream_batches(3, seed=rank)) for rank, learner in enumerate(learners)))
    assert ranks.log[0] == ranks.log[1] and len(ranks.log[0]) == 3 + 2
    for learner in learners:  # the first step was skipped on both ranks, the second taken on both
        assert (learner.updates, learner.skipped_updates) == (1, 1)
    assert same_weights(learners[0].model, learners[1].model)


# ---------------------------------------------------------------- copies to the device


def reference_loss(learner, sample):
    """The loss as written before the frames were copied once: obs and next_obs from the host."""
    to = lambda values: torch.from_numpy(np.ascontiguousarray(values))  # noqa: E731
    next_q = learner.target(to(sample.next_obs))[0]
    best = learner.model(to(sample.next_obs))[0].argmax(-1, keepdim=True)
    targets = to(sample.returns) + to(sample.discounts) * next_q.gather(-1, best).squeeze(-1)
    taken = learner.model(to(sample.obs))[0].gather(-1, to(sample.actions)[:, None]).squeeze(-1)
    return (to(sample.weights) * torch.nn.functional.smooth_l1_loss(taken, targets, reduction="none")).mean()


def test_an_update_copies_the_sampled_frames_to_the_device_once_into_the_same_loss():
    """The device path (forced on the CPU): one copy of the frames for obs and next_obs (n = 3,
    windows cut short by dones, so next_obs is a gather), one per other field, and the loss of
    the former host-side obs / next_obs; samples are drawn into the learner's one frames buffer."""
    torch.manual_seed(0)
    learner = DQNLearner(dqn_config(**{"replay.n_step": 3}), OBS_SPACE, ACTION_SPACE,
                         device_path=True)
    perturb(learner.target, seed=4)
    for batch, env_ids in stream_batches(3, p_terminate=0.3):
        learner.replay.add(np.repeat(env_ids, T), batch.obs[:T].transpose(0, 1).reshape(-1, 4).numpy(),
                           batch.actions.T.reshape(-1).numpy(), batch.rewards.T.reshape(-1).numpy(),
                           batch.terminated.T.reshape(-1).numpy(), batch.truncated.T.reshape(-1).numpy())
    sample = learner.sample()
    assert sample.frames is learner.frames_out and (sample.bootstrap_steps < 3).any()
    with DeviceCopies() as copies:
        loss, _, _ = learner.loss(sample)
    assert sorted(copies.shapes) == sorted([learner.frames_out.shape] + [(32,)] * 4)
    torch.testing.assert_close(loss, reference_loss(learner, sample))
    assert learner.sample().frames is learner.frames_out
