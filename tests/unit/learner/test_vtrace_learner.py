"""The learner on batches whose correct V-trace targets are known, and on caller-made batches; V-trace
replay, replayed trajectories appended to the fresh ones."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from fastrl.config import build_config
from fastrl.learner import Trajectories, VTraceLearner, gather_trajectories
from fastrl.learner import precision as precision_module
from fastrl.learner.precision import (
    BF16_MAX_TIME_RATIO,
    PROBE_MAX_ROWS,
    auto_precision,
    bf16_time_ratio,
    cpu_flags,
    emulated_bf16_warning,
    learner_precision,
    measured_precision,
    probe_rows,
)
from tests.support.small_learners import ACTION_SPACE, OBS_SPACE, E, T, stream_batches, vtrace_replay_config
from tests.unit.sampling.test_rollout_worker import countdown_config, run_worker


class LinearValue(nn.Module):
    """Uniform policy, V(obs) = 10 + obs[0]: targets can be written down by hand."""

    def __init__(self, num_actions=2):
        super().__init__()
        self.num_actions = num_actions
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, obs):
        logits = torch.zeros(obs.shape[0], self.num_actions) + 0 * self.dummy
        return logits, 10.0 + obs[:, 0] + 0 * self.dummy


def targets_for(cfg):
    arena, full = run_worker(cfg, steps_per_env=cfg.learner.rollout)
    arena.behaviour_logp[:] = math.log(0.5)  # behaviour = the uniform policy: on-policy, log_rho = 0
    batch = gather_trajectories(arena, np.array(full))
    from fastrl.envs import probe_env

    spec = probe_env(cfg)
    learner = VTraceLearner(cfg, spec.observation_space, spec.action_space, model=LinearValue())
    _, values, logp, _ = learner.evaluate(batch)
    rewards, discounts = learner.rewards_and_discounts(batch)
    vs, pg_adv = learner.vtrace_targets(batch, logp, values, rewards, discounts)
    return batch, vs[:, 0].numpy(), pg_adv[:, 0].numpy()


def test_truncation_bootstraps_from_the_final_observation_and_skips_the_reset_step():
    cfg = countdown_config(**{"learner.gamma": 0.9})  # time limit 3, T = 4
    batch, vs, pg_adv = targets_for(cfg)
    np.testing.assert_array_equal(batch.obs[:, 0, 0].numpy(), [0, 1, 2, 3, 0])
    # vs_2 = r + gamma * V(final obs 3) = 1 + 0.9 * 13; the reset step keeps vs = V(3) = 13.
    expected_vs = [1 + 0.9 * (1 + 0.9 * 12.7), 1 + 0.9 * 12.7, 12.7, 13.0]
    np.testing.assert_allclose(vs, expected_vs, rtol=1e-6)
    np.testing.assert_allclose(pg_adv, [expected_vs[0] - 10, expected_vs[1] - 11, 12.7 - 12, 0.0], rtol=1e-5)


def test_termination_cuts_the_return_and_the_next_episode_bootstraps_normally():
    cfg = countdown_config(**{"learner.gamma": 0.9, "env.kwargs": {"length": 3}, "learner.rollout": 5,
                              "learner.batch_size": 20})
    batch, vs, _ = targets_for(cfg)
    np.testing.assert_array_equal(batch.obs[:, 0, 0].numpy(), [0, 1, 2, 3, 0, 1])
    np.testing.assert_allclose(vs, [2.71, 1.9, 1.0, 13.0, 1 + 0.9 * 11], rtol=1e-6)


def random_batch(T=8, B=16, obs_dim=4, n_actions=2, version=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Trajectories(
        obs=torch.randn(T + 1, B, obs_dim, generator=g), actions=torch.randint(0, n_actions, (T, B), generator=g),
        behaviour_logp=torch.full((T, B), math.log(1 / n_actions)), rewards=torch.randn(T, B, generator=g),
        terminated=torch.rand(T, B, generator=g) < 0.1, truncated=torch.zeros(T, B, dtype=torch.bool),
        valid=torch.ones(T, B, dtype=torch.bool), version=torch.full((T, B), version))


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_learner_trains_on_a_batch_the_caller_assembled(algo):
    import gymnasium

    torch.manual_seed(0)

    cfg = build_config("cartpole-appo", {"learner.algo": algo, "learner.lr_decay": False, "learner.lr": 3e-3,
                                         "learner.reward_scale": 1.0})
    obs_space = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    learner = VTraceLearner(cfg, obs_space, gymnasium.spaces.Discrete(2))
    batch = random_batch()
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.train(batch)
    assert learner.version == 1 and learner.updates == 1
    assert all(math.isfinite(stats[k]) for k in ("loss", "policy_loss", "value_loss", "entropy", "grad_norm"))
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    # The value head fits a fixed target: its loss falls over repeated updates.
    losses = [learner.train(batch)["value_loss"] for _ in range(80)]
    assert sum(losses[-10:]) < 0.7 * sum(losses[:10])


def test_policy_lag_is_reported_and_old_transitions_are_masked():
    import gymnasium

    cfg = build_config("cartpole-appo", {"learner.max_policy_lag": 3})
    learner = VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32), gymnasium.spaces.Discrete(2))
    learner.version = 10
    batch = random_batch(version=2)  # lag 8 > 3: every transition masked, nothing to learn from
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.train(batch)
    assert stats["policy_lag_min"] == stats["policy_lag_max"] == 8
    assert stats["loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))


def test_policy_lag_statistics_cover_the_valid_steps_only():
    import gymnasium

    learner = VTraceLearner(build_config("cartpole-appo"), gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                            gymnasium.spaces.Discrete(2))
    learner.version = 10
    batch = random_batch(T=2, B=2)
    batch.version = torch.tensor([[9, 1], [8, 4]])  # lags 1, 9 (invalid), 2, 6
    batch.valid = torch.tensor([[True, False], [True, True]])
    assert learner.lag_stats(batch) == {"policy_lag_min": 1.0, "policy_lag_mean": 3.0, "policy_lag_max": 6.0}
    batch.valid[:] = False
    assert learner.lag_stats(batch) == {"policy_lag_min": 0.0, "policy_lag_mean": 0.0, "policy_lag_max": 0.0}


@pytest.mark.parametrize("algo,minibatches", [("appo", 1), ("appo", 2), ("impala", 1)])
def test_device_path_learns_what_the_cpu_path_learns(algo, minibatches):
    """The torch V-trace scan (what runs on a GPU) against the numba kernel, over three batches
    with off-policy steps, invalid steps and terminations."""
    import gymnasium

    cfg = build_config("cartpole-appo", {"learner.algo": algo, "learner.num_minibatches": minibatches,
                                         "learner.vtrace_lambda": 0.9, "learner.clip_rho": 1.5})
    learners, stats = [], []
    for device_path in (False, True):
        torch.manual_seed(0)
        learner = VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                gymnasium.spaces.Discrete(2), device_path=device_path)
        runs = []
        for seed in range(3):
            batch = random_batch(seed=seed)
            batch.behaviour_logp = batch.behaviour_logp + 0.3 * torch.randn(batch.behaviour_logp.shape)
            batch.valid[2, :4] = False
            runs.append(learner.train(batch))
        learners.append(learner)
        stats.append(runs)
    for cpu, device in zip(*stats):
        assert cpu.keys() == device.keys()
        for key in cpu:
            assert device[key] == pytest.approx(cpu[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(*(learner.model.parameters() for learner in learners)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_fused_adam_takes_the_steps_foreach_adam_takes():
    """The learner's fused Adam (one kernel on the CPU too) against torch's foreach Adam, the
    reference it replaced there, over three batches."""
    import gymnasium

    cfg = build_config("cartpole-appo", {"learner.vtrace_lambda": 0.9})
    learners = []
    for fused in (True, False):
        torch.manual_seed(0)
        learner = VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                gymnasium.spaces.Discrete(2))
        if not learner.optimizer.param_groups[0]["fused"]:
            pytest.skip("this torch has no fused Adam on the CPU (< 2.4): make_adam falls back to foreach")
        if not fused:
            learner.optimizer = torch.optim.Adam(learner.model.parameters(), lr=cfg.learner.lr,
                                                 eps=cfg.learner.adam_eps, foreach=True)
        for seed in range(3):
            learner.train(random_batch(seed=seed))
        learners.append(learner)
    for a, b in zip(*(learner.model.parameters() for learner in learners)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_adam_steps_channels_last_conv_weights_as_foreach_adam_does():
    # The Pong learner's case: NHWC conv weights (fastrl.learner.base), whose gradients autograd
    # gives in the same layout.
    from fastrl.learner.base import make_adam

    results = []
    for fused in (True, False):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
        net = net.to(memory_format=torch.channels_last)
        opt = make_adam(net, 1e-2, 1e-5) if fused else torch.optim.Adam(net.parameters(), lr=1e-2, eps=1e-5,
                                                                         foreach=True)
        for seed in range(3):
            x = torch.randn(2, 4, 9, 9, generator=torch.Generator().manual_seed(seed))
            opt.zero_grad()
            net(x.contiguous(memory_format=torch.channels_last)).square().mean().backward()
            opt.step()
        results.append([p.detach().clone() for p in net.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_adam_falls_back_to_foreach_where_torch_has_no_fused_cpu_kernel(monkeypatch):
    from fastrl.learner import base

    real_adam = torch.optim.Adam

    def adam_without_fused_cpu(params, fused=None, **kwargs):
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported "
                               "devices")
        return real_adam(params, fused=fused, **kwargs)

    monkeypatch.setattr(base.torch.optim, "Adam", adam_without_fused_cpu)
    opt = base.make_adam(torch.nn.Linear(3, 2), 1e-3, 1e-5)
    assert opt.param_groups[0]["foreach"] and not opt.param_groups[0]["fused"]


def test_bfloat16_autocast_trains_close_to_float32():
    import gymnasium

    results = []
    for precision in ("float32", "bfloat16"):
        torch.manual_seed(0)
        cfg = build_config("cartpole-appo", {"learner.precision": precision})
        learner = VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                gymnasium.spaces.Discrete(2))
        results.append((learner.train(random_batch(T=16)), learner.model))
    (full, full_model), (half, half_model) = results
    assert half["value_loss"] != full["value_loss"]  # the network did run in bfloat16
    for key in ("loss", "policy_loss", "value_loss", "entropy", "grad_norm"):
        assert half[key] == pytest.approx(full[key], rel=0.05, abs=2e-3), key
    lr = build_config("cartpole-appo").learner.lr
    for a, b in zip(full_model.parameters(), half_model.parameters()):
        # Adam's first step moves a weight by about lr, either way: a near-zero gradient may flip sign.
        assert a.dtype == b.dtype == torch.float32
        assert (a - b).abs().max() <= 2.01 * lr


def _never_measured() -> tuple[str, str]:
    raise AssertionError("auto timed bf16 where the flags already settle it")


def test_auto_precision_measures_only_for_v_trace_and_dqn_learners_on_a_cpu_with_native_bf16():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    native = {"fpu", "avx2", "avx512f", "avx512_bf16"}
    faster, slower = (lambda: ("bfloat16", "faster")), (lambda: ("float32", "slower"))
    assert learner_precision("auto", "appo", cpu, faster, native) == "bfloat16"
    assert learner_precision("auto", "appo", cpu, slower, native) == "float32"  # native, yet slower here
    assert learner_precision("auto", "impala", cpu, faster, {"sse2", "amx_bf16"}) == "bfloat16"
    assert learner_precision("auto", "appo", cpu, _never_measured, {"avx2", "avx512f"}) == "float32"  # emulated
    assert learner_precision("auto", "appo", gpu, _never_measured, native) == "float32"
    assert learner_precision("auto", "dqn", cpu, faster, native) == "bfloat16"
    assert learner_precision("auto", "dqn", cpu, _never_measured, {"avx2"}) == "float32"
    assert learner_precision("auto", "r2d2", cpu, _never_measured, native) == "float32"
    assert learner_precision("auto", "sac", cpu, _never_measured, native) == "float32"
    for setting in ("float32", "bfloat16"):
        assert learner_precision(setting, "appo", cpu, _never_measured, set()) == setting
    assert auto_precision("appo", cpu, _never_measured, {"avx2"}) == ("float32", "this CPU has no native bf16")


def test_auto_precision_is_float32_on_a_torch_without_onednn(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert learner_precision("auto", "appo", torch.device("cpu"), _never_measured, {"avx512_bf16"}) == "float32"


def _cnn_learner_parts():
    import gymnasium

    space = gymnasium.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    cfg = build_config("cartpole-appo", {"model.kind": "mnih2013_cnn", "learner.torch_threads": 1})
    return cfg, VTraceLearner(cfg, space, gymnasium.spaces.Discrete(6)).model, space


def test_measured_precision_wants_a_tenth_of_float32s_time_saved_and_says_what_it_measured(monkeypatch):
    cfg, model, space = _cnn_learner_parts()
    timed = []
    for ratio in (BF16_MAX_TIME_RATIO, 0.95, float("nan")):
        monkeypatch.setattr(precision_module, "bf16_time_ratio",
                            lambda *args, threads, r=ratio: timed.append((args, threads)) or r)
        timed.clear()
        choice, why = measured_precision(cfg, model, space)
        assert timed == [((model, space, 64), 1)]
        if ratio == BF16_MAX_TIME_RATIO:
            assert choice == "bfloat16"
        elif ratio == 0.95:
            assert (choice, why) == ("float32", "bf16 took 0.95x float32's time for the learner's network on this CPU")
        else:
            assert choice == "float32" and "set learner.precision=bfloat16 by hand" in why
    assert measured_precision(cfg, model, None)[0] == "float32"


def test_measured_precision_keeps_an_mlp_on_the_numpy_path_without_timing(monkeypatch):
    import gymnasium

    monkeypatch.setattr(precision_module, "bf16_time_ratio", lambda *args, **kwargs: pytest.fail("timed"))
    space = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    cfg = build_config("cartpole-appo")
    model = VTraceLearner(cfg, space, gymnasium.spaces.Discrete(2)).model
    assert measured_precision(cfg, model, space) == ("float32",
                                                     "this MLP trains through numpy (learner.numpy_mlp), in float32")
    monkeypatch.setattr(precision_module, "bf16_time_ratio", lambda *args, **kwargs: 0.5)
    torch_mlp = build_config("cartpole-appo", {"learner.numpy_mlp": False})
    assert measured_precision(torch_mlp, model, space)[0] == "bfloat16"


class _DropoutPolicy(nn.Module):
    """A user's network, (params, value), whose training-mode dropout draws from torch's generator
    and whose forward pass counts itself in a buffer (as a normalizer's statistics would change)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5))
        self.logits, self.value = nn.Linear(16, 2), nn.Linear(16, 1)
        self.register_buffer("passes", torch.zeros(()))

    def forward(self, obs):
        self.passes += 1
        h = self.body(obs)
        return self.logits(h), self.value(h).squeeze(-1)


@pytest.mark.parametrize("network", ["user", "cnn"])
def test_bf16_time_ratio_times_a_copy_and_leaves_the_model_and_threads_as_they_were(network):
    import gymnasium

    if network == "user":
        model, space = _DropoutPolicy(), gymnasium.spaces.Box(-1, 1, (4,), np.float32)
    else:
        _, model, space = _cnn_learner_parts()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    threads = torch.get_num_threads()
    ratio = bf16_time_ratio(model, space, rows=8, repeats=1, threads=1)
    assert math.isfinite(ratio) and ratio > 0
    assert torch.get_num_threads() == threads
    for name, p in model.named_parameters():
        assert p.grad is None and torch.equal(p, weights[name]), name
    if network == "user":
        assert model.passes == 0  # the copy ran


def test_bf16_time_ratio_leaves_torchs_random_state_as_it_was():
    import gymnasium

    space, model = gymnasium.spaces.Box(-1, 1, (4,), np.float32), _DropoutPolicy()
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    assert math.isfinite(bf16_time_ratio(model, space, rows=4, repeats=1))
    assert torch.equal(torch.rand(2), expected)  # the dropout's draws were the probe's own


def test_bf16_time_ratio_is_nan_for_a_network_it_cannot_copy_or_run():
    import gymnasium

    class Uncopyable(_DropoutPolicy):
        def __deepcopy__(self, memo):
            raise TypeError("holds a handle")

    space = gymnasium.spaces.Box(-1, 1, (4,), np.float32)
    assert math.isnan(bf16_time_ratio(Uncopyable(), space, rows=4))
    assert math.isnan(bf16_time_ratio(_DropoutPolicy().requires_grad_(False), space, rows=4))  # frozen: no backward


def test_probe_rows_are_one_gradient_steps_observations_at_most_64():
    assert probe_rows(build_config("atari-dqn-cpu")) == 32  # replay.batch_size
    cfg = build_config("cartpole-appo", {"learner.batch_size": 256, "learner.num_minibatches": 8})
    assert probe_rows(cfg) == 32
    assert probe_rows(build_config("cartpole-appo", {"learner.batch_size": 4096})) == PROBE_MAX_ROWS == 64


def test_bfloat16_set_by_hand_on_a_cpu_that_would_emulate_it_gets_one_line_naming_the_fix():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    line = emulated_bf16_warning("bfloat16", "dqn", cpu, {"avx2", "avx512f"})
    assert line.startswith("[fastrl] learner.precision=bfloat16 on a CPU without native bf16") and "\n" not in line
    assert "set learner.precision=auto" in line
    assert emulated_bf16_warning("bfloat16", "appo", cpu, {"avx2", "avx512_bf16"}) is None
    assert emulated_bf16_warning("bfloat16", "appo", gpu, {"avx2"}) is None
    assert emulated_bf16_warning("auto", "appo", cpu, {"avx2"}) is None  # auto picks float32 there
    assert emulated_bf16_warning("float32", "appo", cpu, {"avx2"}) is None


def test_cpu_flags_are_read_from_the_cpuinfo_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(str(info)) == {"fpu", "sse2", "avx512_bf16"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


@pytest.mark.parametrize("ratio, chosen", [(0.6, "bfloat16"), (1.3, "float32")])
def test_a_learner_set_to_auto_runs_in_the_precision_timed_on_its_own_network(monkeypatch, ratio, chosen):
    import gymnasium

    timed = []
    monkeypatch.setattr(precision_module, "native_bf16", lambda flags=None: True)
    monkeypatch.setattr(precision_module, "bf16_time_ratio",
                        lambda model, space, rows, threads: timed.append((model, space, rows, threads)) or ratio)
    cfg = build_config("cartpole-appo", {"learner.precision": "auto", "learner.batch_size": 512,
                                         "learner.num_minibatches": 16, "learner.numpy_mlp": False,
                                         "learner.torch_threads": 2})
    space = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    learner = VTraceLearner(cfg, space, gymnasium.spaces.Discrete(2))
    assert learner.precision == chosen
    assert timed == [(learner.model, space, 32, 2)]  # one gradient step's rows (512 / 16), the learner's threads
    batch = random_batch(T=16)
    with learner.autocast():
        features = learner.model.encode(batch.obs.reshape(-1, 4))
        params, _ = learner.model(batch.obs.reshape(-1, 4))
    assert features.dtype == (torch.bfloat16 if chosen == "bfloat16" else torch.float32)
    assert params.dtype == torch.float32  # the heads run float32 either way (models.float32_heads)


def test_a_nan_loss_skips_the_step_even_when_its_gradients_are_finite():
    import gymnasium

    learner = VTraceLearner(build_config("cartpole-appo"), gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                            gymnasium.spaces.Discrete(2))
    before = [p.detach().clone() for p in learner.model.parameters()]
    grad_norm, _ = learner.gradient_step(sum(p.sum() for p in learner.model.parameters()) + float("nan"))
    assert math.isnan(grad_norm) and learner.skipped_updates == 1 and learner.updates == 0
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    assert all(p.grad is None for p in learner.model.parameters())


@pytest.mark.parametrize("device_path", [False, True])
def test_non_finite_loss_skips_the_update(device_path):
    import gymnasium

    cfg = build_config("cartpole-appo")
    learner = VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32), gymnasium.spaces.Discrete(2),
                            device_path=device_path)
    batch = random_batch()
    batch.rewards[0, 0] = float("nan")
    before = [p.detach().clone() for p in learner.model.parameters()]
    learner.train(batch)
    assert learner.skipped_updates == 1 and learner.updates == 0
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))


