"""Central inference batcher (SEED RL style): one forward pass for every ready request.

A request ``(worker, request_id)`` names a batch of envs whose observations sit in the arena at
their cursors ``(env_slot, env_t)``. The batcher gathers all ready requests into one batch, runs
the policy on the device, and writes action, behaviour log-prob and policy version back into the
same slot rows. For the dqn learner the policy is epsilon-greedy over Q-values, with one epsilon
per env (Ape-X), which may start at 1 and fall to that rate over the run's first env steps
(``learner.epsilon_decay_steps``, DQN's schedule) and give way to a smaller late rate
(``learner.epsilon_late_after_steps``). For sac it is the squashed Gaussian scaled to
the env's bounds, and uniformly random actions until ``replay.min_fill`` env steps were taken
(CleanRL's ``learning_starts``), so that the first updates see the whole action range. A plain MLP
policy (categorical, or SAC's squashed Gaussian) on the CPU acts through numpy and numba
(fastrl.sampling.numpy_mlp) instead of torch ops.

With a recurrent core the batcher also reads each env's state from the arena in the same gather
(zeroed where the env's worker flagged an episode start), records it as the slot's initial state
when the env is at the first step of a slot, and writes the new state back with the action.
"""
from __future__ import annotations

import bisect
import copy
import dataclasses
import time
from multiprocessing.connection import wait

import numba
import numpy as np
import torch

from ..config import Q_LEARNERS
from ..distributed.process_group import DistInfo
from ..ipc.arena import Arena, Control, set_error, steps_taken
from ..ipc.child import BatcherChannels, ProcessExit, ReadablePipes, check_alive, configure_child
from ..ipc.device_io import BatchTransfer
from ..ipc.slots import request_ids
from ..ipc.weights import WeightReader
from ..models.heads import MASKED_LOGIT
from ..models.networks import ActorCritic, action_head, build_model
from ..reporting.metrics import BatcherTiming
from .numpy_mlp import NumpyMLPPolicy
from .recent_return import RecentReturn


def apex_epsilons(num_envs: int, epsilon: float, alpha: float, first: int = 0, total: int | None = None) -> np.ndarray:
    """Ape-X exploration rates ``epsilon ** (1 + alpha * i / (N - 1))`` for envs ``first ..
    first + num_envs - 1`` of ``N = total`` (float32); a single env gets ``epsilon``."""
    total = num_envs if total is None else total
    i = np.arange(first, first + num_envs, dtype=np.float64)
    exponent = 1.0 + alpha * i / max(total - 1, 1)
    return (epsilon ** exponent).astype(np.float32)


class WeightSetPolicy:
    """One weight set's network as the batcher acts with it: the model at the weights the learner
    publishes for that set (a policy, or a self-play snapshot), and the function that acts.

    Feed-forward, acting needs the action parameters only (a separate critic is not run); a plain
    MLP on the CPU acts through numpy's BLAS and numba instead of torch ops (fastrl.sampling.numpy_mlp)."""

    def __init__(self, arena: Arena, model: torch.nn.Module, device: torch.device, index: int, compile: bool,
                 numpy_mlp: bool):
        self.model = model.to(device).eval()
        self.weights = WeightReader(arena, self.model, device, index)
        self.recurrent = bool(getattr(model, "is_recurrent", False))
        if self.recurrent:
            self.policy = self.model
        elif isinstance(self.model, ActorCritic):
            self.policy = self.model.policy_params
        else:
            self.policy = self._params_of_forward
        if compile:
            # "reduce-overhead" replays CUDA graphs: the weights keep their addresses (view_flat).
            self.policy = torch.compile(self.policy, mode="reduce-overhead" if device.type == "cuda" else None,
                                        dynamic=False)
        self.numpy_mlp = NumpyMLPPolicy(self.model) if numpy_mlp else None

    def _params_of_forward(self, obs: torch.Tensor) -> torch.Tensor:
        """A user model's action parameters (its forward returns ``(params, value)``)."""
        return self.model(obs)[0]


