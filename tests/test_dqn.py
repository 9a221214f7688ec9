"""Ape-X DQN: exploration rates, epsilon-greedy log-probs, n-step windows of trajectories (the
shared kernel) against a brute-force loop, the dueling head, arrival priorities in the replay,
the DQN learner (replay ratio, target refresh, priorities by hand, checkpoints), V-trace replay
in the learner, and the replay config."""
import copy
import io
import math
import threading

import gymnasium
import numpy as np
import pytest
import torch
import torch.distributed as dist

from fastrl import distributed
from fastrl.config import ConfigError, ReplayConfig, build_config, load_run_config, to_toml
from fastrl.kernels import nstep_targets
from fastrl.inference import apex_epsilons, batcher_epsilons, epsilon_greedy
from fastrl.learner import PRIORITY_EPS, DQNLearner, Learner, Trajectories, make_learner
from fastrl.models import ActorCritic, DuelingQNetwork, build_model
from fastrl.replay import ReplayRatio, TransitionReplay
from tests.autoreset import nstep_episodes_reference
from tests.device_copies import DeviceCopies

OBS_SPACE = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = gymnasium.spaces.Discrete(2)
T, E = 8, 4  # rollout and envs of the small learner configs


# ---------------------------------------------------------------- references and helpers


def reference_windows(rewards, terminated, truncated, gamma, n):
    """Brute force over each env's episodes (tests.autoreset): the step after a done is the
    autoreset step (its action was discarded), with an empty window."""
    done = terminated | truncated
    valid = np.ones_like(done)
    valid[1:] = ~done[:-1]
    return nstep_episodes_reference(rewards, terminated, truncated, valid, gamma, n)


def stream_batches(num_batches, seed=0, p_terminate=0.1, p_truncate=0.05, obs_dim=4, num_actions=2):
    """``num_batches`` consecutive ``[T, B=E]`` batches cut from one continuous stream per env, each
    batch's columns in a different env order. ``valid`` follows NEXT_STEP autoreset (the step after
    a done is invalid), so a replay rebuilds exactly these columns. Returns [(batch, env_ids)]."""
    g = torch.Generator().manual_seed(seed)
    steps = num_batches * T
    obs = torch.randn(steps + 1, E, obs_dim, generator=g)
    actions = torch.randint(0, num_actions, (steps, E), generator=g)
    logp = -torch.rand(steps, E, generator=g)
    rewards = torch.randn(steps, E, generator=g)
    terminated = torch.rand(steps, E, generator=g) < p_terminate
    truncated = (torch.rand(steps, E, generator=g) < p_truncate) & ~terminated
    done = terminated | truncated
    valid = torch.ones(steps, E, dtype=torch.bool)
    valid[1:] = ~done[:-1]
    rng = np.random.default_rng(seed)
    out = []
    for k in range(num_batches):
        env_ids = rng.permutation(E)
        rows = slice(k * T, (k + 1) * T)
        cols = torch.from_numpy(env_ids)
        out.append((Trajectories(
            obs=obs[k * T:(k + 1) * T + 1][:, cols].clone(), actions=actions[rows][:, cols].clone(),
            behaviour_logp=logp[rows][:, cols].clone(), rewards=rewards[rows][:, cols].clone(),
            terminated=terminated[rows][:, cols].clone(), truncated=truncated[rows][:, cols].clone(),
            valid=valid[rows][:, cols].clone(), version=torch.full((T, E), k, dtype=torch.int64)), env_ids))
    return out


def dqn_config(**overrides):
    return build_config("cartpole-dqn", {
        "env.num_workers": 1, "env.envs_per_worker": E, "env.num_splits": 1, "learner.rollout": T,
        "learner.batch_size": T * E, "replay.capacity": 64 * E, "replay.min_fill": 64, "replay.batch_size": 32,
        "replay.replay_ratio": 2.0, "learner.target_update_every": 3, **overrides})


