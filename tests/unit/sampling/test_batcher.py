"""The batcher's host <-> device traffic, counted on the CPU: one copy each way per batch and per
weight refresh or publication on the staged (CUDA) path, with the plain path's results; padding
batches to the compiled policy's bucket sizes; Ape-X exploration (the actors' epsilons, epsilon-greedy
sampling and its log-probs)."""
import copy
import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastrl.config import ConfigError, build_config
from fastrl.envs import probe_env
from fastrl.ipc.arena import Arena, Control
from fastrl.ipc.device_io import BatchTransfer
from fastrl.ipc.weights import WeightBuffer
from fastrl.learner import LearnerRuntime, VTraceLearner
from fastrl.models.networks import build_model, num_state_values, state_to_flat
from fastrl.run.training import arena_layout
from fastrl.sampling.batcher import (
    InferenceBatcher,
    apex_epsilons,
    batch_buckets,
    batcher_epsilon_decay,
    batcher_epsilons,
    batcher_late_epsilons,
    epsilon_greedy,
    exploration,
    padded_size,
    random_action_steps,
)

aten = torch.ops.aten


class CopyCounter(TorchDispatchMode):
    """Counts ``copy_`` into device memory from the ``host`` tensors (``to_device``), into them
    (``to_host``), and every copy op (``copies``). On the CPU host and device are one memory, so
    the host side is named by the buffers the code under test stages through."""

    def __init__(self, *host: torch.Tensor):
        super().__init__()
        self.host = {t.untyped_storage().data_ptr() for t in host}
        self.to_device = self.to_host = self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten.copy_.default:
            self.to_device += args[1].untyped_storage().data_ptr() in self.host
            self.to_host += args[0].untyped_storage().data_ptr() in self.host
        if func in (aten.copy_.default, aten._to_copy.default):
            self.copies += 1
        return func(*args, **(kwargs or {}))


def small_run(core: str = "none", **overrides):
    """Config, arena (two workers of 8 envs, 2 splits: requests of 4 envs) with random observations
    and cursors, and a policy whose weights are published as version 0."""
    cfg = build_config("cartpole-appo", {"env.num_workers": 2, "env.envs_per_worker": 8, "env.num_splits": 2,
                                         "learner.rollout": 4, "learner.batch_size": 16, "model.hidden_sizes": [16],
                                         "model.core": core, "model.core_size": 8, "device": "cpu", **overrides})
    spec = probe_env(cfg)
    torch.manual_seed(0)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)
    arena = Arena(arena_layout(cfg, spec, num_state_values(model), getattr(model, "state_size", 0)), shared=False)
    rng = np.random.default_rng(0)
    arena.obs[:] = rng.normal(size=arena.obs.shape)
    W, E = arena.env_slot.shape
    arena.env_slot[:] = np.arange(W * E).reshape(W, E)
    arena.env_t[:] = rng.integers(0, 4, (W, E))
    arena.request_envs[:] = np.arange(E).reshape(1, 2, 4)
    if core != "none":
        arena.env_state[:] = rng.normal(size=arena.env_state.shape)
        arena.env_start[:] = rng.integers(0, 2, (W, E))
    WeightBuffer(arena).publish(state_to_flat(model, torch.empty(num_state_values(model))).numpy(), 0)
    return cfg, spec, model, arena


def act(arena, batcher, workers, requests, seed=1):
    """Run one batch; returns (actions, behaviour log-probs, env states) as written to the arena."""
    batcher.refresh_weights()
    torch.manual_seed(seed)
    batcher.infer(np.array(workers), np.array(requests))
    state = arena.env_state.copy() if "env_state" in arena.arrays else None
    return arena.actions.copy(), arena.behaviour_logp.copy(), state


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_a_staged_batch_crosses_once_each_way_and_acts_as_the_plain_path(core):
    cfg, spec, model, arena = small_run(core)
    start_state = arena.env_state.copy() if core != "none" else None
    plain = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"))
    expected = act(arena, plain, [0, 1, 1], [1, 0, 1])
    if core != "none":
        arena.env_state[:] = start_state
    transfer = BatchTransfer(torch.device("cpu"), staged=True)
    staged = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), transfer=transfer)
    arena.actions[:] = 0
    arena.behaviour_logp[:] = 0
    for got, want in zip(act(arena, staged, [0, 1, 1], [1, 0, 1]), expected):
        np.testing.assert_array_equal(got, want)
    with CopyCounter(transfer.inputs.host, transfer.outputs.host) as counter:
        staged.infer(np.array([0, 1]), np.array([0, 1]))
    outputs = 3 if core != "none" else 2  # actions, log-probs (, states): packed on the device
    assert (counter.to_device, counter.to_host, counter.copies) == (1, 1, 2 + outputs)