def test_bad_batch_shapes_name_the_field():
    import gymnasium

    cfg = build_config("cartpole-appo")
    learner = VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32), gymnasium.spaces.Discrete(2))
    batch = random_batch()
    batch.obs = batch.obs[:-1]
    with pytest.raises(ValueError, match="Trajectories.obs"):
        learner.train(batch)


@pytest.mark.parametrize("activation, hidden", [("relu", [16, 8]), ("tanh", [16]), ("relu", [])])
@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_the_numpy_mlp_path_gives_the_torch_path_outputs_gradients_and_steps(activation, hidden, algo):
    """learner.numpy_mlp: the network's outputs, every parameter's gradient and the weights after
    three train() calls equal those of torch's forward and backward, from the same weights."""
    import gymnasium

    obs_space = gymnasium.spaces.Box(-np.inf, np.inf, (5,), np.float32)
    learners = []
    for numpy_mlp in (True, False):
        cfg = build_config("cartpole-appo", {"learner.algo": algo, "model.activation": activation,
                                             "model.hidden_sizes": hidden, "learner.entropy_coef": 0.01,
                                             "learner.numpy_mlp": numpy_mlp})
        torch.manual_seed(0)
        learners.append(VTraceLearner(cfg, obs_space, gymnasium.spaces.Discrete(3)))
    fast, reference = learners
    assert fast.numpy_mlp is not None and reference.numpy_mlp is None
    batch = random_batch(obs_dim=5, n_actions=3)
    batch.obs *= 3  # past the ReLUs' kinks and into tanh's curve
    outputs = [learner.evaluate(batch) for learner in learners]
    for got, want in zip(*outputs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grads = []
    for learner, (_, values, logp, entropy) in zip(learners, outputs):
        (values.square().mean() + (logp * torch.linspace(-1, 1, logp.numel()).reshape(logp.shape)).mean()
         - entropy.mean()).backward()
        grads.append([p.grad for p in learner.model.parameters()])
        learner.optimizer.zero_grad(set_to_none=True)
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for seed in range(3):
        stats = [learner.train(random_batch(obs_dim=5, n_actions=3, seed=seed)) for learner in learners]
        for key in ("loss", "policy_loss", "value_loss", "entropy", "grad_norm"):
            assert stats[0][key] == pytest.approx(stats[1][key], rel=1e-4, abs=1e-6), key
    for got, want in zip(fast.model.parameters(), reference.model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("overrides, device_path", [
    ({"model.separate_critic": True}, False), ({"model.normalize_obs": True}, False), ({"model.core": "lstm"}, False),
    ({"learner.precision": "bfloat16"}, False), ({}, True), ({"learner.numpy_mlp": False}, False)])
def test_the_numpy_mlp_path_is_taken_only_where_it_reproduces_the_model(overrides, device_path):
    import gymnasium

    cfg = build_config("cartpole-appo", overrides)
    learner = VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32), gymnasium.spaces.Discrete(2),
                            device_path=device_path)
    assert learner.numpy_mlp is None


