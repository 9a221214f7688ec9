"""Evaluation: run complete episodes with a trained policy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .checkpoint import load_latest_checkpoint, model_fit_check
from .config import Q_LEARNERS, Config, load_run_config
from .envs import make_vec_env, probe_env
from .models import action_head, build_model
from .spaces import ObsLayout


@torch.no_grad()
def evaluate_policy(cfg: Config, model: torch.nn.Module, episodes: int, deterministic: bool = False,
                    device: str = "cpu", seed: int = 12345) -> dict:
    """Mean and std of the return over ``episodes`` complete episodes.

    Each of the ``n`` parallel envs plays a fixed quota of episodes: taking the first episodes to
    finish across envs would favour short episodes. A dqn policy always acts greedily on its
    Q-values (they are not logits to sample from).
    """
    deterministic = deterministic or cfg.learner.algo in Q_LEARNERS
    n = min(episodes, 8)
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)
    env = make_vec_env(cfg.env.id, num_envs=n, batch_size=n, seed=seed, backend=cfg.env.backend,
                       env_kwargs=cfg.env.kwargs)
    model = model.to(device).eval()
    head = action_head(env.action_space)
    layout = ObsLayout(env.observation_space)
    recurrent = getattr(model, "is_recurrent", False)
    state = model.initial_state(n, device) if recurrent else None
    started = np.zeros(n, dtype=bool)
    returns: list[float] = []
    running = np.zeros(n)
    finished = np.zeros(n, dtype=np.int64)
    after_done = np.zeros(n, dtype=bool)
    try:
        env.async_reset()
        while (finished < quota).any():
            obs, rewards, terminated, truncated, ids = env.recv()
            ids = np.asarray(ids)
            running[ids] += np.where(after_done[ids], 0.0, rewards)
            done = np.logical_or(terminated, truncated)
            for i in ids[done]:
                if finished[i] < quota[i]:
                    returns.append(float(running[i]))
                    finished[i] += 1
            running[ids[done]] = 0.0
            # The observation after an autoreset step (or the first one) begins an episode.
            episode_start = after_done[ids] | ~started[ids]
            started[ids] = True
            after_done[ids] = done
            obs = torch.as_tensor(layout.pack(obs, len(ids))).to(device)
            if layout.mask is not None:
                model.check_mask(obs, torch.as_tensor(done))
            if recurrent:
                starts = torch.as_tensor(episode_start, device=device)[None]
                rows = torch.as_tensor(ids, device=device)
                params, _, new_state = model(obs[None], state[rows], starts)
                state[rows] = new_state
                params = params[0]
            else:
                params, _ = model(obs)
            actions = head.sample(params, deterministic=deterministic).cpu().numpy()
            env.send(actions, ids)
    finally:
        env.close()
    return {"episode_return_mean": float(np.mean(returns)), "episode_return_std": float(np.std(returns)),
            "episodes": len(returns)}


def evaluate_run(run_dir: Path, episodes: int, deterministic: bool = False, device: str = "cpu",
                 seed: int = 12345) -> dict:
    cfg = load_run_config(run_dir)
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    path, state = load_latest_checkpoint(run_dir, check=model_fit_check(model))
    result = evaluate_policy(cfg, model, episodes, deterministic, device, seed)
    result["checkpoint"] = str(path)
    result["env_steps"] = state["counters"]["env_steps"]
    return result
