"""Same as `fastrl-eval`: python scripts/eval.py RUN_DIR [--episodes N] [--deterministic]"""
import sys

from fastrl.cli import eval_main

if __name__ == "__main__":
    sys.exit(eval_main())
