"""Same as `fastrl-train`: python scripts/train.py --profile cartpole-appo [...]"""
import sys

from fastrl.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
