"""The pure losses give the learner's own numbers on a fixed batch, and follow their formulas."""
import copy
import math
import re

import gymnasium
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fastrl.config import build_config
from fastrl.kernels import vtrace
from fastrl.learner import VTraceLearner, appo_loss, impala_loss, td_loss, vtrace_targets
from fastrl.learner.losses import sequence_priorities
from tests.unit.learner.test_dqn import E, T, make_dqn, perturb, reference_windows, stream_batches
from tests.unit.learner.test_vtrace_learner import random_batch

OBS = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def learner_and_tensors(algo):
    torch.manual_seed(0)
    cfg = build_config("cartpole-appo", {"learner.algo": algo, "learner.vtrace_lambda": 0.9,
                                         "learner.clip_rho": 1.5, "learner.entropy_coef": 0.02})
    learner = VTraceLearner(cfg, OBS, gymnasium.spaces.Discrete(2))
    batch = random_batch(seed=3)
    batch.behaviour_logp = batch.behaviour_logp + 0.3 * torch.randn(batch.behaviour_logp.shape)  # off-policy
    batch.valid[2, :4] = False
    return learner, batch


@pytest.mark.parametrize("algo,loss_fn", [("appo", appo_loss), ("impala", impala_loss)])
def test_pure_losses_reproduce_the_learners_numbers(algo, loss_fn):
    learner, batch = learner_and_tensors(algo)
    probe = copy.deepcopy(learner)
    rewards, discounts = probe.rewards_and_discounts(batch)
    params, values, target_logp, entropy = probe.evaluate(batch)
    T, B = rewards.shape
    torch.testing.assert_close(entropy, probe.head.entropy(params.reshape(T * B, -1)).reshape(T, B))
    loss, stats = loss_fn(target_logp, batch.behaviour_logp, values, entropy, rewards, discounts, batch.valid,
                          **probe.loss_settings())
    reported = learner.train(batch)  # one epoch, one minibatch: the loss before its step
    for key in ("loss", "policy_loss", "value_loss", "entropy"):
        assert float(stats[key]) == pytest.approx(reported[key], rel=1e-6, abs=1e-7), key
    assert float(loss.detach()) == pytest.approx(reported["loss"], rel=1e-6)
    loss.backward()  # gradients flow to the network through target_logp and values
    assert all(p.grad is not None for p in probe.model.parameters())


def test_vtrace_targets_by_torch_scan_match_the_numba_kernel():
    learner, batch = learner_and_tensors("appo")  # off-policy, with invalid steps and terminations
    rewards, discounts = learner.rewards_and_discounts(batch)
    _, values, target_logp, _ = learner.evaluate(batch)
    inputs = (target_logp.detach(), batch.behaviour_logp, values.detach(), rewards, discounts, batch.valid)
    settings = dict(clip_rho=1.5, clip_c=1.2, clip_pg_rho=0.8, lambda_=0.9)
    on_cpu = vtrace_targets(*inputs, **settings)  # the numba kernel, faster on the CPU
    scanned = vtrace_targets(*inputs, **settings, torch_scan=True)
    for scan, kernel in zip(scanned, on_cpu):
        torch.testing.assert_close(scan, kernel, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(on_cpu, vtrace_targets(*inputs, **settings, torch_scan=False)))


def test_impala_loss_follows_its_formula():
    g = torch.Generator().manual_seed(1)
    T, B = 5, 3
    target_logp = -torch.rand(T, B, generator=g)
    behaviour_logp = -torch.rand(T, B, generator=g)
    values = torch.randn(T + 1, B, generator=g)
    entropy = torch.rand(T, B, generator=g)
    rewards = torch.randn(T, B, generator=g)
    discounts = torch.full((T, B), 0.9)
    valid = torch.ones(T, B, dtype=torch.bool)
    loss, stats = impala_loss(target_logp, behaviour_logp, values, entropy, rewards, discounts, valid,
                              value_coef=0.5, entropy_coef=0.01)
    vs, adv = vtrace(np.float32(target_logp - behaviour_logp), discounts.numpy(), rewards.numpy(),
                     values[:T].numpy(), values[T].numpy())
    policy = -(adv * target_logp.numpy()).mean()
    value = 0.5 * ((vs - values[:T].numpy()) ** 2).mean()
    expected = policy + 0.5 * value - 0.01 * entropy.mean().item()
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert float(stats["policy_loss"]) == pytest.approx(policy, rel=1e-5)


