"""The learner alone: train() calls per second on synthetic batches of a profile's shape.

    python scripts/bench.py learner --setup pong-cpu --rounds 4
    python scripts/bench.py learner --profile atari-appo-cpu --rounds 4
    python scripts/bench.py learner --setup pong-cpu --compare nchw-input
    python scripts/bench.py learner --setup pong-cpu --arithmetic

One process, one torch thread and the learner process's heap settings (``retain_freed_memory``).
A batch has the profile's ``[T, B]`` shape and the env's observation space, with random
observations, actions and rewards. The header says whether the heap setting took (it does not
off glibc or under the user's own glibc variables) and the precision the learner resolved.
Each round times ``--calls`` train() calls after one warm-up call. With ``--compare``, each round
also times the variant named, side by side, and the ratio of the medians is printed:

- ``nchw-input``: the learner scales images into NCHW memory instead of straight into the NHWC
  memory its channels-last conv weights use (fastrl.models.encoders.scale_obs).
- ``torch-ops``: the network's forward and backward passes, the categorical head's log-probs
  and entropies and APPO's loss by torch ops instead of numpy's BLAS and compiled kernels
  (fastrl.sampling.numpy_mlp, fastrl.models.heads, fastrl.learner.losses).

``--arithmetic`` also prints the floating-point work of one train() (torch's FlopCounterMode over
the torch ops: a numpy/numba learner, CartPole's, is not counted), the rate the median call
reaches, and a one-thread 2048x2048 matmul's rate in float32 and bf16 beside it: how near the
learner runs to what this core's arithmetic allows.
"""
from __future__ import annotations

import resource
import statistics
import sys
import time

import torch

from fastrl.config import build_config
from fastrl.envs import probe_env
from fastrl.envs.spaces import ObsLayout
from fastrl.ipc.allocator import retain_freed_memory
from fastrl.learner import Trajectories, make_learner
from fastrl.models import networks as models
from fastrl.models.encoders import scale_obs
from fastrl.profiler import hardware

from .options import add_rounds, add_set, add_setup, load_setup, overrides


def random_batch(cfg, spec, seed: int) -> Trajectories:
    T, B = cfg.learner.rollout, cfg.trajectories_per_batch
    g = torch.Generator().manual_seed(seed)
    space = spec.observation_space
    layout = ObsLayout(space)
    if layout.packed:  # a Dict / Tuple observation: random values of each leaf, packed into rows
        space.seed(seed)
        obs = torch.from_numpy(layout.sample((T + 1) * B)).reshape(T + 1, B, *layout.storage_shape)
    elif space.dtype.kind == "u":
        obs = torch.randint(0, 256, (T + 1, B, *space.shape), dtype=torch.uint8, generator=g)
    else:
        obs = torch.randn((T + 1, B, *space.shape), generator=g)
    n = spec.action_space.n
    return Trajectories(obs=obs, actions=torch.randint(0, n, (T, B), generator=g),
                        behaviour_logp=torch.full((T, B), -float(torch.log(torch.tensor(float(n))))),
                        rewards=torch.randn(T, B, generator=g).sign(), terminated=torch.zeros(T, B, dtype=torch.bool),
                        truncated=torch.zeros(T, B, dtype=torch.bool), valid=torch.ones(T, B, dtype=torch.bool),
                        version=torch.zeros(T, B, dtype=torch.int64))


def nchw_scaling(obs, scale, dtype=torch.float32, channels_last=False):
    """fastrl.models.encoders.scale_obs into NCHW memory, whatever the weights' memory format."""
    return scale_obs(obs, scale, dtype)


def make(cfg, spec, variant: str):
    torch.manual_seed(0)
    learner = make_learner(cfg, spec.observation_space, spec.action_space)
    if variant == "torch-ops":
        learner.numpy_mlp = None
        learner.compiled_kernels = False
    return learner


