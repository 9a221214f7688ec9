"""Replay: stacks, n-step targets and sequences against a naive env stream; the sampleable-index
rule; wrap-around; generations; importance weights; compression and memmap round trips; arrival
priorities; a restarted stream."""
from collections import deque

import numpy as np
import pytest

from fastrl.config import ReplayConfig
from fastrl.kernels import nstep_targets
from fastrl.replay.buffer import ReplayRatio, SequenceReplay, TransitionReplay
from fastrl.replay.storage import LZ4FrameStore

FRAME = (8, 8)
GAMMA = 0.9


def encode(env: int, frame_id: int) -> np.ndarray:
    """A frame that names itself: env id and frame id in its first pixels."""
    frame = np.full(FRAME, frame_id % 251, dtype=np.uint8)
    frame[0, :4] = env, frame_id & 255, (frame_id >> 8) & 255, frame_id >> 16
    return frame


def decode(frame: np.ndarray) -> int:
    return int(frame[0, 1]) | int(frame[0, 2]) << 8 | int(frame[0, 3]) << 16


class NaiveEnvs:
    """Vectorized envs with NEXT_STEP autoreset and a FrameStack that pads a reset with its first
    frame (envpool, gymnasium). ``records[e]`` is what the replay must hold for stream e, one dict
    per record, including the history records the replay writes for a stream that starts
    mid-episode; ``by_frame`` maps a record's newest frame id to (env, record index)."""

    def __init__(self, num_envs, stack, rng, p_terminate=0.12, p_truncate=0.05, mid_episode=()):
        self.stack, self.rng = stack, rng
        self.p_terminate, self.p_truncate = p_terminate, p_truncate
        self.frame_id = 0
        self.records = [[] for _ in range(num_envs)]
        self.by_frame = {}
        self.frames = []
        self.pending_reset = [False] * num_envs
        for env in range(num_envs):
            if env in mid_episode:  # envs already running: S distinct frames, history records
                self.frames.append(deque((self.new_frame(env) for _ in range(stack)), maxlen=stack))
                for h in range(stack - 1):
                    older = [self.frames[env][0]] * (stack - 1 - h) + list(self.frames[env])[:h + 1]
                    self.record(env, self.obs(older), action=0, reward=0.0, terminated=False,
                                truncated=False, valid=False, behaviour_logp=0.0)
            else:
                self.frames.append(self.reset_frames(env))

    def new_frame(self, env):
        self.frame_id += 1
        return encode(env, self.frame_id)

    def reset_frames(self, env):
        return deque([self.new_frame(env)] * self.stack, maxlen=self.stack)

    def obs(self, frames):
        return np.stack(frames) if self.stack > 1 else frames[-1].copy()

    def record(self, env, obs, **fields):
        self.by_frame[decode(obs[-1] if self.stack > 1 else obs)] = (env, len(self.records[env]))
        self.records[env].append(dict(obs=obs, **fields))

    def step(self, env):
        """One agent step of ``env``: returns the replay row (obs acted on, action, ...)."""
        obs = self.obs(self.frames[env])
        action, behaviour_logp = int(self.rng.integers(0, 5)), float(self.rng.normal())
        if self.pending_reset[env]:  # action discarded, env resets
            self.frames[env] = self.reset_frames(env)
            reward, terminated, truncated, valid = 0.0, False, False, False
        else:
            self.frames[env].append(self.new_frame(env))
            reward = float(self.rng.normal())
            terminated = bool(self.rng.random() < self.p_terminate)
            truncated = bool(self.rng.random() < self.p_truncate)
            valid = True
        self.pending_reset[env] = terminated or truncated
        self.record(env, obs, action=action, reward=np.float32(reward), terminated=terminated,
                    truncated=truncated, valid=valid, behaviour_logp=np.float32(behaviour_logp))
        return env, obs, action, reward, terminated, truncated, behaviour_logp

    def chunk(self, max_steps=3):
        """Rows from a random subset of envs, a random number of steps each, interleaved."""
        num_envs = len(self.frames)
        envs = np.repeat(np.arange(num_envs), self.rng.integers(0, max_steps + 1, num_envs))
        rows = [self.step(int(env)) for env in self.rng.permutation(envs)]
        if not rows:
            return None
        env_ids, obs, actions, rewards, terminated, truncated, behaviour_logp = map(np.array, zip(*rows))
        return dict(env_ids=env_ids, obs=obs, actions=actions, rewards=rewards,
                    terminated=terminated, truncated=truncated, behaviour_logp=behaviour_logp)


