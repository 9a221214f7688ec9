"""fastrl-profile: how fast each part runs, which part limits the rest, and which knob to turn.

One invocation measures, on the same cores and with the same env settings:

  raw env    ``env.num_workers`` processes step their env groups (same splits, threads, affinity)
             with random actions: the honest limit of this process layout;
  sampling   ``train()`` with ``sample_only``: rollout + inference, slots handed straight back;
  training   ``train()``: the whole pipeline.

Each run is measured in steady state: start-up (seconds of spawning and importing) varies with
the machine's load, so a training run lasts a start-up allowance + warm-up + the measured
seconds, and the window opens ``warmup_s`` after the reports show the pipeline flowing
(``steady_window``); the rate is taken between that report and the last. The cumulative
component timings of those two reports give the breakdown (``breakdown``; it works on any two
lines of a metrics.jsonl), and ``diagnose`` turns a breakdown into one line naming the
bottleneck and the knob. CPU and RSS of every process come
from a thread of the profiler process that samples the pids in processes.json, so the measured
processes carry no profiling code. ``autotune`` searches the throughput knobs with short runs.

Heavy imports (torch, the runner) stay inside functions: the raw env processes import this
module and, like rollout workers, should not pay for torch.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import multiprocessing as mp
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .config import Config, ConfigError, build_config, parse_override, set_key, to_toml, validate
from .metrics import INFERENCE_TIMINGS, LEARNER_STATS, WORKER_TIMINGS

DEFAULT_SECONDS = 10.0
DEFAULT_TRIAL_SECONDS = 4.0
DEFAULT_BUDGET_S = 300.0
# From the train() call until env steps flow and the first update is done (probe env, spawn 4+
# processes, import torch, build envs): 5-8 s on an idle 2-vCPU VM, 10-12 s while other jobs load
# it. A run lasts this allowance + warm-up + the measured seconds; later runs use what was measured.
STARTUP_ESTIMATE_S = 12.0
STARTUP_MARGIN = 1.2  # later runs may start slower than the first (more workers, more envs)
# A run's time beyond its train_for_seconds (probing the env, spawning, stopping the processes
# and the final checkpoint): 3-6 s here. Autotune's estimate until it has measured its own.
OVERHEAD_ESTIMATE_S = 5.0
MIN_WINDOW_S = 0.5
MIN_GAIN = 0.03  # autotune keeps a setting only if it beats the best so far by this (noise)
SAMPLE_PERIOD_S = 0.25
GPU_PERIOD_S = 1.0  # nvidia-smi costs ~0.1 s of CPU per call
ENV_START_TIMEOUT_S = 120.0
ACTION_TABLE = 64  # batches of random actions drawn up front, cycled in the raw env loop

# Cumulative seconds of each process group, named as in metrics.jsonl ("rollout/env_step_s").
GROUPS = {"rollout": WORKER_TIMINGS,
          "inference": tuple(name for name in INFERENCE_TIMINGS if name.endswith("_s")),
          "learner": tuple(name for name in LEARNER_STATS if name.endswith("_s"))}

# Diagnosis thresholds, as shares of the measured wall time. A stage is busy when it works for
# BUSY of the window; a wait is high when the waiting side spends WAIT of its time blocked.
BUSY = 0.6
WAIT = 0.25
CPU_SATURATED = 0.85  # share of the available cores used by the run's processes

TUNED_KEYS = ("env.num_workers", "env.envs_per_worker", "env.num_splits", "learner.batch_size",
              "env.num_threads", "env.thread_affinity")
ENVPOOL_ONLY = ("env.num_threads", "env.thread_affinity")


class ProfileError(ValueError):
    """A profiling request that cannot be measured; the message is one line that names the fix."""


def _log(message: str) -> None:
    print(f"[fastrl-profile] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Breakdown and diagnosis: pure functions on report dicts (lines of metrics.jsonl).


def _component(timing: str) -> str:
    """Breakdown name of a metrics timing: "inference_forward_s" -> "forward"."""
    return timing.removeprefix("inference_").removesuffix("_s")


def breakdown(report_a: dict, report_b: dict, num_workers: int) -> dict:
    """The component breakdown of the window between two reports of one run.

    Reports hold cumulative component seconds (fastrl.metrics): ``rollout/*`` summed over the
    ``num_workers`` rollout workers, ``inference/*`` of the batcher, ``learner/*`` of the learner.
    Returns shares of the window's wall time per process group (rollout shares are per worker:
    divided by ``num_workers``), keyed ``group/component`` without the ``_s``; ``*/other`` is the
    untimed rest, ``*/busy`` the sum of the components that are not waits; plus rates
    (``env_steps_per_s``, ``frames_per_s``, updates and inference batches per second, requests
    per batch) and the policy lag of ``report_b``.
    Missing keys (metrics.jsonl of older runs) count as 0.
    """
    window = report_b["wall_time"] - report_a["wall_time"]
    if window <= 0:
        raise ProfileError(f"report_b must come after report_a (wall_time {report_a['wall_time']} -> "
                           f"{report_b['wall_time']})")

    def delta(key: str) -> float:
        return float(report_b.get(key) or 0.0) - float(report_a.get(key) or 0.0)

    out = {"window_s": window, "env_steps_per_s": delta("env_steps") / window,
           "frames_per_s": delta("frames") / window}
    for group, timings in GROUPS.items():
        per = window * (num_workers if group == "rollout" else 1)
        shares = {_component(name): delta(f"{group}/{name}") / per for name in timings}
        timed = sum(shares.values())
        # Untimed: loop bookkeeping, pipes, and time the OS gave to other processes.
        shares["other"] = max(0.0, 1.0 - timed) if timed else 0.0
        out.update({f"{group}/{part}": share for part, share in shares.items()})
        out[f"{group}/busy"] = sum(share for part, share in shares.items() if part != "other"
                                   and not part.startswith("wait"))
    batches = delta("inference/inference_batches")
    out["inference/batches_per_s"] = batches / window
    out["inference/requests_per_batch"] = delta("inference/inference_requests") / batches if batches else 0.0
    out["learner/updates_per_s"] = delta("learner_updates") / window
    for name in ("policy_lag_mean", "policy_lag_min", "policy_lag_max"):
        out[name] = float(report_b.get(name) or 0.0)
    return out


@dataclass
class Diagnosis:
    bottleneck: str  # learner | slots | inference | env | cpu | latency | balanced
    message: str  # one line: "<bottleneck>-bound: <evidence> -> <knob>"


def share_keys(bd: dict) -> list[str]:
    """The keys of a breakdown that are shares of wall time ("rollout/env_step" ... "learner/busy")."""
    return [key for key in bd if key.split("/")[0] in GROUPS and not key.endswith(("_per_s", "_per_batch"))]


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def diagnose(bd: dict, cores_used: float | None = None, cpu_count: int | None = None) -> Diagnosis:
    """Name the bottleneck of a breakdown (see ``breakdown``) and the knob that moves it.

    Rules, first match wins (BUSY, WAIT, CPU_SATURATED are module constants):
      1. learner   workers wait for slots >= WAIT and learner busy >= BUSY: backpressure from a
                   learner that cannot keep up;
      2. slots     workers wait for slots >= WAIT, learner not busy: too few slots queued;
      3. inference workers wait for actions >= WAIT and batcher busy >= BUSY;
      4. env       workers stepping >= BUSY and the CPU not saturated: more envs would help;
      5. cpu       the run's processes use >= CPU_SATURATED of the cores (needs ``cores_used`` and
                   ``cpu_count``): every stage competes for the same cores;
      6. latency   workers wait for actions >= WAIT while the batcher is idle: round trips, not
                   compute, hold the workers back;
      7. balanced  none of the above; names the busiest stage.
    """
    rollout, wait_slots, wait_actions = bd["rollout/busy"], bd["rollout/wait_slots"], bd["rollout/wait_actions"]
    learner, inference = bd["learner/busy"], bd["inference/busy"]
    saturated = bool(cores_used is not None and cpu_count and cores_used >= CPU_SATURATED * cpu_count)
    if wait_slots >= WAIT and learner >= BUSY:
        # Only the dqn learner spends time in its replay: its pace is set by the replay ratio.
        knob = ("lower replay.replay_ratio (fewer gradient steps per env step)" if bd.get("learner/replay", 0) > 0
                else "raise learner.batch_size")
        return Diagnosis("learner", f"learner-bound: learner busy {_pct(learner)}, workers waiting for slots "
                                    f"{_pct(wait_slots)} -> {knob} or use a GPU (device=cuda)")
    if wait_slots >= WAIT:
        return Diagnosis("slots", f"slot-bound: workers waiting for slots {_pct(wait_slots)} while the learner "
                                  f"is busy {_pct(learner)} -> raise slots_per_env or lower learner.batch_size")
    if wait_actions >= WAIT and inference >= BUSY:
        return Diagnosis("inference", f"inference-bound: batcher busy {_pct(inference)}, workers waiting for "
                                      f"actions {_pct(wait_actions)} -> raise env.num_splits / "
                                      f"env.envs_per_worker (bigger batches) or use a GPU")
    if rollout >= BUSY and not saturated:
        return Diagnosis("env", f"env-bound: workers stepping {_pct(rollout)} -> add env.num_workers / "
                                f"env.envs_per_worker")
    if saturated:
        return Diagnosis("cpu", f"cpu-bound: the run uses {cores_used:.2f} of {cpu_count} cores (workers stepping "
                                f"{_pct(rollout)}, batcher {_pct(inference)}, learner {_pct(learner)}) -> more "
                                f"cores, or rebalance with --autotune (env.num_workers, env.num_threads)")
    if wait_actions >= WAIT:
        return Diagnosis("latency", f"latency-bound: workers waiting for actions {_pct(wait_actions)} while the "
                                    f"batcher is busy {_pct(inference)} -> raise env.num_splits (more batches in "
                                    f"flight) or env.envs_per_worker")
    busiest = max((("workers stepping", rollout), ("batcher", inference), ("learner", learner)),
                  key=lambda item: item[1])
    return Diagnosis("balanced", f"no single bottleneck: busiest is {busiest[0]} {_pct(busiest[1])} -> "
                                 f"try --autotune")


def steady_window(reports: list[dict], warmup_s: float, training: bool) -> tuple[dict, dict]:
    """(first report after the warm-up, last report): the steady-state window of a run.

    Start-up (spawning processes, importing torch, building envs) takes seconds and varies with
    the load, so the warm-up is counted from the first report with env steps flowing and, when
    ``training``, a learner update done (the first update compiles kernels): the window opens at
    the first report ``warmup_s`` after that one.
    """
    flowing = next((r for r in reports if r["env_steps"] > 0 and (r["learner_updates"] > 0 or not training)), None)
    if flowing is not None:
        first = next((r for r in reports if r["wall_time"] >= flowing["wall_time"] + warmup_s), None)
        if first is not None and reports[-1]["wall_time"] - first["wall_time"] >= MIN_WINDOW_S:
            return first, reports[-1]
    raise LateStart(flowing["wall_time"] if flowing else None, reports[-1]["wall_time"] if reports else 0.0,
                    warmup_s)


class LateStart(ProfileError):
    """A run that ended before its steady state began: start-up took longer than allowed."""

    def __init__(self, flowed_at: float | None, ended_at: float, warmup_s: float):
        self.flowed_at, self.ended_at = flowed_at, ended_at
        started = f"at {flowed_at:.1f} s" if flowed_at is not None else "never"
        super().__init__(f"the run ended at {ended_at:.1f} s with less than {MIN_WINDOW_S} s of steady state (it "
                         f"started flowing {started}, then {warmup_s:g} s warm-up); the machine may be busy: retry")

    def allowance(self) -> float:
        """A start-up allowance that would have fit this run."""
        return STARTUP_MARGIN * self.flowed_at if self.flowed_at is not None else 2 * self.ended_at


# ---------------------------------------------------------------------------------------------
# Sampling CPU, RSS and GPU from a thread of the profiler process.


def parse_nvidia_smi(text: str) -> list[dict]:
    """Rows of ``nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits`` -> [{index, name, util_percent, memory_used_mib, memory_total_mib}]."""
    gpus = []
    for line in text.strip().splitlines():
        index, name, util, used, total = (part.strip() for part in line.split(","))
        gpus.append({"index": int(index), "name": name, "util_percent": _number(util),
                     "memory_used_mib": _number(used), "memory_total_mib": _number(total)})
    return gpus


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]" on GPUs that do not report it
        return None


def _nvidia_smi_query() -> list[dict]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,utilization.gpu,memory.used,memory.total",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    return parse_nvidia_smi(out.stdout) if out.returncode == 0 else []


def _torch_gpu_query() -> list[dict]:
    import torch

    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        try:
            util = float(torch.cuda.utilization(i))
        except Exception:  # needs pynvml, an optional dependency of torch
            util = None
        gpus.append({"index": i, "name": torch.cuda.get_device_name(i), "util_percent": util,
                     "memory_used_mib": (total - free) / 2**20, "memory_total_mib": total / 2**20})
    return gpus


def gpu_query() -> Callable[[], list[dict]] | None:
    """A function reading every GPU's use (nvidia-smi if present, else torch.cuda), or None
    without a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return _nvidia_smi_query if shutil.which("nvidia-smi") else _torch_gpu_query


