"""Recurrent cores end to end: the core's resets, the batcher's per-env state in the arena, the
learner's unroll (it must recompute exactly what the batcher acted with), burn-in, the config
rules, and a memory task that a feed-forward policy cannot solve."""
import copy
from collections import deque

import numpy as np
import pytest
import torch

from fastrl.config import ConfigError, build_config
from fastrl.envs import probe_env
from fastrl.envs.toy import MemoryEnv
from fastrl.ipc.arena import Arena
from fastrl.ipc.slots import worker_slot_ids
from fastrl.ipc.weights import WeightBuffer
from fastrl.learner.batch import Trajectories
from fastrl.learner.staging import gather_trajectories
from fastrl.learner.vtrace import VTraceLearner
from fastrl.models.networks import num_state_values, state_to_flat
from fastrl.models.recurrent import RecurrentCore
from fastrl.run.training import arena_layout
from fastrl.sampling.batcher import InferenceBatcher, request_cursors
from fastrl.sampling.rollout_worker import RolloutWorker, make_worker_env

ATOL = 1e-5
MEMORY_LENGTH = 5  # MemoryEnv: an episode is 5 steps, then the autoreset step: 6 rows per episode
TIME = 2  # MemoryEnv observation: (cue, decision step, t / length); t = 0 on an episode's first row