def expected_sampleable(envs, ring_len, stack, horizon, stride=1, needs_valid=True):
    """The documented rule, from the naive records: slot -> sampleable."""
    expected = np.zeros(len(envs.records) * ring_len, dtype=bool)
    for env, records in enumerate(envs.records):
        written = len(records)
        for t in range(max(0, written - ring_len), written):
            ok = written - ring_len + stack - 1 <= t <= written - 1 - horizon and t % stride == 0
            ok = ok and (records[t]["valid"] or not needs_valid)
            expected[env * ring_len + t % ring_len] = ok
    return expected


def naive_transition(records, t, n):
    """The n-step target of record t by a plain loop, cut at the first done."""
    total, scale = 0.0, 1.0
    for k in range(n):
        record = records[t + k]
        total += scale * record["reward"]
        scale *= GAMMA
        if record["terminated"] or record["truncated"]:
            return total, 0.0 if record["terminated"] else scale, record["terminated"], k + 1
    return total, scale, False, n


def fill(replay, envs, chunks, check=None, extra_fields=()):
    """Add ``chunks`` random chunks of rows, calling ``check()`` after each."""
    for _ in range(chunks):
        rows = envs.chunk()
        if rows is None:
            continue
        replay.add(**{k: rows[k] for k in ("env_ids", "obs", "actions", "rewards", "terminated",
                                           "truncated", *extra_fields)})
        if check is not None:
            check()


@pytest.mark.parametrize("stack", [1, 4])
def test_transitions_match_a_naive_stream_of_interleaved_envs(stack):
    """Several interleaved envs with short episodes (terminations and truncations), two of them
    attached mid-episode, a ring that wraps many times: every sampled transition equals the
    naive one, and the slots with positive priority are exactly the sampleable ones."""
    n, ring_len, num_envs = 3, 24, 5
    rng = np.random.default_rng(stack)
    envs = NaiveEnvs(num_envs, stack, rng, mid_episode=(1, 3) if stack > 1 else ())
    obs_shape = (stack, *FRAME) if stack > 1 else FRAME
    replay = TransitionReplay(ReplayConfig(capacity=ring_len * num_envs, min_fill=1, n_step=n,
                                             frame_stack=stack), gamma=GAMMA, num_streams=num_envs,
                              obs_shape=obs_shape, seed=0)
    every_slot = np.arange(replay.capacity)
    checked = []

    def check():
        expected = expected_sampleable(envs, ring_len, stack, n)
        np.testing.assert_array_equal(replay.sampleable(every_slot), expected)
        np.testing.assert_array_equal(replay.priorities(every_slot) > 0, expected)
        batch = replay.sample(64, rng=rng)
        if not expected.any():
            assert batch is None
            return
        obs, next_obs = batch.obs, batch.next_obs
        for b in range(64):
            env, t = envs.by_frame[decode(obs[b, -1] if stack > 1 else obs[b])]
            records = envs.records[env]
            assert expected[batch.indices[b]] and batch.indices[b] == env * ring_len + t % ring_len
            total, discount, done, m = naive_transition(records, t, n)
            np.testing.assert_array_equal(obs[b], records[t]["obs"])
            np.testing.assert_array_equal(next_obs[b], records[t + m]["obs"])
            assert batch.actions[b] == records[t]["action"]
            assert batch.returns[b] == pytest.approx(total, rel=1e-5, abs=1e-5)
            assert batch.discounts[b] == pytest.approx(discount, rel=1e-6)
            assert (batch.dones[b], batch.bootstrap_steps[b]) == (done, m)
            if stack > 1:  # no frame of another episode anywhere in the block
                block = {decode(f) for f in batch.frames[b]}
                assert block <= {decode(f) for r in records[t:t + m + 1] for f in r["obs"]}
        checked.append(len(batch.indices))

    fill(replay, envs, 150, check)
    assert sum(checked) > 5000
    assert min(len(r) for r in envs.records) > 5 * ring_len  # wrapped several times
    assert len(replay) == replay.capacity


