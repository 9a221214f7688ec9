"""fastrl.kernels.squashed_gaussian (SAC's draw on the numpy inference path) against a brute-force
float64 reference written from the definition, and against the torch head it stands in for."""
import math

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.kernels.squashed_gaussian import sample_squashed_gaussian
from fastrl.models.heads import LOG_STD_RANGE, SquashedGaussianHead


def reference(params, normals, low, high, lo, hi):
    """Per element, in float64: bounded log-std, u = mean + std * eps, the action tanh(u) mapped onto
    [low, high], and log N(u; mean, std) - log(1 - tanh(u)^2) summed over the dimensions (the
    Jacobian through log(cosh(u)^-2), exact in float64 for the |u| drawn here)."""
    softplus = lambda x: math.log1p(math.exp(x)) if x < 30 else x  # noqa: E731
    actions, logp = [], []
    for row, eps_row in zip(params.astype(np.float64), normals.astype(np.float64)):
        d = len(eps_row)
        acts, total = [], 0.0
        for j in range(d):
            mean, raw, eps = row[j], row[d + j], eps_row[j]
            log_std = lo + softplus(raw - lo) - softplus(raw - hi)
            std = math.exp(log_std)
            u = mean + std * eps
            total += -0.5 * ((u - mean) / std) ** 2 - math.log(std * math.sqrt(2 * math.pi))
            total -= math.log(1.0 / math.cosh(u) ** 2)
            acts.append(low[j] + (high[j] - low[j]) * (math.tanh(u) + 1.0) / 2.0)
        actions.append(acts)
        logp.append(total)
    return np.array(actions), np.array(logp)


@pytest.mark.parametrize("d", [1, 3, 6])
def test_matches_the_definition_in_float64(d):
    rng = np.random.default_rng(d)
    params = np.concatenate([rng.normal(size=(200, d)) * 2, rng.normal(size=(200, d)) * 4 - 1], 1)
    params = params.astype(np.float32)
    normals = rng.normal(size=(200, d)).astype(np.float32)
    low, high = rng.uniform(-3, 0, d), rng.uniform(0.5, 3, d)
    center, half = (high + low) / 2, (high - low) / 2
    actions, logp = sample_squashed_gaussian(params, normals, center, half, LOG_STD_RANGE)
    want_actions, want_logp = reference(params, normals, low, high, *LOG_STD_RANGE)
    assert actions.dtype == logp.dtype == np.float32 and actions.shape == (200, d) and logp.shape == (200,)
    np.testing.assert_allclose(actions, want_actions, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logp, want_logp, rtol=1e-5, atol=1e-4)
    assert ((actions >= low - 1e-6) & (actions <= high + 1e-6)).all()


def test_is_the_torch_heads_draw_given_its_normals():
    """The same normals through SquashedGaussianHead.sample_with_log_prob (which draws them with
    randn_like) give the same actions and log-probabilities."""
    space = gymnasium.spaces.Box(np.array([-1.0, 0.0, -2.0], np.float32), np.array([1.0, 4.0, -1.5], np.float32))
    head = SquashedGaussianHead(space)
    torch.manual_seed(3)
    params = torch.randn(64, 6) * 3
    torch.manual_seed(7)
    want_actions, want_logp = head.sample_with_log_prob(params)
    torch.manual_seed(7)
    normals = torch.randn(64, 3)
    actions, logp = sample_squashed_gaussian(params.numpy(), normals.numpy(), head.center.numpy(),
                                             head.half_width.numpy(), LOG_STD_RANGE)
    np.testing.assert_allclose(actions, want_actions.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logp, want_logp.numpy(), rtol=1e-5, atol=1e-4)


def test_saturated_rows_stay_finite_and_inside_the_bounds():
    """|u| in the hundreds: tanh(u) rounds to +-1, the log-prob's Jacobian term stays finite (its
    softplus form), and the raw log-std far outside the range is bounded."""
    params = np.array([[300.0, -300.0, 50.0, -50.0], [-300.0, 300.0, -50.0, 50.0]], np.float32)
    normals = np.array([[1.0, -1.0], [0.0, 0.0]], np.float32)
    actions, logp = sample_squashed_gaussian(params, normals, np.zeros(2), np.full(2, 2.0), LOG_STD_RANGE)
    assert np.isfinite(actions).all() and np.isfinite(logp).all()
    assert (np.abs(actions) <= 2.0).all() and np.allclose(np.abs(actions), 2.0)
    # log(1 - tanh(u)^2) ~ log 4 - 2|u|: the density of a saturated draw is enormous, not inf.
    assert logp[0] > 1000


@pytest.mark.parametrize("shapes", [((4, 5), (4, 2)), ((4, 4), (3, 2)), ((4,), (4, 2))])
def test_shape_errors_name_the_arrays(shapes):
    params, normals = np.zeros(shapes[0], np.float32), np.zeros(shapes[1], np.float32)
    with pytest.raises(ValueError, match=r"params \[B, 2d\], normals \[B, d\]"):
        sample_squashed_gaussian(params, normals, np.zeros(2), np.ones(2), LOG_STD_RANGE)
    with pytest.raises(ValueError, match="center and half_width"):
        sample_squashed_gaussian(np.zeros((4, 4)), np.zeros((4, 2)), np.zeros(3), np.ones(2), LOG_STD_RANGE)
