"""Central inference batcher (SEED RL style): one forward pass for every ready request.

A request ``(worker, request_id)`` names a batch of envs whose observations sit in the arena at
their cursors ``(env_slot, env_t)``. The batcher gathers all ready requests into one batch, runs
the policy on the device, and writes action, behaviour log-prob and policy version back into the
same slot rows. For the dqn learner the policy is epsilon-greedy over Q-values, with one epsilon
per env (Ape-X).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .models import action_head, load_flat_state, num_state_values
from .shm import Arena, WeightBuffer


def apex_epsilons(num_envs: int, epsilon: float, alpha: float, first: int = 0, total: int | None = None) -> np.ndarray:
    """Ape-X exploration rates ``epsilon ** (1 + alpha * i / (N - 1))`` for envs ``first ..
    first + num_envs - 1`` of ``N = total`` (float32); a single env gets ``epsilon``."""
    total = num_envs if total is None else total
    i = np.arange(first, first + num_envs, dtype=np.float64)
    exponent = 1.0 + alpha * i / max(total - 1, 1)
    return (epsilon ** exponent).astype(np.float32)


class InferenceBatcher:
    """``epsilons`` ``[W, E]`` (dqn): each env's exploration rate; None samples the policy head."""

    def __init__(self, arena: Arena, model: torch.nn.Module, action_space, device: torch.device,
                 epsilons: np.ndarray | None = None):
        self.arena = arena
        self.model = model.to(device).eval()
        self.device = device
        self.on_cpu = device.type == "cpu"
        self.head = action_head(action_space)
        self.weights = WeightBuffer(arena)
        self.flat = np.empty(num_state_values(model), dtype=np.float32)
        self.version = -1
        self.epsilons = None if epsilons is None else torch.from_numpy(np.asarray(epsilons, np.float32))
        # Columns: fastrl.metrics.INFERENCE_TIMINGS; row W of arena.timings.
        self.timings = arena.timings[arena.env_steps.shape[0]]

    def refresh_weights(self) -> bool:
        """Load the newest published weights; True once any weights are loaded."""
        published = int(self.weights.version[0])
        if published != self.version and published >= 0:
            start = time.perf_counter()
            version = self.weights.read_into(self.flat)
            if version is not None:
                load_flat_state(self.model, torch.from_numpy(self.flat).to(self.device))
                self.version = version
            self.timings[1] += time.perf_counter() - start
        return self.version >= 0

    def infer(self, workers: np.ndarray, requests: np.ndarray) -> None:
        """Act for the requests ``(workers[i], requests[i])``."""
        start = time.perf_counter()
        arena = self.arena
        env_ids = arena.request_envs[workers, requests]  # [n, b]
        rows = workers[:, None]
        slots = arena.env_slot[rows, env_ids].reshape(-1)
        steps = arena.env_t[rows, env_ids].reshape(-1)
        # numpy fancy indexing on the shared arrays measured ~2x cheaper than torch's here.
        obs = torch.from_numpy(arena.obs[slots, steps])
        with torch.inference_mode():
            if self.on_cpu:
                params, _ = self.model(obs)
            else:
                params, _ = self.model(obs.to(self.device, non_blocking=True))
            if self.epsilons is None:
                actions = self.head.sample(params)
                logp = self.head.log_prob(params, actions)
            else:
                actions, logp = epsilon_greedy(params.cpu(), self.epsilons[workers[:, None], env_ids].reshape(-1))
            actions, logp = actions.cpu().numpy(), logp.cpu().numpy()
        arena.actions[slots, steps] = actions
        arena.logp[slots, steps] = logp
        arena.version[slots, steps] = self.version
        self.timings[0] += time.perf_counter() - start
        self.timings[3] += 1
        self.timings[4] += len(requests)


def epsilon_greedy(q: torch.Tensor, epsilons: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b takes a uniformly random action with probability ``epsilons[b]``, else argmax ``q[b]``;
    returns (actions ``[B]`` int64, the behaviour log-probability of each action ``[B]``)."""
    num_actions = q.shape[-1]
    greedy = q.argmax(-1)
    explore = torch.rand(q.shape[0]) < epsilons
    actions = torch.where(explore, torch.randint(num_actions, greedy.shape), greedy)
    prob = epsilons / num_actions + (1.0 - epsilons) * (actions == greedy)
    return actions, torch.log(prob)


def batcher_epsilons(cfg) -> np.ndarray | None:
    """``[W, E]`` exploration rates of this rank's envs for dqn (numbered across all ranks), else None."""
    if cfg.learner.algo != "dqn":
        return None
    from .distributed import DistInfo

    info = DistInfo.from_env()
    per_rank = cfg.total_envs
    return apex_epsilons(per_rank, cfg.learner.epsilon, cfg.learner.epsilon_alpha, first=info.rank * per_rank,
                         total=info.world_size * per_rank).reshape(cfg.env.num_workers, cfg.env.envs_per_worker)


def inference_process(cfg, layout, arena_name: str, model, action_space, device: str, channels,
                      parent_pid: int) -> None:
    """Main loop of the inference process: wait for requests, batch them, answer each worker."""
    from multiprocessing.connection import wait

    from .process_utils import ProcessExit, check_alive, configure_child, wait_readable

    configure_child(parent_pid)
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed + 7919)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    arena = Arena.attach(layout, arena_name)
    ready_in, actions_out = channels
    worker_of = {conn: w for w, conn in enumerate(ready_in)}
    batcher = InferenceBatcher(arena, model, action_space, torch.device(device), batcher_epsilons(cfg))
    try:
        while not batcher.refresh_weights():
            wait([], 0.01)  # the learner publishes its first weights within a moment of starting
            check_alive(arena.control, parent_pid)
        while True:
            waited = time.perf_counter()
            ready = wait_readable(ready_in, arena.control, parent_pid)
            batcher.timings[2] += time.perf_counter() - waited
            workers, messages = gather_ready_requests(ready, worker_of)
            if not workers:
                continue
            batcher.refresh_weights()
            # A message is generation_tag * S + request (see fastrl.rollout.rollout_process).
            batcher.infer(np.array(workers), np.array(messages) % cfg.env.num_splits)
            for w in sorted(set(workers)):
                actions_out[w].send_bytes(bytes(m for wk, m in zip(workers, messages) if wk == w))
    except ProcessExit:
        pass
    finally:
        del batcher
        arena.close()


def gather_ready_requests(ready, worker_of) -> tuple[list[int], list[int]]:
    workers, requests = [], []
    for conn in ready:
        while conn.poll():
            for request in conn.recv_bytes():
                workers.append(worker_of[conn])
                requests.append(request)
    return workers, requests
