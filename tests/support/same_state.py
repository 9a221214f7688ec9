"""Checkpoint entries compared exactly: the tests of resumed, repeated and multi-policy runs."""
import numpy as np
import torch


def assert_same_state(a, b, where=""):
    """Nested dicts/lists of tensors, arrays and plain values equal exactly (``where``: the path
    to the first difference, in the assertion's message)."""
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, where