def test_appo_loss_clips_the_ratio_like_ppo():
    T, B = 1, 2
    # Advantages +1 and -1 after normalization; ratio e^1 ~ 2.7 on both: the clip binds on the
    # positive one (min(2.7, 1.2) = 1.2) and not on the negative one (min(-2.7, -1.2) = -2.7).
    target_logp = torch.zeros(T, B)
    behaviour_logp = torch.full((T, B), -1.0)
    targets = (torch.zeros(T, B), torch.tensor([[1.0, -1.0]]))
    loss, stats = appo_loss(target_logp, behaviour_logp, torch.zeros(T + 1, B), torch.zeros(T, B),
                            torch.zeros(T, B), torch.ones(T, B), torch.ones(T, B, dtype=torch.bool),
                            ppo_clip=0.2, normalize_advantages=False, targets=targets)
    assert float(stats["policy_loss"]) == pytest.approx(-(1.2 - math.e) / 2, rel=1e-6)


def appo_inputs(seed, dtype=torch.float32, T=6, B=5):
    """Random APPO inputs that reach every branch: ratios inside, above and below the clip range
    with advantages of both signs, one log-ratio past the exp's clamp at 20, masked-out steps."""
    g = torch.Generator().manual_seed(seed)
    target_logp = -torch.rand(T, B, generator=g, dtype=dtype) * 2
    behaviour_logp = target_logp + torch.randn(T, B, generator=g, dtype=dtype) * 0.4
    behaviour_logp[0, 0] = target_logp[0, 0] - 21.0
    values = torch.randn(T + 1, B, generator=g, dtype=dtype)
    entropy = torch.rand(T, B, generator=g, dtype=dtype)
    targets = (torch.randn(T, B, generator=g, dtype=dtype), torch.randn(T, B, generator=g, dtype=dtype))
    mask = torch.rand(T, B, generator=g) > 0.25
    return target_logp, behaviour_logp, values, entropy, targets, mask


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("normalize, entropy_coef, ppo_clip, upstream", [
    (True, 0.0, 0.2, 1.0), (False, 0.01, 0.2, 1.0), (True, 0.05, 0.1, 3.0)])
def test_compiled_appo_loss_equals_the_torch_ops_with_their_gradients(dtype, tol, normalize, entropy_coef, ppo_clip,
                                                                      upstream):
    target_logp, behaviour_logp, values, entropy, targets, mask = appo_inputs(0, dtype)
    ratio = torch.exp(target_logp - behaviour_logp)
    assert ((ratio > 1 + ppo_clip) & mask).any() and ((ratio < 1 - ppo_clip) & mask).any()
    results = {}
    for compiled in (True, False):
        leaves = [x.clone().requires_grad_() for x in (target_logp, values, entropy)]
        loss, stats = appo_loss(leaves[0], behaviour_logp, leaves[1], leaves[2], None, None, mask, mask,
                                ppo_clip=ppo_clip, value_coef=0.7, entropy_coef=entropy_coef,
                                normalize_advantages=normalize, targets=targets, compiled=compiled)
        (loss * upstream).backward()
        results[compiled] = (loss, stats, [leaf.grad for leaf in leaves])
    (loss, stats, grads), (want_loss, want_stats, want_grads) = results[True], results[False]
    assert loss.dtype == dtype and all(grad.dtype == dtype for grad in grads)
    torch.testing.assert_close(loss, want_loss, rtol=tol, atol=tol)
    for key in ("loss", "policy_loss", "value_loss", "entropy"):
        torch.testing.assert_close(stats[key], want_stats[key], rtol=tol, atol=tol)
        assert not stats[key].requires_grad
    for grad, want in zip(grads, want_grads):
        torch.testing.assert_close(grad, want, rtol=tol, atol=tol)
    assert not grads[1][-1].any()  # the bootstrap value gets no gradient
    assert not grads[0][~mask].any() and not grads[2][~mask].any()