def make_dqn(seed=0, **overrides):
    torch.manual_seed(seed)
    return DQNLearner(dqn_config(**overrides), OBS_SPACE, ACTION_SPACE)


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def perturb(module, scale=0.1, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


# ---------------------------------------------------------------- exploration


def test_apex_epsilons_follow_the_paper_formula():
    brute = np.array([0.4 ** (1 + 7 * i / 7) for i in range(8)])
    eps = apex_epsilons(8, 0.4, 7.0)
    assert eps.dtype == np.float32 and eps.shape == (8,)
    np.testing.assert_allclose(eps, brute, rtol=1e-6)
    assert eps[0] == np.float32(0.4) and np.all(np.diff(eps) < 0)
    # A rank's slice of a larger numbering matches the whole.
    np.testing.assert_array_equal(apex_epsilons(3, 0.4, 7.0, first=5, total=8), eps[5:])
    np.testing.assert_allclose(apex_epsilons(4, 0.3, 2.0, first=4, total=12),
                               [0.3 ** (1 + 2 * i / 11) for i in range(4, 8)], rtol=1e-6)
    np.testing.assert_array_equal(apex_epsilons(1, 0.4, 7.0), [np.float32(0.4)])


def test_batcher_epsilons_number_envs_across_ranks(monkeypatch):
    cfg = build_config("cartpole-dqn", {"env.num_workers": 2, "env.envs_per_worker": 4, "env.num_splits": 2,
                                        "learner.batch_size": 64, "replay.capacity": 1000, "replay.min_fill": 10})
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    eps = batcher_epsilons(cfg)
    assert eps.shape == (2, 4)
    np.testing.assert_array_equal(eps.reshape(-1), apex_epsilons(16, 0.4, 7.0)[8:])
    assert batcher_epsilons(build_config("cartpole-appo")) is None


def test_epsilon_greedy_with_no_exploration_is_greedy_and_certain():
    torch.manual_seed(0)
    q = torch.randn(2000, 5)
    actions, logp = epsilon_greedy(q, torch.zeros(2000))
    assert actions.dtype == torch.int64
    torch.testing.assert_close(actions, q.argmax(-1), rtol=0, atol=0)
    assert torch.all(logp == 0.0)


def test_epsilon_greedy_with_full_exploration_is_uniform():
    torch.manual_seed(0)
    rows, n = 20000, 4
    q = torch.randn(rows, n)
    actions, logp = epsilon_greedy(q, torch.ones(rows))
    counts = torch.bincount(actions, minlength=n).double()
    chi2 = float(((counts - rows / n) ** 2 / (rows / n)).sum())
    assert chi2 < 21.1, counts  # 99.99% quantile of chi-square with 3 degrees of freedom
    greedy = actions == q.argmax(-1)
    assert 0 < int(greedy.sum()) < rows
    torch.testing.assert_close(logp, torch.full((rows,), math.log(1 / n)))


def test_epsilon_greedy_log_probs_mix_uniform_and_greedy():
    torch.manual_seed(1)
    rows, n = 20000, 3
    q = torch.randn(rows, n)
    eps = torch.rand(rows)
    actions, logp = epsilon_greedy(q, eps)
    is_greedy = (actions == q.argmax(-1)).double()
    expected = torch.log(eps.double() / n + (1 - eps.double()) * is_greedy)
    torch.testing.assert_close(logp.double(), expected, rtol=1e-6, atol=1e-6)
    # The greedy action is taken with probability 1 - eps + eps / n.
    assert abs(float(is_greedy.mean()) - float((1 - eps + eps / n).mean())) < 0.015


# ---------------------------------------------------------------- n-step windows


def arrival_windows(rewards, terminated, truncated, gamma, n):
    """The n-step windows of trajectories ``[T, B]`` by the shared kernel, as the DQN learner
    builds them for its arrival priorities: the step after a done is the autoreset step."""
    valid = np.ones_like(terminated)
    valid[1:] = ~(terminated[:-1] | truncated[:-1])
    return nstep_targets(rewards, gamma * ~terminated, n, valid=valid)


@pytest.mark.parametrize("n", [1, 3, 5, 9])
def test_nstep_windows_of_trajectories_match_a_brute_force_loop(n):
    g = torch.Generator().manual_seed(n)
    steps, batch, gamma = 7, 5, 0.9
    rewards = torch.randn(steps, batch, generator=g, dtype=torch.float64).numpy()
    terminated = (torch.rand(steps, batch, generator=g) < 0.2).numpy()
    truncated = (torch.rand(steps, batch, generator=g) < 0.15).numpy()
    returns, discounts, ends = arrival_windows(rewards, terminated, truncated, gamma, n)
    ref_returns, ref_discounts, ref_ends = reference_windows(rewards, terminated, truncated, gamma, n)
    assert returns.dtype == discounts.dtype == np.float64 and ends.dtype == np.int64
    np.testing.assert_allclose(returns, ref_returns, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(discounts, ref_discounts, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(ends, ref_ends)
    assert ends.min() >= 0 and ends.max() <= steps


def test_nstep_windows_of_a_trajectory_by_hand():
    rewards = np.array([[1.0], [2.0], [4.0], [0.0], [16.0], [0.0], [64.0]])
    terminated = np.array([[False], [False], [True], [False], [False], [False], [False]])
    truncated = np.array([[False], [False], [False], [False], [True], [False], [False]])
    returns, discounts, ends = arrival_windows(rewards, terminated, truncated, 0.5, 3)
    # t=0: 1 + .5*2 + .25*4, terminated inside; t=1: 2 + .5*4 terminated; t=2: 4 terminated;
    # t=3 and t=5: autoreset steps, empty windows; t=4: truncated after one step, bootstraps from
    # the final observation obs[5]; t=6: cut by the trajectory's end, bootstraps from obs[T].
    np.testing.assert_allclose(returns[:, 0], [3.0, 4.0, 4.0, 0.0, 16.0, 0.0, 64.0])
    np.testing.assert_allclose(discounts[:, 0], [0.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.5])
    np.testing.assert_array_equal(ends[:, 0], [3, 3, 3, 3, 5, 5, 7])


# ---------------------------------------------------------------- dueling network


def test_dueling_network_is_value_plus_centred_advantages():
    torch.manual_seed(0)
    net = build_model(OBS_SPACE, gymnasium.spaces.Discrete(3), build_config("cartpole-dqn").model, algo="dqn")
    assert isinstance(net, DuelingQNetwork)
    perturb(net, scale=0.5)  # the small-gain initial heads would make every check near zero
    obs = torch.randn(16, 4)
    q, q_max = net(obs)
    with torch.no_grad():
        features = net.encoder(net.preprocess(obs))
        adv, value = net.policy(features), net.value(features)
    assert q.shape == (16, 3) and q_max.shape == (16,)
    torch.testing.assert_close(q, value + adv - adv.mean(-1, keepdim=True))
    torch.testing.assert_close(q.mean(-1), value.squeeze(-1))
    torch.testing.assert_close(q_max, q.max(-1).values, rtol=0, atol=0)
    assert type(build_model(OBS_SPACE, ACTION_SPACE, build_config("cartpole-dqn").model)) is ActorCritic


def test_dueling_network_refuses_continuous_actions():
    box = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    with pytest.raises(ValueError, match="appo"):
        build_model(OBS_SPACE, box, build_config("cartpole-dqn").model, algo="dqn")
    with pytest.raises(ValueError, match="Discrete action space"):
        DuelingQNetwork(OBS_SPACE, box)


# ---------------------------------------------------------------- arrival priorities in the replay


def one_stream_replay(alpha=0.5, capacity=16):
    return TransitionReplay(ReplayConfig(capacity=capacity, min_fill=1, n_step=1, alpha=alpha), gamma=0.99,
                            num_streams=1, obs_shape=(3,), obs_dtype=np.float32, seed=0)


def add_row(replay, priority, value=0.0):
    replay.add([0], np.full((1, 3), value, np.float32), [0], [1.0], [False], [False],
               None if priority is None else [priority])


def test_arrival_priorities_enter_the_tree_once_sampleable():
    alpha = 0.5
    replay = one_stream_replay(alpha)
    add_row(replay, 4.0)
    assert replay.priorities([0])[0] == 0.0  # record 1 is not written yet: not sampleable
    add_row(replay, 0.25)
    np.testing.assert_allclose(replay.priorities([0, 1]), [4.0 ** alpha, 0.0])
    add_row(replay, None)  # PER: the largest priority seen so far (4)
    add_row(replay, 0.0)
    add_row(replay, 9.0)
    add_row(replay, None)
    np.testing.assert_allclose(replay.priorities(np.arange(6)),
                               [4.0 ** alpha, 0.25 ** alpha, 4.0 ** alpha, 0.0, 9.0 ** alpha, 0.0])
    drawn = np.concatenate([replay.sample(64, rng=seed).indices for seed in range(10)])
    assert set(drawn) == {0, 1, 2, 4}  # the zero arrival priority is never sampled


def test_without_arrival_priorities_new_records_get_the_initial_max():
    replay = one_stream_replay(alpha=0.5)
    for _ in range(4):
        add_row(replay, None)
    np.testing.assert_array_equal(replay.priorities(np.arange(4)), [1.0, 1.0, 1.0, 0.0])


@pytest.mark.parametrize("priorities, message", [
    ([np.nan], "finite and >= 0"), ([-1.0], "finite and >= 0"), ([np.inf], "finite and >= 0"),
    ([1.0, 2.0], r"priorities must have shape \[1\]"), ([[1.0]], r"priorities must have shape \[1\]"),
])
def test_bad_arrival_priorities_are_rejected_before_anything_is_written(priorities, message):
    replay = one_stream_replay()
    add_row(replay, 1.0)
    with pytest.raises(ValueError, match=message):
        replay.add([0], np.zeros((1, 3), np.float32), [0], [1.0], [False], [False], priorities)
    assert len(replay) == 1 and replay.added == 1


# ---------------------------------------------------------------- the DQN learner


def test_the_replays_and_make_learner_follow_the_config():
    cfg = dqn_config(**{"learner.gamma": 0.95, "replay.n_step": 5, "replay.alpha": 0.7})
    learner = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    rc = learner.replay.settings
    assert (rc.capacity, rc.min_fill, rc.alpha, rc.beta, rc.n_step, learner.replay.gamma) == (256, 64, 0.7, 0.4, 5, 0.95)
    assert rc.compress == "" and rc.memmap_dir == ""  # "": off
    sequences = make_learner(vtrace_replay_config(0.5, 1), OBS_SPACE, ACTION_SPACE).replay
    assert sequences.horizon == sequences.stride == T
    assert isinstance(learner, DQNLearner) and isinstance(learner.model, DuelingQNetwork)
    assert learner.replay.num_streams == E and learner.replay.horizon == 5
    assert not any(p.requires_grad for p in learner.target.parameters())
    assert type(make_learner(build_config("cartpole-appo"), OBS_SPACE, ACTION_SPACE)) is Learner


def test_replay_ratio_sets_the_number_of_gradient_steps():
    learner = make_dqn()
    cfg = learner.cfg
    ratio = ReplayRatio(cfg.replay.replay_ratio / cfg.replay.batch_size, start=cfg.replay.min_fill)
    for k, (batch, env_ids) in enumerate(stream_batches(6)):
        stats = learner.train(batch, env_ids=env_ids)
        added = (k + 1) * T * E
        assert learner.replay.added == added and len(learner.replay) == stats["replay_size"] == added
        expected = ratio.allowed_batches(added, 0)
        assert expected == max(0, (added - 64) * 2 // 32)
        assert learner.updates == learner.replayed_batches == stats["learner_updates"] == expected
        assert learner.version == stats["version"] == k + 1
        if expected:
            assert math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])
    assert learner.updates == 8 and learner.skipped_updates == 0


def test_target_network_is_refreshed_every_target_update_every_steps():
    learner = make_dqn()
    for batch, env_ids in stream_batches(2):  # 64 records: min_fill reached, no step taken yet
        learner.train(batch, env_ids=env_ids)
    assert learner.updates == 0 and same_weights(learner.model, learner.target)
    initial = copy.deepcopy(learner.target.state_dict())
    target_before = initial
    for step in range(1, 10):
        assert learner.update() is not None
        assert learner.updates == step
        refreshed = step % 3 == 0
        assert same_weights(learner.model, learner.target) == refreshed, step
        target_now = copy.deepcopy(learner.target.state_dict())
        unchanged = all(torch.equal(target_before[k], target_now[k]) for k in target_now)
        assert unchanged != refreshed, step  # the target moves at a refresh and only then
        target_before = target_now


def test_a_skipped_update_never_refreshes_the_target():
    learner = make_dqn()
    for batch, env_ids in stream_batches(2):
        learner.train(batch, env_ids=env_ids)
    for _ in range(3):
        learner.update()
    assert learner.updates == 3 and same_weights(learner.model, learner.target)
    target_before = copy.deepcopy(learner.target.state_dict())
    with torch.no_grad():
        learner.model.value.bias.fill_(float("nan"))  # every loss from now on is NaN
    assert learner.update() is not None
    assert (learner.updates, learner.skipped_updates, learner.consecutive_skips) == (3, 1, 1)
    assert all(torch.equal(target_before[k], v) for k, v in learner.target.state_dict().items())


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


# ---------------------------------------------------------------- V-trace replay in the learner


def vtrace_replay_config(fraction, min_fill):
    return build_config("cartpole-appo", {
        "replay.vtrace_fraction": fraction, "replay.capacity": 64 * E, "replay.min_fill": min_fill,
        "env.num_workers": 1, "env.envs_per_worker": E, "env.num_splits": 1, "learner.rollout": T,
        "learner.batch_size": T * E})


FIELDS = ("obs", "actions", "behaviour_logp", "rewards", "terminated", "truncated", "valid")


@pytest.mark.parametrize("fraction", [0.25, 0.6])
def test_learner_appends_replayed_trajectories_of_the_right_stream(fraction):
    torch.manual_seed(0)
    learner = Learner(vtrace_replay_config(fraction, min_fill=3 * T * E), OBS_SPACE, ACTION_SPACE)
    outputs = []
    original = learner.with_replayed

    def spy(batch, env_ids, fresh=None):
        out = original(batch, env_ids, fresh)
        outputs.append(out)
        return out

    learner.with_replayed = spy
    batches = stream_batches(5, seed=4)
    wanted = round(E * fraction / (1 - fraction))
    for k, (batch, env_ids) in enumerate(batches):
        stats = learner.train(batch, env_ids=env_ids)
        assert learner.version == k + 1 and math.isfinite(stats["loss"])
        out = outputs[-1]
        out.validate()
        for name in FIELDS + ("version",):  # fresh columns first, unchanged
            assert torch.equal(getattr(out, name)[:, :E], getattr(batch, name)), name
        if k < 2:  # below min_fill (3 batches' records): nothing replayed
            assert out.rewards.shape[1] == E
            continue
        assert out.rewards.shape[1] == E + wanted
        assert torch.all(out.version[:, E:] == k)  # the learner's version when they were replayed
        # Every replayed column is one earlier trajectory of one env, exactly (batch k's own
        # sequences need batch k + 1's first observation, so they cannot be sampled yet).
        earlier = [(b, c) for b, _ in batches[:k] for c in range(E)]
        for col in range(E, E + wanted):
            matches = [(b, c) for b, c in earlier if torch.equal(b.obs[:, c], out.obs[:, col])]
            assert len(matches) == 1, col
            b, c = matches[0]
            for name in FIELDS:
                replayed = getattr(out, name)[:, col]
                assert torch.equal(replayed, getattr(b, name)[:, c].to(replayed.dtype)), name


def test_learner_with_vtrace_replay_needs_env_ids():
    learner = Learner(vtrace_replay_config(0.5, min_fill=T * E), OBS_SPACE, ACTION_SPACE)
    (batch, env_ids), = stream_batches(1)
    with pytest.raises(ValueError, match=r"needs env_ids \[4\]"):
        learner.train(batch)
    with pytest.raises(ValueError, match=r"needs env_ids \[4\]"):
        learner.train(batch, env_ids=env_ids[:2])
    assert learner.version == 0 and learner.replay.added == 0


def test_vtrace_replay_never_stores_a_batch_with_non_finite_data():
    learner = Learner(vtrace_replay_config(0.5, min_fill=T * E), OBS_SPACE, ACTION_SPACE)
    *good, (bad, bad_ids) = stream_batches(3)
    for batch, env_ids in good:
        learner.train(batch, env_ids=env_ids)
    bad.rewards[1, 2] = float("nan")
    learner.train(bad, env_ids=bad_ids)
    assert learner.replay.added == 2 * T * E  # the good batches only
    assert learner.skipped_updates == 1
    sample = learner.replay.sample(E)
    assert sample is not None and np.isfinite(sample.rewards).all()


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("profile, overrides, message", [
    ("cartpole-appo", {"replay.vtrace_fraction": 1.0}, r"vtrace_fraction' must be in \[0, 1\)"),
    ("cartpole-appo", {"replay.vtrace_fraction": -0.1}, r"vtrace_fraction' must be in \[0, 1\)"),
    ("cartpole-dqn", {"replay.vtrace_fraction": 0.5}, "dqn replays every batch"),
    ("cartpole-dqn", {"replay.min_fill": 200_000}, r"min_fill \(200000\) exceeds the 99968 records replay.capacity"),
    ("cartpole-appo", {"replay.vtrace_fraction": 0.5, "replay.min_fill": 2_000_000}, "lower replay.min_fill"),
    ("cartpole-dqn", {"replay.capacity": 64 * 3, "replay.min_fill": 0}, "leaves 3 records per env for 64 envs"),
    ("cartpole-appo", {"replay.vtrace_fraction": 0.5, "replay.capacity": 2048 * 32, "replay.min_fill": 0},
     r"frame_stack \+ learner.rollout = 33"),
    ("cartpole-dqn", {"learner.epsilon": 1.5}, r"learner.epsilon' must be in \[0, 1\]"),
    ("cartpole-dqn", {"learner.target_update_every": 0}, "target_update_every' must be >= 1"),
    ("cartpole-dqn", {"replay.replay_ratio": 0.0}, "replay_ratio' must be > 0 for dqn"),
    ("cartpole-dqn", {"replay.compress": "zip"}, "replay.compress' must be one of"),
    ("cartpole-dqn", {"replay.n_step": 0}, "replay.n_step' must be >= 1"),
    ("cartpole-dqn", {"replay.alpha": -1.0}, "replay.alpha' must be >= 0"),
])
def test_bad_replay_settings_name_the_fix(profile, overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(profile, overrides)


def test_min_fill_is_checked_against_the_capacity_the_replay_can_hold():
    with pytest.raises(ConfigError, match="min_fill"):
        dqn_config(**{"replay.capacity": 258, "replay.min_fill": 257})


def test_replay_settings_matter_only_where_a_replay_is_used():
    # appo without V-trace replay keeps no replay: its capacity and epsilon are not checked.
    build_config("cartpole-appo", {"replay.capacity": 1, "replay.min_fill": 5, "learner.epsilon": 1.5})


def test_replay_section_round_trips_through_toml(tmp_path):
    cfg = build_config("cartpole-dqn", {"replay.n_step": 5, "replay.compress": "lz4", "replay.replay_ratio": 0.5,
                                        "learner.target_update_every": 7, "learner.double_q": False})
    text = to_toml(cfg)
    assert "\n[replay]\n" in text and "replay_ratio = 0.5" in text
    (tmp_path / "config.toml").write_text(text)
    loaded = load_run_config(tmp_path)
    assert loaded == cfg
    assert loaded.replay.compress == "lz4" and loaded.learner.algo == "dqn" and not loaded.learner.double_q


# --- a worker restart: the env's stream restarts in the replay --------------------------------


def test_restart_streams_cuts_the_windows_that_would_read_the_new_episode():
    n = 3
    replay = TransitionReplay(ReplayConfig(capacity=64, min_fill=1, n_step=n), gamma=0.5, num_streams=1,
                              obs_shape=(1,), obs_dtype=np.float32, seed=0)
    ones = np.ones(10)
    replay.add(np.zeros(10, int), np.arange(10, dtype=np.float32)[:, None], np.zeros(10, int), ones,
               np.zeros(10, bool), np.zeros(10, bool))
    replay.restart_streams([0])
    replay.add(np.zeros(6, int), np.arange(100, 106, dtype=np.float32)[:, None], np.zeros(6, int), ones[:6],
               np.zeros(6, bool), np.zeros(6, bool))
    sampleable = replay.sampleable(np.arange(16))
    # Records 0-6 keep windows inside the old episode; 7-9 would bootstrap from the new one.
    assert sampleable[:7].all() and not sampleable[7:10].any()
    assert sampleable[10:16 - n].all()  # the new episode starts a valid stream of its own
    drawn = replay.sample(2000)
    assert not np.isin(drawn.indices, [7, 8, 9]).any()
    six = drawn.indices == 6
    assert six.any() and np.all(drawn.next_obs[six] == 9.0)  # record 6 bootstraps from old record 9


def test_a_fresh_trajectory_restarts_only_its_own_stream_in_arrival_order():
    learner = make_dqn()
    (first, ids_first), (second, ids_second) = stream_batches(2)
    learner.train(first, env_ids=ids_first, fresh=np.ones(E, bool))  # run start: nothing to cut
    L, n = learner.replay.ring_len, learner.cfg.replay.n_step
    assert learner.replay.stream_length(0) == T and learner.replay._valid[:T].sum() == first.valid[:, ids_first == 0].sum()
    fresh = ids_second == 0  # env 0's worker restarted: its second trajectory begins a new episode
    learner.train(second, env_ids=ids_second, fresh=fresh)
    valid = learner.replay._valid
    assert not valid[T - n:T].any()  # env 0's last n records before the restart
    assert valid[T] and learner.replay._first[T]  # its first record after the restart
    for env in range(1, E):  # every other stream continues untouched
        column = int(np.flatnonzero(ids_second == env)[0])
        assert np.array_equal(valid[env * L + T:env * L + 2 * T], second.valid[:, column].numpy())
        assert valid[env * L + T - n:env * L + T].tolist() == first.valid[T - n:, int(np.flatnonzero(ids_first == env)[0])].tolist()


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


def test_target_observation_statistics_change_only_at_a_target_refresh():
    learner = make_dqn(**{"model.normalize_obs": True})
    online, target = learner.model.normalizer, learner.target.normalizer

    def snapshot():
        return {key: value.clone() for key, value in target.state_dict().items()}

    initial = snapshot()
    refreshes = 0
    for k, (batch, env_ids) in enumerate(stream_batches(8, seed=2)):
        before = snapshot()
        learner.train(batch, env_ids=env_ids)  # statistics update, then 2 gradient steps from the 3rd batch on
        if learner.updates // 3 > refreshes:  # refreshed (every 3 steps) after this batch's statistics update
            refreshes = learner.updates // 3
            assert same_weights(online, target), k
        else:
            assert all(torch.equal(before[key], value) for key, value in target.state_dict().items()), k
            assert not same_weights(online, target), k  # while the online statistics moved on
    assert refreshes == 4 and learner.updates == 12 and learner.skipped_updates == 0
    assert not all(torch.equal(initial[key], value) for key, value in target.state_dict().items())


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