@pytest.mark.parametrize("activation,hidden", [("relu", [16, 8]), ("tanh", [16]), ("relu", [])])
def test_the_numpy_mlp_path_acts_as_torch_and_follows_refreshed_weights(activation, hidden):
    """inference.numpy_mlp: the same actions (the same uniforms drawn) and log-probabilities as
    the torch path, before and after a weight refresh, with the logits far from uniform."""
    cfg, spec, model, arena = small_run(**{"model.activation": activation, "model.hidden_sizes": hidden})
    torch_path = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"))
    numpy_path = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), numpy_mlp=True)
    assert torch_path.weight_sets[0].numpy_mlp is None and numpy_path.weight_sets[0].numpy_mlp is not None
    for version in (0, 1):
        if version:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p))
            WeightBuffer(arena).publish(state_to_flat(model, torch.empty(num_state_values(model))).numpy(), 1)
        actions, logp, _ = act(arena, torch_path, [0, 1, 1], [1, 0, 1], seed=version)
        numpy_actions, numpy_logp, _ = act(arena, numpy_path, [0, 1, 1], [1, 0, 1], seed=version)
        np.testing.assert_array_equal(numpy_actions, actions)
        np.testing.assert_allclose(numpy_logp, logp, rtol=1e-5, atol=1e-5)
        assert numpy_path.version == version
    envs = arena.request_envs[[0, 1, 1], [1, 0, 1]]  # [3 requests, 4 envs]
    workers = np.array([0, 1, 1])[:, None]
    acted = logp[arena.env_slot[workers, envs], arena.env_t[workers, envs]]
    assert np.abs(acted - np.log(0.5)).max() > 0.2, "the refreshed weights should move the policy off uniform"


@pytest.mark.parametrize("overrides", [{"model.core": "lstm"}, {"model.normalize_obs": True},
                                       {"learner.algo": "dqn"}])
def test_models_the_numpy_mlp_path_does_not_reproduce_act_through_torch(overrides):
    cfg, spec, model, arena = small_run(**overrides)
    epsilons = np.full(arena.env_slot.shape, 0.1, np.float32) if overrides.get("learner.algo") == "dqn" else None
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), epsilons,
                               numpy_mlp=True)
    assert batcher.weight_sets[0].numpy_mlp is None


@pytest.mark.parametrize("edit", ["extra module", "linear without activation", "mixed activations"])
def test_an_encoder_edited_past_what_mlp_encoder_builds_acts_through_torch(edit):
    from fastrl.sampling.numpy_mlp import NumpyMLPPolicy
    cfg, spec, model, arena = small_run(**{"model.hidden_sizes": [8, 8]})
    assert NumpyMLPPolicy.supports(model, arena.obs.dtype)
    net = model.encoder.net  # Flatten, Linear, ReLU, Linear, ReLU
    if edit == "extra module":
        net.append(torch.nn.LayerNorm(8))
    elif edit == "linear without activation":
        del net[-1]
    else:
        net[-1] = torch.nn.Tanh()
    assert not NumpyMLPPolicy.supports(model, arena.obs.dtype)


def test_padded_batches_act_on_their_real_rows_as_unpadded_ones():
    cfg, spec, model, arena = small_run("lstm")
    start_state = arena.env_state.copy()
    plain = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"))
    hooked = []
    plain.model.register_forward_hook(lambda module, args, output: hooked.append(output[0][0]))
    actions, _, states = act(arena, plain, [1], [0])
    arena.env_state[:] = start_state
    padded = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), buckets=(16, 32))
    rows = []
    padded.model.register_forward_hook(lambda module, args, output: rows.append(len(output[0][0])))
    padded_actions, padded_logp, padded_states = act(arena, padded, [1], [0], seed=2)
    assert rows == [16]
    np.testing.assert_array_equal(padded_states, states)
    slots, steps = arena.env_slot[1, :4], arena.env_t[1, :4]
    params = hooked[0]
    logp = padded.head.log_prob(params, torch.from_numpy(padded_actions[slots, steps]))
    np.testing.assert_allclose(padded_logp[slots, steps], logp.numpy(), rtol=1e-6)
    untouched = np.ones(arena.behaviour_logp.shape, bool)
    untouched[slots, steps] = False
    assert not padded_logp[untouched].any() and not padded_actions[untouched].any()