def test_the_numpy_mlp_path_refuses_a_backward_after_an_in_place_weight_edit():
    import gymnasium

    learner = VTraceLearner(build_config("cartpole-appo"), gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                            gymnasium.spaces.Discrete(2))
    _, values, _, _ = learner.evaluate(random_batch())
    with torch.no_grad():
        learner.model.value.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        values.sum().backward()


# V-trace replay: replayed trajectories appended to the fresh ones.


FIELDS = ("obs", "actions", "behaviour_logp", "rewards", "terminated", "truncated", "valid")


@pytest.mark.parametrize("fraction", [0.25, 0.6])
def test_learner_appends_replayed_trajectories_of_the_right_stream(fraction):
    torch.manual_seed(0)
    learner = VTraceLearner(vtrace_replay_config(fraction, min_fill=3 * T * E), OBS_SPACE, ACTION_SPACE)
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
    learner = VTraceLearner(vtrace_replay_config(0.5, min_fill=T * E), OBS_SPACE, ACTION_SPACE)
    (batch, env_ids), = stream_batches(1)
    with pytest.raises(ValueError, match=r"needs env_ids \[4\]"):
        learner.train(batch)
    with pytest.raises(ValueError, match=r"needs env_ids \[4\]"):
        learner.train(batch, env_ids=env_ids[:2])
    assert learner.version == 0 and learner.replay.added == 0


