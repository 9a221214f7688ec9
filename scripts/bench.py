"""fastrl's benchmarks, one subcommand each: python scripts/bench.py SUBCOMMAND [options]

    python scripts/bench.py kernels --rounds 15
    python scripts/bench.py learning --profile cartpole-appo --seeds 3 --json /tmp/learning.json
    python scripts/bench.py SUBCOMMAND --help

Each subcommand prints its table, then its figures as one JSON line; ``--json PATH`` also writes
them to PATH. A subcommand whose module defines ``failed(report)`` exits with status 1 when it
says so (``soak``: the training run did not exit cleanly); bad options exit with status 2. The
options several share (``--set``, ``--rounds``, the setups in benchmarks/setups/) are declared
once, in benchmarks/options.py. A subcommand's module is imported only when it runs: some pin
their thread pools before numpy loads, and the batcher's is re-run against an older checkout of
fastrl, which the others' imports may not match.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import json
import sys
from pathlib import Path

# subcommand: (module in benchmarks/, what it measures)
SUBCOMMANDS = {
    "learning": ("learning", "whether a profile keeps its [expect] promise: steps and wall time to the threshold"),
    "learning-checks": ("learning_checks", "tests/learning: small runs that must reach a score within a budget"),
    "throughput": ("throughput", "training throughput against the raw env limit, and CartPole time-to-solve"),
    "compare": ("compare", "a profile's steady env steps/s with and without some overrides, alternating"),
    "agents": ("agents", "agent rows/s of multi-agent games against the single-agent path, alternating"),
    "learner": ("learner", "the learner alone: train() calls per second on synthetic batches"),
    "updates": ("updates", "a replay learner's gradient steps alone: updates/s, their parts, the arithmetic floor"),
    "batcher": ("batcher", "the inference batcher's infer() alone"),
    "kernels": ("kernels", "fastrl.kernels against the loops they replace"),
    "replay": ("replay", "replay memory per transition, add, sample and priority-update rates"),
    "recurrent": ("recurrent", "what an LSTM costs on CartPole, and how fast recurrent learners solve MemoryEnv"),
    "eval": ("evaluation", "what evaluation during training costs"),
    "scaling": ("scaling", "one rank against N ranks (torchrun; two nodes over a veth link as root)"),
    "vizdoom": ("vizdoom", "fastrl against Sample Factory on ViZDoom: training frames/s, time to a score"),
    "syncs": ("syncs", "host synchronisations and host <-> device copies per call"),
    "check-envs": ("check_envs", "every envpool task family trained for a few seconds"),
    "soak": ("soak", "a long run with a rollout worker SIGKILLed every --kill-every seconds"),
    "gpu": ("gpu", "the GPU report in one call: tests, throughput, syncs, bf16, learning, GPU use"),
    "tactics": ("tactics", "a connect-four policy's greedy wins in one and blocks, on positions from random play"),
    "perfect-play": ("perfect_play", "a tic-tac-toe policy's greedy play against every line of a perfect player"),
}
BENCH = Path(__file__).resolve()


def subcommand_parser(name: str, module) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{BENCH.name} {name}", description=module.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures printed as JSON to PATH")
    module.add_arguments(p)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    table = "\n".join(f"  {name:<11} {what}" for name, (_, what) in SUBCOMMANDS.items())
    top = argparse.ArgumentParser(prog=BENCH.name, description=f"{__doc__}\nsubcommands:\n{table}",
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("subcommand", choices=SUBCOMMANDS, metavar="SUBCOMMAND")
    top.add_argument("options", nargs=argparse.REMAINDER, help="the subcommand's (SUBCOMMAND --help)")
    chosen = top.parse_args(argv[:1])
    name = chosen.subcommand
    module = importlib.import_module(f"benchmarks.{SUBCOMMANDS[name][0]}")
    args = subcommand_parser(name, module).parse_args(argv[1:])
    try:
        report = module.run(args)
    except getattr(module, "ERRORS", ()) as exc:
        print(f"{BENCH.name} {name}: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 1 if getattr(module, "failed", lambda report: False)(report) else 0


if __name__ == "__main__":
    # The final collection skipped, as fastrl's commands do (fastrl.ipc.fast_exit; not imported
    # from there: fastrl is not imported before the subcommand's module). Here, not in main(): a
    # process that calls main() many times (the tests) registers nothing.
    atexit.register(gc.freeze)
    sys.exit(main())