def test_buckets_double_up_to_every_request_in_one_batch():
    assert batch_buckets(4, 4) == (4, 8, 16)
    assert batch_buckets(4, 6) == (4, 8, 16, 24)
    assert batch_buckets(256, 1) == (256,)
    assert [padded_size(n, (4, 8, 16)) for n in (1, 4, 5, 16)] == [4, 4, 8, 16]
    assert padded_size(12, ()) == 12


def test_a_weight_refresh_is_one_copy_into_the_weights_the_model_views():
    cfg, spec, model, arena = small_run()
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"))
    assert batcher.refresh_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    published = state_to_flat(model, torch.empty(num_state_values(model)))
    WeightBuffer(arena).publish(published.numpy(), 1)
    with CopyCounter(batcher.weights.host) as counter:
        assert batcher.refresh_weights()
    assert (counter.to_device, counter.copies, batcher.version) == (1, 1, 1)
    torch.testing.assert_close(state_to_flat(batcher.model, torch.empty_like(published)), published)


def test_the_learner_publishes_its_weights_in_one_copy_from_the_device():
    cfg, spec, model, arena = small_run()
    learner = VTraceLearner(cfg, spec.observation_space, spec.action_space, device_path=True)
    host = LearnerRuntime(cfg, arena, learner)
    assert host.device_flat is not host.flat
    with CopyCounter(host.flat) as counter:
        assert host.publish()
    assert counter.to_host == 1
    expected = state_to_flat(learner.model, torch.empty(num_state_values(learner.model))).numpy()
    np.testing.assert_array_equal(arena.weights[0, learner.version % 2], expected)


# Ape-X exploration: the epsilons of the actors and the batcher's epsilon-greedy sampling.


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


def test_decaying_epsilons_fall_linearly_from_one_to_the_apex_rates():
    """learner.epsilon_decay_steps: each env's epsilon is 1 at the run's start, its Ape-X rate from
    the decay's end on, and linear between, counting the steps before a resume."""
    cfg, spec, model, arena = small_run(**{"learner.algo": "dqn"})
    final = apex_epsilons(16, 0.4, 7.0).reshape(2, 8)
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), final,
                               epsilon_decay=1000)
    rows = np.arange(16)
    for steps_done, offset in [(0, 0), (250, 0), (400, 200), (999, 0), (1000, 0), (700, 5000)]:
        arena.env_steps[:] = 0
        arena.env_steps[0] = steps_done
        arena.control[Control.ENV_STEPS_OFFSET] = offset
        ahead = max(0.0, 1.0 - (steps_done + offset) / 1000)
        brute = [f + (1 - f) * ahead for f in final.reshape(-1)]
        np.testing.assert_allclose(batcher.current_epsilons(rows).numpy(), brute, rtol=1e-6)
    # At the start every action is uniform: its behaviour probability is 1 / A whatever Q says.
    arena.env_steps[:] = 0
    arena.control[Control.ENV_STEPS_OFFSET] = 0
    actions, logp, _ = act(arena, batcher, [0, 1], [0, 1])
    envs = arena.request_envs[[0, 1], [0, 1]]
    workers = np.array([0, 1])[:, None]
    acted = logp[arena.env_slot[workers, envs], arena.env_t[workers, envs]]
    np.testing.assert_allclose(acted, np.log(1 / spec.action_space.n), rtol=1e-6)
    without = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), final)
    np.testing.assert_array_equal(without.current_epsilons(rows).numpy(), final.reshape(-1))


def test_the_epsilon_decay_is_shared_over_ranks_and_read_by_q_learners_only(monkeypatch):
    overrides = {"env.num_workers": 2, "env.envs_per_worker": 4, "env.num_splits": 2, "learner.batch_size": 64,
                 "replay.capacity": 1000, "replay.min_fill": 10, "learner.epsilon_decay_steps": 10_000}
    assert batcher_epsilon_decay(build_config("cartpole-dqn", overrides)) == 10_000
    assert batcher_epsilon_decay(build_config("cartpole-dqn", {**overrides, "learner.epsilon_decay_steps": 0})) == 0
    assert batcher_epsilon_decay(build_config("cartpole-appo", {"learner.epsilon_decay_steps": 10_000})) == 0
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert batcher_epsilon_decay(build_config("cartpole-dqn", overrides)) == 2_500