def test_vtrace_replay_never_stores_a_batch_with_non_finite_data():
    learner = VTraceLearner(vtrace_replay_config(0.5, min_fill=T * E), OBS_SPACE, ACTION_SPACE)
    *good, (bad, bad_ids) = stream_batches(3)
    for batch, env_ids in good:
        learner.train(batch, env_ids=env_ids)
    bad.rewards[1, 2] = float("nan")
    learner.train(bad, env_ids=bad_ids)
    assert learner.replay.added == 2 * T * E  # the good batches only
    assert learner.skipped_updates == 1
    sample = learner.replay.sample(E)
    assert sample is not None and np.isfinite(sample.rewards).all()


def recorded_loss_calls(learner):
    """Wrap ``learner.loss`` to record the targets and old_values of each call (the minibatch's obs beside them)."""
    calls = []
    loss = learner.loss

    def recording(target_logp, behaviour_logp, values, *args, targets=None, old_values=None, **kwargs):
        calls.append({"targets": [t.clone() for t in targets],
                      "old_values": None if old_values is None else old_values.clone()})
        return loss(target_logp, behaviour_logp, values, *args, targets=targets, old_values=old_values, **kwargs)
    learner.loss = recording
    return calls


def learner_on(overrides, seed=0):
    import gymnasium

    torch.manual_seed(seed)
    cfg = build_config("cartpole-appo", {"learner.lr_decay": False, "learner.lr": 3e-2, **overrides})
    return VTraceLearner(cfg, gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32), gymnasium.spaces.Discrete(2))