def with_variant(variant: str):
    """The scaling the variant uses, set in its module for the calls that follow."""
    models.scale_obs = nchw_scaling if variant == "nchw-input" else scale_obs


def seconds_per_call(learner, batch, calls: int) -> tuple[float, float]:
    """(seconds, minor page faults) per train() call."""
    learner.train(batch)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for _ in range(calls):
        learner.train(batch)
    seconds = (time.perf_counter() - start) / calls
    return seconds, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / calls


def gflop_per_call(learner, batch) -> float:
    """Floating-point operations of one ``learner.train(batch)`` in torch ops, in GFLOP."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        learner.train(batch)
    return counter.get_total_flops() / 1e9


def matmul_gflops(dtype: torch.dtype, n: int = 2048, calls: int = 5) -> float:
    """GFLOP/s of an ``n x n`` matmul in ``dtype`` on the current torch threads."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(calls):
        a @ b
    return 2 * n ** 3 * calls / (time.perf_counter() - start) / 1e9


def add_arguments(p) -> None:
    p.add_argument("--profile", default="atari-appo", help="the profile, on the CPU (default atari-appo)")
    add_setup(p, "the profile and overrides of this setup, in place of --profile on the CPU")
    add_set(p, "override on top of the profile's or the setup's")
    p.add_argument("--calls", type=int, default=3)
    add_rounds(p, 3, "timings of each variant, alternating")
    p.add_argument("--compare", choices=["nchw-input", "torch-ops"], default=None)
    p.add_argument("--arithmetic", action="store_true",
                   help="also GFLOP per train(), the GFLOP/s reached and a one-thread matmul's")


def run(args) -> dict:
    setup = load_setup(args.setup) if args.setup else None
    profile = setup.profile if setup else args.profile
    cfg = build_config(profile, {**(setup.overrides if setup else {"device": "cpu"}), **overrides(args.set)})
    torch.set_num_threads(cfg.learner.torch_threads)
    heap_retained = cfg.retain_freed_memory and retain_freed_memory()
    spec = probe_env(cfg)
    batch = random_batch(cfg, spec, 0)
    steps = batch.rewards.numel()
    variants = ["default"] + ([args.compare] if args.compare else [])
    learners = {v: make(cfg, spec, v) for v in variants}
    times = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            with_variant(v)
            seconds, faults = seconds_per_call(learners[v], batch, args.calls)
            times[v].append(seconds)
            print(f"round {r}: {v:<12} {seconds * 1e3:8.1f} ms per train() = {steps / seconds:8,.0f} env steps/s, "
                  f"{faults:,.0f} page faults per call", file=sys.stderr)
    medians = {v: statistics.median(t) for v, t in times.items()}
    print(f"hardware: {hardware()}")
    print(f"{cfg.env.id} T={cfg.learner.rollout} B={cfg.trajectories_per_batch} model={cfg.model.kind} "
          f"minibatches={cfg.learner.num_minibatches} epochs={cfg.learner.num_epochs} "
          f"threads={cfg.learner.torch_threads} heap retained={heap_retained} "
          f"precision={learners['default'].precision}")
    for v, t in medians.items():
        print(f"  {v:<12} median {t * 1e3:8.1f} ms per train()  {steps / t:8,.0f} env steps/s (learner alone)")
    if args.compare:
        print(f"  default / {args.compare} speed: {medians[args.compare] / medians['default']:.2f}x")
    if args.arithmetic:
        with_variant("default")
        gflop = gflop_per_call(learners["default"], batch)
        print(f"  {gflop:.2f} GFLOP per train() in torch ops = {gflop / medians['default']:.0f} GFLOP/s at the "
              f"median; a 2048x2048 matmul: {matmul_gflops(torch.float32):.0f} GFLOP/s float32, "
              f"{matmul_gflops(torch.bfloat16):.0f} bf16")
    return {"profile": cfg.env.id, "seconds_per_call": medians, "env_steps_per_call": steps, "hardware": hardware()}
