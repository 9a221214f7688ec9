"""Central inference batcher (SEED RL style): one forward pass for every ready request.

A request ``(worker, request_id)`` names a batch of envs whose observations sit in the arena at
their cursors ``(env_slot, env_t)``. The batcher gathers all ready requests into one batch, runs
the policy on the device, and writes action, behaviour log-prob and policy version back into the
same slot rows. For the dqn learner the policy is epsilon-greedy over Q-values, with one epsilon
per env (Ape-X).

With a recurrent core the batcher also reads each env's state from the arena in the same gather
(zeroed where the env's worker flagged an episode start), records it as the slot's initial state
when the env is at the first step of a slot, and writes the new state back with the action.
"""
from __future__ import annotations

import time
from multiprocessing.connection import wait

import numba
import numpy as np
import torch

from .config import Q_LEARNERS
from .metrics import BatcherTiming
from .distributed import DistInfo
from .heads import MASKED_LOGIT
from .models import action_head, load_flat_state, num_state_values
from .process_utils import BatcherChannels, ProcessExit, check_alive, configure_child, wait_readable
from .shm import Arena, WeightBuffer, set_error


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
        self.timings = BatcherTiming.row(arena)
        self.slot_actions = arena.actions.reshape(*arena.actions.shape[:2], -1)  # [N, T, action size] view
        self.recurrent = bool(getattr(model, "is_recurrent", False))
        self.masks = getattr(getattr(model, "obs_layout", None), "mask", None) is not None
        if self.recurrent:
            W, E, S = arena.env_state.shape
            self.env_state = arena.env_state.reshape(W * E, S)  # [W * E, S] views
            self.env_start = arena.env_start.reshape(W * E)

    def refresh_weights(self) -> bool:
        """Load the newest published weights; True once any weights are loaded."""
        published = int(self.weights.version[0])
        if published != self.version and published >= 0:
            start = time.perf_counter()
            version = self.weights.read_into(self.flat)
            if version is not None:
                load_flat_state(self.model, torch.from_numpy(self.flat).to(self.device))
                self.version = version
            self.timings[BatcherTiming.WEIGHT_REFRESH] += time.perf_counter() - start
        return self.version >= 0

    def infer(self, workers: np.ndarray, requests: np.ndarray) -> None:
        """Act for the requests ``(workers[i], requests[i])``."""
        start = time.perf_counter()
        arena = self.arena
        slots, steps = request_cursors(arena.request_envs, arena.env_slot, arena.env_t, workers, requests)
        # numpy fancy indexing on the shared arrays measured ~2x cheaper than torch's here.
        obs = torch.from_numpy(arena.obs[slots, steps])
        with torch.inference_mode():
            if self.masks:
                final = arena.env_final[workers[:, None], arena.request_envs[workers, requests]].reshape(-1)
                self.model.check_mask(obs, torch.from_numpy(final != 0))
            if not self.on_cpu:
                obs = obs.to(self.device, non_blocking=True)
            if self.recurrent:
                params = self.recurrent_step(obs, workers, requests, slots, steps)
            else:
                params, _ = self.model(obs)
            if self.epsilons is None:
                actions, behaviour_logp = self.head.sample_with_log_prob(params)
            else:
                env_ids = arena.request_envs[workers, requests]  # [n, b]
                epsilons = self.epsilons[workers[:, None], env_ids].reshape(-1)
                actions, behaviour_logp = epsilon_greedy(params.cpu(), epsilons)
            actions, behaviour_logp = actions.cpu().numpy(), behaviour_logp.cpu().numpy()
        write_actions(slots, steps, actions.reshape(len(slots), -1), behaviour_logp, self.version,
                      self.slot_actions, arena.behaviour_logp, arena.version)
        self.timings[BatcherTiming.FORWARD] += time.perf_counter() - start
        self.timings[BatcherTiming.BATCHES] += 1
        self.timings[BatcherTiming.REQUESTS] += len(requests)

    def recurrent_step(self, obs: torch.Tensor, workers, requests, slots, steps) -> torch.Tensor:
        """One step of the recurrent policy for the requests' envs: their states are read (zeroed at
        an episode start), stored as the initial state of slots at step 0, and replaced by the new
        states; returns the action params ``[n, P]``."""
        arena = self.arena
        E = arena.env_start.shape[1]
        rows = (workers[:, None].astype(np.int64) * E + arena.request_envs[workers, requests]).reshape(-1)
        state = self.env_state[rows]
        state *= (self.env_start[rows] == 0)[:, None]
        first = steps == 0
        arena.slot_state[slots[first]] = state[first]
        state_t = torch.from_numpy(state)
        if not self.on_cpu:
            state_t = state_t.to(self.device, non_blocking=True)
        params, _, new_state = self.model(obs.unsqueeze(0), state_t, None)
        self.env_state[rows] = new_state.cpu().numpy()
        return params[0]


