"""R2D2: value rescaling and its inverse, sequence priorities by the formula, stored states at
sequence starts in the replay, burn-in steps without loss or gradient, resets inside a sequence,
the config rules, and a short run end to end (train -> checkpoint -> eval)."""

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import ConfigError, ReplayConfig, build_config, validate
from fastrl.learner import R2D2Learner, make_learner
from fastrl.learner.base import unroll
from fastrl.learner.losses import inverse_value_rescale, sequence_priorities, value_rescale
from fastrl.replay.buffer import SequenceBatch, SequenceReplay

OBS_SPACE = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACTION_SPACE = gymnasium.spaces.Discrete(2)


def r2d2_config(**overrides):
    base = {"env.num_workers": 1, "env.envs_per_worker": 4, "env.num_splits": 1, "learner.rollout": 4,
            "learner.batch_size": 16, "replay.capacity": 256, "replay.min_fill": 8, "replay.sequence_length": 8,
            "replay.burn_in": 3, "replay.batch_size": 4, "model.core_size": 16, "device": "cpu"}
    return build_config("cartpole-r2d2", {**base, **overrides})


def test_value_rescaling_round_trips_and_matches_the_formula():
    x = torch.tensor([-1e6, -1234.5, -3.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 1.0, 7.0, 1e4, 1e6], dtype=torch.float64)
    eps = 1e-3
    expected = torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x
    assert torch.allclose(value_rescale(x), expected, rtol=0, atol=1e-12)
    assert torch.allclose(inverse_value_rescale(value_rescale(x)), x, rtol=1e-9, atol=1e-9)
    assert torch.allclose(value_rescale(inverse_value_rescale(x)), x, rtol=1e-9, atol=1e-9)


def test_sequence_priorities_follow_the_formula_over_trained_steps():
    g = torch.Generator().manual_seed(0)
    td = torch.randn(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) < 0.7
    mask[:, 3] = False  # a sequence with no trained step
    got = sequence_priorities(td, mask.float())
    for b in range(5):
        trained = td[mask[:, b], b].abs()
        want = 0.0 if trained.numel() == 0 else 0.9 * trained.max() + 0.1 * trained.mean()
        assert float(got[b]) == pytest.approx(float(want), abs=1e-6)


def test_the_replay_keeps_the_state_each_sequence_started_with():
    settings = ReplayConfig(capacity=64, min_fill=1, alpha=0.0)
    replay = SequenceReplay(settings, sequence_length=8, sequence_stride=4, num_streams=2, obs_shape=(1,),
                            obs_dtype=np.float32, seed=0, state_size=3)
    records = 24
    for stream in range(2):
        t = np.arange(records)
        states = np.stack([t * 10 + stream, -t, np.full(records, stream)], axis=1).astype(np.float32)
        replay.add(np.full(records, stream), t[:, None].astype(np.float32), np.zeros(records, np.int64),
                   np.zeros(records, np.float32), np.zeros(records, bool), np.zeros(records, bool),
                   np.zeros(records, np.float32), states=states)
    sample = replay.sample(64)
    first_obs = sample.obs[0, :, 0]  # the record index t of each sequence's first step
    assert (first_obs % 4 == 0).all()
    stream = sample.initial_state[:, 2]
    np.testing.assert_array_equal(sample.initial_state[:, 0], first_obs * 10 + stream)
    np.testing.assert_array_equal(sample.initial_state[:, 1], -first_obs)
    with pytest.raises(ValueError, match="states"):
        replay.add([0], np.zeros((1, 1), np.float32), [0], [0.0], [False], [False], [0.0])