def test_late_epsilons_replace_the_apex_rates_from_their_step_on():
    """learner.epsilon_late_after_steps: the decay from 1 runs as before, then each env keeps its
    Ape-X rate until the run took ``late_after`` env steps (counting those before a resume), and its
    late rate from there."""
    cfg, spec, model, arena = small_run(**{"learner.algo": "dqn"})
    base = apex_epsilons(16, 0.4, 7.0).reshape(2, 8)
    late = apex_epsilons(16, 0.01, 7.0).reshape(2, 8)
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), base,
                               epsilon_decay=1000, late_epsilons=late, late_after=3000)
    rows = np.arange(16)
    for steps_done, offset, expected in [(0, 0, np.ones(16)), (1000, 0, base), (2999, 0, base), (3000, 0, late),
                                         (500, 2500, late), (10**6, 0, late)]:
        arena.env_steps[:] = 0
        arena.env_steps[1] = steps_done
        arena.control[Control.ENV_STEPS_OFFSET] = offset
        np.testing.assert_allclose(batcher.current_epsilons(rows).numpy(), expected.reshape(-1), rtol=1e-6)
    # Greedy once late at rate 0: every action is the argmax, with behaviour probability 1.
    greedy = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), base,
                              late_epsilons=np.zeros((2, 8), np.float32), late_after=10)
    arena.env_steps[:] = 0
    arena.env_steps[0] = 10
    arena.control[Control.ENV_STEPS_OFFSET] = 0
    _, logp, _ = act(arena, greedy, [0, 1], [0, 1])
    envs = arena.request_envs[[0, 1], [0, 1]]
    acted = logp[arena.env_slot[np.array([0, 1])[:, None], envs], arena.env_t[np.array([0, 1])[:, None], envs]]
    np.testing.assert_array_equal(acted, 0.0)


def finish_episodes(arena, worker: int, returns, actor: int = 0) -> None:
    """Write finished episodes into ``worker``'s episode ring as a rollout worker does."""
    for episode_return in returns:
        k = int(arena.episode_count[worker]) % arena.episode_return.shape[1]
        arena.episode_return[worker, k], arena.episode_actor[worker, k] = episode_return, actor
        arena.episode_count[worker] += 1


def test_the_late_stage_waits_for_the_newest_episodes_to_reach_the_return_then_stays():
    """learner.epsilon_late_return_episodes: past its step, the late rate waits until the mean of the
    rank's newest n episodes (over every worker, a self-play snapshot's left out) reaches the return;
    a later fall does not bring the first rate back, and the step it began at is recorded."""
    cfg, spec, model, arena = small_run(**{"learner.algo": "dqn"})
    base = apex_epsilons(16, 0.4, 7.0).reshape(2, 8)
    late = apex_epsilons(16, 0.01, 7.0).reshape(2, 8)
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), base,
                               late_epsilons=late, late_after=100, late_return=(4, 15.0))
    rows = np.arange(16)

    def rates(steps: int) -> np.ndarray:
        arena.env_steps[:] = 0
        arena.env_steps[0] = steps
        return batcher.current_epsilons(rows).numpy()

    finish_episodes(arena, 0, [21.0, 21.0, 21.0, 21.0])
    np.testing.assert_allclose(rates(99), base.reshape(-1), rtol=1e-6)  # scoring, but before the step
    arena.episode_count[:] = 0  # a fresh rank: the batcher counts the episodes ended after it starts
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), base,
                               late_epsilons=late, late_after=100, late_return=(4, 15.0))
    finish_episodes(arena, 0, [20.0, 20.0])
    finish_episodes(arena, 1, [20.0])
    np.testing.assert_allclose(rates(500), base.reshape(-1), rtol=1e-6)  # three of the four episodes
    finish_episodes(arena, 1, [21.0], actor=1)  # a snapshot's win is not the policy's
    np.testing.assert_allclose(rates(600), base.reshape(-1), rtol=1e-6)
    finish_episodes(arena, 1, [-20.0])  # 20, 20, 20, -20: mean 10
    np.testing.assert_allclose(rates(700), base.reshape(-1), rtol=1e-6)
    assert arena.control[Control.EPSILON_LATE_AT] == 0
    finish_episodes(arena, 0, [20.0, 20.0])  # the newest four: 20, -20, 20, 20 -> mean 10
    np.testing.assert_allclose(rates(800), base.reshape(-1), rtol=1e-6)
    finish_episodes(arena, 0, [21.0])  # -20, 20, 20, 21 -> 10.25
    np.testing.assert_allclose(rates(850), base.reshape(-1), rtol=1e-6)
    finish_episodes(arena, 1, [5.0])  # 20, 20, 21, 5 -> 16.5
    np.testing.assert_allclose(rates(900), late.reshape(-1), rtol=1e-6)
    assert arena.control[Control.EPSILON_LATE_AT] == 900
    finish_episodes(arena, 0, [-21.0] * 4)
    np.testing.assert_allclose(rates(1000), late.reshape(-1), rtol=1e-6)
    assert arena.control[Control.EPSILON_LATE_AT] == 900
    # A batcher restarted in the same arena keeps the stage it found.
    restarted = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), base,
                                 late_epsilons=late, late_after=100, late_return=(4, 15.0))
    np.testing.assert_allclose(restarted.current_epsilons(rows).numpy(), late.reshape(-1), rtol=1e-6)