def start_of_batch(learner, batch):
    """(vs, advantages, values) by a copy of the learner's network as it is now."""
    import copy

    probe = copy.deepcopy(learner)
    rewards, discounts = probe.rewards_and_discounts(batch)
    with torch.no_grad():
        _, values, logp, _ = probe.evaluate(batch)
    vs, advantages = probe.vtrace_targets(batch, logp, values, rewards, discounts)
    return vs, advantages, values


@pytest.mark.parametrize("targets", ["batch", "minibatch"])
def test_batch_targets_are_computed_once_before_the_first_step_and_kept_through_every_epoch(targets):
    learner = learner_on({"learner.targets": targets, "learner.num_epochs": 3})
    batch = random_batch(seed=4)
    batch.behaviour_logp = batch.behaviour_logp + 0.2 * torch.randn(batch.behaviour_logp.shape)  # off-policy
    vs, advantages, _ = start_of_batch(learner, batch)
    calls = recorded_loss_calls(learner)
    learner.train(batch)
    assert len(calls) == 3
    torch.testing.assert_close(calls[0]["targets"][0], vs)  # the first step sees the same numbers either way
    torch.testing.assert_close(calls[0]["targets"][1], advantages)
    for call in calls[1:]:
        moved = not torch.allclose(call["targets"][0], vs) and not torch.allclose(call["targets"][1], advantages)
        assert moved == (targets == "minibatch")
    assert all(call["old_values"] is None for call in calls)


