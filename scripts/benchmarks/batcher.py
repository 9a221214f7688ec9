"""The inference batcher's ``infer()`` alone: microseconds per batch in a profile's layout.

    python scripts/bench.py batcher [--profile cartpole-appo] [--rounds 3] [--set KEY=VALUE]
    git worktree add ../fastrl-base 730e5cc && python scripts/bench.py batcher --base-code ../fastrl-base
    python scripts/bench.py batcher --profile mujoco-sac --variant inference.numpy_mlp=false

One process, one thread (as the batcher process runs), the profile's arena with random
observations and every env's cursor at a random slot, so that the gather and the write-back miss
the cache as they do in a run. Batches of one request and, with several workers, of one request
per worker. Each measurement is the best of 5 repeats of ``--calls`` calls. ``--base-code DIR``
measures that checkout of fastrl too (DIR first on PYTHONPATH, a fresh interpreter each round);
``--variant`` measures this tree again with more overrides; the sides alternate ``--rounds``
times. Prints one line per measurement, naming the path that acted (numpy or torch,
fastrl.sampling.numpy_mlp).

Nothing of fastrl is imported before ``measure`` runs: under ``--base-code`` this module runs
again in an interpreter that imports the other checkout's fastrl, whose names may differ.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .options import add_rounds, add_set, overrides

BENCH = Path(__file__).resolve().parents[1] / "bench.py"


def measure(profile: str, calls: int, settings: list[str]) -> dict:
    """Best microseconds per ``infer()`` for one request and (with several workers) for one request
    per worker, with the ``settings`` ("KEY=VALUE") over the profile, and the path that acted
    (``"path"``)."""
    import torch
    from threadpoolctl import threadpool_limits

    from fastrl.config import build_config, parse_override
    from fastrl.envs import probe_env
    from fastrl.ipc.arena import Arena
    from fastrl.ipc.weights import WeightBuffer
    from fastrl.models.networks import build_model, num_state_values, state_to_flat
    from fastrl.run.training import arena_layout
    from fastrl.sampling.batcher import InferenceBatcher

    torch.set_num_threads(1)
    threadpool_limits(1)
    cfg = build_config(profile, {"device": "cpu", **dict(parse_override(text) for text in settings)})
    spec = probe_env(cfg)
    torch.manual_seed(0)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)
    arena = Arena(arena_layout(cfg, spec, num_state_values(model), getattr(model, "state_size", 0)), shared=False)
    rng = np.random.default_rng(0)
    arena.obs[:] = rng.normal(size=arena.obs.shape).astype(arena.obs.dtype)
    W, E = arena.env_slot.shape
    N, slot_length = arena.obs.shape[:2]
    arena.env_slot[:] = rng.permutation(N)[:W * E].reshape(W, E)
    arena.env_t[:] = rng.integers(0, slot_length - 1, (W, E))
    S = cfg.env.num_splits
    arena.request_envs[:] = np.arange(E).reshape(1, S, E // S)
    WeightBuffer(arena).publish(state_to_flat(model, torch.empty(num_state_values(model))).numpy(), 0)
    # `algo` only where it matters, so that a --base-code checkout older than the argument runs.
    algo = {} if cfg.learner.algo == "appo" else {"algo": cfg.learner.algo}
    batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"),
                               numpy_mlp=cfg.inference.numpy_mlp, **algo)
    batcher.refresh_weights()
    acting = batcher.weight_sets[0] if hasattr(batcher, "weight_sets") else batcher  # an older --base-code's
    results = {"path": "torch" if getattr(acting, "numpy_mlp", None) is None else "numpy"}
    batches = [(f"1 request of {E // S}", [0])]
    if W > 1:
        batches.append((f"{W} requests of {E // S}", list(range(W))))
    for name, workers in batches:
        workers, requests = np.array(workers), np.zeros(len(workers), np.int64)
        for _ in range(calls // 10):
            batcher.infer(workers, requests)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                batcher.infer(workers, requests)
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
        results[name] = best
    return results


def measure_with(code: Path | None, profile: str, calls: int, settings: list[str]) -> dict:
    """:func:`measure` in a fresh interpreter, with the fastrl checkout in ``code`` when given."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
    sets = [part for text in settings for part in ("--set", text)]
    out = subprocess.run([sys.executable, str(BENCH), "batcher", "--profile", profile, "--calls", str(calls),
                          *sets, "--once"], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def add_arguments(p) -> None:
    p.add_argument("--profile", default="cartpole-appo")
    p.add_argument("--calls", type=int, default=2000)
    add_rounds(p, 3, "measurements of each side, alternating")
    p.add_argument("--base-code", type=Path, metavar="DIR")
    add_set(p, "override of every side (repeat for several)")
    p.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                   help="also measure this tree with these overrides on top of --set (repeat for several)")
    p.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # one measurement, JSON only


ERRORS = (ValueError,)


def run(args) -> dict:
    if args.once:
        return measure(args.profile, args.calls, args.set)
    if args.base_code is not None and not (args.base_code / "fastrl" / "__init__.py").is_file():
        raise ValueError(f"--base-code {args.base_code} holds no fastrl package "
                         f"(expected {args.base_code}/fastrl/__init__.py)")
    from fastrl.config import build_config
    build_config(args.profile, overrides(args.set + args.variant))  # a bad key: one line here, not a child's traceback
    sides = {"this tree": (None, args.set)}
    if args.base_code is not None:
        sides = {"base": (args.base_code.resolve(), args.set), "this tree": (BENCH.parents[1], args.set)}
    if args.variant:
        sides["variant"] = (BENCH.parents[1], args.set + args.variant)
    rounds = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, (code, settings) in sides.items():
            result = measure_with(code, args.profile, args.calls, settings)
            rounds[name].append(result)
            times = "  ".join(f"{k}: {v:.1f} us" for k, v in result.items() if k != "path")
            print(f"{name:10s} {result.get('path', '?'):5s}  {times}", flush=True)
    return {"profile": args.profile, "us_per_infer": rounds}