def test_the_late_return_gate_is_read_from_the_config_and_needs_the_late_stage():
    overrides = {"env.num_workers": 2, "env.envs_per_worker": 4, "env.num_splits": 2, "learner.batch_size": 64,
                 "replay.capacity": 1000, "replay.min_fill": 10, "learner.epsilon_late": 0.002,
                 "learner.epsilon_late_after_steps": 40_000, "learner.epsilon_late_return_episodes": 16,
                 "learner.epsilon_late_min_return": 15.0}
    assert exploration(build_config("cartpole-dqn", overrides))["late_return"] == (16, 15.0)
    with pytest.raises(ConfigError, match="epsilon_late_return_episodes gates the late rate, which is off"):
        build_config("cartpole-dqn", {**overrides, "learner.epsilon_late_after_steps": 0})
    with pytest.raises(ConfigError, match="epsilon_late_min_return"):
        build_config("cartpole-dqn", {**overrides, "learner.epsilon_late_min_return": math.inf})
    with pytest.raises(ConfigError, match="epsilon_late_min_return is read with learner.epsilon_late_return_episodes"):
        build_config("cartpole-dqn", {**overrides, "learner.epsilon_late_return_episodes": 0})


def test_the_late_stage_is_shared_over_ranks_numbered_across_them_and_follows_the_decay(monkeypatch):
    overrides = {"env.num_workers": 2, "env.envs_per_worker": 4, "env.num_splits": 2, "learner.batch_size": 64,
                 "replay.capacity": 1000, "replay.min_fill": 10, "learner.epsilon_decay_steps": 10_000,
                 "learner.epsilon_late": 0.002, "learner.epsilon_late_after_steps": 40_000}
    cfg = build_config("cartpole-dqn", overrides)
    late, after = batcher_late_epsilons(cfg)
    assert after == 40_000
    np.testing.assert_allclose(late.reshape(-1), apex_epsilons(8, 0.002, cfg.learner.epsilon_alpha), rtol=1e-6)
    assert exploration(cfg)["late_after"] == 40_000
    assert batcher_late_epsilons(build_config("cartpole-dqn", {**overrides, "learner.epsilon_late_after_steps": 0})) \
        == (None, 0)
    assert batcher_late_epsilons(build_config("cartpole-appo", {"learner.epsilon_late_after_steps": 40_000})) \
        == (None, 0)
    with pytest.raises(ConfigError, match="epsilon_late_after_steps .9999. must be >= learner.epsilon_decay_steps"):
        build_config("cartpole-dqn", {**overrides, "learner.epsilon_late_after_steps": 9_999})
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    late, after = batcher_late_epsilons(build_config("cartpole-dqn", overrides))
    assert after == 10_000
    np.testing.assert_allclose(late.reshape(-1), apex_epsilons(8, 0.002, cfg.learner.epsilon_alpha, first=8, total=32),
                               rtol=1e-6)


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


def sac_run(low, high, **overrides):
    """small_run's arena with sac's actor over a Box with bounds ``low``, ``high``."""
    return small_run(**{"learner.algo": "sac", "env.id": "tests.support.space_envs:make_bounded_target",
                        "env.kwargs": {"low": low, "high": high}, "replay.n_step": 1, **overrides})