def test_compiled_appo_loss_turns_nan_into_a_nan_loss_like_torch():
    """NaN where the mask is 0 still makes the loss NaN (x * 0), so the learner skips the step
    the same way on either path."""
    target_logp, behaviour_logp, values, entropy, targets, mask = appo_inputs(1)
    values[1][~mask[1]] = float("nan")
    for compiled in (True, False):
        loss, _ = appo_loss(target_logp, behaviour_logp, values, entropy, None, None, mask, mask,
                            targets=targets, compiled=compiled)
        assert torch.isnan(loss), compiled


def test_compiled_appo_loss_is_used_only_where_it_takes_the_tensors():
    target_logp, behaviour_logp, values, entropy, targets, mask = appo_inputs(2)
    compiled, _ = appo_loss(target_logp.requires_grad_(), behaviour_logp, values, entropy, None, None, mask, mask,
                            targets=targets)
    assert compiled.grad_fn.name() == "APPOLossBackward"
    mixed, _ = appo_loss(target_logp.double(), behaviour_logp, values, entropy, None, None, mask, mask,
                         targets=targets)
    assert mixed.grad_fn.name() != "APPOLossBackward"
    torch.testing.assert_close(mixed.float(), compiled, rtol=1e-5, atol=1e-6)


def test_td_loss_is_the_weighted_huber_loss_and_reports_td_errors():
    q = torch.tensor([0.0, 1.0, 5.0], requires_grad=True)
    targets = torch.tensor([0.5, -1.0, 5.0])
    weights = torch.tensor([1.0, 0.5, 2.0])
    loss, stats = td_loss(q, targets, weights)
    expected = (weights * F.smooth_l1_loss(q.detach(), targets, reduction="none")).mean()
    assert float(loss.detach()) == pytest.approx(float(expected))  # 0.5 * 0.5^2 and 0.5 * (2 - 0.5), over 3
    assert float(loss.detach()) == pytest.approx((0.125 + 0.5 * 1.5) / 3)
    assert torch.equal(stats["td"], targets - q.detach())
    loss.backward()
    assert q.grad is not None and targets.grad is None


def test_td_loss_with_a_mask_is_the_loss_of_the_selected_items():
    torch.manual_seed(0)
    q = torch.randn(4, 3, requires_grad=True)
    targets, weights = torch.randn(4, 3), torch.rand(4, 3)
    keep = torch.rand(4, 3) > 0.4
    loss, stats = td_loss(q, targets, weights, mask=keep.float())
    selected, selected_stats = td_loss(q[keep], targets[keep], weights[keep])
    torch.testing.assert_close(loss, selected)
    torch.testing.assert_close(stats["q_mean"], selected_stats["q_mean"])
    torch.testing.assert_close(stats["td"][keep], selected_stats["td"])
    assert not stats["td"][~keep].any()
    masked_grad, = torch.autograd.grad(loss, q)
    selected_grad, = torch.autograd.grad(selected, q)
    torch.testing.assert_close(masked_grad, selected_grad)
    # What lies outside the mask never counts, NaN included; an empty mask gives NaN (a skipped step).
    poisoned = targets.clone()
    poisoned[~keep] = float("nan")
    torch.testing.assert_close(td_loss(q, poisoned, weights, mask=keep.float())[0], selected)
    assert torch.isnan(td_loss(q, targets, weights, mask=torch.zeros(4, 3))[0])