class ProcessSampler:
    """Samples CPU time and RSS of a run's processes (and the GPUs) every ``period_s``.

    ``find_pids()`` returns ``{role: [pid, ...]}`` (None until the processes exist); it is asked
    every period, so replaced processes are picked up. Use as a context manager around the run.
    """

    def __init__(self, find_pids: Callable[[], dict | None], period_s: float = SAMPLE_PERIOD_S):
        self.find_pids = find_pids
        self.period_s = period_s
        self.samples: dict[tuple[str, int, int], list[tuple[float, float, int]]] = {}
        self.gpu_samples: list[tuple[float, list[dict]]] = []
        self.query_gpu = gpu_query()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fastrl-profile-sampler", daemon=True)

    def __enter__(self) -> "ProcessSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        import psutil

        procs: dict[tuple[str, int, int], psutil.Process] = {}
        gone: set[tuple[str, int, int]] = set()
        next_gpu = 0.0
        while True:
            # Asked every time: the runner rewrites processes.json when it restarts a worker.
            for role, pids in (self.find_pids() or {}).items():
                for i, pid in enumerate(pids):
                    key = (role, i, pid)
                    if key not in procs and key not in gone:
                        try:
                            procs[key] = psutil.Process(pid)
                        except psutil.NoSuchProcess:
                            gone.add(key)
            for key, proc in list(procs.items()):
                try:
                    with proc.oneshot():
                        cpu = proc.cpu_times()
                        sample = (time.time(), cpu.user + cpu.system, proc.memory_info().rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    gone.add(key)
                    del procs[key]
                    continue
                self.samples.setdefault(key, []).append(sample)
            if self.query_gpu is not None and time.time() >= next_gpu:
                self.gpu_samples.append((time.time(), self.query_gpu()))
                next_gpu = time.time() + GPU_PERIOD_S
            if self._stop.wait(self.period_s):
                return

    def processes(self, t_a: float, t_b: float) -> list[dict]:
        """Per process: mean CPU use over [t_a, t_b] (% of one core) and peak RSS (MiB; counts the
        shared slots the process touched). Falls back to the whole run when the window holds
        fewer than two samples."""
        rows = []
        for (role, index, pid), samples in sorted(self.samples.items()):
            inside = [s for s in samples if t_a <= s[0] <= t_b]
            span = inside if len(inside) >= 2 else samples
            cpu = None
            if len(span) >= 2 and span[-1][0] > span[0][0]:
                cpu = 100 * (span[-1][1] - span[0][1]) / (span[-1][0] - span[0][0])
            rows.append({"name": f"{role}[{index}]" if role == "rollout" else role, "role": role, "pid": pid,
                         "cpu_percent": cpu, "rss_mib": max(s[2] for s in span) / 2**20})
        return rows

    def gpus(self, t_a: float, t_b: float) -> list[dict] | None:
        """Per GPU over [t_a, t_b]: mean utilisation and peak memory, or None without a GPU."""
        if self.query_gpu is None:
            return None
        inside = [gpus for t, gpus in self.gpu_samples if t_a <= t <= t_b] or [g for _, g in self.gpu_samples]
        summary = {}
        for gpus in inside:
            for gpu in gpus:
                row = summary.setdefault(gpu["index"], {"index": gpu["index"], "name": gpu["name"], "utils": [],
                                                        "memory_used_mib": 0.0,
                                                        "memory_total_mib": gpu["memory_total_mib"]})
                if gpu["util_percent"] is not None:
                    row["utils"].append(gpu["util_percent"])
                row["memory_used_mib"] = max(row["memory_used_mib"], gpu["memory_used_mib"] or 0.0)
        for row in summary.values():
            utils = row.pop("utils")
            row["util_percent"] = sum(utils) / len(utils) if utils else None
        return list(summary.values())


def cores_used(processes: list[dict]) -> float:
    return sum(p["cpu_percent"] or 0.0 for p in processes) / 100


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask), which is what the run gets."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def hardware() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    query = gpu_query()
    import torch

    return {"cpu_count": cpu_count(), "cpu_count_total": os.cpu_count(), "cpu_model": model,
            "gpus": [gpu["name"] for gpu in query()] if query else [], "torch": torch.__version__}