def test_unroll_runs_burn_in_steps_without_gradient():
    cfg = r2d2_config()
    learner = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    model = learner.model
    obs = torch.randn(9, 4, 3)
    starts = torch.zeros(9, 4, dtype=torch.bool)
    q, _ = unroll(model, obs, model.initial_state(4), starts, burn_in=3)
    params = list(model.parameters())
    burn_grads = torch.autograd.grad(q[:3].sum(), params, allow_unused=True, retain_graph=True)
    assert all(g is None or not g.any() for g in burn_grads)  # no gradient reaches the weights
    trained_grads = torch.autograd.grad(q[3:].sum(), params, allow_unused=True)
    assert any(g is not None and g.any() for g in trained_grads)
    # Same values as one unroll: burn-in changes where gradients flow, not the outputs.
    with torch.no_grad():
        whole, _, _ = model(obs, model.initial_state(4), starts)
    torch.testing.assert_close(q.detach(), whole)


def sequence_sample(cfg, learner, seed=0, episode_end_at=None):
    L, B = cfg.replay.sequence_length, cfg.replay.batch_size
    rng = np.random.default_rng(seed)
    terminated = np.zeros((L, B), bool)
    valid = np.ones((L, B), bool)
    if episode_end_at is not None:
        terminated[episode_end_at] = True
        valid[episode_end_at + 1] = False  # the autoreset step
    return SequenceBatch(
        obs=rng.standard_normal((L + 1, B, 3)).astype(np.float32), actions=rng.integers(0, 2, (L, B)),
        behaviour_logp=np.zeros((L, B), np.float32), rewards=rng.standard_normal((L, B)).astype(np.float32),
        terminated=terminated, truncated=np.zeros((L, B), bool), valid=valid, indices=np.arange(B),
        generations=np.zeros(B, np.int64), weights=np.ones(B, np.float32),
        initial_state=rng.standard_normal((B, learner.model.state_size)).astype(np.float32))


def test_burn_in_steps_carry_no_loss():
    cfg = r2d2_config()
    learner = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    assert isinstance(learner, R2D2Learner)
    sample = sequence_sample(cfg, learner)
    loss, _, priorities = learner.loss(sample)
    changed = sequence_sample(cfg, learner)
    burn_in = cfg.replay.burn_in
    changed.actions[:burn_in] = 1 - changed.actions[:burn_in]
    changed.rewards[:burn_in] += 100.0
    loss2, _, priorities2 = learner.loss(changed)
    assert float(loss2.detach()) == pytest.approx(float(loss.detach()), rel=1e-6)
    torch.testing.assert_close(priorities2, priorities)
    # ... while a trained step's reward does change it.
    changed.rewards[burn_in] += 100.0
    assert float(learner.loss(changed)[0].detach()) != pytest.approx(float(loss.detach()), rel=1e-3)


def test_a_sequence_crossing_an_episode_end_resets_the_state_there():
    cfg = r2d2_config()
    learner = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    sample = sequence_sample(cfg, learner, episode_end_at=4)  # step 5 is the autoreset step: episode starts at 6
    obs = torch.from_numpy(sample.obs)
    starts = torch.zeros(obs.shape[:2], dtype=torch.bool)
    starts[1:] = ~torch.from_numpy(sample.valid)
    with torch.no_grad():
        q, _, _ = learner.model(obs, torch.from_numpy(sample.initial_state), starts)
        fresh, _, _ = learner.model(obs[6:], learner.model.initial_state(obs.shape[1]), None)
    torch.testing.assert_close(q[6:], fresh)  # nothing of the old episode leaks into the new one


def test_targets_bootstrap_from_the_online_networks_pick_or_without_double_q_the_targets_max():
    for double_q in (True, False):
        cfg = r2d2_config(**{"learner.double_q": double_q, "replay.n_step": 1})
        learner = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():  # two unrelated networks, so that their argmaxes differ
            for network in (learner.model, learner.target):
                for p in network.parameters():
                    p.copy_(torch.randn(p.shape, generator=g))
        sample = sequence_sample(cfg, learner, seed=1)  # no episode end: one state unroll per sequence
        _, stats, _ = learner.loss(sample)
        obs, state = torch.from_numpy(sample.obs), torch.from_numpy(sample.initial_state)
        with torch.no_grad():
            online = learner.model(obs, state, None)[0]  # [L + 1, B, A]
            target = learner.target(obs, state, None)[0]
        L, B = sample.rewards.shape
        picks_differ = False
        for t in range(cfg.replay.burn_in, L):
            for b in range(B):
                next_online, next_target = online[t + 1, b], target[t + 1, b]
                picks_differ |= int(next_online.argmax()) != int(next_target.argmax())
                bootstrap = next_target[next_online.argmax()] if double_q else next_target.max()
                y = value_rescale(sample.rewards[t, b] + cfg.learner.gamma * inverse_value_rescale(bootstrap))
                td = float(y) - float(online[t, b, sample.actions[t, b]])
                assert float(stats["td"][t, b]) == pytest.approx(td, rel=1e-4, abs=1e-5), (double_q, t, b)
        assert picks_differ  # the two rules give different targets on this sample