def test_td_loss_reproduces_the_dqn_learners_numbers():
    """q_taken, the n-step double-Q targets and the importance weights of the batch the learner
    samples, computed here from its networks, its streams and its tree: td_loss on them is the
    loss its gradient step reports."""
    learner = make_dqn()
    perturb(learner.target)  # online and target differ: double Q matters
    batches = stream_batches(2, seed=3, p_terminate=0.15, p_truncate=0.1)
    # Each env's stream, time-major [2T (+1), E], as the replay holds it.
    obs = torch.empty(2 * T + 1, E, 4)
    actions = torch.empty(2 * T, E, dtype=torch.int64)
    rewards = torch.empty(2 * T, E)
    terminated, truncated = torch.empty(2 * T, E, dtype=torch.bool), torch.empty(2 * T, E, dtype=torch.bool)
    for k, (batch, env_ids) in enumerate(batches):
        rows, cols = slice(k * T, (k + 1) * T), torch.from_numpy(env_ids)
        obs[k * T:(k + 1) * T + 1, cols] = batch.obs
        actions[rows, cols], terminated[rows, cols], truncated[rows, cols] = (
            batch.actions, batch.terminated, batch.truncated)
        rewards[rows, cols] = learner.transformed_rewards(batch.rewards)
        learner.train(batch, env_ids=env_ids)  # 64 records: min_fill reached, no step taken yet
    assert learner.updates == 0

    model, target = copy.deepcopy(learner.model), copy.deepcopy(learner.target)  # before the step
    ring = learner.replay.ring_len
    tree = learner.replay.priorities(np.arange(E * ring))  # p^alpha of every slot
    drawn = []
    sample = learner.replay.sample

    def fixed_draw(batch_size, **kwargs):
        drawn.append(sample(batch_size, rng=5, **kwargs))
        return drawn[-1]

    learner.replay.sample = fixed_draw
    reported = learner.update()
    indices = drawn[0].indices

    env, t = indices // ring, indices % ring  # slot env * L + t holds record t of env's stream (t < L here)
    cfg = learner.cfg
    returns, discounts, ends = reference_windows(rewards.double().numpy(), terminated.numpy(), truncated.numpy(),
                                                 cfg.learner.gamma, cfg.replay.n_step)
    with torch.no_grad():
        end_obs = obs[ends[t, env], env]
        best = model(end_obs)[0].argmax(-1, keepdim=True)
        bootstrap = target(end_obs)[0].gather(-1, best).squeeze(-1)
        targets = torch.from_numpy(returns[t, env] + discounts[t, env] * bootstrap.double().numpy()).float()
    q_taken = model(obs[t, env])[0].gather(-1, actions[t, env][:, None]).squeeze(-1)
    weights = torch.from_numpy((tree[indices] / tree[indices].min()) ** -cfg.replay.beta).float()
    loss, stats = td_loss(q_taken, targets, weights)

    assert weights.min() < 1  # the importance weights matter
    np.testing.assert_allclose(drawn[0].weights, weights.numpy(), rtol=1e-6)
    assert float(loss.detach()) == pytest.approx(reported["loss"], rel=1e-5)
    assert float(stats["q_mean"]) == pytest.approx(reported["q_mean"], rel=1e-5)


# ---------------------------------------------------------------- shapes checked first


def time_major_inputs(steps=4, batch=3):
    """Every argument of the V-trace losses, well shaped: ``[T, B]``, values ``[T + 1, B]``."""
    g = torch.Generator().manual_seed(0)
    return dict(target_logp=-torch.rand(steps, batch, generator=g),
                behaviour_logp=-torch.rand(steps, batch, generator=g),
                values=torch.randn(steps + 1, batch, generator=g), entropy=torch.rand(steps, batch, generator=g),
                rewards=torch.randn(steps, batch, generator=g), discounts=torch.full((steps, batch), 0.9),
                valid=torch.ones(steps, batch, dtype=torch.bool), mask=torch.rand(steps, batch, generator=g) > 0.3)


def call_with(function, inputs):
    if function is vtrace_targets:
        return vtrace_targets(**{name: inputs[name] for name in VTRACE_ARGUMENTS})
    return function(**inputs)


VTRACE_ARGUMENTS = ("target_logp", "behaviour_logp", "values", "rewards", "discounts", "valid")
PER_STEP = {vtrace_targets: ("behaviour_logp", "rewards", "discounts", "valid"),
            appo_loss: ("behaviour_logp", "entropy", "rewards", "discounts", "valid", "mask"),
            impala_loss: ("behaviour_logp", "entropy", "rewards", "discounts", "valid", "mask")}


@pytest.mark.parametrize("function, name", [(f, name) for f, names in PER_STEP.items() for name in names],
                         ids=lambda x: getattr(x, "__name__", x))
def test_a_batch_major_argument_is_refused_by_its_name(function, name):
    inputs = time_major_inputs()
    call_with(function, inputs)  # well shaped: no complaint
    inputs[name] = inputs[name].T.contiguous()  # [B, T]: batch-major, which broadcasting could hide
    with pytest.raises(ValueError) as refused:
        call_with(function, inputs)
    assert str(refused.value) == f"{function.__name__}: {name} has shape [3, 4], expected [T, B] = [4, 3]"