def memory_config(**overrides):
    """Two workers of four MemoryEnvs, T = 4: the 6-row episodes cross slot boundaries, so slots
    continue episodes from the previous slot and hold episode boundaries inside."""
    settings = {"env.id": "fastrl.envs.toy:make_memory", "env.kwargs": {"length": MEMORY_LENGTH},
                "env.num_workers": 2, "env.envs_per_worker": 4, "env.num_splits": 2, "model.hidden_sizes": [16],
                "model.core": "lstm", "model.core_size": 16, "learner.rollout": 4, "learner.batch_size": 16,
                "slots_per_env": 6, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


# RecurrentCore


@pytest.mark.parametrize("kind,parts", [("lstm", 2), ("gru", 1)])
@pytest.mark.parametrize("layers", [1, 2])
def test_state_size_is_every_layer_s_parts(kind, parts, layers):
    core = RecurrentCore(kind, in_features=5, size=8, layers=layers)
    assert core.state_size == parts * 8 * layers and core.out_features == 8
    assert torch.equal(core.initial_state(3), torch.zeros(3, core.state_size))
    out, state = core(torch.randn(4, 3, 5), torch.randn(3, core.state_size), torch.zeros(4, 3, dtype=torch.bool))
    assert out.shape == (4, 3, 8) and state.shape == (3, core.state_size)
    # The output is the last layer's h, the first part of that layer's chunk of the flat state.
    last = state.view(3, layers, parts, 8)[:, -1, 0]
    torch.testing.assert_close(out[-1], last)


def piecewise(core, x, state, cuts):
    """One env, ``x`` ``[T, 1, F]``: one plain unroll per episode piece, a cut at t starting a
    piece from zeros (the first piece starts from ``state`` unless a cut is at 0)."""
    T = x.shape[0]
    bounds = sorted(set(cuts) | {0})
    pieces = []
    for lo, hi in zip(bounds, bounds[1:] + [T]):
        state = core.initial_state(1) if lo in cuts else state
        out, state = core(x[lo:hi], state, torch.zeros(hi - lo, 1, dtype=torch.bool))
        pieces.append(out)
    return torch.cat(pieces), state


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
def test_episode_start_zeroes_the_state_like_separate_unrolls(kind, layers):
    torch.manual_seed(0)
    core = RecurrentCore(kind, in_features=5, size=8, layers=layers)
    T, B = 7, 3
    x, state = torch.randn(T, B, 5), torch.randn(B, core.state_size)
    cuts = {0: [3], 1: [], 2: [0, 5]}  # env 2's given state is dropped at t = 0
    starts = torch.zeros(T, B, dtype=torch.bool)
    for b, at in cuts.items():
        starts[at, b] = True
    with torch.no_grad():
        out, final = core(x, state, starts)
        for b, at in cuts.items():
            want_out, want_state = piecewise(core, x[:, b:b + 1], state[b:b + 1], at)
            torch.testing.assert_close(out[:, b:b + 1], want_out, rtol=0, atol=ATOL)
            torch.testing.assert_close(final[b:b + 1], want_state, rtol=0, atol=ATOL)
        # The reset matters: without it env 0's outputs differ from t = 3 on, and only from there.
        other, _ = core(x, state, torch.zeros(T, B, dtype=torch.bool))
    assert not torch.allclose(other[3:, 0], out[3:, 0], atol=1e-3)
    torch.testing.assert_close(other[:3, 0], out[:3, 0])


# Batcher and learner in one process


class LockstepRun:
    """Rollout workers and the inference batcher over one private arena, driven in lockstep as
    fastrl.run.training's serial mode does, with the learner's weights published. Records what the
    batcher computed for every slot row and, for every forward pass, the state each env acted with."""

    def __init__(self, cfg, seed: int = 0):
        torch.manual_seed(seed)
        self.cfg = cfg
        spec = probe_env(cfg)
        self.learner = VTraceLearner(cfg, spec.observation_space, spec.action_space)
        model = self.learner.model
        with torch.no_grad():  # a fresh policy head is near uniform: make log-probs depend on the state
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        self.arena = arena = Arena(arena_layout(cfg, spec, num_state_values(model), model.state_size), shared=False)
        arena.weight_version[0] = -1
        self.batcher = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, torch.device("cpu"))
        WeightBuffer(arena).publish(state_to_flat(model, torch.empty(num_state_values(model))).numpy(), 0)
        assert self.batcher.refresh_weights()
        N, T = arena.rewards.shape
        self.E = cfg.env.envs_per_worker
        self.acted_value = np.full((N, T), np.nan, np.float32)
        self.acted_params = np.full((N, T, 2), np.nan, np.float32)
        self.acted = []  # per forward pass: (env rows, env_start, obs [n, 3], state [n, S])
        self.batcher.model.register_forward_hook(self._record)
        self.spare = [deque(worker_slot_ids(w, cfg.slots_per_worker).tolist()) for w in range(cfg.env.num_workers)]
        self.filled = [[] for _ in range(cfg.env.num_workers)]  # full slots since the worker (re)started
        self.full = []  # every full slot (none is handed back: their contents stay)
        self.workers = [None] * cfg.env.num_workers
        for w in range(cfg.env.num_workers):
            self.start_worker(w)

    def start_worker(self, w: int) -> None:
        """A new RolloutWorker for worker ``w`` (as the supervisor restarts a crashed one)."""
        if self.workers[w] is not None:
            self.workers[w].env.close()
        self.filled[w] = []

        def take(n):
            return np.array([self.spare[w].popleft() for _ in range(n)], dtype=np.int32)

        self.workers[w] = RolloutWorker(w, self.cfg, self.arena, make_worker_env(self.cfg, w), take(self.E), take,
                                        lambda slots: self.emitted(w, slots))
        self.workers[w].start()

    def emitted(self, w: int, slots: np.ndarray) -> None:
        self.filled[w].extend(slots.tolist())
        self.full.extend(slots.tolist())

    def step(self) -> None:
        """Every worker's ready batches, one forward pass for all of them, the actions sent."""
        arena = self.arena
        workers, requests = [], []
        for w, worker in enumerate(self.workers):
            while worker.can_recv():
                requests.append(worker.recv_batch())
                workers.append(w)
        workers, requests = np.array(workers), np.array(requests)
        self.cursor = request_cursors(arena.request_envs, arena.env_slot, arena.env_t, arena.obs.shape[1], workers,
                                      requests)[:2]
        self.rows = (workers[:, None] * self.E + arena.request_envs[workers, requests]).reshape(-1)
        self.batcher.infer(workers, requests)
        for w, request in zip(workers, requests):
            self.workers[w].act(request)

    def _record(self, module, args, output):
        obs, state, _ = args
        params, value, _ = output
        slots, steps = self.cursor
        self.acted_value[slots, steps] = value[0].numpy()
        self.acted_params[slots, steps] = params[0].numpy()
        self.acted.append((self.rows.copy(), self.arena.env_start.reshape(-1)[self.rows].copy(),
                           obs[0].clone().numpy(), state.clone().numpy()))

    def stream(self, w: int, e: int) -> tuple[list[int], np.ndarray]:
        """Env ``(w, e)``'s slots since its worker started, the filling one last, and the
        observations it acted on, in order ``[steps, 3]``."""
        arena, T = self.arena, self.arena.rewards.shape[1]
        slots = [s for s in self.filled[w] if arena.slot_env[s] == w * self.E + e]
        current, t = arena.env_slot[w, e], arena.env_t[w, e]
        obs = np.concatenate([arena.obs[s, :T] for s in slots] + [arena.obs[current, :t + 1]])
        return slots + [int(current)], obs

    def close(self) -> None:
        for worker in self.workers:
            worker.env.close()


