"""The learner's arithmetic: ``learner.precision`` = float32 | bfloat16 | auto.

``auto`` is float32 on GPUs (which a user tunes knowingly), for r2d2 and sac (which train in
float32) and on CPUs that would emulate bf16 (no AVX512_BF16 or AMX-BF16 flag: 0.27x float32's
speed). On a CPU with native bf16 it is *measured*: one forward and backward pass of the
learner's network (its encoder, for fastrl's networks) on a gradient step's rows, timed in
float32 and under bf16 autocast, alternately (:func:`bf16_time_ratio`), and bfloat16 only where
it takes at most ``BF16_MAX_TIME_RATIO`` of float32's time. The flags do not say enough: a Pong
DQN learner's updates ran 1.19x faster in bf16 on an AMD EPYC with avx512_bf16 and 0.91x as
fast on an Intel Xeon with avx512_bf16 but no AMX, where the whole run went 0.81x as fast
(docs/results.md#bf16-or-float32-on-a-cpu). An MLP that the V-trace learner trains through numpy
(float32 only, faster than torch) stays float32 untimed. A run times it once, before its
processes start (fastrl.run.training); a learner built alone times it itself. Only x86 Linux
flags are read: on ARM (whose ``Features`` list ``bf16``) and on macOS ``auto`` is float32; set
bfloat16 there by hand.
"""
from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from ..config import BF16_LEARNERS, VTRACE, Config
from ..envs.spaces import ObsLayout
from ..models.networks import ActorCritic, learner_layout
from ..sampling.numpy_mlp import NumpyMLPActorCritic

# x86 flags (Linux /proc/cpuinfo names) of native bfloat16 arithmetic.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# auto picks bf16 only where it saves a tenth of float32's time or more: bf16 learned less per env
# step than float32 in atari-appo-cpu's same-seed pairs, so a near tie goes to float32.
BF16_MAX_TIME_RATIO = 0.9
# Rows of the timed pass at most: the ratio, not the learner's full time, is what is wanted.
PROBE_MAX_ROWS = 64


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags as Linux lists them; empty where there is no such file."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def native_bf16(flags: set[str] | None = None) -> bool:
    """Whether this CPU (``flags``: its, read from the running CPU by default) computes in bf16
    natively. Without oneDNN torch would emulate bf16 even on such a CPU."""
    flags = cpu_flags() if flags is None else flags
    return any(flag in flags for flag in NATIVE_BF16_FLAGS) and torch.backends.mkldnn.is_available()


def learner_precision(setting: str, algo: str, device: torch.device, measure: Callable[[], tuple[str, str]],
                      flags: set[str] | None = None) -> str:
    """``setting`` (``learner.precision``) resolved for a learner of ``algo`` on ``device``:
    "float32" or "bfloat16" (see :func:`auto_precision` for ``measure`` and ``flags``)."""
    return setting if setting != "auto" else auto_precision(algo, device, measure, flags)[0]


def auto_precision(algo: str, device: torch.device, measure: Callable[[], tuple[str, str]],
                   flags: set[str] | None = None) -> tuple[str, str]:
    """What ``auto`` picks ("float32" or "bfloat16") and why, in words for the run's log.
    ``measure``: the choice on this CPU and why (:func:`measured_precision`), called only where the
    CPU computes in bf16 natively; ``flags`` the CPU's (default: the running CPU's)."""
    if algo not in BF16_LEARNERS:
        return "float32", f"{algo} trains in float32"
    if device.type != "cpu":
        return "float32", "bf16 on a GPU is set by hand"
    if not native_bf16(flags):
        return "float32", "this CPU has no native bf16"
    return measure()


