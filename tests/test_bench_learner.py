"""scripts/bench.py learner's arithmetic count against the Nature CNN's by hand."""
import gymnasium
import numpy as np
import torch

from fastrl.config import build_config
from fastrl.learner import make_learner
from tests.scripts import load_benchmark


def nature_cnn_flop_per_observation(actions: int) -> int:
    """Forward multiply-adds, again for the weight gradients, and for the input gradients of
    every layer but the first convolution (whose input, the pixels, needs none); 2 FLOP each."""
    layers = [  # (multiply-adds, the layer's input needs a gradient)
        (20 * 20 * 32 * 8 * 8 * 4, False), (9 * 9 * 64 * 4 * 4 * 32, True), (7 * 7 * 64 * 3 * 3 * 64, True),
        (3136 * 512, True), (512 * actions, True), (512 * 1, True)]
    return 2 * sum(macs * (3 if input_grad else 2) for macs, input_grad in layers)


def test_one_train_call_counts_the_nature_cnn_s_forward_and_backward():
    bench = load_benchmark("learner")
    cfg = build_config("atari-appo", {"device": "cpu", "learner.rollout": 4, "learner.batch_size": 8,
                                      "learner.num_minibatches": 1, "env.num_workers": 1, "env.envs_per_worker": 2,
                                      "env.num_splits": 1})
    spec = type("Spec", (), {"observation_space": gymnasium.spaces.Box(0, 255, (4, 84, 84), np.uint8),
                             "action_space": gymnasium.spaces.Discrete(6)})()
    torch.manual_seed(0)
    learner = make_learner(cfg, spec.observation_space, spec.action_space)
    batch = bench.random_batch(cfg, spec, 0)
    observations = batch.obs.shape[0] * batch.obs.shape[1]  # T + 1 rows: the bootstrap's too
    gflop = bench.gflop_per_call(learner, batch)
    # The convolutions and linear layers; the losses, V-trace and Adam add a few element-wise FLOP.
    assert gflop * 1e9 >= observations * nature_cnn_flop_per_observation(6)
    assert gflop * 1e9 <= observations * nature_cnn_flop_per_observation(6) * 1.001
    assert bench.matmul_gflops(torch.float32, n=64, calls=1) > 0