def state_batch(T: int, B: int, state_size: int, g: torch.Generator, rewards=None):
    """A ``[T, B]`` batch of random 3-value observations and actions, with each env's starting
    state; random rewards unless ``rewards`` are given."""
    from fastrl.learner import Trajectories
    obs, actions = torch.randn(T + 1, B, 3, generator=g), torch.randint(0, 2, (T, B), generator=g)
    rewards = torch.randn(T, B, generator=g) if rewards is None else rewards
    return Trajectories(obs=obs, actions=actions, behaviour_logp=torch.zeros(T, B), rewards=rewards,
                        terminated=torch.zeros(T, B, dtype=torch.bool), truncated=torch.zeros(T, B, dtype=torch.bool),
                        valid=torch.ones(T, B, dtype=torch.bool), version=torch.zeros(T, B, dtype=torch.int64),
                        initial_state=torch.randn(B, state_size, generator=g))


def test_the_device_path_samples_into_its_staging_buffer_and_reads_back_once_per_step():
    """R2D2's device path (forced on the CPU): the sampled observations land in the staging
    buffer, a gradient step makes one copy to the device and two host reads (the gradient norm,
    then the priorities with the statistics), and it computes what the CPU path computes."""
    from fastrl.ipc.sync_counter import SyncCounter, optimizer_steps
    cfg = r2d2_config(**{"replay.replay_ratio": 1.0})
    learners = []
    for device_path in (False, True):
        torch.manual_seed(0)
        learner = R2D2Learner(cfg, OBS_SPACE, ACTION_SPACE, device_path=device_path)
        learner.model.core.use_kernel = learner.target.core.use_kernel = False  # a GPU's LSTM: torch ops
        learners.append(learner)
    cpu, device = learners
    T, B = cfg.learner.rollout, 4
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        batch = state_batch(T, B, cpu.model.state_size, g)
        for learner in learners:
            learner.train(batch, env_ids=np.arange(B))
    sample = device.sample()
    assert np.shares_memory(sample.obs, device.transfer.inputs.host_np)
    for learner in learners:
        learner.replay.update_priorities(sample.indices, sample.generations, np.ones(len(sample.indices)))
    expected = cpu.loss(sample)
    got = device.loss(sample)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[2], expected[2])

    copies = []
    to_device = device.transfer.to_device
    device.transfer.to_device = lambda arrays: copies.append(len(arrays)) or to_device(arrays)
    with SyncCounter(host=optimizer_steps(device.optimizer)) as counter:
        stats = device.update()
    assert stats is not None and np.isfinite(stats["loss"]) and np.isfinite(stats["grad_norm"])
    assert copies == [9]  # obs, state, starts, mask, returns, discounts, ends, actions, weights: one copy
    assert counter.total == 2, counter.syncs


@pytest.mark.parametrize("overrides, message", [
    ({"model.core": "none"}, "model.core=lstm or gru"),
    ({"replay.burn_in": 8}, "replay.burn_in"),
    ({"learner.algo": "dqn"}, "r2d2"),
])
def test_bad_r2d2_settings_name_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(r2d2_config(**overrides))


def test_r2d2_refuses_continuous_actions():
    with pytest.raises(ValueError, match="Discrete"):
        make_learner(r2d2_config(), OBS_SPACE, gymnasium.spaces.Box(-1, 1, (2,), np.float32))