def single_env_unroll(model, obs: np.ndarray):
    """One env alone, step by step from a zero state, reset wherever an observation shows t = 0
    (MemoryEnv's first row of an episode): states before each step ``[steps, S]``, the state
    after the last step, values ``[steps]``."""
    starts = torch.from_numpy(obs[:, TIME] == 0)
    state, before, values = model.initial_state(1), [], []
    with torch.no_grad():
        for t in range(len(obs)):
            state = state * ~starts[t]
            before.append(state[0])
            _, value, state = model(torch.from_numpy(obs[t:t + 1, None]), state, None)
            values.append(value[0, 0])
    return torch.stack(before), state[0], torch.stack(values)


@pytest.fixture(scope="module")
def lockstep():
    """13 lockstep rounds (each env: 3 full slots, the 4th acted at t = 0), then worker 1 restarts
    and 7 more rounds run: worker 0's envs continue while worker 1's start over, in the same
    batches. Returns the run and worker 1's env_state just before the restart."""
    run = LockstepRun(memory_config())
    try:
        for _ in range(13):
            run.step()
        before_restart = run.arena.env_state[1].copy()
        run.start_worker(1)
        for _ in range(7):
            run.step()
        yield run, before_restart
    finally:
        run.close()


def test_learner_recomputes_the_batcher_s_log_probs_values_and_params(lockstep):
    run, _ = lockstep
    arena, T = run.arena, run.arena.rewards.shape[1]
    slots = np.array(run.full)  # worker 1's slots from before its restart too
    batch = gather_trajectories(arena, slots)
    assert (batch.version == 0).all()
    # The slots hold both cases the unroll must get right: an episode that continues from the
    # previous slot (a nonzero initial state), and an episode boundary inside the slot.
    continues = batch.initial_state.abs().sum(-1) > 0
    boundary_inside = (~batch.valid[:-1]).any(0)
    assert continues.any() and (~continues).any() and (continues & boundary_inside).any()
    with torch.no_grad():
        params, values, logp, _ = run.learner.evaluate(batch)
    assert logp.std() > 0.05  # the policy's log-probs vary: the comparison is not trivial
    torch.testing.assert_close(logp, batch.behaviour_logp, rtol=0, atol=ATOL)
    torch.testing.assert_close(values[:T], torch.from_numpy(run.acted_value[slots].T), rtol=0, atol=ATOL)
    torch.testing.assert_close(params, torch.from_numpy(run.acted_params[slots].transpose(1, 0, 2)),
                               rtol=0, atol=ATOL)
    # The bootstrap row obs[T] is the next slot's first row: same value there too.
    for w in range(2):
        for e in range(run.E):
            chain, _ = run.stream(w, e)
            for slot, following in zip(chain, chain[1:]):
                column = int(np.flatnonzero(slots == slot)[0])
                torch.testing.assert_close(values[T, column].item(), float(run.acted_value[following, 0]),
                                           rtol=0, atol=ATOL)