# The two index kernels below replace five 2-D numpy gathers/scatters per batch. Measured here
# for 3 requests of 256 envs: 24 -> 11 us alone, and ~80 us of a ~340 us batch inside a running
# `fastrl-profile --profile cartpole-appo` (cache misses on rows the workers just wrote) before.
@numba.njit(cache=True, nogil=True)
def request_cursors(request_envs, env_slot, env_t, workers, requests):
    """Cursors of the envs of requests ``(workers[i], requests[i])``, in request order.

    ``request_envs`` ``[W, S, b]``, ``env_slot``/``env_t`` ``[W, E]``, ``workers``/``requests``
    ``[n]`` -> (slots, steps), each int64 ``[n * b]``."""
    n, b = workers.shape[0], request_envs.shape[2]
    slots = np.empty(n * b, np.int64)
    steps = np.empty(n * b, np.int64)
    for i in range(n):
        w = workers[i]
        for j in range(b):
            env = request_envs[w, requests[i], j]
            slots[i * b + j] = env_slot[w, env]
            steps[i * b + j] = env_t[w, env]
    return slots, steps


@numba.njit(cache=True, nogil=True)
def write_actions(slots, steps, actions, behaviour_logp, version, slot_actions, slot_behaviour_logp, slot_version):
    """Row k of ``actions`` ``[n, A]`` and ``behaviour_logp`` ``[n]``, and ``version``, into slot row
    ``(slots[k], steps[k])`` of ``slot_actions`` ``[N, T, A]``, ``slot_behaviour_logp`` and ``slot_version``
    ``[N, T]``."""
    for k in range(slots.shape[0]):
        s, t = slots[k], steps[k]
        slot_actions[s, t, :] = actions[k]
        slot_behaviour_logp[s, t] = behaviour_logp[k]
        slot_version[s, t] = version


def epsilon_greedy(q: torch.Tensor, epsilons: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b takes a uniformly random legal action with probability ``epsilons[b]``, else argmax
    ``q[b]``; returns (actions ``[B]`` int64, the behaviour log-probability of each action ``[B]``).
    Illegal actions (an action mask: Q = MASKED_LOGIT) are never taken, by either branch."""
    greedy = q.argmax(-1)
    explore = torch.rand(q.shape[0]) < epsilons
    legal = q > MASKED_LOGIT
    if bool(legal.all()):
        num_legal = torch.full_like(epsilons, q.shape[-1])
        random = torch.randint(q.shape[-1], greedy.shape)
    else:
        num_legal = legal.sum(-1).to(epsilons.dtype)
        random = torch.multinomial(legal.float(), 1).squeeze(-1)
    actions = torch.where(explore, random, greedy)
    prob = epsilons / num_legal + (1.0 - epsilons) * (actions == greedy)
    return actions, torch.log(prob)


def batcher_epsilons(cfg) -> np.ndarray | None:
    """``[W, E]`` exploration rates of this rank's envs for dqn (numbered across all ranks), else None."""
    if cfg.learner.algo not in Q_LEARNERS:
        return None
    info = DistInfo.from_env()
    per_rank = cfg.total_envs
    return apex_epsilons(per_rank, cfg.learner.epsilon, cfg.learner.epsilon_alpha, first=info.rank * per_rank,
                         total=info.world_size * per_rank).reshape(cfg.env.num_workers, cfg.env.envs_per_worker)


def inference_process(cfg, layout, arena_name: str, model, action_space, device: str,
                      channels: BatcherChannels, parent_pid: int) -> None:
    """Main loop of the inference process: wait for requests, batch them, answer each worker."""
    configure_child(parent_pid)
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed + 7919)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    arena = Arena.attach(layout, arena_name)
    requests_in, actions_out = channels.requests_in, channels.actions_out
    worker_of = {conn: w for w, conn in enumerate(requests_in)}
    batcher = InferenceBatcher(arena, model, action_space, torch.device(device), batcher_epsilons(cfg))
    try:
        while not batcher.refresh_weights():
            wait([], 0.01)  # the learner publishes its first weights within a moment of starting
            check_alive(arena.control, parent_pid)
        while True:
            waited = time.perf_counter()
            ready = wait_readable(requests_in, arena.control, parent_pid)
            batcher.timings[BatcherTiming.WAIT_REQUESTS] += time.perf_counter() - waited
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
    except Exception as exc:
        # The runner reports this line (an action mask that allows nothing, a model that fails on
        # the observations); the traceback still goes to stderr.
        set_error(arena, f"the inference batcher stopped: {exc}")
        raise
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
