"""V-trace against a brute-force reference written from the paper's sum formula, and the torch
scan the learner runs on an accelerator against the numba kernel."""
import numpy as np
import pytest
import torch

from fastrl.kernels import gae, vtrace
from fastrl.kernels.torch_ops import vtrace_scan

TOLERANCE = {np.float64: 1e-10, np.float32: 2e-6}


def vtrace_reference(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar, pg_rho_bar,
                     c_bar, lambda_):
    """Espeholt et al. 2018, eq. 1, truncated at the end of the trajectory, in float64:

    vs_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} discount_i c_i) delta_t,
    delta_t = rho_t (r_t + discount_t V(x_{t+1}) - V(x_t)), V(x_T) = bootstrap_value,

    and the policy-gradient advantage of section 4.2 with the lambda of its Remark 2 (as rlax's
    vtrace_td_error_and_advantage): the bootstrap mixes vs and V,

    pg_s = pg_rho_s (r_s + discount_s (lambda vs_{s+1} + (1 - lambda) V(x_{s+1})) - V(x_s)),
    vs_T = V(x_T).
    """
    def clip(x, bar):
        return x if bar is None else min(bar, x)

    num_steps, batch = rewards.shape
    vs = np.zeros((num_steps, batch))
    pg_advantages = np.zeros((num_steps, batch))
    for b in range(batch):
        v = [float(x) for x in values[:, b]] + [float(bootstrap_value[b])]
        rhos = [float(np.exp(np.float64(x))) for x in log_rhos[:, b]]
        for s in range(num_steps):
            total = v[s]
            trace = 1.0  # prod_{i=s}^{t-1} discount_i c_i
            for t in range(s, num_steps):
                delta = clip(rhos[t], rho_bar) * (rewards[t, b] + discounts[t, b] * v[t + 1] - v[t])
                total += trace * delta
                trace *= discounts[t, b] * lambda_ * clip(rhos[t], c_bar)
            vs[s, b] = total
        for s in range(num_steps):
            vs_next = vs[s + 1, b] if s + 1 < num_steps else v[num_steps]
            bootstrap = lambda_ * vs_next + (1.0 - lambda_) * v[s + 1]
            pg_advantages[s, b] = clip(rhos[s], pg_rho_bar) * (
                rewards[s, b] + discounts[s, b] * bootstrap - v[s])
    return vs, pg_advantages


def random_inputs(num_steps, batch, dtype, seed=0):
    rng = np.random.default_rng(seed)
    # sigma 1 puts the ratios on both sides of every threshold used below.
    log_rhos = rng.normal(0.0, 1.0, (num_steps, batch))
    discounts = 0.97 * (rng.random((num_steps, batch)) > 0.2)
    rewards = rng.normal(size=(num_steps, batch))
    values = rng.normal(size=(num_steps, batch))
    bootstrap_value = rng.normal(size=batch)
    return [a.astype(dtype) for a in (log_rhos, discounts, rewards, values, bootstrap_value)]


def assert_close(actual, expected, dtype):
    scale = np.maximum(1.0, np.abs(expected))
    relative_error = np.abs(actual.astype(np.float64) - expected) / scale
    np.testing.assert_array_less(relative_error, TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("num_steps", [1, 5, 33])
@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("thresholds,lambda_", [
    ((1.0, 1.0, 1.0), 1.0),
    ((1.0, 1.0, 1.0), 0.95),
    ((None, None, None), 1.0),
    ((2.0, 0.5, 0.9), 0.8),
])
def test_matches_reference(dtype, num_steps, batch, thresholds, lambda_):
    inputs = random_inputs(num_steps, batch, dtype, seed=num_steps * 10 + batch)
    rho_bar, pg_rho_bar, c_bar = thresholds
    vs, pg_advantages = vtrace(*inputs, clip_rho_threshold=rho_bar,
                               clip_pg_rho_threshold=pg_rho_bar, clip_c_threshold=c_bar,
                               lambda_=lambda_)
    assert vs.dtype == dtype and pg_advantages.dtype == dtype
    assert vs.shape == pg_advantages.shape == (num_steps, batch)
    ref_vs, ref_pg = vtrace_reference(*inputs, rho_bar, pg_rho_bar, c_bar, lambda_)
    assert_close(vs, ref_vs, dtype)
    assert_close(pg_advantages, ref_pg, dtype)


def test_non_contiguous_inputs_give_the_same_result():
    inputs = random_inputs(9, 6, np.float64, seed=1)
    expected = vtrace(*inputs)
    # A transposed copy of [B, T] data and a strided slice: neither is C-contiguous.
    transposed = [np.ascontiguousarray(a.T).T for a in inputs[:4]]
    padded_bootstrap = np.repeat(inputs[4], 2)[::2]
    assert not transposed[0].flags.c_contiguous and not padded_bootstrap.flags.c_contiguous
    actual = vtrace(*transposed, padded_bootstrap)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)


