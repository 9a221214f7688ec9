"""Torch wrappers: the numpy kernels' values, on the caller's device and dtype."""
import numpy as np
import pytest
import torch

from fastrl.kernels import gae, vtrace
from fastrl.kernels.torch_ops import gae_torch, vtrace_torch

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else [])


def random_tensors(dtype, device, seed=0, num_steps=6, batch=4):
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=(num_steps, batch)), 0.99 * (rng.random((num_steps, batch)) > 0.2),
              rng.normal(size=(num_steps, batch)), rng.normal(size=(num_steps, batch)),
              rng.normal(size=batch)]
    return [torch.tensor(a, dtype=dtype, device=device) for a in arrays]


def as_numpy(tensors):
    return [t.cpu().numpy() for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vtrace_torch_matches_numpy(device, dtype):
    tensors = random_tensors(dtype, device)
    tensors[3].requires_grad_(True)
    kwargs = dict(clip_rho_threshold=2.0, clip_pg_rho_threshold=None, lambda_=0.9)
    actual = vtrace_torch(*tensors, **kwargs)
    expected = vtrace(*as_numpy([t.detach() for t in tensors]), **kwargs)
    for a, e in zip(actual, expected):
        assert a.device.type == device and a.dtype == dtype and not a.requires_grad
        np.testing.assert_array_equal(a.cpu().numpy(), e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_torch_matches_numpy(device, dtype):
    _, discounts, rewards, values, bootstrap_value = random_tensors(dtype, device, seed=1)
    actual = gae_torch(rewards, values, bootstrap_value, discounts, 0.95)
    expected = gae(*as_numpy([rewards, values, bootstrap_value, discounts]), 0.95)
    for a, e in zip(actual, expected):
        assert a.device.type == device and a.dtype == dtype
        np.testing.assert_array_equal(a.cpu().numpy(), e)


def test_half_precision_is_computed_in_float32_and_returned_as_given():
    tensors = random_tensors(torch.bfloat16, "cpu", seed=2)
    vs, pg_advantages = vtrace_torch(*tensors)
    assert vs.dtype == pg_advantages.dtype == torch.bfloat16
    expected_vs, _ = vtrace(*as_numpy([t.float() for t in tensors]))
    np.testing.assert_array_equal(vs.float().numpy(),
                                  torch.from_numpy(expected_vs).bfloat16().float().numpy())