# ---------------------------------------------------------------------------------------------
# Measurements.


def default_warmup(seconds: float) -> float:
    """Seconds skipped once a run flows (see ``steady_window``)."""
    return min(3.0, max(1.0, seconds / 8))


def _report_period(seconds: float) -> float:
    return min(1.0, max(0.25, seconds / 12))


def random_action_table(space, batch_size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` batches of uniform random actions: [count, batch_size, *space.shape]. Box bounds
    that are infinite are replaced by [-1, 1]."""
    if not space.shape:  # Discrete
        return rng.integers(space.start, space.start + space.n, size=(count, batch_size), dtype=np.int64)
    low = np.where(np.isfinite(space.low), space.low, -1.0)
    high = np.where(np.isfinite(space.high), space.high, 1.0)
    return rng.uniform(low, high, size=(count, batch_size, *space.shape)).astype(np.float32)


def _raw_env_process(worker_id: int, cfg: Config, warmup_s: float, window_s: float, barrier, results,
                     parent_pid: int) -> None:
    """One raw env process: the env group of rollout worker ``worker_id``, random actions, and
    the same double buffering (``num_splits`` batches in flight). Puts (worker_id, result)."""
    from .process_utils import configure_child
    from .rollout import make_worker_env

    configure_child(parent_pid)
    try:
        env = make_worker_env(cfg, worker_id)
    except Exception as exc:
        results.put((worker_id, {"error": f"{type(exc).__name__}: {exc}"}))
        barrier.abort()
        return
    try:
        table = random_action_table(env.action_space, env.batch_size, ACTION_TABLE,
                                    np.random.default_rng(cfg.seed + worker_id))
        barrier.wait(ENV_START_TIMEOUT_S)
        env.async_reset()
        start = time.time()
        steps, i = 0, 0
        t_a, steps_a = None, 0
        while True:
            _, _, _, _, env_ids = env.recv()
            env.send(table[i % ACTION_TABLE], env_ids)
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


def measure_env(cfg: Config, seconds: float, warmup_s: float) -> dict:
    """Raw env throughput of ``cfg``'s rollout layout with random actions, summed over workers:
    ``seconds`` measured after ``warmup_s``, once every process has built its envs."""
    ctx = mp.get_context("spawn")
    W = cfg.env.num_workers
    barrier, results = ctx.Barrier(W), ctx.Queue()
    procs = [ctx.Process(target=_raw_env_process, name=f"fastrl-rawenv-{w}", daemon=True,
                         args=(w, cfg, warmup_s, seconds, barrier, results, os.getpid()))
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
    return {"env_steps_per_s": rate, "frames_per_s": rate * frame_skip, "frame_skip": frame_skip,
            "window_s": seconds, "processes": processes, "cores_used": cores_used(processes)}


def _read_pids(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "processes.json").read_text())
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return None


def measure_run(cfg: Config, seconds: float, warmup_s: float, sample_only: bool,
                startup_s: float = STARTUP_ESTIMATE_S) -> dict:
    """Steady-state throughput and breakdown of a ``train()`` of ``cfg`` (``sample_only``: the
    learner hands slots back untrained) that runs ``startup_s + warmup_s + seconds``; the
    result's ``startup_s`` is how long this run took to flow (an allowance for the next)."""
    from .runner import train

    if cfg.serial:
        raise ProfileError("serial=true runs everything in one process; the profiler measures the process layout: "
                           "drop --set serial=true")
    run_cfg = copy.deepcopy(cfg)
    run_cfg.sample_only = sample_only
    run_cfg.train_for_seconds, run_cfg.train_for_env_steps = startup_s + warmup_s + seconds, 0
    run_cfg.report_every_s = _report_period(seconds)
    run_cfg.checkpoint_every_s = 1e9  # only the final one, outside the measured window
    validate(run_cfg)
    with tempfile.TemporaryDirectory(prefix="fastrl-profile-") as tmp:
        run_dir = Path(tmp)
        with ProcessSampler(lambda: _read_pids(run_dir)) as sampler:
            t0 = time.time()  # report wall_time counts from the train() call (fastrl.metrics)
            result = train(run_cfg, run_dir=run_dir, quiet=True)
    a, b = steady_window(result.reports, warmup_s, training=not sample_only)
    bd = breakdown(a, b, cfg.env.num_workers)
    processes = sampler.processes(t0 + a["wall_time"], t0 + b["wall_time"])
    used = cores_used(processes)
    return {"env_steps_per_s": bd["env_steps_per_s"], "frames_per_s": bd["frames_per_s"], "window_s": bd["window_s"],
            "startup_s": a["wall_time"] - warmup_s, "breakdown": bd, "processes": processes, "cores_used": used,
            "gpus": sampler.gpus(t0 + a["wall_time"], t0 + b["wall_time"]),
            "diagnosis": diagnose(bd, used, cpu_count())}


def measure_run_patiently(cfg: Config, seconds: float, warmup_s: float, sample_only: bool, startup_s: float,
                          log=_log) -> dict:
    """``measure_run``, once more with a longer start-up allowance if the run started too late."""
    try:
        return measure_run(cfg, seconds, warmup_s, sample_only, startup_s)
    except LateStart as late:
        log(f"start-up took longer than the {startup_s:.0f} s allowed ({late}); once more with "
            f"{late.allowance():.0f} s")
        return measure_run(cfg, seconds, warmup_s, sample_only, late.allowance())


def profile(cfg: Config, seconds: float = DEFAULT_SECONDS, warmup_s: float | None = None,
            profile_name: str | None = None, overrides: dict | None = None, log=_log) -> dict:
    """Raw env, sampling and training throughput of ``cfg``, each measured for about ``seconds``
    after start-up and ``warmup_s``; every figure the CLI prints and writes as JSON."""
    validate(cfg)
    warmup_s = default_warmup(seconds) if warmup_s is None else warmup_s
    if seconds < MIN_WINDOW_S or warmup_s < 0:
        raise ProfileError(f"--seconds must be >= {MIN_WINDOW_S} and --warmup-seconds >= 0 (got {seconds}, {warmup_s})")
    log(f"raw env: {cfg.env.num_workers} processes x {cfg.env.envs_per_worker} envs, random actions, "
        f"{warmup_s:g} + {seconds:g} s")
    env = measure_env(cfg, seconds, warmup_s)
    log(f"sampling: train() with sample_only, start-up + {warmup_s:g} + {seconds:g} s")
    sample = measure_run_patiently(cfg, seconds, warmup_s, True, STARTUP_ESTIMATE_S, log)
    log(f"training: train(), start-up + {warmup_s:g} + {seconds:g} s")
    startup = max(STARTUP_ESTIMATE_S, sample["startup_s"] * STARTUP_MARGIN)
    trained = measure_run_patiently(cfg, seconds, warmup_s, False, startup, log)
    limit = env["env_steps_per_s"]
    return {
        "profile": profile_name, "env_id": cfg.env.id, "overrides": overrides or {},
        "seconds": seconds, "warmup_seconds": warmup_s, "frame_skip": env["frame_skip"],
        "env_fps": limit, "sample_fps": sample["env_steps_per_s"], "train_fps": trained["env_steps_per_s"],
        "env_frames_per_s": env["frames_per_s"], "sample_frames_per_s": sample["frames_per_s"],
        "train_frames_per_s": trained["frames_per_s"],
        "sample_ratio": sample["env_steps_per_s"] / limit, "train_ratio": trained["env_steps_per_s"] / limit,
        "window_s": {"env": env["window_s"], "sample": sample["window_s"], "train": trained["window_s"]},
        "startup_s": {"sample": sample["startup_s"], "train": trained["startup_s"]},
        "breakdown": {"sample": sample["breakdown"], "train": trained["breakdown"]},
        "policy_lag": {k: trained["breakdown"][f"policy_lag_{k}"] for k in ("mean", "min", "max")},
        "processes": {"env": env["processes"], "sample": sample["processes"], "train": trained["processes"]},
        "cores_used": {"env": env["cores_used"], "sample": sample["cores_used"], "train": trained["cores_used"]},
        "gpus": {"sample": sample["gpus"], "train": trained["gpus"]} if trained["gpus"] is not None else None,
        "bottleneck": trained["diagnosis"].bottleneck, "diagnosis": trained["diagnosis"].message,
        "sample_diagnosis": sample["diagnosis"].message,
        "hardware": hardware(), "config": cfg.to_dict(),
    }


# ---------------------------------------------------------------------------------------------
# Autotune: coordinate search over the throughput knobs with short training runs.


def _get_key(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def with_settings(cfg: Config, settings: dict) -> Config:
    out = copy.deepcopy(cfg)
    for key, value in settings.items():
        set_key(out, key, value)
    return out


def candidate_values(cfg: Config, key: str, cores: int) -> list:
    """Values of ``key`` worth a trial around ``cfg``'s current one (validity is checked later)."""
    current = _get_key(cfg, key)
    if key == "env.num_workers":
        values = [max(1, cores // 2), cores, 2 * cores]
    elif key == "env.envs_per_worker":
        values = [current // 2, current * 2]
    elif key == "env.num_splits":
        values = [1, 2, 4]
    elif key == "learner.batch_size":
        rollout = cfg.learner.rollout
        values = [max(rollout, current // 2 // rollout * rollout), current * 2]
    elif key == "env.num_threads":
        values = [0, 1, max(1, cores // cfg.env.num_workers)]
    else:  # env.thread_affinity
        values = [False, True]
    return [v for v in dict.fromkeys(values) if v != current]


def tuned_keys(cfg: Config) -> tuple[str, ...]:
    from .envs import resolve_backend

    envpool = resolve_backend(cfg.env.id, cfg.env.backend) == "envpool"
    return tuple(k for k in TUNED_KEYS if envpool or k not in ENVPOOL_ONLY)


def autotune(cfg: Config, budget_s: float = DEFAULT_BUDGET_S, trial_seconds: float = DEFAULT_TRIAL_SECONDS,
             warmup_s: float | None = None, log=_log) -> dict:
    """Search ``TUNED_KEYS`` one at a time (keeping a value only when it beats the best training
    throughput by MIN_GAIN), within ``budget_s`` seconds of wall time in all.

    Every candidate must pass ``validate``. A trial costs start-up + ``warmup_s`` +
    ``trial_seconds`` + overhead; start-up and overhead are estimated from the trials so far
    (STARTUP_ESTIMATE_S and OVERHEAD_ESTIMATE_S before the first), and a trial starts only if
    the rest of the budget fits it. Returns the trials, the best settings, their --set arguments and
    the winning config as TOML.
    """
    started = time.time()
    warmup_s = default_warmup(trial_seconds) if warmup_s is None else warmup_s
    if trial_seconds < MIN_WINDOW_S or warmup_s < 0:
        raise ProfileError(f"--seconds must be >= {MIN_WINDOW_S} and --warmup-seconds >= 0 "
                           f"(got {trial_seconds}, {warmup_s})")
    validate(cfg)
    keys = tuned_keys(cfg)
    cores = cpu_count()
    allowances: list[float] = []  # start-up allowances that fit, learned from each trial
    overheads: list[float] = []  # a trial's time beyond its train_for_seconds, per trial
    trials: list[dict] = []

    def changed(settings: dict) -> dict:
        return {k: v for k, v in settings.items() if v != _get_key(cfg, k)}

    def allowance() -> float:
        return max(allowances) if allowances else STARTUP_ESTIMATE_S

    def cost() -> float:
        overhead = max(overheads) * STARTUP_MARGIN if overheads else OVERHEAD_ESTIMATE_S
        return allowance() + warmup_s + trial_seconds + overhead

    def fits() -> bool:
        return time.time() - started + cost() <= budget_s

    if not fits():
        raise ProfileError(f"--budget-seconds {budget_s:g} cannot fit one trial (~{cost():.0f} s: start-up, "
                           f"{warmup_s:g} s warm-up, {trial_seconds:g} s measured, stopping); raise it or lower --seconds")

    def trial(settings: dict) -> float | None:
        """Measure a valid setting; records it in ``trials``; None if it failed to run or started
        too late (status "late": the allowance grows for the next trials)."""
        record = {"settings": settings, "changed": changed(settings)}
        trials.append(record)
        log(f"trial {len(trials)}: {_set_args(record['changed']) or 'the profile as given'}")
        begun, startup = time.time(), allowance()
        try:
            measured = measure_run(with_settings(cfg, settings), trial_seconds, warmup_s, False, startup)
        except LateStart as late:
            allowances.append(late.allowance())
            record.update(status="late", error=str(late))
            return None
        except Exception as exc:  # a setting that cannot run here (memory, env threads) is a result too
            record.update(status="failed", error=f"{type(exc).__name__}: {exc}")
            return None
        finally:
            overheads.append(time.time() - begun - (startup + warmup_s + trial_seconds))
        allowances.append(measured["startup_s"] * STARTUP_MARGIN)
        record.update(status="ok", train_fps=measured["env_steps_per_s"], train_frames_per_s=measured["frames_per_s"],
                      bottleneck=measured["diagnosis"].bottleneck, elapsed_s=time.time() - begun)
        return measured["env_steps_per_s"]

    best_settings = {key: _get_key(cfg, key) for key in keys}
    best_fps = trial(best_settings)
    while best_fps is None and trials[-1]["status"] == "late" and fits():
        best_fps = trial(best_settings)
    if best_fps is None:
        raise ProfileError(f"the profile as given could not be measured: {trials[-1]['error']}")
    base_fps = best_fps

    def search() -> bool:
        """One pass over the keys from the best settings so far; False when the budget ran out."""
        nonlocal best_settings, best_fps
        for key in keys:
            for value in candidate_values(with_settings(cfg, best_settings), key, cores):
                settings = {**best_settings, key: value}
                try:
                    validate(with_settings(cfg, settings))
                except ConfigError as exc:
                    trials.append({"settings": settings, "changed": changed(settings), "status": "invalid",
                                   "error": str(exc)})
                    continue
                if not fits():
                    return False
                fps = trial(settings)
                if fps is not None and fps > best_fps * (1 + MIN_GAIN):
                    best_settings, best_fps = settings, fps
        return True

    complete = search()
    winner = with_settings(cfg, best_settings)
    return {"budget_seconds": budget_s, "elapsed_s": time.time() - started, "trial_seconds": trial_seconds,
            "warmup_seconds": warmup_s, "keys": list(keys), "complete": complete, "trials": trials,
            "base_fps": base_fps, "best_fps": best_fps, "gain": best_fps / base_fps if base_fps else None,
            "best": best_settings, "set_args": _set_args(best_settings), "toml": to_toml(winner)}


def _set_args(settings: dict) -> str:
    return " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items())


# ---------------------------------------------------------------------------------------------
# Output: table, JSON, plot.


def format_report(result: dict) -> str:
    """The profile as a table: throughput against the raw limit, breakdown, processes, diagnosis."""
    cfg, hw = result["config"], result["hardware"]
    env = cfg["env"]
    lines = [
        f"fastrl-profile  {result['profile'] or ''}  {result['env_id']}  {env['num_workers']} workers x "
        f"{env['envs_per_worker']} envs in {env['num_splits']} splits  device {cfg['device']}",
        f"{hw['cpu_count']} cores ({hw['cpu_model']}){'  GPU ' + ', '.join(hw['gpus']) if hw['gpus'] else ''}  "
        f"each run measured for ~{result['seconds']:g} s after start-up + {result['warmup_seconds']:g} s warm-up",
        "",
        f"{'':24}{'env steps/s':>14}{'frames/s':>14}{'vs raw env':>12}{'measured s':>12}{'start-up s':>12}",
    ]
    for label, kind in (("raw env (random acts)", "env"), ("sampling", "sample"), ("training", "train")):
        ratio = 1.0 if kind == "env" else result[f"{kind}_ratio"]
        startup = f"{result['startup_s'][kind]:>12.1f}" if kind in result["startup_s"] else f"{'-':>12}"
        lines.append(f"{label:24}{result[f'{kind}_fps']:>14,.0f}{result[f'{kind}_frames_per_s']:>14,.0f}{ratio:>12.2f}"
                     f"{result['window_s'][kind]:>12.1f}{startup}")
    sample, train = result["breakdown"]["sample"], result["breakdown"]["train"]
    lines += ["", f"{'breakdown (share of wall time; rollout per worker)':52}{'sampling':>10}{'training':>10}"]
    for key in share_keys(sample):
        lines.append(f"  {key:50}{100 * sample[key]:>9.1f}%{100 * train[key]:>9.1f}%")
    for key in ("inference/requests_per_batch", "inference/batches_per_s", "learner/updates_per_s"):
        lines.append(f"  {key:50}{sample[key]:>10.1f}{train[key]:>10.1f}")
    lag = result["policy_lag"]
    lines.append(f"  {'policy lag mean / min / max (training)':50}{'':>10}{lag['mean']:>4.1f} / {lag['min']:.0f} / "
                 f"{lag['max']:.0f}")
    lines += ["", f"{'processes (cpu % of a core, peak rss MiB)':44}{'raw env':>18}{'sampling':>18}{'training':>18}"]
    names = list(dict.fromkeys(p["name"] for run in ("env", "sample", "train") for p in result["processes"][run]))
    for name in names:
        cells = []
        for run in ("env", "sample", "train"):
            row = next((p for p in result["processes"][run] if p["name"] == name), None)
            cells.append(f"{row['cpu_percent'] or 0:>8.0f}% {row['rss_mib']:>7.0f}" if row else f"{'-':>18}")
        lines.append(f"  {name:42}" + "".join(f"{c:>18}" for c in cells))
    used = result["cores_used"]
    lines.append(f"  {'cores used':42}{used['env']:>18.2f}{used['sample']:>18.2f}{used['train']:>18.2f}")
    for run, gpus in (result["gpus"] or {}).items():
        for gpu in gpus:
            util = "n/a" if gpu["util_percent"] is None else f"{gpu['util_percent']:.0f}%"
            lines.append(f"  GPU {gpu['index']} {gpu['name']} ({run}): util {util}, memory "
                         f"{gpu['memory_used_mib']:.0f} / {gpu['memory_total_mib']:.0f} MiB")
    lines += ["", f"diagnosis (sampling): {result['sample_diagnosis']}", f"diagnosis: {result['diagnosis']}"]
    return "\n".join(lines)


def format_autotune(result: dict) -> str:
    lines = [f"autotune: {sum(t['status'] == 'ok' for t in result['trials'])} trials of {result['trial_seconds']:g} s "
             f"in {result['elapsed_s']:.0f} s (budget {result['budget_seconds']:g} s)"
             + ("" if result["complete"] else "; stopped: the budget could not fit another trial"), ""]
    lines.append(f"  {'#':>3}  {'train steps/s':>14}  {'status':8}  settings changed")
    for i, t in enumerate(result["trials"], 1):
        fps = f"{t['train_fps']:,.0f}" if t["status"] == "ok" else "-"
        note = "" if t["status"] == "ok" else f"  ({t['error']})"
        lines.append(f"  {i:>3}  {fps:>14}  {t['status']:8}  {_set_args(t['changed']) or '(profile as given)'}{note}")
    gain = f" ({result['gain']:.2f}x the profile as given)" if result["gain"] else ""
    lines += ["", f"best: {result['best_fps']:,.0f} env steps/s{gain}", f"  {result['set_args']}", "",
              "as a profile (TOML):", result["toml"]]
    return "\n".join(lines)


def _json_ready(value):
    """JSON has no NaN or infinity: write them as null, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def write_json(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(_json_ready(result), indent=2) + "\n")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ProfileError("--plot needs matplotlib, the optional extra: pip install 'fastrl[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(result: dict, path: str | Path) -> None:
    """A PNG: throughput against the raw env limit (left) and the component breakdown (right)."""
    plt = _pyplot()
    from matplotlib.ticker import EngFormatter

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6), gridspec_kw={"width_ratios": [1, 1.4]})
    labels = ["raw env", "sampling", "training"]
    values = [result["env_fps"], result["sample_fps"], result["train_fps"]]
    left.barh(labels, values, color=["#888888", "#4c72b0", "#dd8452"])
    left.axvline(result["env_fps"], color="black", linestyle="--", linewidth=1, label="raw env limit")
    for y, value in enumerate(values):
        left.text(value, y, f" {value:,.0f} ({value / result['env_fps']:.2f})", va="center", fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("env steps / s")
    left.xaxis.set_major_formatter(EngFormatter(sep=""))  # 2.5k, 100k, 1M
    left.set_title(f"{result['env_id']}: throughput vs raw env")
    left.legend(loc="lower right", fontsize=8)
    rows = [(group, run) for group in GROUPS for run in ("sample", "train")]
    parts = [key for key in share_keys(result["breakdown"]["train"]) if not key.endswith("/busy")]
    colors = dict(zip(parts, itertools.cycle(plt.get_cmap("tab20").colors)))
    for y, (group, run) in enumerate(rows):
        x = 0.0
        for part in (key for key in parts if key.startswith(group + "/")):
            share = result["breakdown"][run][part]
            right.barh(y, share, left=x, color=colors[part], label=part if run == "sample" else None)
            x += share
    right.set_yticks(range(len(rows)), [f"{group} ({run})" for group, run in rows])
    right.invert_yaxis()
    right.set_xlabel("share of wall time (rollout: per worker)")
    right.set_title("breakdown")
    right.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.suptitle(result["diagnosis"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The fastrl-profile command (argument parsing lives in fastrl.cli.profile_main).


def command(profile_name: str, env: str | None, overrides: list[str], seconds: float | None,
            warmup_seconds: float | None, json_path: str | None, plot_path: str | None, autotune_run: bool,
            budget_seconds: float | None) -> str:
    """Run fastrl-profile; returns the text to print. Raises ConfigError/ProfileError (one line)."""
    pairs = dict(parse_override(text) for text in overrides)
    if env:
        pairs["env.id"] = env
    cfg = build_config(profile_name, pairs)
    for path, flag in ((json_path, "--json"), (plot_path, "--plot")):
        if path and not Path(path).resolve().parent.is_dir():
            raise ProfileError(f"{flag} {path}: the directory does not exist")
    if plot_path and autotune_run:
        raise ProfileError("--plot draws a profile; run it without --autotune")
    if budget_seconds is not None and not autotune_run:
        raise ProfileError("--budget-seconds limits --autotune; add --autotune")
    if plot_path:
        _pyplot()  # fail now, not after the measurements
    if autotune_run:
        result = autotune(cfg, budget_seconds or DEFAULT_BUDGET_S, seconds or DEFAULT_TRIAL_SECONDS, warmup_seconds)
        result.update(profile=profile_name, overrides=pairs, hardware=hardware())
        text = format_autotune(result)
    else:
        result = profile(cfg, seconds or DEFAULT_SECONDS, warmup_seconds, profile_name, pairs)
        text = format_report(result)
        if plot_path:
            plot(result, plot_path)
    if json_path:
        write_json(result, json_path)
    return text
