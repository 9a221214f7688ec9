"""What would stall the host on an accelerator, counted on the CPU: the counter itself, and the
V-trace learner's bound of two host synchronisations per train() call on its device path."""
import gymnasium
import numpy as np
import torch

from fastrl.config import build_config
from fastrl.ipc.sync_counter import SyncCounter, optimizer_steps
from fastrl.learner import VTraceLearner
from tests.unit.learner.test_vtrace_learner import random_batch

OBS = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def test_counts_reads_and_data_sized_ops_but_not_work_that_stays_queued():
    x = torch.arange(-3.0, 3.0)
    with SyncCounter() as counter:
        float(x.sum())
        bool(x.max() > 0)
        x.tolist()
        np.asarray(x)
        x[x > 0]
        torch.nonzero(x)
        y = x.clone()
        y[x > 0] = x[:2]  # a tensor into a mask: the host must learn how many
        y[x < 0] = 0.0  # a host scalar into a mask: runs as masked_fill_, nothing to learn
        x[torch.tensor([0, 2])] + (x * 2).exp().sum()  # integer indexing and arithmetic queue
    assert counter.syncs == {"item": 2, "tolist": 1, "numpy": 1, "mask_index": 1, "nonzero": 1,
                             "mask_index_put": 1}
    assert counter.total == 7 and counter.to_host == 2 and counter.to_device == 0
    assert "numpy" not in torch.Tensor.__dict__ and "tolist" not in torch.Tensor.__dict__
    with SyncCounter() as idle:
        x.tolist()
    assert idle.total == 1 and counter.total == 7


def test_a_non_fused_adams_step_counters_stay_on_the_host():
    weights = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    for kernel, host_steps in (({"foreach": True}, 2), ({"fused": True}, 0)):
        optimizer = torch.optim.Adam(weights, **kernel)
        for w in weights:
            w.grad = torch.ones_like(w)
        optimizer.step()
        assert len(optimizer_steps(optimizer)) == host_steps
        with SyncCounter(host=optimizer_steps(optimizer)) as counter:
            optimizer.step()
        assert counter.total == 0, (kernel, counter.syncs)


def test_vtrace_learner_reads_the_device_twice_per_train_call():
    """CartPole's shape (cartpole-appo: T = 32, 4-float observations, 2 actions) on the device
    path: the gradient norm once (it also carries the finite check) and the statistics once."""
    torch.manual_seed(0)
    learner = VTraceLearner(build_config("cartpole-appo"), OBS, gymnasium.spaces.Discrete(2), device_path=True)
    batch = random_batch(T=32, B=16)
    batch.valid[5, :3] = False
    learner.train(batch)  # the optimizer's state is made on its first step
    with SyncCounter() as counter:
        stats = learner.train(batch)
    assert counter.total <= 2, counter.syncs
    assert stats["learner_updates"] == 2 and np.isfinite(stats["loss"]) and np.isfinite(stats["grad_norm"])