def test_batch_targets_follow_each_minibatchs_columns():
    learner = learner_on({"learner.targets": "batch", "learner.num_epochs": 2, "learner.num_minibatches": 4})
    batch = random_batch(seed=5)
    vs, advantages, _ = start_of_batch(learner, batch)
    seen = []
    update = learner.update

    def recording(part, *args):
        seen.append((part.obs[0], args[-1]))
        return update(part, *args)
    learner.update = recording
    learner.train(batch)
    assert len(seen) == 8
    for first_obs, start in seen:
        # Each column of the minibatch is the batch's column with the same first observation.
        columns = [int(torch.nonzero((batch.obs[0] == row).all(-1))[0]) for row in first_obs]
        torch.testing.assert_close(start[0], vs[:, columns])
        torch.testing.assert_close(start[1], advantages[:, columns])


def test_value_clipping_is_around_the_values_before_the_batchs_first_step():
    learner = learner_on({"learner.value_clip": 0.1, "learner.num_epochs": 3})
    batch = random_batch(seed=6)
    vs, _, values = start_of_batch(learner, batch)
    calls = recorded_loss_calls(learner)
    learner.train(batch)
    for call in calls:
        torch.testing.assert_close(call["old_values"], values)
    # targets stay "minibatch": re-derived at every step, so they move after the first.
    torch.testing.assert_close(calls[0]["targets"][0], vs)
    assert not torch.allclose(calls[-1]["targets"][0], vs)



