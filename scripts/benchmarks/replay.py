"""Benchmark the replay buffer: memory per transition, add, sample and priority-update rates.

    flock /tmp/fastrl-bench.lock python scripts/bench.py replay [--capacity N] [--obs atari|vector]
        [--compress lz4] [--memmap DIR] [--envs 64] [--steps-per-chunk 4] [--batch 512] [--n-step 1]

Rows arrive as a vectorized env delivers them: chunks of envs x steps (64 x 4 = 256 rows),
interleaved across envs. Atari observations are uint8 [4, 84, 84] stacks of synthetic frames
made to compress like real ones: a constant playfield (score bar, walls, six rows of bricks)
with a ball, a paddle and three moving blocks per env, bricks knocked out and the score
redrawn over time; neither noise nor blank (real Pong frames take ~240 B with lz4, Breakout
~430 B, MsPacman ~1850 B; these take a few hundred). Vector observations are float32 [17].
Episodes end with probability 1/1000 per step. The figures, in the JSON line:

  bytes_per_transition     replay.nbytes / capacity (frames + per-slot arrays)
  rss_gib                  process RSS after filling the buffer (inputs freed); of which
                           file-backed (a memmap store's page cache); RSS before the buffer
  fill_add_per_s           rows/s while first filling the ring (pages being committed)
  add_per_s                rows/s once the ring is full (steady state)
  sample_batches_per_s     sample(batch) incl. stacked obs + next obs block, n-step targets and
                           IS weights, into a reused output array (as into pinned memory)
  sample_fresh_batches_per_s   the same, allocating the output every call
  update_priorities_per_s  update_priorities calls of `batch` entries per second

With ``--save DIR`` (replay.checkpoint's files, fastrl.replay.snapshot) also:

  save_s, load_s           writing the full replay under DIR, and loading it into a fresh one
  saved_mib                the files' size on disk
"""
import os

# Before numpy/numba load: one thread each, so no pool oversubscribes the cores.
os.environ["NUMBA_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import gc  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from fastrl.config import ReplayConfig  # noqa: E402
from fastrl.replay.buffer import TransitionReplay  # noqa: E402
from fastrl.replay.snapshot import load_replay, save_replay  # noqa: E402

GIB = 2 ** 30
STACK = 4
SIZE = 84
VECTOR_DIM = 17
EPISODE_END_PROBABILITY = 1e-3
INPUT_CHUNKS = 16  # distinct chunks cycled while adding (their frames are built before timing)


def playfield() -> np.ndarray:
    field = np.full((SIZE, SIZE), 0, np.uint8)
    field[:10] = 52  # score bar
    field[10:, :3] = field[10:, -3:] = 142  # walls
    for row in range(6):
        field[16 + 4 * row:19 + 4 * row, 3:-3] = 60 + 25 * row  # bricks, 1-pixel gaps
        field[16 + 4 * row:19 + 4 * row, 3:-3:8] = 0
    return field


class AtariLikeEnvs:
    """Per env: the playfield, its own bricks and score, and five moving blocks."""

    SIZES = np.array([[2, 2], [3, 14], [5, 5], [5, 5], [4, 7]])

    def __init__(self, num_envs: int, rng):
        self.rng = rng
        self.fields = np.repeat(playfield()[None], num_envs, axis=0)
        self.pos = rng.uniform(12, 70, (num_envs, 5, 2))
        self.vel = rng.uniform(-2.5, 2.5, (num_envs, 5, 2))
        self.pos[:, 1, 0], self.vel[:, 1, 0] = 78, 0  # the paddle moves sideways only
        self.score = np.zeros(num_envs, np.int64)

    def frame(self, env: int) -> np.ndarray:
        self.pos[env] += self.vel[env]
        out = (self.pos[env] < 11) | (self.pos[env] > 74)
        self.vel[env][out] *= -1
        self.pos[env] = np.clip(self.pos[env], 11, 74)
        if self.rng.random() < 0.05:  # a brick knocked out, the score redrawn
            row, col = self.rng.integers(0, 6), self.rng.integers(0, 9)
            self.fields[env, 16 + 4 * row:19 + 4 * row, 3 + 8 * col:11 + 8 * col] = 0
            self.score[env] += 1
            digits = np.array(list(f"{self.score[env] % 1000:03d}"), dtype=np.int64)
            self.fields[env, 2:8, 30:54] = 52
            for k, digit in enumerate(digits):
                self.fields[env, 2:8, 30 + 8 * k:30 + 8 * k + 1 + digit % 6] = 200
        frame = self.fields[env].copy()
        for (y, x), (h, w) in zip(self.pos[env].astype(int), self.SIZES):
            frame[y:y + h, x:x + w] = 236
        return frame


def make_chunks(obs_kind: str, num_envs: int, steps: int, rng):
    """INPUT_CHUNKS chunks of num_envs x steps rows, step-major, with frame stacks that restart
    (reset frame repeated) at episode starts."""
    rows = num_envs * steps
    if obs_kind == "atari":
        envs = AtariLikeEnvs(num_envs, rng)
        obs = np.empty((INPUT_CHUNKS, rows, STACK, SIZE, SIZE), np.uint8)  # one mmapped block
        stacks = np.repeat(np.stack([envs.frame(e) for e in range(num_envs)])[:, None], STACK, 1)
    else:
        obs = rng.standard_normal((INPUT_CHUNKS, rows, VECTOR_DIM), dtype=np.float32)
    ends = rng.random((INPUT_CHUNKS, rows)) < EPISODE_END_PROBABILITY
    for c in range(INPUT_CHUNKS):
        for step in range(steps):
            for env in range(num_envs):
                row = step * num_envs + env
                if obs_kind == "atari":
                    obs[c, row] = stacks[env]
                    frame = envs.frame(env)
                    stacks[env] = frame if ends[c, row] else np.roll(stacks[env], -1, axis=0)
                    stacks[env, -1] = frame
    env_ids = np.tile(np.arange(num_envs), steps)
    actions = rng.integers(0, 6, (INPUT_CHUNKS, rows))
    rewards = rng.random((INPUT_CHUNKS, rows), dtype=np.float32)
    return env_ids, obs, actions, rewards, ends


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1)