def test_wraparound_keeps_the_newest_records_of_each_stream():
    """Streams advance at different rates; each keeps its own newest L records (FIFO)."""
    replay = TransitionReplay(ReplayConfig(capacity=30, min_fill=1, n_step=1), gamma=0.99,
                              num_streams=3, obs_shape=(1,), obs_dtype=np.float32, seed=0)
    for step in range(25):  # stream 0 records every step, streams 1 and 2 the odd steps
        ids = np.array([0, 1, 2]) if step % 2 else np.array([0])
        replay.add(ids, np.full((len(ids), 1), step, np.float32), np.zeros(len(ids)),
                   np.zeros(len(ids)), np.zeros(len(ids), bool), np.zeros(len(ids), bool))
        assert len(replay) == min(step + 1, 10) + 2 * min((step + 1) // 2, 10)
    batch = replay.sample(2000, rng=0)
    obs, stream = batch.obs[:, 0], batch.indices // 10
    # 10 slots each: stream 0 holds steps 15..24, streams 1 and 2 the odd steps 5..23; the newest
    # record of a stream has no successor yet.
    assert set(obs[stream == 0]) == set(range(15, 24))
    assert set(obs[stream == 1]) == set(obs[stream == 2]) == set(range(5, 22, 2))
    step_to_next = np.where(stream == 0, 1, 2)
    np.testing.assert_array_equal(batch.next_obs[:, 0], obs + step_to_next)


def make_vector_replay(capacity=64, num_streams=2, steps=40, min_fill=1, **settings):
    settings = ReplayConfig(capacity=capacity, min_fill=min_fill, n_step=1, **settings)
    replay = TransitionReplay(settings, gamma=0.99, num_streams=num_streams, obs_shape=(3,),
                              obs_dtype=np.float32, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        ids = np.arange(num_streams)
        replay.add(ids, rng.random((num_streams, 3), dtype=np.float32), ids,
                   rng.random(num_streams), np.zeros(num_streams, bool), np.zeros(num_streams, bool))
    return replay


def test_updates_for_rewritten_or_invalidated_slots_are_dropped():
    alpha = 0.6
    replay = TransitionReplay(ReplayConfig(capacity=40, min_fill=1, n_step=1, alpha=alpha,
                                             frame_stack=2), gamma=0.99,
                              num_streams=2, obs_shape=(2, 3), obs_dtype=np.float32, seed=0)
    rng = np.random.default_rng(0)

    def add(ids):
        frames = rng.random((len(ids), 1, 3), dtype=np.float32)
        replay.add(ids, np.repeat(frames, 2, axis=1), ids, np.ones(len(ids)),
                   np.zeros(len(ids), bool), np.zeros(len(ids), bool))

    for _ in range(15):
        add([0, 1])
    batch = replay.sample(512, rng=1)
    assert set(batch.indices) == set(range(0, 14)) | set(range(20, 34))  # records 0..13
    for _ in range(8):  # stream 0: records 20..22 overwrite 0..2; record 3 loses its older frame
        add([0])
    applied = replay.update_priorities(batch.indices, batch.generations, np.full(512, 7.0))
    fresh = np.r_[4:14, 20:34]
    assert applied == np.isin(batch.indices, fresh).sum()
    priorities = replay.priorities(np.arange(40))
    np.testing.assert_allclose(priorities[fresh], 7.0 ** alpha)
    # Slots 0..2 now hold records 20..22 at the priority new records got (1.0; 22 has no
    # successor yet); record 3 kept its generation but is not sampleable: not revived.
    np.testing.assert_array_equal(priorities[:4], [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(priorities[14:20], 1.0)
    np.testing.assert_array_equal(priorities[34:], 0.0)


def every_sampleable_slot(replay):
    """(slots, generations) of every sampleable slot, through sample(): while all priorities are
    equal, a stratified draw of more points than slots hits each of them."""
    batch = replay.sample(4 * replay.capacity, rng=0)
    slots, first = np.unique(batch.indices, return_index=True)
    everything = np.arange(replay.capacity)
    np.testing.assert_array_equal(slots, np.flatnonzero(replay.sampleable(everything)))
    return slots, batch.generations[first]


def test_importance_weights_follow_the_formula():
    alpha, beta = 0.7, 0.5
    replay = make_vector_replay(alpha=alpha, beta=0.4)
    slots, generations = every_sampleable_slot(replay)
    raw = np.random.default_rng(2).uniform(0.1, 5.0, len(slots))
    assert replay.update_priorities(slots, generations, raw) == len(slots)
    batch = replay.sample(32, rng=3, beta=beta)
    probability = dict(zip(slots, raw ** alpha / np.sum(raw ** alpha)))
    weights = np.array([(len(slots) * probability[i]) ** -beta for i in batch.indices])
    np.testing.assert_allclose(batch.weights, weights / weights.max(), rtol=1e-6)
    assert batch.weights.max() == 1.0
    default = replay.sample(32, rng=3)  # config beta
    expected = (weights / weights.max()) ** (0.4 / beta)
    np.testing.assert_allclose(default.weights, expected, rtol=1e-5)


def test_zero_priority_and_invalid_slots_are_never_sampled():
    replay = make_vector_replay()
    slots, generations = every_sampleable_slot(replay)
    zeroed = slots[::2]
    replay.update_priorities(zeroed, generations[::2], np.zeros(len(zeroed)))
    drawn = np.concatenate([replay.sample(512, rng=seed).indices for seed in range(20)])
    assert not np.isin(drawn, zeroed).any()
    assert replay.sampleable(drawn).all()
    assert set(drawn) == set(slots[1::2])


def test_sample_waits_for_min_fill():
    replay = make_vector_replay(steps=0, min_fill=10)
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert replay.sample(4) is None
        replay.add([0, 1], rng.random((2, 3), dtype=np.float32), [0, 0], [0, 0], [False] * 2,
                   [False] * 2)
    assert len(replay) == 10 and replay.sample(4) is not None


@pytest.mark.parametrize("stack", [1, 4])
def test_sequences_are_time_major_windows_on_the_stride(stack):
    T, stride, ring_len, num_envs = 5, 3, 20, 4
    rng = np.random.default_rng(10 + stack)
    envs = NaiveEnvs(num_envs, stack, rng, mid_episode=(2,) if stack > 1 else ())
    obs_shape = (stack, *FRAME) if stack > 1 else FRAME
    replay = SequenceReplay(ReplayConfig(capacity=ring_len * num_envs, min_fill=1,
                                           frame_stack=stack),
                            sequence_length=T, sequence_stride=stride,
                            num_streams=num_envs, obs_shape=obs_shape, seed=0)
    every_slot = np.arange(replay.capacity)
    seen = set()

    def check():
        expected = expected_sampleable(envs, ring_len, stack, T, stride, needs_valid=False)
        np.testing.assert_array_equal(replay.priorities(every_slot) > 0, expected)
        batch = replay.sample(16, rng=rng)
        if batch is None:
            assert not expected.any()
            return
        assert batch.obs.shape == (T + 1, 16, *obs_shape) and batch.rewards.shape == (T, 16)
        for b in range(16):
            newest = batch.obs[0, b, -1] if stack > 1 else batch.obs[0, b]
            env, t = envs.by_frame[decode(newest)]
            assert t % stride == 0 and expected[batch.indices[b]]
            records = envs.records[env][t:t + T + 1]
            np.testing.assert_array_equal(batch.obs[:, b], np.stack([r["obs"] for r in records]))
            for name, field in [("action", batch.actions), ("reward", batch.rewards),
                                ("terminated", batch.terminated), ("truncated", batch.truncated),
                                ("valid", batch.valid), ("behaviour_logp", batch.behaviour_logp)]:
                np.testing.assert_array_equal(field[:, b], [r[name] for r in records[:T]])
            seen.add((env, t))

    fill(replay, envs, 80, check, extra_fields=("behaviour_logp",))
    assert len(seen) > 50


@pytest.mark.parametrize("p_truncate", [0.0, 0.1])
def test_nstep_returns_agree_with_the_nstep_kernel(p_truncate):
    """The replay's returns and discounts equal kernels.nstep_targets run over each whole stream
    with discounts gamma * (1 - terminated): without truncations as they are; with truncations
    given the stream's valid flags (the autoreset step after a done is invalid), which then also
    gives the window lengths."""
    n = 4
    envs = NaiveEnvs(3, 1, np.random.default_rng(5), p_truncate=p_truncate)
    replay = TransitionReplay(ReplayConfig(capacity=3000, min_fill=1, n_step=n), gamma=GAMMA,
                              num_streams=3, obs_shape=FRAME, seed=0)
    fill(replay, envs, 200)
    targets = []
    for records in envs.records:  # each stream as one [T, 1] column
        rewards = np.array([[r["reward"]] for r in records], np.float64)
        discounts = GAMMA * (1.0 - np.array([[r["terminated"]] for r in records], np.float64))
        valid = np.array([[r["valid"]] for r in records]) if p_truncate else None
        targets.append(nstep_targets(rewards, discounts, n, valid=valid))
    batch = replay.sample(256, rng=0)
    for b in range(256):
        env, t = envs.by_frame[decode(batch.obs[b])]
        returns, bootstrap_discounts, bootstrap_indices = targets[env]
        assert batch.returns[b] == pytest.approx(returns[t, 0], rel=1e-5, abs=1e-6)
        assert batch.discounts[b] == pytest.approx(bootstrap_discounts[t, 0], rel=1e-6)
        if p_truncate:
            assert batch.bootstrap_steps[b] == bootstrap_indices[t, 0] - t
    if p_truncate:
        assert batch.bootstrap_steps.min() < n  # some windows were cut by a done


def stream_of_frames(rng, count):
    """Atari-like frames: constant background, walls, a few moving blocks; every fifth frame
    random noise, the codec's worst case."""
    frames = np.full((count, 84, 84), 87, np.uint8)
    frames[:, :8] = 236
    for k in range(count):
        y, x = (3 * k) % 70 + 8, (5 * k) % 76
        frames[k, y:y + 4, x:x + 8] = 200
        if k % 5 == 0:
            frames[k] = rng.integers(0, 256, (84, 84), dtype=np.uint8)
    return frames


def test_lz4_store_round_trips_exactly():
    pytest.importorskip("lz4")
    rng = np.random.default_rng(0)
    frames = stream_of_frames(rng, 50)
    store = LZ4FrameStore(64, (84, 84), np.uint8, threads=2)
    try:
        slots = rng.permutation(64)[:50]
        store.write(slots, frames)
        out = np.empty((120, 84, 84), np.uint8)
        picks = rng.integers(0, 50, 120)
        store.read(slots[picks], out)
        np.testing.assert_array_equal(out, frames[picks])
        assert 0 < store.nbytes < frames.nbytes
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["lz4", "memmap"])
def test_compressed_and_memmap_replays_sample_what_the_ram_replay_samples(backend, tmp_path):
    def build(**options):
        replay = TransitionReplay(ReplayConfig(capacity=240, min_fill=1, n_step=2,
                                                 frame_stack=4, **options), gamma=0.99,
                                  num_streams=4, obs_shape=(4, 84, 84), seed=0)
        rng = np.random.default_rng(1)
        frames = stream_of_frames(rng, 400)
        for step in range(0, 100, 2):  # 4 envs x 2 steps per chunk, wraps the 60-slot rings
            ids = np.tile(np.arange(4), 2)
            times = np.repeat([step, step + 1], 4) + ids * 100
            obs = np.stack([frames[np.maximum(times - 3 + k, ids * 100)] for k in range(4)], axis=1)
            replay.add(ids, obs, ids, rng.random(8), rng.random(8) < 0.1, np.zeros(8, bool))
        return replay

    if backend == "lz4":
        pytest.importorskip("lz4")
    options = {"compress": "lz4"} if backend == "lz4" else {"memmap_dir": str(tmp_path)}
    with build() as plain, build(**options) as other:
        for seed in range(3):
            expected, got = plain.sample(128, rng=seed), other.sample(128, rng=seed)
            np.testing.assert_array_equal(got.indices, expected.indices)
            np.testing.assert_array_equal(got.frames, expected.frames)
            np.testing.assert_array_equal(got.returns, expected.returns)
        if backend == "lz4":
            assert other.nbytes < plain.nbytes / 3
    assert list(tmp_path.iterdir()) == []  # the scratch file is unlinked from the start


def test_replay_ratio_allows_batches_in_proportion():
    ratio = ReplayRatio(0.25)
    assert [ratio.allowed_batches(added, 0) for added in (0, 3, 4, 7, 8)] == [0, 0, 1, 1, 2]
    assert ratio.allowed_batches(8, 2) == 0 and ratio.allowed_batches(8, 5) == 0
    third = ReplayRatio(1 / 3, start=100)
    assert third.allowed_batches(100, 0) == 0 and third.allowed_batches(3100, 0) == 1000
    assert ReplayRatio(8.0).allowed_batches(2, 3) == 13
    with pytest.raises(ValueError, match="must be > 0"):
        ReplayRatio(0)


def test_bad_inputs_raise_clear_errors():
    replay = make_vector_replay(steps=0)
    ok = dict(env_ids=[0], obs=np.zeros((1, 3), np.float32), actions=[0], rewards=[0.0],
              terminated=[False], truncated=[False])
    with pytest.raises(ValueError, match="obs must be float32"):
        replay.add(**{**ok, "obs": np.zeros((1, 3))})
    with pytest.raises(ValueError, match=r"env ids must lie in \[0, 2\)"):
        replay.add(**{**ok, "env_ids": [2]})
    with pytest.raises(ValueError, match="rewards must have shape"):
        replay.add(**{**ok, "rewards": [0.0, 1.0]})
    with pytest.raises(ValueError, match="more rows than its 32 slots"):
        replay.add(np.zeros(33, int), np.zeros((33, 3), np.float32), np.zeros(33), np.zeros(33),
                   np.zeros(33, bool), np.zeros(33, bool))
    with pytest.raises(ValueError, match="needs at least frame_stack \\+ horizon"):
        TransitionReplay(ReplayConfig(capacity=8, min_fill=0, n_step=3, frame_stack=4),
                         gamma=0.99, num_streams=2, obs_shape=(4, 2, 2))
    with pytest.raises(ValueError, match="stack on axis 0"):
        TransitionReplay(ReplayConfig(capacity=80, min_fill=0, frame_stack=4), gamma=0.99,
                         num_streams=2, obs_shape=(2, 2, 4))
    with pytest.raises(ValueError, match="num_streams and frame_stack must be >= 1, got 0, 1"):
        TransitionReplay(ReplayConfig(capacity=80, min_fill=0), gamma=0.99, num_streams=0, obs_shape=(3,))
    with pytest.raises(ValueError, match="finite and >= 0"):
        replay.update_priorities([0], [0], [np.nan])
    with pytest.raises(ValueError, match="compress' must be one of"):
        TransitionReplay(ReplayConfig(compress="gzip"), gamma=0.99, num_streams=2, obs_shape=(3,))
    with pytest.raises(ValueError, match=r"'replay.capacity' must be in \[1, 1000000000\], got 0"):
        TransitionReplay(ReplayConfig(capacity=0), gamma=0.99, num_streams=2, obs_shape=(3,))
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got 1.5"):
        TransitionReplay(ReplayConfig(capacity=80, min_fill=0), gamma=1.5, num_streams=2,
                         obs_shape=(3,))
    with pytest.raises(ValueError, match="sequence_stride must be an integer >= 1, got 0"):
        SequenceReplay(ReplayConfig(capacity=80, min_fill=0), sequence_length=4,
                       sequence_stride=0, num_streams=2, obs_shape=(3,))


# Arrival priorities (the DQN learner's n-step TD errors) and a restarted stream.


def one_stream_replay(alpha=0.5, capacity=16):
    return TransitionReplay(ReplayConfig(capacity=capacity, min_fill=1, n_step=1, alpha=alpha), gamma=0.99,
                            num_streams=1, obs_shape=(3,), obs_dtype=np.float32, seed=0)


def add_row(replay, priority, value=0.0):
    replay.add([0], np.full((1, 3), value, np.float32), [0], [1.0], [False], [False],
               None if priority is None else [priority])


def test_arrival_priorities_enter_the_tree_once_sampleable():
    alpha = 0.5
    replay = one_stream_replay(alpha)
    add_row(replay, 4.0)
    assert replay.priorities([0])[0] == 0.0  # record 1 is not written yet: not sampleable
    add_row(replay, 0.25)
    np.testing.assert_allclose(replay.priorities([0, 1]), [4.0 ** alpha, 0.0])
    add_row(replay, None)  # PER: the largest priority seen so far (4)
    add_row(replay, 0.0)
    add_row(replay, 9.0)
    add_row(replay, None)
    np.testing.assert_allclose(replay.priorities(np.arange(6)),
                               [4.0 ** alpha, 0.25 ** alpha, 4.0 ** alpha, 0.0, 9.0 ** alpha, 0.0])
    drawn = np.concatenate([replay.sample(64, rng=seed).indices for seed in range(10)])
    assert set(drawn) == {0, 1, 2, 4}  # the zero arrival priority is never sampled


def test_without_arrival_priorities_new_records_get_the_initial_max():
    replay = one_stream_replay(alpha=0.5)
    for _ in range(4):
        add_row(replay, None)
    np.testing.assert_array_equal(replay.priorities(np.arange(4)), [1.0, 1.0, 1.0, 0.0])


@pytest.mark.parametrize("priorities, message", [
    ([np.nan], "finite and >= 0"), ([-1.0], "finite and >= 0"), ([np.inf], "finite and >= 0"),
    ([1.0, 2.0], r"priorities must have shape \[1\]"), ([[1.0]], r"priorities must have shape \[1\]"),
])
def test_bad_arrival_priorities_are_rejected_before_anything_is_written(priorities, message):
    replay = one_stream_replay()
    add_row(replay, 1.0)
    with pytest.raises(ValueError, match=message):
        replay.add([0], np.zeros((1, 3), np.float32), [0], [1.0], [False], [False], priorities)
    assert len(replay) == 1 and replay.added == 1


def test_restart_streams_cuts_the_windows_that_would_read_the_new_episode():
    n = 3
    replay = TransitionReplay(ReplayConfig(capacity=64, min_fill=1, n_step=n), gamma=0.5, num_streams=1,
                              obs_shape=(1,), obs_dtype=np.float32, seed=0)
    ones = np.ones(10)
    replay.add(np.zeros(10, int), np.arange(10, dtype=np.float32)[:, None], np.zeros(10, int), ones,
               np.zeros(10, bool), np.zeros(10, bool))
    replay.restart_streams([0])
    replay.add(np.zeros(6, int), np.arange(100, 106, dtype=np.float32)[:, None], np.zeros(6, int), ones[:6],
               np.zeros(6, bool), np.zeros(6, bool))
    sampleable = replay.sampleable(np.arange(16))
    # Records 0-6 keep windows inside the old episode; 7-9 would bootstrap from the new one.
    assert sampleable[:7].all() and not sampleable[7:10].any()
    assert sampleable[10:16 - n].all()  # the new episode starts a valid stream of its own
    drawn = replay.sample(2000)
    assert not np.isin(drawn.indices, [7, 8, 9]).any()
    six = drawn.indices == 6
    assert six.any() and np.all(drawn.next_obs[six] == 9.0)  # record 6 bootstraps from old record 9
