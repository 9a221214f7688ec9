"""Evaluation: run complete episodes with a trained policy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .checkpoint import (CheckpointError, CheckpointMismatch, best_checkpoint_path, load_checkpoint,
                         load_latest_checkpoint, load_model_state)
from .config import Q_LEARNERS, Config, ConfigError, is_device_name, load_run_config, weights_mismatch
from .envs import make_episode_env, probe_env
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
    In a multi-agent env every agent is an env here (its episodes count one by one) and whole
    games are played: the fewest that hold ``min(episodes, num_envs)`` agents, so ``n`` may
    exceed ``num_envs`` by less than a game.
    """
    deterministic = deterministic or cfg.learner.algo in Q_LEARNERS
    if env is None:
        env = make_episode_env(cfg, min(episodes, num_envs), seed)
    n = env.num_envs
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)
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
            # A done that ends no step is an agent that left its game before, still reporting it.
            for i in ids[done & stepped]:
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

    def check(state: dict, path_hint: str = "the checkpoint") -> None:
        differs = weights_mismatch(state.get("config", {}), cfg)
        if differs:
            raise CheckpointMismatch(f"'{Path(run_dir) / 'config.toml'}' differs from the config its checkpoints "
                                     f"were trained with ({differs}; checkpoint -> config.toml): put the "
                                     f"checkpoints' values back in config.toml to evaluate them")
        load_model_state(model, state, path_hint)

    if best:
        path = best_checkpoint_path(run_dir)
        if not path.is_file():
            raise CheckpointError(f"no '{path}': evaluation during training was off (train with --set "
                                  f"eval.every_s=60) or had not finished one yet; run fastrl-eval without --best "
                                  f"for the latest checkpoint")
        state = load_checkpoint(path)
        check(state, path_hint=f"'{path}'")
    else:
        path, state = load_latest_checkpoint(run_dir, check=check)
    return cfg, model, {"checkpoint": str(path), "env_steps": state["counters"]["env_steps"]}


def evaluation_device(name: str) -> str:
    """fastrl-eval's --device as torch takes it: auto (a GPU if one is visible), cpu, cuda or
    cuda:N; ConfigError (one line) for another name or a GPU this machine does not have."""
    if not is_device_name(name):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got '{name}'")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    count = torch.cuda.device_count()
    if torch.device(name).index is not None and torch.device(name).index >= count:
        raise ConfigError(f"--device {name}: {count} GPU(s) are visible (cuda:0 to cuda:{count - 1}); pick one of "
                          f"those, or check CUDA_VISIBLE_DEVICES")
    return name


def evaluate_run(run_dir: Path, episodes: int, deterministic: bool = False, device: str = "cpu",
                 seed: int = 12345, best: bool = False) -> dict:
    """fastrl-eval: evaluate a run's latest (or ``best``) weights."""
    cfg, model, source = load_run_model(run_dir, best)
    return {**evaluate_policy(cfg, model, episodes, deterministic, device, seed), **source}