def test_states_are_zero_exactly_at_episode_starts(lockstep):
    run, _ = lockstep
    for rows, env_start, obs, state in run.acted:
        starts = obs[:, TIME] == 0
        np.testing.assert_array_equal(env_start.astype(bool), starts)  # the worker flags every start
        assert (state[starts] == 0).all()
        assert (np.abs(state[~starts]).sum(-1) > 0).all()  # and only starts: memory is kept within episodes


def test_a_restarted_worker_s_envs_start_from_zero_state(lockstep):
    run, before_restart = lockstep
    E = run.E
    assert (np.abs(before_restart).sum(-1) > 0).all()  # worker 1's envs were mid-trajectory
    restarted = [(rows, env_start, state) for rows, env_start, _, state in run.acted[13:]]
    first_seen = {}
    for rows, env_start, state in restarted:
        for k, row in enumerate(rows):
            if row >= E and row not in first_seen:
                first_seen[row] = (env_start[k], state[k])
    assert sorted(first_seen) == list(range(E, 2 * E))
    for env_start, state in first_seen.values():
        assert env_start == 1 and (state == 0).all()
    # The restarted worker's first slots record that zero state as their initial state.
    first_slots = [run.stream(1, e)[0][0] for e in range(E)]
    assert (run.arena.slot_state[first_slots] == 0).all() and run.arena.slot_fresh[first_slots].all()


def test_no_state_leaks_between_envs_of_one_batch(lockstep):
    """Every env's states (each slot's initial state and the current env_state) equal those of
    the env unrolled alone, though its forward passes shared batches with envs at other points
    of other episodes (worker 1 restarted, so its envs are out of phase with worker 0's)."""
    run, _ = lockstep
    arena, T = run.arena, run.arena.rewards.shape[1]
    phases = set()
    for w in range(2):
        for e in range(run.E):
            slots, obs = run.stream(w, e)
            before, final, values = single_env_unroll(run.learner.model, obs)
            for k, slot in enumerate(slots):
                torch.testing.assert_close(torch.from_numpy(arena.slot_state[slot]), before[k * T], rtol=0, atol=ATOL)
                steps = min(T, len(obs) - k * T)
                torch.testing.assert_close(torch.from_numpy(run.acted_value[slot, :steps]),
                                           values[k * T:k * T + steps], rtol=0, atol=ATOL)
            torch.testing.assert_close(torch.from_numpy(arena.env_state[w, e]), final, rtol=0, atol=ATOL)
            phases.add(len(obs) % (MEMORY_LENGTH + 1))
    assert len(phases) > 1


# Burn-in


def synthetic_batch(T: int, B: int, state_size: int, seed: int = 0) -> Trajectories:
    g = torch.Generator().manual_seed(seed)
    valid = torch.ones(T, B, dtype=torch.bool)
    valid[1, 0] = valid[5, 1] = False  # an autoreset step inside the burn-in and one after it
    terminated = torch.zeros(T, B, dtype=torch.bool)
    terminated[0, 0] = terminated[4, 1] = True
    return Trajectories(
        obs=torch.rand(T + 1, B, 3, generator=g) * 2 - 1, actions=torch.randint(2, (T, B), generator=g),
        behaviour_logp=torch.log(torch.rand(T, B, generator=g) * 0.8 + 0.1), rewards=torch.randn(T, B, generator=g),
        terminated=terminated, truncated=torch.zeros(T, B, dtype=torch.bool), valid=valid,
        version=torch.zeros(T, B, dtype=torch.int64), initial_state=torch.randn(B, state_size, generator=g) * 0.5)


def burn_in_learner(burn_in: int, algo: str = "appo") -> VTraceLearner:
    cfg = memory_config(**{"learner.burn_in": burn_in, "learner.rollout": 8, "learner.batch_size": 32,
                           "learner.algo": algo})
    spec = probe_env(cfg)
    torch.manual_seed(1)
    return VTraceLearner(cfg, spec.observation_space, spec.action_space)


BURN_IN = 3


