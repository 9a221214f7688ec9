"""A replay learner's gradient steps alone: update() calls per second, what one costs part by part,
and how near it runs to the arithmetic floor of this CPU.

    python scripts/bench.py updates --profile mujoco-sac --threads 1 2 --rounds 3

One process, on the CPU. The learner's replay is filled past ``replay.min_fill`` with random
transitions of the profile's shapes (random observations, actions in the action space, rewards
in [-1, 1]); each round then times ``--updates`` update() calls per torch thread count, after 20
warm-up calls. The parts are timed on a further pass that runs update()'s steps one by one,
through the learner's own methods: sampling, the loss (every forward pass), the backward pass,
gradient clipping, the optimizer's step and the targets' refresh.

The floor is the update's floating-point work (torch's FlopCounterMode) at the rate of one
``[batch, width] x [width, width]`` float32 matmul on the same threads: an update cannot be
faster than that on this CPU.
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

from fastrl.config import ConfigError, build_config
from fastrl.envs import probe_env
from fastrl.learner import Trajectories, make_learner
from fastrl.profiler import hardware

from .options import add_rounds, add_set, overrides

ERRORS = (ConfigError,)
PARTS = ("sample", "loss", "backward", "clip", "optimizer", "targets")
WARMUP = 20


def random_trajectories(cfg, spec, g: torch.Generator) -> Trajectories:
    """One learner batch ``[T, B]`` of random steps in the env's spaces."""
    T, B = cfg.learner.rollout, cfg.total_envs
    obs_space, action_space = spec.observation_space, spec.action_space
    obs = torch.randn((T + 1, B, *obs_space.shape), generator=g).to(getattr(torch, str(obs_space.dtype)))
    if hasattr(action_space, "n"):
        actions = torch.randint(0, int(action_space.n), (T, B), generator=g)
    else:
        low, high = (torch.as_tensor(bound, dtype=torch.float32) for bound in (action_space.low, action_space.high))
        actions = low + (high - low) * torch.rand((T, B, *action_space.shape), generator=g)
    return Trajectories(obs=obs, actions=actions, behaviour_logp=torch.zeros(T, B),
                        rewards=torch.rand(T, B, generator=g) * 2 - 1, terminated=torch.zeros(T, B, dtype=torch.bool),
                        truncated=torch.zeros(T, B, dtype=torch.bool), valid=torch.ones(T, B, dtype=torch.bool),
                        version=torch.zeros(T, B, dtype=torch.int64))


def filled_learner(cfg, spec):
    """A learner of ``cfg`` whose replay holds ``replay.min_fill`` random transitions or more."""
    torch.manual_seed(cfg.seed)
    learner = make_learner(cfg, spec.observation_space, spec.action_space)
    g = torch.Generator().manual_seed(cfg.seed)
    env_ids = np.arange(cfg.total_envs)
    while len(learner.replay) < max(cfg.replay.min_fill, cfg.replay.batch_size):
        learner.train(random_trajectories(cfg, spec, g), env_ids=env_ids)
    return learner


def updates_per_second(learner, updates: int) -> float:
    for _ in range(WARMUP):
        learner.update()
    start = time.perf_counter()
    for _ in range(updates):
        learner.update()
    return updates / (time.perf_counter() - start)


def part_seconds(learner, updates: int) -> dict[str, float]:
    """Seconds per update of each of update()'s steps, run one by one."""
    totals = dict.fromkeys(PARTS, 0.0)
    clock = time.perf_counter
    for _ in range(updates):
        t0 = clock()
        sample = learner.sample()
        t1 = clock()
        loss, _, _ = learner.loss(sample)
        t2 = clock()
        learner.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t3 = clock()
        learner.clip_gradients()
        t4 = clock()
        learner.optimizer.step()
        t5 = clock()
        learner.refresh_targets()
        t6 = clock()
        for name, seconds in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            totals[name] += seconds
    return {name: seconds / updates for name, seconds in totals.items()}


def gflop_per_update(learner) -> float:
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        learner.update()
    return counter.get_total_flops() / 1e9


def matmul_gflops(rows: int, width: int, calls: int = 300) -> float:
    """GFLOP/s of a ``[rows, width] x [width, width]`` float32 matmul on the current threads."""
    a, b = torch.randn(rows, width), torch.randn(width, width)
    for _ in range(10):
        a @ b
    start = time.perf_counter()
    for _ in range(calls):
        a @ b
    return 2 * rows * width * width * calls / (time.perf_counter() - start) / 1e9


def add_arguments(p) -> None:
    p.add_argument("--profile", default="mujoco-sac",
                   help="a replay learner's profile, on the CPU (default mujoco-sac)")
    add_set(p, "override on top of the profile's")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts to time (default 1 2)")
    p.add_argument("--updates", type=int, default=200, help="update() calls timed per round (default 200)")
    add_rounds(p, 3, "timings of each thread count, alternating")


def run(args) -> dict:
    cfg = build_config(args.profile, {"device": "cpu", **overrides(args.set)})
    if cfg.learner.algo not in ("sac", "dqn"):
        raise ConfigError(f"bench.py updates measures the learners of one-step transitions (sac, dqn), not "
                          f"learner.algo={cfg.learner.algo}: use bench.py learner")
    if min(args.threads) < 1 or args.updates < 1:
        raise ConfigError("--threads and --updates take counts of 1 or more")
    spec = probe_env(cfg)
    learner = filled_learner(cfg, spec)
    rates = {n: [] for n in args.threads}
    for r in range(args.rounds):
        for n in args.threads:
            torch.set_num_threads(n)
            rates[n].append(updates_per_second(learner, args.updates))
            print(f"round {r}: threads {n} {rates[n][-1]:7.1f} updates/s", file=sys.stderr)
    gflop = gflop_per_update(learner)
    width = max(cfg.model.hidden_sizes or [256])
    print(f"hardware: {hardware()}")
    print(f"{cfg.env.id} algo={cfg.learner.algo} batch={cfg.replay.batch_size} hidden={cfg.model.hidden_sizes} "
          f"{gflop:.3f} GFLOP per update")
    report = {"profile": args.profile, "env": cfg.env.id, "gflop_per_update": gflop, "hardware": hardware(),
              "threads": {}}
    for n in args.threads:
        torch.set_num_threads(n)
        median = statistics.median(rates[n])
        parts = part_seconds(learner, args.updates)
        floor = gflop / matmul_gflops(cfg.replay.batch_size, width)
        print(f"  threads {n}: median {median:6.1f} updates/s = {1e3 / median:5.2f} ms; floor {floor * 1e3:5.2f} ms "
              f"({floor * median:.0%} of the update)")
        print("    " + "  ".join(f"{name} {seconds * 1e3:.2f}" for name, seconds in parts.items()) + " ms")
        report["threads"][n] = {"updates_per_s": median, "floor_s": floor, "parts_s": parts}
    return report
