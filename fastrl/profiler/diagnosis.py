"""Pure functions on report dicts (lines of metrics.jsonl): the steady-state window of a run,
the component breakdown between two reports, and the diagnosis that names the bottleneck.

Also the profiler's errors, which every other module of the package raises.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..reporting.metrics import INFERENCE_TIMINGS, LEARNER_STATS, WORKER_TIMINGS

MIN_WINDOW_S = 0.5
STARTUP_MARGIN = 1.2  # later runs may start slower than the first (more workers, more envs)

# Cumulative seconds of each process group, named as in metrics.jsonl ("rollout/env_step_s").
GROUPS = {"rollout": WORKER_TIMINGS,
          "inference": tuple(name for name in INFERENCE_TIMINGS if name.endswith("_s")),
          "learner": tuple(name for name in LEARNER_STATS if name.endswith("_s"))}

# Diagnosis thresholds, as shares of the measured wall time. A stage is busy when it works for
# BUSY of the window; a wait is high when the waiting side spends WAIT of its time blocked.
BUSY = 0.6
WAIT = 0.25
CPU_SATURATED = 0.85  # share of the available cores used by the run's processes


class ProfileError(ValueError):
    """A profiling request that cannot be measured; the message is one line that names the fix."""


class LateStart(ProfileError):
    """A run that ended before its steady state began: start-up took longer than allowed."""

    def __init__(self, flowed_at: float | None, ended_at: float, warmup_s: float):
        self.flowed_at, self.ended_at = flowed_at, ended_at
        started = f"at {flowed_at:.1f} s" if flowed_at is not None else "never"
        super().__init__(f"the run ended at {ended_at:.1f} s with less than {MIN_WINDOW_S} s of steady state (it "
                         f"started flowing {started}, then {warmup_s:g} s warm-up); the machine may be busy: retry")

    def allowance(self, margin: float = STARTUP_MARGIN) -> float:
        """A start-up allowance that would have fit this run, ``margin`` times its start-up."""
        return margin * self.flowed_at if self.flowed_at is not None else 2 * self.ended_at


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


def window_measured(reports: list[dict], warmup_s: float, seconds: float, training: bool) -> bool:
    """Whether ``reports`` already hold a steady-state window (``steady_window``) of ``seconds``."""
    try:
        first, last = steady_window(reports, warmup_s, training)
    except LateStart:
        return False
    return last["wall_time"] - first["wall_time"] >= seconds


def _component(group: str, timing: str) -> str:
    """Breakdown name of a metrics timing: the batcher's "inference_forward_s" -> "forward", a
    worker's "inference_s" (its own acting) -> "inference"."""
    name = timing.removeprefix("inference_") if group == "inference" else timing
    return name.removesuffix("_s")


def breakdown(report_a: dict, report_b: dict, num_workers: int) -> dict:
    """The component breakdown of the window between two reports of one run.

    Reports hold cumulative component seconds (fastrl.reporting.metrics): ``rollout/*`` summed over the
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
        shares = {_component(group, name): delta(f"{group}/{name}") / per for name in timings}
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


def share_keys(bd: dict) -> list[str]:
    """The keys of a breakdown that are shares of wall time ("rollout/env_step" ... "learner/busy")."""
    return [key for key in bd if key.split("/")[0] in GROUPS and not key.endswith(("_per_s", "_per_batch"))]


@dataclass
class Diagnosis:
    bottleneck: str  # learner | slots | inference | env | cpu | latency | balanced
    message: str  # one line: "<bottleneck>-bound: <evidence> -> <knob>"


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

    When the workers act for themselves (``inference.in_workers``: ``rollout/inference`` > 0 and
    no batcher), the policy's stage is the workers' acting share: rule 3 becomes workers busy
    >= BUSY with more of it acting than stepping, and rule 4 the same with more stepping.
    """
    rollout, wait_slots, wait_actions = bd["rollout/busy"], bd["rollout/wait_slots"], bd["rollout/wait_actions"]
    learner, inference = bd["learner/busy"], bd["inference/busy"]
    acting = bd.get("rollout/inference", 0.0)  # the workers' own forward passes (inference.in_workers)
    stepping = rollout - acting
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
    if acting and rollout >= BUSY and acting > stepping and not saturated:
        return Diagnosis("inference", f"inference-bound: workers acting {_pct(acting)}, stepping {_pct(stepping)} "
                                      f"-> raise env.envs_per_worker (bigger batches) or add env.num_workers; "
                                      f"on a GPU, inference.in_workers=false")
    if rollout >= BUSY and not saturated:
        busy = f"workers busy {_pct(rollout)} (stepping {_pct(stepping)}, acting {_pct(acting)})" if acting \
            else f"workers stepping {_pct(rollout)}"
        return Diagnosis("env", f"env-bound: {busy} -> add env.num_workers / env.envs_per_worker")
    if saturated:
        policy = f"acting {_pct(acting)}" if acting else f"batcher {_pct(inference)}"
        return Diagnosis("cpu", f"cpu-bound: the run uses {cores_used:.2f} of {cpu_count} cores (workers stepping "
                                f"{_pct(stepping)}, {policy}, learner {_pct(learner)}) -> more "
                                f"cores, or rebalance with --autotune (env.num_workers, env.num_threads)")
    if wait_actions >= WAIT:
        return Diagnosis("latency", f"latency-bound: workers waiting for actions {_pct(wait_actions)} while the "
                                    f"batcher is busy {_pct(inference)} -> raise env.num_splits (more batches in "
                                    f"flight) or env.envs_per_worker")
    policy = ("workers acting", acting) if acting else ("batcher", inference)
    busiest = max((("workers stepping", stepping), policy, ("learner", learner)), key=lambda item: item[1])
    return Diagnosis("balanced", f"no single bottleneck: busiest is {busiest[0]} {_pct(busiest[1])} -> "
                                 f"try --autotune")