def test_burn_in_unroll_equals_the_full_unroll_and_carries_no_gradient():
    learner = burn_in_learner(BURN_IN)
    full = burn_in_learner(0)
    full.model.load_state_dict(learner.model.state_dict())
    batch = synthetic_batch(8, 4, learner.model.state_size)
    params, values, logp, entropy = learner.evaluate(batch)
    with torch.no_grad():
        want = full.evaluate(batch)
    for got, expected in zip((params, values, logp, entropy), want):
        torch.testing.assert_close(got.detach(), expected, rtol=0, atol=ATOL)
    weights = list(learner.model.parameters())
    burn = torch.autograd.grad(values[:BURN_IN].sum() + logp[:BURN_IN].sum(), weights, allow_unused=True,
                               retain_graph=True)
    assert all(g is None or not g.any() for g in burn)
    after = torch.autograd.grad(values[BURN_IN:].sum() + logp[BURN_IN:].sum(), weights, allow_unused=True)
    assert any(g is not None and g.any() for g in after)


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_burn_in_steps_only_warm_the_state(algo):
    """Changing the burn-in steps' rewards, behaviour log-probs, actions or terminations leaves
    the update bit-identical; their observations (which warm the state) and later rewards do not."""
    learner = burn_in_learner(BURN_IN, algo)
    batch = synthetic_batch(8, 4, learner.model.state_size)

    def trained(changed: Trajectories) -> list[torch.Tensor]:
        other = copy.deepcopy(learner)
        other.train(changed)
        return [p.detach() for p in other.model.parameters()]

    reference = trained(batch)
    recorder, masks = copy.deepcopy(learner), []
    update = recorder.update

    def recording_update(part, rewards, discounts, mask, *rest):
        masks.append(mask.clone())
        return update(part, rewards, discounts, mask, *rest)

    recorder.update = recording_update
    recorder.train(batch)
    assert len(masks) == 1 and not masks[0][:BURN_IN].any()
    assert torch.equal(masks[0][BURN_IN:], batch.valid[BURN_IN:])
    burn = copy.deepcopy(batch)
    burn.rewards[:BURN_IN] = torch.randn(BURN_IN, 4) * 10
    burn.behaviour_logp[:BURN_IN] = -5.0
    burn.actions[:BURN_IN] = 1 - burn.actions[:BURN_IN]
    burn.terminated[:BURN_IN] = ~burn.terminated[:BURN_IN]
    assert all(torch.equal(a, b) for a, b in zip(trained(burn), reference))
    later = copy.deepcopy(batch)
    later.rewards[BURN_IN] += 1.0
    assert not all(torch.equal(a, b) for a, b in zip(trained(later), reference))
    warmed = copy.deepcopy(batch)
    warmed.obs[0] = -warmed.obs[0]
    assert not all(torch.equal(a, b) for a, b in zip(trained(warmed), reference))


# Configuration


