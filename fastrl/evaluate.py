"""Evaluation: run complete episodes with a trained policy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .checkpoint import (CheckpointError, best_checkpoint_path, load_checkpoint, load_latest_checkpoint,
                         load_model_state, model_fit_check)
from .config import Q_LEARNERS, Config, load_run_config
from .envs import make_vec_env, probe_env
from .models import action_head, build_model
from .spaces import ObsLayout


@torch.no_grad()
def evaluate_policy(cfg: Config, model: torch.nn.Module, episodes: int, deterministic: bool = False,
                    device: str = "cpu", seed: int = 12345, num_envs: int = 8, keep_going=None, env=None,
                    after_recv=None) -> dict:
    """Mean and std of the return (and the mean length) over ``episodes`` complete episodes, and
    the env steps they took.

    Each of the ``n`` parallel envs (at most ``num_envs``) plays a fixed quota of episodes: taking
    the first episodes to finish across envs would favour short episodes. A dqn policy always acts
    greedily on its Q-values (they are not logits to sample from). ``keep_going()`` is called
    every step; an evaluation inside a run raises from it to stop at once. Given ``env`` (a VecEnv
    of ``cfg.env``, closed here) the episodes are played on its envs, all at once, and
    ``after_recv()`` is called after every ``recv()``: fastrl.video grabs its frames there.
    """
    deterministic = deterministic or cfg.learner.algo in Q_LEARNERS
    n = env.num_envs if env is not None else min(episodes, num_envs)
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)
    if env is None:
        env = make_vec_env(cfg.env.id, num_envs=n, batch_size=n, seed=seed, backend=cfg.env.backend,
                           env_kwargs=cfg.env.kwargs)
    model = model.to(device).eval()
    head = action_head(env.action_space)
    layout = ObsLayout(env.observation_space)
    recurrent = getattr(model, "is_recurrent", False)
    state = model.initial_state(n, device) if recurrent else None
    started = np.zeros(n, dtype=bool)
    returns: list[float] = []
    lengths: list[int] = []
    running = np.zeros(n)
    running_length = np.zeros(n, dtype=np.int64)
    env_steps = 0
    finished = np.zeros(n, dtype=np.int64)
    after_done = np.zeros(n, dtype=bool)
    try:
        env.async_reset()
        while (finished < quota).any():
            if keep_going is not None:
                keep_going()
            obs, rewards, terminated, truncated, ids = env.recv()
            if after_recv is not None:
                after_recv()
            ids = np.asarray(ids)
            stepped = started[ids] & ~after_done[ids]  # not a reset observation
            env_steps += int(stepped.sum())
            running[ids] += np.where(stepped, rewards, 0.0)
            running_length[ids] += stepped
            done = np.logical_or(terminated, truncated)
            for i in ids[done]:
                if finished[i] < quota[i]:
                    returns.append(float(running[i]))
                    lengths.append(int(running_length[i]))
                    finished[i] += 1
            running[ids[done]] = 0.0
            running_length[ids[done]] = 0
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
            "episode_length_mean": float(np.mean(lengths)), "episodes": len(returns), "env_steps_played": env_steps}


def load_run_model(run_dir: Path, best: bool = False) -> tuple[Config, torch.nn.Module, dict]:
    """The run's config, its model holding the weights of the latest checkpoint (or with ``best``,
    of ``checkpoints/best.pt``, the best evaluation during training), and where those weights come
    from: ``{"checkpoint": path, "env_steps": ...}``, as fastrl-eval prints them."""
    cfg = load_run_config(run_dir)
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    if best:
        path = best_checkpoint_path(run_dir)
        if not path.is_file():
            raise CheckpointError(f"no '{path}': evaluation during training was off (train with --set "
                                  f"eval.every_s=60) or had not finished one yet; run fastrl-eval without --best "
                                  f"for the latest checkpoint")
        state = load_checkpoint(path)
        load_model_state(model, state, path_hint=f"'{path}'")
    else:
        path, state = load_latest_checkpoint(run_dir, check=model_fit_check(model))
    return cfg, model, {"checkpoint": str(path), "env_steps": state["counters"]["env_steps"]}


def evaluate_run(run_dir: Path, episodes: int, deterministic: bool = False, device: str = "cpu",
                 seed: int = 12345, best: bool = False) -> dict:
    """fastrl-eval: evaluate a run's latest (or ``best``) weights."""
    cfg, model, source = load_run_model(run_dir, best)
    return {**evaluate_policy(cfg, model, episodes, deterministic, device, seed), **source}