def test_result_before_an_episode_end_ignores_what_follows():
    log_rhos, discounts, rewards, values, bootstrap_value = random_inputs(12, 4, np.float64, seed=2)
    cut = 5
    discounts[cut] = 0.0
    vs, pg_advantages = vtrace(log_rhos, discounts, rewards, values, bootstrap_value)

    # The two halves run separately: the first bootstraps from V(x_{cut+1}), which its
    # zero discount must ignore, the second from the original bootstrap value.
    head = vtrace(log_rhos[:cut + 1], discounts[:cut + 1], rewards[:cut + 1], values[:cut + 1],
                  values[cut + 1])
    tail = vtrace(log_rhos[cut + 1:], discounts[cut + 1:], rewards[cut + 1:], values[cut + 1:],
                  bootstrap_value)
    np.testing.assert_array_equal(np.concatenate([head[0], tail[0]]), vs)
    np.testing.assert_array_equal(np.concatenate([head[1], tail[1]]), pg_advantages)

    # Anything after the cut may change without moving the targets before it.
    rng = np.random.default_rng(3)
    changed = [a.copy() for a in (log_rhos, rewards, values)]
    for a in changed:
        a[cut + 1:] = rng.normal(size=a[cut + 1:].shape)
    vs2, pg2 = vtrace(changed[0], discounts, changed[1], changed[2], rng.normal(size=4))
    np.testing.assert_array_equal(vs2[:cut + 1], vs[:cut + 1])
    np.testing.assert_array_equal(pg2[:cut + 1], pg_advantages[:cut + 1])


