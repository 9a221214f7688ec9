"""Every envpool task family trained by fastrl for a few seconds, with no per-env code.

    python scripts/bench.py check-envs                             # one id per family, 8 s each
    python scripts/bench.py check-envs --ids FetchReach-v4 Taxi-v3 --seconds 15 --json /tmp/envs.json

Each id runs in a subprocess of its own (a crashing env cannot take the others down; --timeout
bounds a hung one) that measures, in steady state and on the same process layout:

  raw env    the rollout workers' env groups stepped with random actions (fastrl.profiler.measure_env)
  training   fastrl's train() on the cartpole-appo profile with ``model.kind=auto`` (the
             atari-appo profile in scripts/benchmarks/setups/pong-cpu.toml for Atari ids)

The layout comes from the env, not from a table: 16 envs on one thread are stepped for a second
and each worker gets the power of two of envs that steps in about BATCH_SECONDS, within the arena
budget. Random actions are legal ones where the observation has an action_mask. A multi-player
task's envs are its players' rows (docs/multiagent.md): its batches hold whole games, and a
turn-based game's env.num_splits is a multiple of its players. The table gives training env
steps/s next to the raw figure and their ratio; an id that could not be trained says why in one
line. The JSON line holds every row, the seconds and the hardware.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fastrl.config import build_config
from fastrl.envs import make_vec_env
from fastrl.envs.backends.envpool_backend import episode_layout, task_players
from fastrl.envs.spaces import MASK_KEY, ActionLayout, ObsLayout
from fastrl.profiler import (
    STARTUP_ESTIMATE_S,
    default_warmup,
    hardware,
    legal_random_actions,
    measure_env,
    measure_run_patiently,
    random_action_table,
)

from .options import load_setup

# One representative id per envpool family (envpool.registration.registry.specs[id][0]), each
# checked to construct here; procgen needs the Qt 5 runtime and is kept to report that. pgx's
# board games (2 or 3 players, turn-based) and highway's IntersectionMultiAgent (2 players at once)
# are multi-player: every player a row.
DEFAULT_IDS = {
    "atari": "Pong-v5",
    "box2d": "LunarLander-v3",
    "classic_control": "CartPole-v1",
    "gfootball": "gfootball/academy_empty_goal_close-v1",
    "highway": "highway-v0",
    "highway, 2 players": "IntersectionMultiAgent-v1",
    "jumanji": "Snake-v1",
    "minigrid": "MiniGrid-Empty-5x5-v0",
    "mujoco.dmc": "CartpoleBalance-v1",
    "mujoco.gym": "HalfCheetah-v5",
    "mujoco.metaworld": "MetaWorld/Reach-v3",
    "mujoco.myosuite": "myoFingerReachFixed-v0",
    "mujoco.playground": "Go1JoystickFlatTerrain-v1",
    "mujoco.robotics": "FetchReach-v4",
    "pgx": "Play2048-v1",
    "pgx, 2 players": "ConnectFour-v1",
    "pgx, 3 players": "SparrowMahjong-v1",
    "procgen": "BigfishEasy-v0",
    "toy_text": "Taxi-v3",
    "vizdoom": "Basic-v1",
}
NUM_WORKERS = 2
BATCH_SECONDS = 0.01  # one worker's envs, stepped on one thread, take about this long
MIN_ENVS, MAX_ENVS = 4, 1024  # per worker; 1024 is cartpole-appo's
ARENA_BYTES = 256 * 2**20  # observations of every slot of every env
ROLLOUT = 32
MAX_TRAJECTORIES = 128  # per learner batch: cartpole-appo's 4096 env steps
CALIBRATION_ENVS, CALIBRATION_S = 16, 1.0
RESULT_PREFIX = "check_envs result: "
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")
BENCH = Path(__file__).resolve().parents[1] / "bench.py"


def family(env_id: str) -> str:
    from envpool.registration import registry

    spec = registry.specs.get(env_id)
    return spec[0].removeprefix("envpool.") if spec else "-"


def describe_space(space) -> str:
    """Short form for the table: "Box uint8 (4, 84, 84)", "Dict{image, direction}", "Discrete(6)"."""
    name = type(space).__name__
    if name == "Dict":
        return "Dict{" + ", ".join(space.spaces) + "}"
    if name == "Box":
        return f"Box {np.dtype(space.dtype).name} {tuple(space.shape)}"
    return str(space)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def calibrate(env_id: str, seed: int) -> tuple[float, object, object]:
    """(env steps/s of CALIBRATION_ENVS envs (players' rows of whole games, in one batch) on one
    thread with random legal actions, observation space, action space)."""
    num_envs, batch_size = episode_layout(env_id, {}, CALIBRATION_ENVS)
    env = make_vec_env(env_id, num_envs, batch_size, seed, num_threads=1)
    try:
        rng = np.random.default_rng(seed)
        actions = ActionLayout(env.action_space)
        masked = ObsLayout(env.observation_space).mask is not None
        table = (rng.random((8, batch_size, actions.num_logits)) if masked else
                 random_action_table(env.action_space, batch_size, 8, rng))
        env.async_reset()
        obs, *_, env_ids = env.recv()
        start, batches, steps = time.perf_counter(), 0, 0
        while batches < 3 or time.perf_counter() - start < CALIBRATION_S:
            draws = table[batches % len(table)]
            env.send(legal_random_actions(actions, obs[MASK_KEY], draws) if masked else draws, env_ids)
            obs, *_, env_ids = env.recv()
            batches, steps = batches + 1, steps + len(env_ids)
        return steps / (time.perf_counter() - start), env.observation_space, env.action_space
    finally:
        env.close()


def rollout_overrides(steps_per_s: float, obs_space, env_id: str) -> dict:
    """Config overrides for the rollout layout and learner batch of an env this fast."""
    layout_obs = ObsLayout(obs_space)
    step_bytes = int(np.prod(layout_obs.storage_shape)) * layout_obs.storage_dtype.itemsize
    by_memory = ARENA_BYTES // (NUM_WORKERS * 2 * (ROLLOUT + 1) * step_bytes)  # 2 slots per env
    wanted = max(MIN_ENVS, min(MAX_ENVS, steps_per_s * BATCH_SECONDS, by_memory))
    envs = 2 ** int(np.log2(wanted))
    splits = 4 if envs >= 256 else 2
    players, turn_based = task_players(env_id, {})
    if turn_based:
        splits *= players  # a batch is a row of each game of a group: num_splits / players groups in flight
    whole_games = splits if turn_based else splits * players  # envs that fill every batch with whole games
    envs = max(whole_games, envs // whole_games * whole_games)
    trajectories = min(MAX_TRAJECTORIES, NUM_WORKERS * envs // 2)
    return {"env.num_workers": NUM_WORKERS, "env.envs_per_worker": envs, "env.num_splits": splits,
            "env.num_threads": 1, "learner.rollout": ROLLOUT, "learner.batch_size": ROLLOUT * trajectories}


def check_one(env_id: str, seconds: float, startup_s: float) -> dict:
    """Everything measured for one id (runs in the child process)."""
    row = {"family": family(env_id), "id": env_id, "trained": False, "env_fps": None, "train_fps": None,
           "ratio": None, "error": None}
    try:
        steps_per_s, obs_space, action_space = calibrate(env_id, seed=0)
    except Exception as exc:
        row["error"] = f"env: {one_line(exc)}"
        return row
    row.update(observation=describe_space(obs_space), action=describe_space(action_space),
               calibration_fps=steps_per_s)
    overrides = {"device": "cpu", "env.id": env_id, "model.kind": "auto"}
    if row["family"] == "atari":
        pong = load_setup("pong-cpu")
        cfg = build_config(pong.profile, {**pong.overrides, **overrides})
    else:
        cfg = build_config("cartpole-appo", {**rollout_overrides(steps_per_s, obs_space, env_id), **overrides})
    row["layout"] = f"{cfg.env.num_workers} x {cfg.env.envs_per_worker} / {cfg.env.num_splits}"
    row["batch_size"] = cfg.learner.batch_size
    warmup = default_warmup(seconds)
    errors = []
    try:
        row["env_fps"] = measure_env(cfg, seconds, warmup).env_steps_per_s
    except Exception as exc:
        errors.append(f"raw env: {one_line(exc)}")
    try:
        run = measure_run_patiently(cfg, seconds, warmup, False, startup_s, log=lambda m: None)
        row.update(trained=True, train_fps=run.env_steps_per_s, policy_lag_mean=run.breakdown["policy_lag_mean"],
                   bottleneck=run.diagnosis.bottleneck)
    except Exception as exc:
        errors.append(f"training: {one_line(exc)}")
    if row["env_fps"] and row["train_fps"] is not None:
        row["ratio"] = row["train_fps"] / row["env_fps"]
    row["error"] = "; ".join(errors) or None
    return row


def run_child(env_id: str, seconds: float, startup_s: float, timeout_s: float) -> dict:
    """``check_one`` in a subprocess in its own session, killed with its children after ``timeout_s``.
    It works in a temporary directory: some envs write files where they run (ViZDoom's _vizdoom.ini)."""
    cmd = [sys.executable, str(BENCH), "check-envs", "--child", env_id, "--seconds", str(seconds),
           "--startup-seconds", str(startup_s)]
    with tempfile.TemporaryDirectory(prefix="fastrl-check-envs-") as cwd:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            failure = f"no result within {timeout_s:g} s (killed)"
        else:
            failure = None
    row = next((json.loads(line.removeprefix(RESULT_PREFIX)) for line in reversed(out.splitlines())
                if line.startswith(RESULT_PREFIX)), None)
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    if row is None:
        failure = failure or f"exit code {proc.returncode}" + (f": {lines[-1]}" if lines else "")
        row = {"family": family(env_id), "id": env_id, "trained": False, "env_fps": None, "train_fps": None,
               "ratio": None, "error": failure}
    if not row["trained"]:
        # A crashed fastrl process printed its traceback here: its last line names the cause.
        cause = next((line for line in reversed(lines) if EXCEPTION_LINE.match(line)), None)
        if cause and cause not in row["error"]:
            row["error"] += f" (cause: {cause})"
        row["stderr_tail"] = lines[-40:]
    return row


def number(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_table(rows: list[dict]) -> None:
    print("| family | id | observation | action | workers x envs / splits | trained | raw env steps/s "
          "| training steps/s | training / raw | bottleneck |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        trained = "yes" if r["trained"] else f"no: {r['error']}"
        print(f"| {r['family']} | {r['id']} | {r.get('observation', '-')} | {r.get('action', '-')} "
              f"| {r.get('layout', '-')} | {trained} | {number(r['env_fps'], ',.0f')} "
              f"| {number(r['train_fps'], ',.0f')} | {number(r['ratio'], '.2f')} | {r.get('bottleneck', '-')} |")
    notes = [r for r in rows if r["trained"] and r["error"]]
    for r in notes:
        print(f"\n{r['id']}: {r['error']}")
    packed = [r for r in rows if r["ratio"] is not None and r.get("observation", "").startswith("Dict")]
    if packed:
        print("\nDict observations, training / raw: "
              + ", ".join(f"{r['id']} {r['ratio']:.2f}" for r in packed))


def add_arguments(p) -> None:
    p.add_argument("--ids", nargs="+", help="envpool ids to check (default: one per family)")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds of each raw env and training run")
    p.add_argument("--startup-seconds", type=float, default=STARTUP_ESTIMATE_S,
                   help="start-up allowed to a training run before its warm-up (once more, longer, if it starts later)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before an id's subprocess is killed")
    p.add_argument("--child", metavar="ID", help=argparse.SUPPRESS)  # one id, in the subprocess run_child starts


def run(args) -> dict:
    if args.child:
        row = check_one(args.child, args.seconds, args.startup_seconds)
        print(RESULT_PREFIX + json.dumps(row), flush=True)
        return row
    rows = []
    for env_id in args.ids or DEFAULT_IDS.values():
        print(f"[check_envs] {env_id} ...", file=sys.stderr, flush=True)
        start = time.time()
        rows.append(run_child(env_id, args.seconds, args.startup_seconds, args.timeout))
        r = rows[-1]
        print(f"[check_envs] {env_id}: trained {'yes' if r['trained'] else 'no'}, raw {number(r['env_fps'], ',.0f')}, "
              f"training {number(r['train_fps'], ',.0f')} env steps/s ({time.time() - start:.0f} s)"
              + (f"; {r['error']}" if r["error"] else ""), file=sys.stderr, flush=True)
    print(f"hardware: {hardware()}")
    print_table(rows)
    return {"rows": rows, "seconds": args.seconds, "startup_seconds": args.startup_seconds, "hardware": hardware()}