@pytest.mark.parametrize("profile,overrides,named", [
    ("cartpole-dqn", {"model.core": "lstm"}, "r2d2"),
    ("cartpole-appo", {"model.core": "gru", "learner.burn_in": 32}, "learner.burn_in"),
    ("cartpole-appo", {"model.core": "lstm", "model.core_size": 0}, "model.core_size"),
    ("cartpole-appo", {"model.core": "lstm", "model.core_layers": 0}, "model.core_layers"),
    ("cartpole-appo", {"learner.burn_in": 4}, "model.core=lstm"),
    ("cartpole-appo", {"model.core": "transformer"}, "lstm, gru"),
])
def test_config_refuses_what_a_core_cannot_do(profile, overrides, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")) as error:
        build_config(profile, overrides)
    assert "\n" not in str(error.value)


# Learning


@pytest.mark.parametrize("policy, expected", [("cue and side", 1.0), ("cue alone", 0.0), ("side alone", 0.0)])
def test_memory_env_with_sides_pays_only_for_combining_the_cue_with_the_side(policy, expected):
    """MemoryEnv(sides=True), MiniGrid Memory's split: the decision step shows the side where the
    cue's match lies, and neither the cue alone nor the side alone beats a guess."""
    env = MemoryEnv(length=4, sides=True)
    returns = []
    for seed in range(400):
        obs, _ = env.reset(seed=seed)
        cue = obs[0]
        for _ in range(3):
            obs, reward, terminated, _, _ = env.step(0)
            assert reward == 0.0 and not terminated
        side = obs[0]
        assert obs[1] == 1.0 and side in (-1.0, 1.0)
        named = {"cue and side": cue * side, "cue alone": cue, "side alone": side}[policy]
        _, reward, terminated, _, _ = env.step(int(named > 0))
        assert terminated
        returns.append(reward)
    assert np.mean(returns) == pytest.approx(expected, abs=0.15)


@pytest.mark.parametrize("kind, use_kernel", [("lstm", True), ("lstm", False), ("gru", False)])
@pytest.mark.parametrize("layers", [1, 2])
def test_the_layer_by_layer_unroll_matches_torch_cells_step_by_step_with_gradients(kind, use_kernel, layers):
    """RecurrentCore computes each layer over all steps at once (an LSTM on the CPU in the numba
    kernel, or in torch ops); the reference steps torch's own LSTMCell / GRUCell one step at a
    time, zeroing the state at episode starts."""
    torch.manual_seed(0)
    core = RecurrentCore(kind, 10, 8, layers)
    core.use_kernel = use_kernel
    for p in core.parameters():
        torch.nn.init.normal_(p)
    T, B = 6, 5
    x = torch.randn(T, B, 10, requires_grad=True)
    state0 = torch.randn(B, core.state_size, requires_grad=True)
    starts = torch.rand(T, B) < 0.3
    out, last = core(x, state0, starts)
    keep = (~starts).float().unsqueeze(-1)
    state, outs = state0, []
    for t in range(T):
        chunks = (state * keep[t]).view(B, layers, core.parts, 8)
        new, inp = [], x[t]
        for i, cell in enumerate(core.cells):
            if kind == "lstm":
                h, c = cell(inp, (chunks[:, i, 0], chunks[:, i, 1]))
                new += [h, c]
            else:
                h = cell(inp, chunks[:, i, 0])
                new.append(h)
            inp = h
        state = torch.stack(new, 1).reshape(B, -1)
        outs.append(inp)
    reference = torch.stack(outs)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, state, rtol=1e-5, atol=1e-5)
    wrt = [x, state0, *core.parameters()]
    ours = torch.autograd.grad((out ** 2).sum() + (last ** 2).sum(), wrt)
    theirs = torch.autograd.grad((reference ** 2).sum() + (state ** 2).sum(), wrt)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_new_core_keeps_a_cue_for_its_memory_steps(kind):
    """Chrono initialization: an input seen 24 steps ago still moves a new core's output. With
    zero gate biases (memory_steps=1) every gate starts at 0.5 and the trace halves each step."""
    torch.manual_seed(0)

    def trace(memory_steps: int) -> float:
        torch.manual_seed(1)
        core = RecurrentCore(kind, in_features=4, size=32, memory_steps=memory_steps)
        core.use_kernel = False
        x = torch.zeros(25, 1, 4)
        starts = torch.zeros(25, 1, dtype=torch.bool)
        cue = x.clone()
        cue[0] = 1.0
        with torch.no_grad():
            quiet, _ = core(x, core.initial_state(1), starts)
            cued, _ = core(cue, core.initial_state(1), starts)
        first = (cued[0] - quiet[0]).abs().max()
        return ((cued[24] - quiet[24]).abs().max() / first).item()

    assert trace(64) > 0.02
    assert trace(1) < 1e-4
    biases = RecurrentCore(kind, 4, 32, memory_steps=64).cells[0].bias_ih[32:64]
    assert 0.0 <= biases.min() and biases.max() <= np.log(63) + 1e-6


def test_a_resume_may_change_how_new_cores_start():
    from fastrl.config import weights_mismatch

    saved = build_config("cartpole-appo", {"model.core": "lstm"}).to_dict()
    asked = build_config("cartpole-appo", {"model.core": "lstm", "model.core_memory_steps": 8})
    assert weights_mismatch(saved, asked) == ""
    assert "model.core_size" in weights_mismatch(saved, build_config("cartpole-appo", {"model.core": "lstm",
                                                                                     "model.core_size": 8}))