@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_uniform_kl_coef_brings_back_an_action_the_policy_ruled_out(algo):
    """A policy that all but never takes action 1 (p ~ 1e-13): the entropy bonus cannot lift it,
    the KL to the uniform policy does, and the loss and statistics carry it."""
    def probability_of_action_1(coef):
        learner = learner_on({"learner.algo": algo, "learner.uniform_kl_coef": coef, "learner.entropy_coef": 0.01,
                              "learner.lr": 1e-2})
        with torch.no_grad():
            learner.model.policy.weight.zero_()
            learner.model.policy.bias.copy_(torch.tensor([15.0, -15.0]))
        batch = random_batch(seed=7)
        batch.actions.zero_()  # acted by that policy
        batch.behaviour_logp.zero_()
        for _ in range(50):
            stats = learner.train(batch)
        with torch.no_grad():
            logits, _ = learner.model(batch.obs[0])
        return torch.softmax(logits, -1)[:, 1].min().item(), stats

    ruled_out, stats = probability_of_action_1(0.0)
    brought_back, kl_stats = probability_of_action_1(0.5)
    assert ruled_out < 1e-10 and "uniform_kl" not in stats
    assert brought_back > 1e-5  # ~2e-4 after these 50 updates
    assert kl_stats["uniform_kl"] > 0