def time_adds(replay, chunks, rows: int) -> tuple[float, float]:
    """Add ``rows`` rows (whole chunks, cycling through ``chunks``); returns (rows, seconds)."""
    env_ids, obs, actions, rewards, ends = chunks
    no_truncation = np.zeros(len(env_ids), bool)
    calls = -(-rows // len(env_ids))
    start = time.perf_counter()
    for call in range(calls):
        c = (replay.added // len(env_ids) + call) % INPUT_CHUNKS
        replay.add(env_ids, obs[c], actions[c], rewards[c], ends[c], no_truncation)
    return calls * len(env_ids), time.perf_counter() - start


def add_arguments(parser) -> None:
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--obs", choices=["atari", "vector"], default="atari")
    parser.add_argument("--compress", default="", help="codec, e.g. lz4 (default: none)")
    parser.add_argument("--memmap", default="", metavar="DIR", help="scratch directory")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps-per-chunk", type=int, default=4)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--n-step", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="codec / copy threads")
    parser.add_argument("--seconds", type=float, default=3.0, help="per timed phase")
    parser.add_argument("--save", type=Path, metavar="DIR",
                        help="also time saving the replay under DIR and loading it back (removed after)")


def run(args) -> dict:
    rng = np.random.default_rng(0)
    process = psutil.Process()
    atari = args.obs == "atari"
    chunks = make_chunks(args.obs, args.envs, args.steps_per_chunk, rng)
    chunk_rows = args.envs * args.steps_per_chunk
    gc.collect()
    baseline_rss = process.memory_info().rss - chunks[1].nbytes
    settings = ReplayConfig(capacity=args.capacity, min_fill=args.batch, n_step=args.n_step,
                              frame_stack=STACK if atari else 1, compress=args.compress,
                              threads=args.threads, memmap_dir=args.memmap)
    replay = TransitionReplay(settings, gamma=0.99, num_streams=args.envs,
                              obs_shape=(STACK, SIZE, SIZE) if atari else (VECTOR_DIM,),
                              obs_dtype=np.uint8 if atari else np.float32, seed=0)
    time_adds(replay, chunks, chunk_rows)  # compile / load the numba kernels
    fill_rows, fill_seconds = time_adds(replay, chunks, replay.capacity - chunk_rows)
    steady_rows, steady_seconds = time_adds(replay, chunks, min(replay.capacity, 200_000))
    del chunks  # one mmapped block: its memory goes back to the OS before RSS is read
    gc.collect()
    memory = process.memory_info()

    def timed(call) -> float:
        call()
        calls, start = 0, time.perf_counter()
        while calls < 20 or time.perf_counter() - start < args.seconds:
            call()
            calls += 1
        return rate(calls, time.perf_counter() - start)

    out = np.empty((args.batch, replay.frame_stack + args.n_step, *replay.frame_shape),
                   replay.obs_dtype)
    sample_rate = timed(lambda: replay.sample(args.batch, out=out))
    fresh_rate = timed(lambda: replay.sample(args.batch))
    batch = replay.sample(args.batch)
    priorities = rng.uniform(0.01, 2.0, args.batch)
    update_rate = timed(lambda: replay.update_priorities(batch.indices, batch.generations,
                                                         priorities))
    report = {
        "obs": args.obs, "capacity": replay.capacity, "compress": args.compress or None,
        "memmap": bool(args.memmap), "envs": args.envs, "chunk_rows": chunk_rows,
        "batch": args.batch, "n_step": args.n_step,
        "bytes_per_transition": round(replay.nbytes / replay.capacity, 1),
        "rss_gib": round(memory.rss / GIB, 3),
        "rss_file_backed_gib": round(getattr(memory, "shared", 0) / GIB, 3),
        "rss_before_replay_gib": round(baseline_rss / GIB, 3),
        "fill_add_per_s": rate(fill_rows, fill_seconds),
        "add_per_s": rate(steady_rows, steady_seconds),
        "sample_batches_per_s": sample_rate,
        "sample_fresh_batches_per_s": fresh_rate,
        "update_priorities_per_s": update_rate,
        "cpu_load_1min": round(os.getloadavg()[0], 2),
    }
    if args.save is not None:
        report.update(time_snapshot(replay, settings, args.save))
    replay.close()
    return report


def time_snapshot(replay, settings, parent: Path) -> dict:
    """Seconds to save ``replay`` under ``parent`` and to load it into a fresh replay, and the
    files' size; the files are removed after."""
    directory = parent / "fastrl-replay-bench"
    shutil.rmtree(directory, ignore_errors=True)
    try:
        start = time.perf_counter()
        save_replay(replay, directory)
        os.sync()  # the bytes on disk, not in the page cache
        save_s = time.perf_counter() - start
        size = sum(f.stat().st_blocks * 512 for f in directory.iterdir())
        with TransitionReplay(settings, gamma=0.99, num_streams=replay.num_streams, obs_shape=replay.obs_shape,
                              obs_dtype=replay.obs_dtype, seed=0) as fresh:
            start = time.perf_counter()
            load_replay(fresh, directory)
            load_s = time.perf_counter() - start
            loaded = len(fresh) == len(replay)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"save_s": round(save_s, 2), "load_s": round(load_s, 2), "saved_mib": round(size / 2 ** 20, 2),
            "loaded_all": loaded}