@pytest.mark.parametrize("function", list(PER_STEP), ids=lambda f: f.__name__)
def test_values_without_the_bootstrap_row_and_a_target_logp_that_is_not_time_major_are_refused(function):
    inputs = time_major_inputs()
    inputs["values"] = inputs["values"][:-1]
    with pytest.raises(ValueError) as refused:
        call_with(function, inputs)
    assert str(refused.value) == f"{function.__name__}: values has shape [4, 3], expected [T + 1, B] = [5, 3]"
    inputs = time_major_inputs()
    inputs["target_logp"] = inputs["target_logp"][..., None]
    with pytest.raises(ValueError,
                       match=rf"^{function.__name__}: target_logp has shape \[4, 3, 1\], expected \[T, B\]"):
        call_with(function, inputs)


@pytest.mark.parametrize("function", [appo_loss, impala_loss], ids=lambda f: f.__name__)
def test_given_targets_are_checked_and_without_them_rewards_are_needed(function):
    inputs = time_major_inputs()
    vs, advantages = torch.zeros(4, 3), torch.zeros(4, 3)
    function(**inputs, targets=(vs, advantages))
    with pytest.raises(ValueError, match=re.escape(f"{function.__name__}: targets[1] (advantages) has shape [4], "
                                                   f"expected [T, B] = [4, 3]")):
        function(**inputs, targets=(vs, advantages[:, 0]))
    function(**{**inputs, "rewards": None, "discounts": None}, targets=(vs, advantages))  # not needed then
    with pytest.raises(ValueError, match=f"^{function.__name__}: rewards and discounts are needed"):
        function(**{**inputs, "rewards": None, "discounts": None})


@pytest.mark.parametrize("name, shape", [("targets", (6, 1)), ("weights", (5,)), ("mask", (1, 6))])
def test_td_loss_refuses_an_argument_not_shaped_as_q_taken(name, shape):
    inputs = dict(q_taken=torch.randn(6), targets=torch.randn(6), weights=torch.rand(6), mask=torch.ones(6))
    td_loss(**inputs)
    inputs[name] = torch.ones(shape)  # each of these would broadcast
    with pytest.raises(ValueError) as refused:
        td_loss(**inputs)
    assert str(refused.value) == f"td_loss: {name} has shape {list(shape)}, expected q_taken's shape = [6]"


def test_sequence_priorities_refuses_a_td_that_is_not_time_major_and_a_mask_not_like_it():
    td = torch.randn(2, 5)
    sequence_priorities(td, torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"^sequence_priorities: td has shape \[10\], expected \[T, B\]"):
        sequence_priorities(td.reshape(-1), torch.ones(10))
    with pytest.raises(ValueError) as refused:
        sequence_priorities(td, torch.ones(5, 2))
    assert str(refused.value) == "sequence_priorities: mask has shape [5, 2], expected [T, B] = [2, 5]"


def test_the_shape_checks_hold_under_torch_compile():
    """torch.compile keeps the checks as guards on the shapes: well shaped inputs trace into one
    graph (fullgraph=True would raise at a break) with the same numbers, and a compiled loss
    refuses a wrong shape as the plain one does."""
    inputs = time_major_inputs()
    targets = (torch.randn(4, 3), torch.randn(4, 3))
    whole = torch.compile(impala_loss, backend="eager", fullgraph=True)
    torch.testing.assert_close(whole(**inputs, targets=targets)[0], impala_loss(**inputs, targets=targets)[0])
    q, y = torch.randn(6), torch.randn(6)
    torch.testing.assert_close(torch.compile(td_loss, backend="eager", fullgraph=True)(q, y)[0], td_loss(q, y)[0])
    with pytest.raises(ValueError, match=re.escape("td_loss: targets has shape [6, 1], expected q_taken's shape")):
        torch.compile(td_loss, backend="eager")(q, y[:, None])


