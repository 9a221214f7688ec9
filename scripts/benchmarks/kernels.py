"""Benchmark fastrl.kernels against the loops they replace, side by side, on one thread.

    python scripts/bench.py kernels [--rounds 15]

V-trace and GAE (float32, T=128, B in {256, 2048}) against a TorchBeast-style PyTorch loop over
time and the same reverse loop in numpy; SumTree.sample(512) and update(512) at capacity 2^20
against a vectorized numpy binary sum tree. Implementations are timed in interleaved rounds so
that load from other processes falls on all of them alike.
"""
import os

# Before numpy/numba/torch load: one thread each, so no pool oversubscribes the cores.
os.environ["NUMBA_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fastrl.kernels import SumTree, gae, vtrace  # noqa: E402

from .options import add_rounds  # noqa: E402

torch.set_num_threads(1)

TIME_STEPS = 128
BATCHES = (256, 2048)
TREE_CAPACITY = 2 ** 20
TREE_BATCH = 512
TARGETS = {  # name: (what, at least or at most, bound, unit)
    "vtrace_vs_torch_B256": ("V-trace speed-up over the PyTorch loop, B=256", "at least", 10.0, "x"),
    "vtrace_vs_numpy_B2048": ("V-trace speed-up over the numpy loop, B=2048", "at least", 1.8, "x"),
    "sumtree_sample_us": ("SumTree.sample(512) at 2^20", "at most", 50.0, "us"),
    "sumtree_update_us": ("SumTree.update(512) at 2^20", "at most", 40.0, "us"),
}


def vtrace_torch_loop(log_rhos, discounts, rewards, values, bootstrap_value):
    """The TorchBeast formulation: vectorized ratios and deltas, a Python loop over time."""
    with torch.no_grad():
        rhos = torch.exp(log_rhos)
        clipped_rhos = torch.clamp(rhos, max=1.0)
        cs = torch.clamp(rhos, max=1.0)
        next_values = torch.cat([values[1:], bootstrap_value[None]])
        deltas = clipped_rhos * (rewards + discounts * next_values - values)
        acc = torch.zeros_like(bootstrap_value)
        vs_minus_v = []
        for t in range(discounts.shape[0] - 1, -1, -1):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            vs_minus_v.append(acc)
        vs = torch.stack(vs_minus_v[::-1]) + values
        next_vs = torch.cat([vs[1:], bootstrap_value[None]])
        return vs, torch.clamp(rhos, max=1.0) * (rewards + discounts * next_vs - values)


def vtrace_numpy_loop(log_rhos, discounts, rewards, values, bootstrap_value):
    """The same formulation in numpy, writing each step into preallocated rows."""
    rhos = np.exp(log_rhos)
    clipped_rhos = np.minimum(rhos, 1.0)
    cs = np.minimum(rhos, 1.0)
    next_values = np.concatenate([values[1:], bootstrap_value[None]])
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    vs_minus_v = np.empty_like(values)
    acc = np.zeros_like(bootstrap_value)
    for t in range(discounts.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values
    next_vs = np.concatenate([vs[1:], bootstrap_value[None]])
    return vs, np.minimum(rhos, 1.0) * (rewards + discounts * next_vs - values)


def gae_loop(rewards, values, bootstrap_value, discounts, lambda_, zeros_like):
    """CleanRL's GAE loop; ``zeros_like`` picks the array library (numpy or torch)."""
    advantages = zeros_like(rewards)
    last = zeros_like(bootstrap_value)
    for t in range(rewards.shape[0] - 1, -1, -1):
        next_values = bootstrap_value if t == rewards.shape[0] - 1 else values[t + 1]
        delta = rewards[t] + discounts[t] * next_values - values[t]
        last = delta + discounts[t] * lambda_ * last
        advantages[t] = last
    return advantages, advantages + values


class NumpySumTree:
    """Binary sum tree with vectorized numpy level-by-level update and stratified sampling."""

    def __init__(self, capacity):
        self.size = 1 << (capacity - 1).bit_length()
        self.nodes = np.zeros(2 * self.size)

    def update(self, indices, priorities):
        nodes = indices + self.size
        self.nodes[nodes] = priorities
        while nodes[0] > 1:
            nodes = np.unique(nodes // 2)
            self.nodes[nodes] = self.nodes[2 * nodes] + self.nodes[2 * nodes + 1]

    def sample(self, batch_size, rng):
        targets = (np.arange(batch_size) + rng.random(batch_size)) * (self.nodes[1] / batch_size)
        nodes = np.ones(batch_size, dtype=np.int64)
        while nodes[0] < self.size:
            left = self.nodes[2 * nodes]
            right = targets >= left
            targets -= left * right
            nodes = 2 * nodes + right
        return nodes - self.size


def time_interleaved(functions, rounds, calls_per_round):
    """Median microseconds per call of each zero-argument function, timed in alternating rounds."""
    samples = {name: [] for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            for _ in range(calls_per_round):
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
    return {name: 1e6 * float(np.median(s)) for name, s in samples.items()}


def rollout_arrays(batch, seed):
    rng = np.random.default_rng(seed)
    shape = (TIME_STEPS, batch)
    arrays = dict(log_rhos=rng.normal(0.0, 0.5, shape),
                  discounts=0.99 * (rng.random(shape) > 0.01),
                  rewards=rng.normal(size=shape), values=rng.normal(size=shape),
                  bootstrap_value=rng.normal(size=batch))
    return {k: v.astype(np.float32) for k, v in arrays.items()}


def bench_returns(rounds):
    results = {}
    for batch in BATCHES:
        a = rollout_arrays(batch, seed=batch)
        t = {k: torch.from_numpy(v) for k, v in a.items()}
        gae_args = [a["rewards"], a["values"], a["bootstrap_value"], a["discounts"]]
        gae_tensors = [torch.from_numpy(x) for x in gae_args]
        functions = {
            "vtrace numba": lambda: vtrace(**a),
            "vtrace torch loop": lambda: vtrace_torch_loop(**t),
            "vtrace numpy loop": lambda: vtrace_numpy_loop(**a),
            "gae numba": lambda: gae(*gae_args, 0.95),
            "gae torch loop": lambda: gae_loop(*gae_tensors, 0.95, torch.zeros_like),
            "gae numpy loop": lambda: gae_loop(*gae_args, 0.95, np.zeros_like),
        }
        # Warm-up (numba compiles or loads its cache) and a check that all agree.
        reference = vtrace(**a)
        for other in (vtrace_torch_loop(**t), vtrace_numpy_loop(**a)):
            for x, y in zip(reference, other):
                np.testing.assert_allclose(np.asarray(y), x, rtol=1e-4, atol=1e-4)
        reference = gae(*gae_args, 0.95)
        for other in (gae_loop(*gae_tensors, 0.95, torch.zeros_like),
                      gae_loop(*gae_args, 0.95, np.zeros_like)):
            for x, y in zip(reference, other):
                np.testing.assert_allclose(np.asarray(y), x, rtol=1e-4, atol=1e-4)
        calls = 20 if batch <= 256 else 4
        results[batch] = time_interleaved(functions, rounds, calls)
    return results


def bench_sumtree(rounds):
    rng = np.random.default_rng(0)
    initial = rng.random(TREE_CAPACITY)
    tree, numpy_tree = SumTree(TREE_CAPACITY), NumpySumTree(TREE_CAPACITY)
    tree.update(np.arange(TREE_CAPACITY), initial)
    numpy_tree.update(np.arange(TREE_CAPACITY), initial)
    assert np.isclose(tree.total(), numpy_tree.nodes[1], rtol=1e-12)
    calls = 50
    # Fresh indices and priorities for every timed update call, drawn beforehand.
    pool = rounds * calls + 1
    update_indices = rng.integers(0, TREE_CAPACITY, (2, pool, TREE_BATCH))
    update_priorities = rng.random((2, pool, TREE_BATCH))
    counters = [iter(range(pool)), iter(range(pool))]

    def updater(which, target):
        def update():
            k = next(counters[which])
            target.update(update_indices[which, k], update_priorities[which, k])
        return update

    functions = {
        "sumtree sample": lambda: tree.sample(TREE_BATCH, rng),
        "numpy tree sample": lambda: numpy_tree.sample(TREE_BATCH, rng),
        "sumtree update": updater(0, tree),
        "numpy tree update": updater(1, numpy_tree),
    }
    for fn in functions.values():
        fn()
    assert (tree.get(tree.sample(TREE_BATCH, rng)) > 0).all()
    return time_interleaved(functions, rounds, calls)


def add_arguments(p) -> None:
    add_rounds(p, 15, "interleaved timing rounds")


def run(args) -> dict:
    returns = bench_returns(args.rounds)
    tree = bench_sumtree(args.rounds)

    report = {"threads": 1, "time_steps": TIME_STEPS, "vtrace": {}, "gae": {}}
    print(f"{'kernel':8} {'B':>5} {'numba us':>10} {'torch loop us':>14} {'numpy loop us':>14} "
          f"{'vs torch':>9} {'vs numpy':>9}")
    for kernel in ("vtrace", "gae"):
        for batch, timings in returns.items():
            ours = timings[f"{kernel} numba"]
            torch_us, numpy_us = timings[f"{kernel} torch loop"], timings[f"{kernel} numpy loop"]
            row = dict(numba_us=ours, torch_loop_us=torch_us, numpy_loop_us=numpy_us,
                       speedup_vs_torch=torch_us / ours, speedup_vs_numpy=numpy_us / ours)
            report[kernel][f"B{batch}"] = row
            print(f"{kernel:8} {batch:5d} {ours:10.1f} {torch_us:14.1f} {numpy_us:14.1f} "
                  f"{row['speedup_vs_torch']:8.1f}x {row['speedup_vs_numpy']:8.1f}x")

    report["sumtree"] = dict(
        capacity=TREE_CAPACITY, batch=TREE_BATCH,
        sample_us=tree["sumtree sample"], numpy_sample_us=tree["numpy tree sample"],
        update_us=tree["sumtree update"], numpy_update_us=tree["numpy tree update"])
    print(f"\n{'sum tree (2^20, 512)':22} {'SumTree us':>11} {'numpy tree us':>14} {'speed-up':>9}")
    for op in ("sample", "update"):
        ours, theirs = report["sumtree"][f"{op}_us"], report["sumtree"][f"numpy_{op}_us"]
        print(f"{op:22} {ours:11.1f} {theirs:14.1f} {theirs / ours:8.1f}x")

    measured = {
        "vtrace_vs_torch_B256": report["vtrace"]["B256"]["speedup_vs_torch"],
        "vtrace_vs_numpy_B2048": report["vtrace"]["B2048"]["speedup_vs_numpy"],
        "sumtree_sample_us": report["sumtree"]["sample_us"],
        "sumtree_update_us": report["sumtree"]["update_us"],
    }
    report["targets_met"] = {}
    print("\ntargets")
    for name, (what, relation, bound, unit) in TARGETS.items():
        met = measured[name] >= bound if relation == "at least" else measured[name] <= bound
        report["targets_met"][name] = met
        print(f"  {what:46} {measured[name]:8.1f} {unit:2}  target {relation} {bound:g} {unit:2}  "
              f"{'met' if met else 'MISSED'}")
    return report
