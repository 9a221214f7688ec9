"""``scripts/bench.py scaling`` under a name of its own: 1 rank against N ranks (two nodes over a
veth link as root), with the same options.

    python scripts/bench_scaling.py --ranks 2 --seconds 40
"""
import sys

from bench import main

if __name__ == "__main__":
    sys.exit(main(["scaling", *sys.argv[1:]]))
