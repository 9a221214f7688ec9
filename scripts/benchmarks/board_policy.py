"""A board-game run's first policy, loaded for the greedy-play benchmarks (tactics, perfect-play)."""
from __future__ import annotations

from pathlib import Path


def load_board_policy(run_dir: Path, best: bool, board_shape: tuple[int, ...], game: str, benchmark: str):
    """(model, observation layout, checkpoint source) of ``run_dir``'s first policy; ValueError in
    one line where the run did not train on boards of ``board_shape`` (``game``, as errors name it)."""
    from fastrl.envs import probe_env
    from fastrl.envs.spaces import ObsLayout
    from fastrl.evaluation.episodes import load_run_model

    cfg, model, source = load_run_model(run_dir, best=best)
    space = probe_env(cfg).observation_space
    board = space.get("observation") if hasattr(space, "get") else None
    if getattr(board, "shape", None) != tuple(board_shape):
        raise ValueError(f"{run_dir} trained on {cfg.env.id}, not {game}: {benchmark} reads {game} boards only")
    return model, ObsLayout(space), source
