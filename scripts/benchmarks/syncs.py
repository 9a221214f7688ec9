"""Host synchronisations and host<->device copies per call of the learners and the batcher.

    python scripts/bench.py syncs [--device cpu|cuda] [--calls 3]

Each component runs once to warm up (the optimizers make their state on their first step), then
``--calls`` times under :class:`fastrl.ipc.sync_counter.SyncCounter`. With ``--device cuda`` the
counts are what the GPU really waits for; on the CPU they are what it would wait for if every
tensor but a non-fused Adam's step counters lived on an accelerator. That is an upper bound
(the batcher's CPU-only numba sampler reads its logits as numpy, a GPU samples in torch), and
copies to the device cannot be seen there. Shapes are the profiles':
cartpole-appo (T = 32, 128 trajectories, inference requests of 256 envs), cartpole-dqn
(T = 16, 64 trajectories, replay batches of 128) and cartpole-r2d2.
"""
import copy

import numpy as np
import torch

from fastrl.config import build_config
from fastrl.envs import probe_env
from fastrl.ipc.arena import Arena
from fastrl.ipc.sync_counter import SyncCounter, optimizer_steps
from fastrl.ipc.weights import WeightBuffer
from fastrl.learner import DQNLearner, R2D2Learner, Trajectories, VTraceLearner
from fastrl.models.networks import num_state_values, state_to_flat
from fastrl.run.training import arena_layout
from fastrl.sampling.batcher import InferenceBatcher


def random_trajectories(cfg, spec, seed: int) -> Trajectories:
    """A ``[T, B]`` batch of the profile's shape: random observations, actions and rewards."""
    T, B = cfg.learner.rollout, cfg.trajectories_per_batch
    g = torch.Generator().manual_seed(seed)
    n = spec.action_space.n
    return Trajectories(
        obs=torch.randn(T + 1, B, *spec.observation_space.shape, generator=g),
        actions=torch.randint(0, n, (T, B), generator=g), behaviour_logp=torch.full((T, B), -float(np.log(n))),
        rewards=torch.randn(T, B, generator=g), terminated=torch.rand(T, B, generator=g) < 0.05,
        truncated=torch.zeros(T, B, dtype=torch.bool), valid=torch.ones(T, B, dtype=torch.bool),
        version=torch.zeros(T, B, dtype=torch.int64))


def count(device: torch.device, calls: int, fn, optimizer=None) -> dict:
    """Syncs and copies per call of ``fn(i)``, after one warm-up call."""
    fn(0)
    host = optimizer_steps(optimizer) if optimizer is not None else []
    with SyncCounter(device, host) as counter:
        for i in range(1, calls + 1):
            fn(i)
    return {"syncs": counter.total / calls, "to_host": counter.to_host / calls,
            "to_device": counter.to_device / calls if device.type != "cpu" else None,
            "kinds": {kind: n / calls for kind, n in sorted(counter.syncs.items())}}


def vtrace_train(device: torch.device, calls: int, device_path: bool) -> dict:
    cfg = build_config("cartpole-appo", {"device": "cpu"})
    spec = probe_env(cfg)
    learner = VTraceLearner(cfg, spec.observation_space, spec.action_space, device=device, device_path=device_path)
    return count(device, calls, lambda i: learner.train(random_trajectories(cfg, spec, i)), learner.optimizer)


def dqn(device: torch.device, calls: int) -> tuple[dict, dict, int]:
    """(per train() call, per gradient step, gradient steps per train() call)."""
    cfg = build_config("cartpole-dqn", {"device": "cpu", "replay.min_fill": 1024})
    spec = probe_env(cfg)
    learner = DQNLearner(cfg, spec.observation_space, spec.action_space, device=device)
    env_ids = np.arange(cfg.trajectories_per_batch)
    learner.train(random_trajectories(cfg, spec, 0), env_ids=env_ids)  # fills the replay to min_fill
    before = learner.replayed_batches
    per_call = count(device, calls, lambda i: learner.train(random_trajectories(cfg, spec, i + 1), env_ids=env_ids),
                     learner.optimizer)
    steps = (learner.replayed_batches - before) // (calls + 1)
    per_step = count(device, calls, lambda i: learner.update(), learner.optimizer)
    learner.close()
    return per_call, per_step, steps


def r2d2_update(device: torch.device, calls: int) -> dict:
    """One R2D2 gradient step (cartpole-r2d2: 64 sequences of 20 steps, LSTM 64) on the device path;
    the LSTM in torch ops, as on a GPU (the CPU's numba kernel reads its tensors as numpy)."""
    cfg = build_config("cartpole-r2d2", {"device": "cpu", "replay.min_fill": 1024})
    spec = probe_env(cfg)
    learner = R2D2Learner(cfg, spec.observation_space, spec.action_space, device=device, device_path=True)
    learner.model.core.use_kernel = learner.target.core.use_kernel = False
    batch = random_trajectories(cfg, spec, 0)
    batch.initial_state = torch.zeros(batch.rewards.shape[1], learner.model.state_size)
    for _ in range(4):  # past replay.min_fill, with every stream a few sequences long
        learner.train(batch, env_ids=np.arange(batch.rewards.shape[1]))

    def step(i):
        assert learner.update() is not None, "the replay gave no sample"
    row = count(device, calls, step, learner.optimizer)
    learner.close()
    return row


def batcher_infer(device: torch.device, calls: int, requests: int = 2) -> dict:
    cfg = build_config("cartpole-appo", {"device": "cpu"})
    spec = probe_env(cfg)
    model = VTraceLearner(cfg, spec.observation_space, spec.action_space).model
    arena = Arena(arena_layout(cfg, spec, num_state_values(model)), shared=False)
    W, S, b = arena.request_envs.shape
    arena.request_envs[:] = np.arange(S * b, dtype=np.int32).reshape(1, S, b)
    WeightBuffer(arena).publish(state_to_flat(model, torch.empty(num_state_values(model))).numpy(), 0)
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, device)
    assert batcher.refresh_weights()
    workers = np.arange(requests) % W
    request_ids = np.arange(requests) // W
    return count(device, calls, lambda i: batcher.infer(workers, request_ids))


def add_arguments(parser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu (counts what a GPU would wait for) or cuda")
    parser.add_argument("--calls", type=int, default=3, help="measured calls per component")


def run(args) -> dict:
    device = torch.device(args.device)

    dqn_call, dqn_step, dqn_steps = dqn(device, args.calls)
    rows = {
        "VTraceLearner.train, CPU path (numba V-trace)": vtrace_train(device, args.calls, False),
        "VTraceLearner.train, device path (torch V-trace)": vtrace_train(device, args.calls, True),
        f"DQNLearner.train ({dqn_steps} gradient steps)": dqn_call,
        "DQNLearner.update (one gradient step)": dqn_step,
        "R2D2Learner.update (one gradient step, device path)": r2d2_update(device, args.calls),
        "InferenceBatcher.infer (2 requests of 256 envs)": batcher_infer(device, args.calls),
    }
    print(f"device: {device}" + ("  (counts what an accelerator would wait for)" if device.type == "cpu" else ""))
    print(f"{'component':62} {'syncs':>6} {'to host':>8} {'to device':>10}  kinds")
    for name, row in rows.items():
        to_device = "-" if row["to_device"] is None else f"{row['to_device']:g}"
        kinds = ", ".join(f"{kind} {n:g}" for kind, n in row["kinds"].items())
        print(f"{name:62} {row['syncs']:6g} {row['to_host']:8g} {to_device:>10}  {kinds}")
    return {"device": str(device), "calls": args.calls, "per_call": rows}