def measured_precision(cfg: Config, model: nn.Module, observation_space) -> tuple[str, str]:
    """On a CPU with native bf16: bfloat16 where ``cfg``'s learner of ``model`` on
    ``observation_space`` (None: unknown) takes at most BF16_MAX_TIME_RATIO of float32's time
    (:func:`bf16_time_ratio` on ``learner.torch_threads``), and why. float32 without timing where
    the V-trace learner would train this MLP through numpy (fastrl.sampling.numpy_mlp), which
    runs in float32 only and is faster than torch's float32."""
    if observation_space is None:
        return "float32", "bf16 not measurable without the observation space: set learner.precision by hand"
    if (cfg.learner.algo in VTRACE and cfg.learner.numpy_mlp
            and NumpyMLPActorCritic.supports(model, ObsLayout(observation_space).storage_dtype)):
        return "float32", "this MLP trains through numpy (learner.numpy_mlp), in float32"
    ratio = bf16_time_ratio(model, observation_space, probe_rows(cfg), threads=cfg.learner.torch_threads)
    if ratio != ratio:  # nan
        return "float32", "bf16 not measurable on this network: set learner.precision=bfloat16 by hand"
    choice = "bfloat16" if ratio <= BF16_MAX_TIME_RATIO else "float32"
    return choice, f"bf16 took {ratio:.2f}x float32's time for the learner's network on this CPU"


def probe_rows(cfg: Config) -> int:
    """Observations in one gradient step of ``cfg``'s learner (a replay sample for dqn, a
    minibatch for the V-trace learners), at most PROBE_MAX_ROWS."""
    if cfg.learner.algo == "dqn":
        rows = cfg.replay.batch_size
    else:
        rows = cfg.learner.batch_size // cfg.learner.num_minibatches
    return max(1, min(rows, PROBE_MAX_ROWS))


def bf16_time_ratio(model: nn.Module, observation_space, rows: int, repeats: int = 3,
                    threads: int | None = None) -> float:
    """bf16 autocast's time over float32's for one forward and backward pass of ``model`` (its
    encoder, for fastrl's networks: what autocast changes) on ``rows`` random observations, on the
    model's device and ``threads`` torch threads (None: the current number): medians of
    ``repeats`` alternating timings after two warm-ups each (oneDNN builds its bf16 kernels on
    first use). A copy of ``model`` runs, in the learner's channels-last layout where it has
    convolutions, so its weights, gradients and statistics are untouched, and torch's random state
    is restored (a user's dropout draws from it): seeded runs draw what they drew before. nan
    where the model cannot be copied or its pass fails."""
    try:
        probe = copy.deepcopy(model)
    except Exception:  # noqa: BLE001 - a user's module may hold what deepcopy refuses
        return float("nan")
    probe = learner_layout(probe)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return _timed_ratio(probe, observation_space, rows, repeats)
    except Exception:  # noqa: BLE001 - a user's network that trains but not this way (frozen, odd outputs)
        return float("nan")
    finally:
        torch.set_num_threads(before)


def _timed_ratio(probe: nn.Module, observation_space, rows: int, repeats: int) -> float:
    device = next(probe.parameters()).device
    obs = torch.as_tensor(ObsLayout(observation_space).sample(rows)).to(device)
    # A built-in network's encoder is what autocast changes (its heads stay float32); a user's
    # network is called as the learner calls it, obs -> (params, value).
    forward = probe.encode if isinstance(probe, ActorCritic) else probe

    def step(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = forward(obs)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        sum(t.float().sum() for t in outputs if torch.is_tensor(t) and t.is_floating_point()).backward()
        probe.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    times = {False: [], True: []}
    with torch.random.fork_rng(devices=[]):
        for _ in range(2):
            step(False), step(True)
        for _ in range(repeats):
            for bf16 in (False, True):
                times[bf16].append(step(bf16))
    return statistics.median(times[True]) / statistics.median(times[False])


def emulated_bf16_warning(setting: str, algo: str, device: torch.device, flags: set[str] | None = None) -> str | None:
    """A line for a learner set to bfloat16 on a CPU that would emulate it, else None."""
    if setting != "bfloat16" or algo not in BF16_LEARNERS or device.type != "cpu" or native_bf16(flags):
        return None
    return ("[fastrl] learner.precision=bfloat16 on a CPU without native bf16 (avx512_bf16 or amx_bf16): torch "
            "emulates it, 0.27x float32's env steps/s for atari-dqn-cpu on an AVX2 host; set "
            "learner.precision=auto (bf16 where it times faster) or float32")
