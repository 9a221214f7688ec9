"""An env that writes down what its seed gave it, for the tests of what a seed fixes in a parallel
run (tests/test_reproducibility.py): "tests.support.seed_envs:make_recorded_cartpole" (spawned workers
build it by name) saves the observation of every seeded reset as ``out_dir/seed-<seed>.npy``."""
from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np


class SeededResets(gymnasium.Wrapper):
    """``env`` saving each seeded reset's observation in ``out_dir``, a file per seed (an unseeded
    reset, an autoreset, saves nothing)."""

    def __init__(self, env: gymnasium.Env, out_dir: str):
        super().__init__(env)
        self.out_dir = Path(out_dir)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None:
            np.save(self.out_dir / f"seed-{seed}.npy", obs)
        return obs, info


def make_recorded_cartpole(out_dir: str) -> SeededResets:
    return SeededResets(gymnasium.make("CartPole-v1"), out_dir)


def recorded_resets(out_dir: Path) -> dict[int, np.ndarray]:
    """The saved first observations, by seed."""
    return {int(path.stem.split("-")[1]): np.load(path) for path in sorted(out_dir.glob("seed-*.npy"))}
