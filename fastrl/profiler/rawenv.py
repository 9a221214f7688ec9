"""Raw env throughput of a run's process layout: its env groups stepped with random actions in
as many processes as rollout workers, with no trainer around them: the honest limit of that layout."""
from __future__ import annotations

import queue
import time
from dataclasses import dataclass

import gymnasium
import numpy as np

from ..config import Config
from ..envs.spaces import MASK_KEY, ActionLayout, ObsLayout, box_bounds
from ..ipc.child import configure_child
from ..ipc.start import child_context, child_process
from ..sampling.rollout_worker import make_worker_env
from .diagnosis import ProfileError
from .sampling import ProcessSampler, cores_used

ENV_START_TIMEOUT_S = 120.0
ACTION_TABLE = 64  # batches of random actions drawn up front, cycled in the raw env loop


@dataclass
class EnvMeasurement:
    """Raw env throughput, summed over the env processes."""
    env_steps_per_s: float
    frames_per_s: float
    frame_skip: int
    window_s: float
    processes: list[dict]  # see ProcessSampler.processes
    cores_used: float


def random_action_table(space, batch_size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` batches of uniform random actions as ``VecEnv.send`` takes them (flat and
    zero-based, fastrl.envs.spaces.ActionLayout): [count, batch_size, *layout.shape]. Box bounds that
    are infinite are replaced by [-1, 1]."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return rng.integers(0, space.n, size=(count, batch_size), dtype=np.int64)
    layout = ActionLayout(space)
    if isinstance(space, gymnasium.spaces.Box):
        low, high = (bound.reshape(-1) for bound in box_bounds(space))
        low, high = np.where(np.isfinite(low), low, -1.0), np.where(np.isfinite(high), high, 1.0)
        return rng.uniform(low, high, size=(count, batch_size, *layout.shape)).astype(np.float32)
    # MultiDiscrete / MultiBinary / Tuple: the space's own sampler, stored as fastrl stores actions.
    space.seed(int(rng.integers(2**31)))
    rows = [layout.encode(space.sample()) for _ in range(count * batch_size)]
    return np.stack(rows).reshape(count, batch_size, *layout.shape)


def legal_random_actions(layout: ActionLayout, mask: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Uniform random actions among those ``mask`` allows, as ``VecEnv.send`` takes them (``[B]``
    for Discrete, ``[B, k]`` for MultiDiscrete): ``mask`` ``[B, ...]`` holds one flag per category of
    each part (fastrl.envs.spaces), ``uniform`` float ``[B, layout.num_logits]`` draws in [0, 1). A part
    with no legal category gets category 0."""
    scores = np.where(mask.reshape(len(mask), -1) != 0, uniform, -1.0)
    columns = [scores[:, part.param_slice].argmax(axis=1) for part in layout.parts]
    return columns[0] if layout.shape == () else np.stack(columns, axis=1)


def _raw_env_process(worker_id: int, cfg: Config, warmup_s: float, window_s: float, barrier,
                     results) -> None:
    """One raw env process: the env group of rollout worker ``worker_id``, random actions, and
    the same double buffering (``num_splits`` batches in flight). Puts (worker_id, result).

    Actions are drawn among those the observation's ``action_mask`` allows: an illegal move ends a
    PettingZoo classic game at once (or raises, in envs that refuse it), which would measure
    something other than the game."""
    configure_child(cfg.retain_freed_memory)
    try:
        env = make_worker_env(cfg, worker_id)
    except Exception as exc:
        results.put((worker_id, {"error": f"{type(exc).__name__}: {exc}"}))
        barrier.abort()
        return
    try:
        rng = np.random.default_rng(cfg.seed + worker_id)
        layout = ActionLayout(env.action_space)
        masked = ObsLayout(env.observation_space).mask is not None
        table = (rng.random((ACTION_TABLE, env.batch_size, layout.num_logits)) if masked else
                 random_action_table(env.action_space, env.batch_size, ACTION_TABLE, rng))
        barrier.wait(ENV_START_TIMEOUT_S)
        env.async_reset()
        start = time.time()
        steps, i = 0, 0
        t_a, steps_a = None, 0
        while True:
            obs, _, _, _, env_ids = env.recv()
            actions = legal_random_actions(layout, obs[MASK_KEY], table[i % ACTION_TABLE]) if masked else \
                table[i % ACTION_TABLE]
            env.send(actions, env_ids)
            steps += len(env_ids)
            i += 1
            now = time.time()
            if t_a is None and now >= start + warmup_s:
                t_a, steps_a = now, steps
            elif t_a is not None and now >= t_a + window_s:
                break
        results.put((worker_id, {"env_steps": steps - steps_a, "t_a": t_a, "t_b": now,
                                 "frame_skip": env.frame_skip}))
    except Exception as exc:
        results.put((worker_id, {"error": f"{type(exc).__name__}: {exc}"}))
    finally:
        env.close()


def measure_env(cfg: Config, seconds: float, warmup_s: float) -> EnvMeasurement:
    """Raw env throughput of ``cfg``'s rollout layout with random actions, summed over workers:
    ``seconds`` measured after ``warmup_s``, once every process has built its envs."""
    ctx = child_context()
    W = cfg.env.num_workers
    barrier, results = ctx.Barrier(W), ctx.Queue()
    procs = [child_process(ctx, _raw_env_process, f"fastrl-rawenv-{w}", daemon=True,
                           args=(w, cfg, warmup_s, seconds, barrier, results))
             for w in range(W)]
    got: dict[int, dict] = {}
    try:
        for p in procs:
            p.start()
        with ProcessSampler(lambda: {"rollout": [p.pid for p in procs]}) as sampler:
            deadline = time.time() + ENV_START_TIMEOUT_S + warmup_s + seconds
            while len(got) < W:
                try:
                    worker_id, result = results.get(timeout=max(0.1, deadline - time.time()))
                except queue.Empty:
                    raise ProfileError(f"raw env processes did not finish within "
                                       f"{ENV_START_TIMEOUT_S + warmup_s + seconds:.0f} s; "
                                       f"check the env settings (env.id, env.kwargs)") from None
                if "error" in result:
                    raise ProfileError(f"raw env process {worker_id} failed: {result['error']}")
                got[worker_id] = result
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        results.close()
    rate = sum(r["env_steps"] / (r["t_b"] - r["t_a"]) for r in got.values())
    frame_skip = got[0]["frame_skip"]
    t_a, t_b = max(r["t_a"] for r in got.values()), min(r["t_b"] for r in got.values())
    processes = sampler.processes(t_a, t_b)
    return EnvMeasurement(env_steps_per_s=rate, frames_per_s=rate * frame_skip, frame_skip=frame_skip,
                          window_s=seconds, processes=processes, cores_used=cores_used(processes))