@pytest.mark.parametrize("hidden,obs_dtype", [([16, 8], "float32"), ([], "float32"), ([16, 8], "float64")])
def test_the_numpy_mlp_path_acts_as_torch_for_sac_and_follows_refreshed_weights(hidden, obs_dtype):
    """sac's squashed Gaussian through numpy and numba: the same normals drawn, so the same actions
    (inside the bounds) and log-probabilities as the torch path, before and after a weight refresh;
    float64 observations (MuJoCo's) too, cast to float32 as the torch model casts them."""
    low, high = [-2.0, 0.0], [2.0, 1.0]
    cfg, spec, model, arena = sac_run(low, high, **{"model.hidden_sizes": hidden,
                                                    "env.kwargs": {"low": low, "high": high, "obs_dtype": obs_dtype}})
    assert arena.obs.dtype == np.dtype(obs_dtype)
    torch_path = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), algo="sac")
    numpy_path = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"), algo="sac",
                                  numpy_mlp=True)
    assert torch_path.weight_sets[0].numpy_mlp is None and numpy_path.weight_sets[0].numpy_mlp is not None
    envs = arena.request_envs[[0, 1, 1], [1, 0, 1]]  # [3 requests, 4 envs]
    workers = np.array([0, 1, 1])[:, None]
    rows = arena.env_slot[workers, envs], arena.env_t[workers, envs]
    for version in (0, 1):
        if version:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.1 * torch.randn_like(p))  # not so far that the draws saturate
            WeightBuffer(arena).publish(state_to_flat(model, torch.empty(num_state_values(model))).numpy(), 1)
        actions, logp, _ = act(arena, torch_path, [0, 1, 1], [1, 0, 1], seed=version)
        arena.actions[:] = arena.behaviour_logp[:] = 0  # so that a path writing nothing fails
        numpy_actions, numpy_logp, _ = act(arena, numpy_path, [0, 1, 1], [1, 0, 1], seed=version)
        np.testing.assert_allclose(numpy_actions, actions, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(numpy_logp, logp, rtol=1e-5, atol=1e-4)
        assert numpy_path.version == version
        acted = numpy_actions[rows].reshape(-1, 2)
        assert ((acted >= low) & (acted <= high)).all() and len(np.unique(acted[:, 0])) == len(acted)
    assert not np.allclose(numpy_logp[rows], -2 * math.log(2))


@pytest.mark.parametrize("numpy_mlp", [False, True], ids=["torch", "numpy_mlp"])
def test_sac_acts_uniformly_until_every_replay_can_hold_min_fill_then_samples_its_policy(numpy_mlp):
    """sac's first ``replay.min_fill`` env steps (per member in a population) are uniform over the
    Box, behaviour log-prob -d log 2 in the squashed space; from then on the policy's own draws."""
    low, high = [-2.0, 0.0], [2.0, 1.0]
    cfg, spec, model, arena = sac_run(low, high, **{"replay.min_fill": 100})
    assert random_action_steps(cfg) == 100
    assert random_action_steps(build_config("mujoco-sac", {"pbt.population": 4})) == 4 * 5_000
    assert random_action_steps(build_config("cartpole-dqn")) == 0
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"),
                               algo="sac", random_until=random_action_steps(cfg), numpy_mlp=numpy_mlp)
    assert (batcher.weight_sets[0].numpy_mlp is not None) == numpy_mlp
    envs = arena.request_envs[[0, 1], [0, 1]]
    workers = np.array([0, 1])[:, None]
    rows = arena.env_slot[workers, envs], arena.env_t[workers, envs]
    for steps_done, uniform in [(0, True), (99, True), (100, False)]:
        arena.env_steps[:] = 0
        arena.env_steps[0] = steps_done
        actions, logp, _ = act(arena, batcher, [0, 1], [0, 1], seed=steps_done)
        acted, acted_logp = actions[rows].reshape(-1, 2), logp[rows].ravel()
        assert ((acted >= low) & (acted <= high)).all()
        if uniform:
            np.testing.assert_allclose(acted_logp, -2 * math.log(2), rtol=1e-6)
        else:  # the squashed Gaussian's density: one value per draw, none of them the uniform one
            assert len(set(acted_logp.tolist())) == acted_logp.size
            assert not np.isclose(acted_logp, -2 * math.log(2)).any()
