"""One rank of ``scripts/bench.py scaling``'s all-reduce probe, launched by torchrun: the seconds
one update's gradient all-reduce takes (fastrl.distributed.process_group.GradientAverager on the profile's
model, on the device and over the network interface a training run would use) with nothing else
running, so the figure is the link's cost alone, without waiting for a slower rank.

    torchrun --nproc-per-node 2 scripts/benchmarks/all_reduce_probe.py --profile cartpole-appo --out probe.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

WARMUP_ROUNDS = 10  # gloo's and NCCL's first collectives set up buffers and connections


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="fastrl-train's --set")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--out", type=Path, required=True, help="rank 0 writes the figures here as JSON")
    args = p.parse_args()

    import torch

    from fastrl.config import build_config, parse_override
    from fastrl.distributed import process_group as distributed
    from fastrl.envs import probe_env
    from fastrl.models.networks import build_model
    from fastrl.run.preflight import resolve_device

    cfg = build_config(args.profile, dict(parse_override(item) for item in args.set))
    spec = probe_env(cfg)
    info = distributed.DistInfo.from_env()
    device = resolve_device(cfg.device, info)
    distributed.route_collectives_to_master()
    distributed.init_group(info, "learner", device, cfg.dist_timeout_s)
    try:
        model = build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo).to(device)
        for param in model.parameters():
            param.grad = torch.randn_like(param)
        average = distributed.GradientAverager(model, info.world_size)
        for _ in range(WARMUP_ROUNDS):
            average(True)
        start = time.perf_counter()
        for _ in range(args.rounds):
            average(True)  # reads its non-finite flag back: every round ends synchronised
        seconds = (time.perf_counter() - start) / args.rounds
    finally:
        distributed.close_group()
    if info.is_main:
        args.out.write_text(json.dumps({"parameters": average.flat.numel() - 1,
                                        "bytes": average.flat.numel() * average.flat.element_size(),
                                        "all_reduce_s": seconds, "device": device}))


if __name__ == "__main__":
    main()
