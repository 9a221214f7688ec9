"""scripts/bench.py learner: its arithmetic count against the Nature CNN's by hand, and its random batches."""
import gymnasium
import numpy as np
import torch

from fastrl.config import build_config
from fastrl.envs.spaces import ObsLayout
from fastrl.learner import make_learner
from tests.support.scripts import load_benchmark


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
                                      "learner.num_epochs": 1, "learner.num_minibatches": 1, "env.num_workers": 1,
                                      "env.envs_per_worker": 2,
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


def test_a_dict_observation_batch_is_packed_rows_the_learner_trains_on():
    # ViZDoom's observations (a screen and game variables) are a Dict: packed rows, one per step.
    bench = load_benchmark("learner")
    cfg = build_config("cartpole-appo", {"device": "cpu", "learner.rollout": 4, "learner.batch_size": 8,
                                         "env.num_workers": 1, "env.envs_per_worker": 2, "env.num_splits": 1})
    space = gymnasium.spaces.Dict({"screen": gymnasium.spaces.Box(0, 255, (6, 8, 3), np.uint8),
                                   "gamevariables": gymnasium.spaces.Box(-1e3, 1e3, (1,), np.float32)})
    spec = type("Spec", (), {"observation_space": space, "action_space": gymnasium.spaces.Discrete(3)})()
    batch = bench.random_batch(cfg, spec, 0)
    layout = ObsLayout(space)
    assert batch.obs.shape == (5, 2, layout.row_bytes) and batch.obs.dtype == torch.uint8
    leaves = layout.unpack(batch.obs)
    assert leaves["screen"].shape == (5, 2, 6, 8, 3) and leaves["screen"].float().std() > 10
    torch.manual_seed(0)
    stats = make_learner(cfg, space, spec.action_space).train(batch)
    assert np.isfinite(stats["loss"])
