"""CPU, RSS and GPU use of a run's processes, sampled from a thread of the profiler process, so
the measured processes carry no profiling code; and the machine the figures were taken on."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

SAMPLE_PERIOD_S = 0.25
GPU_PERIOD_S = 1.0  # nvidia-smi costs ~0.1 s of CPU per call


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


def _nvml_query() -> Callable[[], list[dict]] | None:
    """A function reading every GPU's use through NVML (``pynvml``, from nvidia-ml-py: the
    ``gpu`` extra), or None where it is not installed or sees no GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        names = [pynvml.nvmlDeviceGetName(handle) for handle in handles]
    except pynvml.NVMLError:  # no driver, or no permission to the devices
        return None
    if not handles:
        return None
    names = [name.decode() if isinstance(name, bytes) else name for name in names]  # older releases return bytes

    def read(call, handle):
        try:
            return call(handle)
        except pynvml.NVMLError:  # "not supported" on some GPUs; a GPU fallen off the bus
            return None

    def query() -> list[dict]:
        gpus = []
        for index, (handle, name) in enumerate(zip(handles, names)):
            util = read(pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = read(pynvml.nvmlDeviceGetMemoryInfo, handle)
            gpus.append({"index": index, "name": name, "util_percent": None if util is None else float(util.gpu),
                         "memory_used_mib": None if memory is None else memory.used / 2**20,
                         "memory_total_mib": None if memory is None else memory.total / 2**20})
        return gpus

    return query


def gpu_query() -> Callable[[], list[dict]] | None:
    """A function reading every GPU's use (NVML if nvidia-ml-py is installed, else nvidia-smi),
    or None without a GPU. Never torch.cuda: the profiler samples from inside the runner, and
    its per-GPU queries would open a CUDA context on every GPU there, each holding hundreds of
    MiB that the run's own processes then lack."""
    query = _nvml_query()
    if query is None and shutil.which("nvidia-smi") and _nvidia_smi_query():
        query = _nvidia_smi_query
    return query


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
    # Imported here: the raw env processes import this package and, like rollout workers, skip torch.
    import torch

    return {"cpu_count": cpu_count(), "cpu_count_total": os.cpu_count(), "cpu_model": model,
            "gpus": [gpu["name"] for gpu in query()] if query else [], "torch": torch.__version__}