def test_value_clipping_takes_the_larger_error_of_v_and_of_v_moved_at_most_the_clip_from_its_start():
    # Step by step: vs = 1. Step 0 starts at 0 and is now at 0.5: moved by 0.5 > 0.2, so the clipped
    # value is 0.2, error 0.8^2 = 0.64 > 0.25: 0.64 counts. Step 1 starts at 2.0, now 1.1: clipped
    # to 1.8, error 0.64 > 0.01: 0.64. Step 2 starts at 1.5, now 1.4 (inside the clip): 0.16 both.
    T, B = 3, 1
    vs = torch.ones(T, B)
    values = torch.tensor([[0.5], [1.1], [1.4], [9.0]], requires_grad=True)
    old_values = torch.tensor([[0.0], [2.0], [1.5], [9.0]])
    loss, stats = appo_loss(torch.zeros(T, B), torch.zeros(T, B), values, torch.zeros(T, B), torch.zeros(T, B),
                            torch.ones(T, B), torch.ones(T, B, dtype=torch.bool), targets=(vs, torch.zeros(T, B)),
                            value_coef=1.0, entropy_coef=0.0, normalize_advantages=False, value_clip=0.2,
                            old_values=old_values)
    assert float(stats["value_loss"]) == pytest.approx(0.5 * (0.64 + 0.64 + 0.16) / 3, rel=1e-6)
    loss.backward()
    # The clipped error carries no gradient for V (it is outside the range); the unclipped one does.
    torch.testing.assert_close(values.grad[:, 0], torch.tensor([0.0, 0.0, (1.4 - 1.0) / 3, 0.0]))
    # Off, and with old_values equal to values, the loss is the unclipped one.
    plain = appo_loss(torch.zeros(T, B), torch.zeros(T, B), values, torch.zeros(T, B), torch.zeros(T, B),
                      torch.ones(T, B), torch.ones(T, B, dtype=torch.bool), targets=(vs, torch.zeros(T, B)),
                      normalize_advantages=False)[1]["value_loss"]
    same = appo_loss(torch.zeros(T, B), torch.zeros(T, B), values, torch.zeros(T, B), torch.zeros(T, B),
                     torch.ones(T, B), torch.ones(T, B, dtype=torch.bool), targets=(vs, torch.zeros(T, B)),
                     normalize_advantages=False, value_clip=0.2, old_values=values.detach())[1]["value_loss"]
    assert float(plain) == pytest.approx(0.5 * (0.25 + 0.01 + 0.16) / 3, rel=1e-6)
    assert float(same) == pytest.approx(float(plain), rel=1e-6)
    with pytest.raises(ValueError, match="value_clip=0.2 needs old_values"):
        appo_loss(torch.zeros(T, B), torch.zeros(T, B), values, torch.zeros(T, B), torch.zeros(T, B),
                  torch.ones(T, B), torch.ones(T, B, dtype=torch.bool), targets=(vs, torch.zeros(T, B)),
                  value_clip=0.2)


@pytest.mark.parametrize("loss_fn,compiled", [(appo_loss, True), (appo_loss, False), (impala_loss, None)])
def test_the_uniform_kl_term_adds_its_coefficient_times_its_masked_mean_with_its_gradient(loss_fn, compiled):
    target_logp, behaviour_logp, values, entropy, targets, mask = appo_inputs(4)
    kl = torch.rand(target_logp.shape, generator=torch.Generator().manual_seed(5), requires_grad=True)
    options = {} if compiled is None else {"compiled": compiled}
    args = (target_logp, behaviour_logp, values, entropy, None, None, mask, mask)
    plain, plain_stats = loss_fn(*args, targets=targets, **options)
    loss, stats = loss_fn(*args, targets=targets, uniform_kl=kl, uniform_kl_coef=0.3, **options)
    by_hand = sum(float(kl.detach()[t, b]) for t, b in mask.nonzero()) / int(mask.sum())
    assert float(stats["uniform_kl"]) == pytest.approx(by_hand, rel=1e-6)
    assert float(loss.detach()) == pytest.approx(float(plain) + 0.3 * by_hand, rel=1e-6)
    assert float(stats["loss"]) == pytest.approx(float(loss.detach()), rel=1e-6) and "uniform_kl" not in plain_stats
    loss.backward()
    torch.testing.assert_close(kl.grad, 0.3 * mask.float() / int(mask.sum()))
    # Off (coefficient 0), the KL is neither added nor reported.
    off, off_stats = loss_fn(*args, targets=targets, uniform_kl=kl, uniform_kl_coef=0.0, **options)
    assert float(off) == pytest.approx(float(plain), rel=1e-6) and "uniform_kl" not in off_stats
    refusal = f"{loss_fn.__name__}: uniform_kl has shape [{kl.shape[0]}], expected target_logp's"
    with pytest.raises(ValueError, match=re.escape(refusal)):
        loss_fn(*args, targets=targets, uniform_kl=kl.detach()[:, 0], uniform_kl_coef=0.3, **options)