def test_on_policy_gives_bootstrapped_returns_and_gae_lambda_one():
    _, discounts, rewards, values, bootstrap_value = random_inputs(10, 3, np.float64, seed=4)
    vs, pg_advantages = vtrace(np.zeros_like(rewards), discounts, rewards, values, bootstrap_value)

    # G_t = r_t + discount_t G_{t+1}, G_T = bootstrap: the bootstrapped n-step return.
    returns = np.zeros_like(rewards)
    next_return = bootstrap_value.copy()
    for t in reversed(range(len(rewards))):
        returns[t] = rewards[t] + discounts[t] * next_return
        next_return = returns[t]
    np.testing.assert_allclose(vs, returns, rtol=1e-12, atol=1e-12)

    advantages, gae_returns = gae(rewards, values, bootstrap_value, discounts, 1.0)
    np.testing.assert_allclose(vs, gae_returns, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(vs - values, advantages, rtol=1e-12, atol=1e-12)
    vs_next = np.concatenate([vs[1:], bootstrap_value[None]])
    np.testing.assert_allclose(pg_advantages, rewards + discounts * vs_next - values,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("lambda_", [0.0, 0.5, 0.9])
def test_pg_advantages_bootstrap_from_lambda_mix_of_targets_and_values(dtype, lambda_):
    inputs = random_inputs(17, 6, dtype, seed=7)
    log_rhos, discounts, rewards, values, bootstrap_value = inputs
    vs, pg_advantages = vtrace(*inputs, clip_rho_threshold=1.5, clip_pg_rho_threshold=0.8,
                               clip_c_threshold=1.2, lambda_=lambda_)
    ref_vs, ref_pg = vtrace_reference(*inputs, 1.5, 0.8, 1.2, lambda_)
    assert_close(vs, ref_vs, dtype)
    assert_close(pg_advantages, ref_pg, dtype)
    if lambda_ == 0.0:
        # c = 0 cuts every trace: vs is the one-step target, and so is the pg bootstrap.
        next_values = np.concatenate([values[1:], bootstrap_value[None]]).astype(np.float64)
        one_step = np.minimum(0.8, np.exp(log_rhos.astype(np.float64))) * (
            rewards + discounts * next_values - values)
        assert_close(pg_advantages, one_step, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("thresholds", [(1.0, 1.0, 1.0), (None, None, None)])
def test_minus_inf_log_rhos_mark_invalid_transitions(dtype, thresholds):
    log_rhos, discounts, rewards, values, bootstrap_value = random_inputs(8, 5, dtype, seed=5)
    invalid = np.random.default_rng(6).random(log_rhos.shape) < 0.3
    log_rhos[invalid] = -np.inf
    rho_bar, pg_rho_bar, c_bar = thresholds
    vs, pg_advantages = vtrace(log_rhos, discounts, rewards, values, bootstrap_value,
                               clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar,
                               clip_c_threshold=c_bar)
    assert np.isfinite(vs).all() and np.isfinite(pg_advantages).all()
    np.testing.assert_array_equal(vs[invalid], values[invalid])
    np.testing.assert_array_equal(pg_advantages[invalid], 0.0)
    ref_vs, ref_pg = vtrace_reference(log_rhos, discounts, rewards, values, bootstrap_value,
                                      rho_bar, pg_rho_bar, c_bar, 1.0)
    assert_close(vs, ref_vs, dtype)
    assert_close(pg_advantages, ref_pg, dtype)


@pytest.mark.parametrize("changes,message", [
    ({"rewards": np.zeros((5, 3))},
     r"vtrace: rewards has shape \(5, 3\) but log_rhos has \(5, 4\)"),
    ({"bootstrap_value": np.zeros(3)},
     r"vtrace: bootstrap_value has shape \(3,\) but must be \[B\] = \(4,\)"),
    ({"values": np.zeros((5, 4), np.float32)},
     r"vtrace: values has dtype float32 but log_rhos has float64"),
    ({"bootstrap_value": np.zeros(4, np.float32)},
     r"vtrace: bootstrap_value has dtype float32 but log_rhos has float64"),
    ({"log_rhos": np.zeros(20)}, r"vtrace: log_rhos must be time-major \[T, B\]"),
    ({name: np.zeros((5, 4), np.int64) for name in ("log_rhos", "discounts", "rewards", "values")},
     r"vtrace: log_rhos has dtype int64; pass float32 or float64"),
])
def test_bad_inputs_raise_naming_the_array(changes, message):
    arrays = dict(log_rhos=np.zeros((5, 4)), discounts=np.zeros((5, 4)), rewards=np.zeros((5, 4)),
                  values=np.zeros((5, 4)), bootstrap_value=np.zeros(4))
    arrays.update(changes)
    with pytest.raises(ValueError, match=message):
        vtrace(**arrays)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("thresholds,lambda_", [
    ((1.0, 1.0, 1.0), 1.0),
    ((None, None, None), 1.0),
    ((2.0, 0.5, 0.9), 0.8),
    ((1.0, 1.0, 1.0), 0.0),
])
def test_torch_scan_matches_the_numba_kernel(dtype, thresholds, lambda_):
    # random_inputs' zero discounts are terminations; -inf log-rhos mark invalid (autoreset) steps.
    inputs = random_inputs(33, 7, dtype, seed=8)
    inputs[0][np.random.default_rng(9).random(inputs[0].shape) < 0.2] = -np.inf
    rho_bar, pg_rho_bar, c_bar = thresholds
    kwargs = dict(clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, clip_c_threshold=c_bar,
                  lambda_=lambda_)
    expected = vtrace(*inputs, **kwargs)
    actual = vtrace_scan(*[torch.from_numpy(a) for a in inputs], **kwargs)
    for a, e in zip(actual, expected):
        assert a.dtype == torch.from_numpy(e).dtype and a.shape == e.shape
        assert_close(a.numpy(), e.astype(np.float64), dtype)


def test_torch_scan_computes_half_precision_in_float32_without_gradient():
    inputs = [torch.from_numpy(a) for a in random_inputs(6, 4, np.float32, seed=10)]
    inputs[3].requires_grad_(True)
    vs, pg_advantages = vtrace_scan(*[t.bfloat16() for t in inputs])
    assert vs.dtype == pg_advantages.dtype == torch.bfloat16 and not vs.requires_grad
    expected_vs, _ = vtrace_scan(*[t.detach().bfloat16().float() for t in inputs])
    torch.testing.assert_close(vs, expected_vs.bfloat16(), rtol=0, atol=0)