class InferenceBatcher:
    """``epsilons`` ``[W, E]`` (dqn): each env's exploration rate; None samples the policy head, the
head of ``action_space`` for ``algo`` (fastrl.models.heads.action_head). ``random_until``: act uniformly
at random until the run's workers took this many env steps (sac). ``epsilon_decay``: the env steps of
this rank over which each epsilon falls linearly from 1 to its ``epsilons`` value (0: none).
``late_epsilons`` (like ``epsilons``) replace ``epsilons`` once this rank took ``late_after`` env
steps (0: never) and, with ``late_return = (n, r)`` and n > 0, once the mean return of the rank's
newest n episodes reached r (fastrl.sampling.recent_return); from then on for good.

    ``buckets``: batch sizes (ascending) each batch is padded up to, so that a compiled policy
    (``compile``; CUDA graphs on a GPU) meets a few shapes only. ``transfer`` moves batches between
    host and device (one copy each way on CUDA, see fastrl.ipc.device_io). ``timings``: the row its
    BatcherTiming columns go to, the arena's batcher row by default (a rollout worker acting for
    itself passes a private row: two processes adding to one shared row would lose updates).

    One WeightSetPolicy per weight set of the arena (``model`` is copied for the others): each env row is
    acted by the set ``arena.env_actor`` names, one forward pass per set a batch holds rows of."""

    def __init__(self, arena: Arena, model: torch.nn.Module, action_space, device: torch.device,
                 epsilons: np.ndarray | None = None, buckets: tuple[int, ...] = (), compile: bool = False,
                 transfer: BatchTransfer | None = None, numpy_mlp: bool = False, timings: np.ndarray | None = None,
                 algo: str = "appo", random_until: int = 0, epsilon_decay: int = 0,
                 late_epsilons: np.ndarray | None = None, late_after: int = 0,
                 late_return: tuple[int, float] = (0, 0.0)):
        self.arena = arena
        self.epsilon_decay = epsilon_decay
        self.late_after = late_after if late_epsilons is not None else 0
        self.late_epsilons = (None if late_epsilons is None
                              else torch.from_numpy(np.asarray(late_epsilons, np.float32).reshape(-1)))
        self.device = device
        self.head = action_head(action_space, algo)
        self.random_until = random_until
        self.epsilons = None if epsilons is None else torch.from_numpy(np.asarray(epsilons, np.float32).reshape(-1))
        self.buckets = tuple(buckets)
        self.recurrent = bool(getattr(model, "is_recurrent", False))
        self.masks = getattr(getattr(model, "obs_layout", None), "mask", None) is not None
        numpy_mlp = (numpy_mlp and device.type == "cpu" and epsilons is None and not compile and not self.masks
                     and NumpyMLPPolicy.supports(model, arena.obs.dtype))
        models = [model] + [copy.deepcopy(model) for _ in range(arena.weight_version.shape[0] - 1)]
        self.weight_sets = [WeightSetPolicy(arena, m, device, k, compile, numpy_mlp) for k, m in enumerate(models)]
        self.num_policies = arena.learner_stats.shape[0]  # weight sets that are policies; then snapshots
        self.late_gate = (RecentReturn(arena, late_return[0], late_return[1], self.num_policies)
                          if self.late_after and late_return[0] else None)
        # A restarted batcher, or a resumed run, keeps a stage begun before.
        self.late_begun = bool(self.late_after and arena.control[Control.EPSILON_LATE_AT])
        self.model = self.weight_sets[0].model
        self.weights = self.weight_sets[0].weights
        self.transfer = BatchTransfer(device) if transfer is None else transfer
        self.timings = BatcherTiming.row(arena) if timings is None else timings
        self.slot_actions = arena.actions.reshape(*arena.actions.shape[:2], -1)  # [N, T, action size] view
        self.obs_rows = arena.obs.reshape(-1, *arena.obs.shape[2:])  # [N * (T + 1), *obs] view
        # The arrays every batch touches, looked up once (an Arena attribute is a dictionary
        # lookup through __getattr__, and infer() runs ~2,000 times a second on CartPole).
        self.cursor_arrays = (arena.request_envs, arena.env_slot, arena.env_t, arena.obs.shape[1])
        self.slot_outputs = (self.slot_actions, arena.behaviour_logp, arena.version)
        self.step_arrays = (arena.control, arena.env_steps)
        W, E = arena.env_start.shape
        self.envs_per_worker = E
        self.env_actor = arena.env_actor.reshape(W * E)  # [W * E] views
        self.env_final = arena.env_final.reshape(W * E)
        # Row ids across workers are needed beyond the plain single-policy feed-forward batch.
        self.needs_env_rows = self.recurrent or self.masks or epsilons is not None or len(self.weight_sets) > 1
        if self.recurrent:
            S = arena.env_state.shape[2]
            self.env_state = arena.env_state.reshape(W * E, S)
            self.env_start = arena.env_start.reshape(W * E)

    @property
    def version(self) -> int:
        """The policy version acted with: the learner's update count of the loaded weights."""
        return self.weights.version

    def refresh_weights(self) -> bool:
        """Load the newest published weights of every weight set; True once the first policy's are loaded."""
        start = time.perf_counter()
        for weight_set in self.weight_sets:
            weight_set.weights.refresh()
        self.timings[BatcherTiming.WEIGHT_REFRESH] += time.perf_counter() - start
        return all(weight_set.weights.version >= 0 for weight_set in self.weight_sets[:self.num_policies])

    def wait_for_weights(self, control) -> None:
        """Block until the learner's first weights are loaded (it publishes them within a moment of
        starting); raise ProcessExit when the run stops meanwhile."""
        while not self.refresh_weights():
            wait([], 0.01)
            check_alive(control)

    def infer(self, workers: np.ndarray, requests: np.ndarray) -> None:
        """Act for the requests ``(workers[i], requests[i])``."""
        start = time.perf_counter()
        slots, steps, obs_index = request_cursors(*self.cursor_arrays, workers, requests)
        env_rows = None
        if self.needs_env_rows:
            env_rows = (workers[:, None].astype(np.int64) * self.envs_per_worker
                        + self.arena.request_envs[workers, requests]).reshape(-1)
        if len(self.weight_sets) == 1:
            self.act(self.weight_sets[0], slots, steps, obs_index, env_rows)
        else:
            acting = self.env_actor[env_rows]
            first = acting[0]
            if (acting == first).all():
                self.act(self.weight_sets[first], slots, steps, obs_index, env_rows)
            else:
                for k in np.unique(acting):
                    rows = np.flatnonzero(acting == k)
                    self.act(self.weight_sets[k], slots[rows], steps[rows], obs_index[rows], env_rows[rows])
        self.timings[BatcherTiming.FORWARD] += time.perf_counter() - start
        self.timings[BatcherTiming.BATCHES] += 1
        self.timings[BatcherTiming.REQUESTS] += len(requests)

    def act(self, weight_set: WeightSetPolicy, slots: np.ndarray, steps: np.ndarray, obs_index: np.ndarray,
            env_rows: np.ndarray | None) -> None:
        """Act with ``weight_set`` for the env rows at cursors ``(slots, steps)`` ``[n]`` (observations at
        ``obs_index``, env rows ``env_rows`` across workers): actions, behaviour log-probs and the
        weight set's version into those slot rows."""
        n = len(slots)
        if weight_set.weights.version < 0:
            weight_set.weights.load_newest()  # a snapshot drawn as it was published
        rows = padded_size(n, self.buckets)
        inputs = self.transfer.host_arrays(self.input_specs(rows))
        # Padding rows repeat row 0: a valid input, whose outputs are dropped. mode="clip" writes
        # `out` unbuffered.
        np.take(self.obs_rows, pad_rows(obs_index, rows), axis=0, out=inputs[0], mode="clip")
        if self.recurrent:
            self.gather_state(pad_rows(env_rows, rows), slots, steps, inputs[1])
        outputs = []  # what a recurrent or torch forward pass brings back beside the actions
        if self.random_until and steps_taken(*self.step_arrays) < self.random_until:
            actions, behaviour_logp = (x.numpy() for x in self.head.sample_uniform(n))
        elif weight_set.numpy_mlp is not None:
            actions, behaviour_logp = weight_set.numpy_mlp.act(inputs[0][:n])  # no torch autograd to turn off
        else:
            with torch.inference_mode():
                outputs, actions, behaviour_logp = self.act_in_torch(weight_set, inputs, env_rows, n)
        if self.recurrent:
            self.env_state[env_rows] = outputs[-1][:n]
        write_actions(slots, steps, actions.reshape(n, -1), behaviour_logp, weight_set.weights.version,
                      *self.slot_outputs)

    def act_in_torch(self, weight_set: WeightSetPolicy, inputs: list[np.ndarray], env_rows: np.ndarray | None,
                     n: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """The weight set's outputs for a batch's ``inputs`` (padded to their rows), then the actions and
        behaviour log-probabilities of its ``n`` real rows (epsilon-greedy for dqn)."""
        if self.masks:
            final = self.env_final[env_rows]
            weight_set.model.check_mask(torch.from_numpy(inputs[0][:n]), torch.from_numpy(final != 0))
        outputs = self.transfer.to_host(self.forward(weight_set, self.transfer.to_device(inputs)))
        if self.epsilons is None:
            return outputs, outputs[0][:n], outputs[1][:n]
        actions, behaviour_logp = epsilon_greedy(torch.from_numpy(outputs[0][:n]), self.current_epsilons(env_rows))
        return outputs, actions.numpy(), behaviour_logp.numpy()

    def current_epsilons(self, env_rows: np.ndarray) -> torch.Tensor:
        """The exploration rates of the envs ``env_rows`` now: their Ape-X rates, moved towards 1 by
        the share of the epsilon decay still ahead, or their late rates once those are due."""
        if not (self.epsilon_decay or self.late_after):
            return self.epsilons[env_rows]
        if self.late_begun:
            return self.late_epsilons[env_rows]
        steps = steps_taken(*self.step_arrays)
        if self.late_gate is not None and steps < self.late_after:
            self.late_gate.read()  # in step with the episodes, so that "newest" holds across workers
        elif self.late_after and steps >= self.late_after and (self.late_gate is None or self.late_gate.reached()):
            self.late_begun = True
            self.step_arrays[0][Control.EPSILON_LATE_AT] = max(1, steps)
            return self.late_epsilons[env_rows]
        epsilons = self.epsilons[env_rows]
        if self.epsilon_decay:
            ahead = max(0.0, 1.0 - steps / self.epsilon_decay)
            if ahead:
                epsilons = epsilons + (1.0 - epsilons) * ahead
        return epsilons

    def input_specs(self, rows: int) -> list[tuple[tuple, np.dtype]]:
        """Shapes and dtypes of a batch's inputs: observations, then the recurrent states."""
        specs = [((rows, *self.obs_rows.shape[1:]), self.obs_rows.dtype)]
        if self.recurrent:
            specs.append(((rows, self.env_state.shape[1]), self.env_state.dtype))
        return specs

    def gather_state(self, env_rows: np.ndarray, slots: np.ndarray, steps: np.ndarray, out: np.ndarray) -> None:
        """The recurrent states ``out`` ``[rows, S]`` of the envs ``env_rows`` (zeroed at an episode
        start), stored as the initial state of the slots at step 0."""
        np.take(self.env_state, env_rows, axis=0, out=out, mode="clip")
        out *= (self.env_start[env_rows] == 0)[:, None]
        first = np.flatnonzero(steps == 0)
        self.arena.slot_state[slots[first]] = out[first]

    def forward(self, weight_set: WeightSetPolicy, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Device inputs (obs ``[rows, *obs]``, state ``[rows, S]`` when recurrent) -> what goes back
        to the host: (actions ``[rows, ...]``, behaviour log-probs ``[rows]``), or Q-values
        ``[rows, A]`` for dqn, then the new states ``[rows, S]`` when recurrent."""
        if self.recurrent:
            params, _, new_state = weight_set.policy(inputs[0].unsqueeze(0), inputs[1], None)
            params, extra = params[0], [new_state]
        else:
            params = weight_set.policy(inputs[0])
            extra = []
        if self.epsilons is not None:
            return [params, *extra]
        return [*self.head.sample_with_log_prob(params), *extra]


def batch_buckets(request_size: int, max_requests: int) -> tuple[int, ...]:
    """Batch sizes a compiled policy serves: ``request_size`` times 1, 2, 4, ... and ``max_requests``
    (a batch holds 1 to ``max_requests`` requests of ``request_size`` envs)."""
    counts = {max_requests} | {1 << k for k in range(max_requests.bit_length()) if 1 << k < max_requests}
    return tuple(request_size * c for c in sorted(counts))


def padded_size(rows: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``rows``; ``rows`` itself without buckets."""
    return buckets[bisect.bisect_left(buckets, rows)] if buckets and rows <= buckets[-1] else rows


def pad_rows(index: np.ndarray, rows: int) -> np.ndarray:
    """``index`` ``[n]`` extended to ``[rows]`` by repeating its first entry."""
    if rows == len(index):
        return index
    return np.concatenate([index, np.full(rows - len(index), index[0], index.dtype)])


# The two index kernels below replace five 2-D numpy gathers/scatters per batch: for 3 requests
# of 256 envs, 11 us against 24 us alone, and more in a run, where the rows the workers just
# wrote miss the cache (docs/results.md#per-batch-costs).
@numba.njit(cache=True, nogil=True)
def request_cursors(request_envs, env_slot, env_t, slot_length, workers, requests):
    """Cursors of the envs of requests ``(workers[i], requests[i])``, in request order, and the
    rows of their observations in the arena's obs viewed as ``[N * slot_length, *obs]``.

    ``request_envs`` ``[W, S, b]``, ``env_slot``/``env_t`` ``[W, E]``, ``slot_length`` (T + 1),
    ``workers``/``requests`` ``[n]`` -> (slots, steps, obs rows), each int64 ``[n * b]``."""
    n, b = workers.shape[0], request_envs.shape[2]
    slots = np.empty(n * b, np.int64)
    steps = np.empty(n * b, np.int64)
    obs_rows = np.empty(n * b, np.int64)
    for i in range(n):
        w = workers[i]
        for j in range(b):
            env = request_envs[w, requests[i], j]
            k = i * b + j
            slots[k] = env_slot[w, env]
            steps[k] = env_t[w, env]
            obs_rows[k] = slots[k] * slot_length + steps[k]
    return slots, steps, obs_rows


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


def batcher_late_epsilons(cfg) -> tuple[np.ndarray | None, int]:
    """``[W, E]`` late exploration rates of this rank's envs and this rank's share of
    ``learner.epsilon_late_after_steps`` for dqn and r2d2 with a late stage, else (None, 0)."""
    if cfg.learner.algo not in Q_LEARNERS or not cfg.learner.epsilon_late_after_steps:
        return None, 0
    late = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, epsilon=cfg.learner.epsilon_late))
    return batcher_epsilons(late), max(1, cfg.learner.epsilon_late_after_steps // DistInfo.from_env().world_size)


def exploration(cfg) -> dict:
    """The InferenceBatcher keywords that set how the run's actors explore."""
    late_epsilons, late_after = batcher_late_epsilons(cfg)
    return {"epsilons": batcher_epsilons(cfg), "epsilon_decay": batcher_epsilon_decay(cfg),
            "late_epsilons": late_epsilons, "late_after": late_after, "random_until": random_action_steps(cfg),
            "late_return": (cfg.learner.epsilon_late_return_episodes, cfg.learner.epsilon_late_min_return)}


def batcher_epsilon_decay(cfg) -> int:
    """This rank's share of ``learner.epsilon_decay_steps`` for dqn and r2d2 (the batcher counts its
    own rank's env steps), else 0."""
    if cfg.learner.algo not in Q_LEARNERS or not cfg.learner.epsilon_decay_steps:
        return 0
    return max(1, cfg.learner.epsilon_decay_steps // DistInfo.from_env().world_size)


def random_action_steps(cfg) -> int:
    """Env steps the batcher acts uniformly at random for: sac's ``replay.min_fill`` for each
    member's replay (with PBT the members take the games of every worker in turn, so their replays
    fill side by side), else 0."""
    return cfg.replay.min_fill * max(1, cfg.pbt.population) if cfg.learner.algo == "sac" else 0


def make_batcher(cfg, arena: Arena, spaces, model, device: str, timings: np.ndarray | None = None) -> InferenceBatcher:
    """The run's batcher on ``device``: ``spaces`` (observation, action); ``model`` the user's network
    or None (built from the config: the weights come from the arena, so no network travels through
    a start-up pipe). One torch thread: the cores belong to the envs and the learner."""
    torch.set_num_threads(1)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    W, S, b = arena.request_envs.shape
    buckets = batch_buckets(b, W * S) if cfg.inference.compile else ()
    model = build_model(*spaces, cfg.model, model, cfg.learner.algo)
    return InferenceBatcher(arena, model, spaces[1], torch.device(device), buckets=buckets,
                            compile=cfg.inference.compile, numpy_mlp=cfg.inference.numpy_mlp, timings=timings,
                            algo=cfg.learner.algo, **exploration(cfg))


def inference_process(cfg, layout, arena_name: str, spaces, model, device: str,
                      channels: BatcherChannels) -> None:
    """Main loop of the inference process: wait for requests, batch them, answer each worker
    (``spaces``, ``model``: see ``make_batcher``)."""
    configure_child(cfg.retain_freed_memory, cfg.actor_niceness)
    torch.manual_seed(cfg.seed + 7919)
    arena = Arena.attach(layout, arena_name)
    requests_in, actions_out = channels.requests_in, channels.actions_out
    worker_of = {conn: w for w, conn in enumerate(requests_in)}
    request_pipes = ReadablePipes(requests_in)
    S = arena.request_envs.shape[1]
    batcher = make_batcher(cfg, arena, spaces, model, device)
    try:
        batcher.wait_for_weights(arena.control)
        while True:
            waited = time.perf_counter()
            ready = request_pipes.wait(arena.control)
            batcher.timings[BatcherTiming.WAIT_REQUESTS] += time.perf_counter() - waited
            messages = gather_ready_requests(ready, worker_of, request_pipes)
            if not messages:
                continue
            batcher.refresh_weights()
            workers, requests = [], []
            for w, sent in messages.items():
                for message in sent:
                    workers.append(w)
                    requests.append(message)
            batcher.infer(np.array(workers), request_ids(np.array(requests), S))
            # Each worker gets back the very bytes it sent: its requests, now answered.
            for w, sent in messages.items():
                actions_out[w].send_bytes(sent)
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


def gather_ready_requests(ready, worker_of, pipes: ReadablePipes) -> dict[int, bytes]:
    """Every request waiting now, as each worker's messages (one byte a request, fastrl.ipc.slots): the
    ``ready`` ends' messages, then those that came meanwhile (a worker has at most ``num_splits``
    requests out, so this ends)."""
    messages: dict[int, bytes] = {}
    while ready:
        for conn in ready:
            worker = worker_of[conn]
            messages[worker] = messages.get(worker, b"") + conn.recv_bytes()
        ready = pipes.ready()
    return messages
