"""Autotune: coordinate search over the throughput knobs with short training runs, within a
wall-time budget."""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field

from ..config import Config, ConfigError, set_user_value, to_toml, validate
from ..envs import resolve_backend
from .diagnosis import STARTUP_MARGIN, LateStart, ProfileError
from .measure import STARTUP_ESTIMATE_S, check_durations, default_warmup, log_progress, measure_run
from .sampling import cpu_count

DEFAULT_TRIAL_SECONDS = 4.0
DEFAULT_BUDGET_S = 300.0
# A run's time beyond its train_for_seconds (probing the env, spawning, stopping the processes
# and the final checkpoint): 3-6 s on two cores. Autotune's estimate until it has measured its own.
OVERHEAD_ESTIMATE_S = 5.0
# A trial on a loaded machine can stop slower than every trial before it, past the estimate that
# admitted it: the search keeps this share of the budget (or the spread of the overheads seen,
# if wider) unspent, so that the last trial it admits still ends within the budget.
BUDGET_RESERVE = 0.05
MIN_GAIN = 0.03  # autotune keeps a setting only if it beats the best so far by this (noise)

TUNED_KEYS = ("env.num_workers", "env.envs_per_worker", "env.num_splits", "learner.batch_size",
              "env.num_threads", "env.thread_affinity", "inference.in_workers")
ENVPOOL_ONLY = ("env.num_threads", "env.thread_affinity")


@dataclass
class Trial:
    """One trial. ``status``: ok | late (started after its allowance) | failed | invalid (the
    settings did not validate); ``error`` unless ok; the measured fields only when ok."""
    settings: dict
    changed: dict  # the settings that differ from the profile as given
    status: str
    error: str | None = None
    train_fps: float | None = None  # env steps per second
    train_frames_per_s: float | None = None
    bottleneck: str | None = None
    elapsed_s: float | None = None

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass
class AutotuneResult:
    """The search: every trial, the best settings and the winning config as a TOML profile.
    ``profile``, ``overrides`` and ``hardware`` are filled in by the command."""
    budget_seconds: float
    elapsed_s: float
    trial_seconds: float
    warmup_seconds: float
    keys: list[str]
    complete: bool  # False when the budget ran out before one pass over the keys
    trials: list[Trial]
    base_fps: float  # the profile as given
    best_fps: float
    gain: float | None  # best_fps / base_fps
    best: dict
    set_args: str  # best as --set arguments
    toml: str
    profile: str | None = None
    overrides: dict = field(default_factory=dict)
    hardware: dict | None = None

    def to_dict(self) -> dict:
        return {**asdict(self), "trials": [trial.to_dict() for trial in self.trials]}


def get_key(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def with_settings(cfg: Config, settings: dict) -> Config:
    out = copy.deepcopy(cfg)
    for key, value in settings.items():
        set_user_value(out, key, value)
    return out


def set_args(settings: dict) -> str:
    return " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items())


def candidate_values(cfg: Config, key: str, cores: int) -> list:
    """Values of ``key`` worth a trial around ``cfg``'s current one (validity is checked later)."""
    current = get_key(cfg, key)
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
    else:  # env.thread_affinity, inference.in_workers
        values = [False, True]
    return [v for v in dict.fromkeys(values) if v != current]


def tuned_keys(cfg: Config) -> tuple[str, ...]:
    envpool = resolve_backend(cfg.env.id, cfg.env.backend) == "envpool"
    return tuple(k for k in TUNED_KEYS if envpool or k not in ENVPOOL_ONLY)


class Autotuner:
    """One search over ``tuned_keys(cfg)``. A trial costs at most start-up + ``warmup_s`` +
    ``trial_seconds`` + overhead; start-up and overhead are learned from the trials so far
    (STARTUP_ESTIMATE_S and OVERHEAD_ESTIMATE_S before the first), and a trial starts only if
    the rest of ``budget_s``, less a reserve (``reserve``), fits it. The profile as given, measured
    first, may start up as slowly as the rest of the budget allows."""

    def __init__(self, cfg: Config, budget_s: float, trial_seconds: float, warmup_s: float, log):
        self.started = time.time()
        self.cfg, self.budget_s, self.log = cfg, budget_s, log
        self.trial_seconds, self.warmup_s = trial_seconds, warmup_s
        self.keys = tuned_keys(cfg)
        self.cores = cpu_count()
        self.allowances: list[float] = []  # start-up allowances that fit, one per trial
        self.overheads: list[float] = []  # a trial's time beyond the trained seconds it ran, per trial
        # Those of the trials that ran to their measurement: a failed trial's (short, often
        # negative) would widen the spread the reserve follows.
        self.measured_overheads: list[float] = []
        self.trials: list[Trial] = []
        self.best_settings = {key: get_key(cfg, key) for key in self.keys}
        self.best_fps: float | None = None

    def allowance(self) -> float:
        return max(self.allowances) if self.allowances else STARTUP_ESTIMATE_S

    def cost(self) -> float:
        overhead = max(self.overheads) * STARTUP_MARGIN if self.overheads else OVERHEAD_ESTIMATE_S
        return self.allowance() + self.warmup_s + self.trial_seconds + overhead

    def reserve(self) -> float:
        stops = self.measured_overheads
        spread = max(stops) - min(stops) if stops else 0.0
        return max(BUDGET_RESERVE * self.budget_s, spread)

    def changed(self, settings: dict) -> dict:
        return {k: v for k, v in settings.items() if v != get_key(self.cfg, k)}

    def slack(self) -> float:
        """Seconds of the budget beyond the next trial's cost and the reserve (negative: over)."""
        return self.budget_s - (time.time() - self.started) - self.cost() - self.reserve()

    def fits(self) -> bool:
        return self.slack() >= 0

    def trial(self, settings: dict, startup: float | None = None) -> float | None:
        """Measure a valid setting and record it; its training env steps/s, or None if it failed
        to run or started too late (status "late": the allowance grows for the next trials).
        ``startup``: its start-up allowance, the one the trials so far learned by default."""
        changed = self.changed(settings)
        self.log(f"trial {len(self.trials) + 1}: {set_args(changed) or 'the profile as given'}")
        begun, startup = time.time(), self.allowance() if startup is None else startup
        ran = startup + self.warmup_s + self.trial_seconds  # its budget, unless it stopped once measured
        try:
            measured = measure_run(with_settings(self.cfg, settings), self.trial_seconds, self.warmup_s, False,
                                   startup)
        except LateStart as late:
            self.allowances.append(late.allowance())
            record = Trial(settings, changed, "late", error=str(late))
        except Exception as exc:  # a setting that cannot run here (memory, env threads) is a result too
            record = Trial(settings, changed, "failed", error=f"{type(exc).__name__}: {exc}")
        else:
            self.allowances.append(measured.startup_s * STARTUP_MARGIN)
            ran = measured.trained_s
            record = Trial(settings, changed, "ok", train_fps=measured.env_steps_per_s,
                           train_frames_per_s=measured.frames_per_s, bottleneck=measured.diagnosis.bottleneck,
                           elapsed_s=time.time() - begun)
        self.overheads.append(time.time() - begun - ran)
        if record.status == "ok":
            self.measured_overheads.append(self.overheads[-1])
        self.trials.append(record)
        return record.train_fps

    def measure_base(self) -> float:
        """The profile as given, measured again while it starts too late and the budget allows."""
        if not self.fits():
            raise ProfileError(f"--budget-seconds {self.budget_s:g} cannot fit one trial (~{self.cost():.0f} s: "
                               f"start-up, {self.warmup_s:g} s warm-up, {self.trial_seconds:g} s measured, "
                               f"stopping; and {self.reserve():.1f} s kept in reserve); raise it or lower --seconds")
        # Nothing is compared without the base, so its start-up may take what the budget leaves: on a
        # loaded machine a first start past STARTUP_ESTIMATE_S would otherwise leave too little
        # budget to try again.
        fps = self.trial(self.best_settings, self.allowance() + self.slack())
        while fps is None and self.trials[-1].status == "late" and self.fits():
            fps = self.trial(self.best_settings, self.allowance() + self.slack())
        if fps is None:
            raise ProfileError(f"the profile as given could not be measured: {self.trials[-1].error}")
        self.best_fps = fps
        return fps

    def search(self) -> bool:
        """One pass over the keys from the best settings so far, keeping a value only when it beats
        the best by MIN_GAIN; False when the budget ran out."""
        for key in self.keys:
            for value in candidate_values(with_settings(self.cfg, self.best_settings), key, self.cores):
                settings = {**self.best_settings, key: value}
                try:
                    validate(with_settings(self.cfg, settings))
                except ConfigError as exc:
                    self.trials.append(Trial(settings, self.changed(settings), "invalid", error=str(exc)))
                    continue
                if not self.fits():
                    return False
                fps = self.trial(settings)
                if fps is not None and fps > self.best_fps * (1 + MIN_GAIN):
                    self.best_settings, self.best_fps = settings, fps
        return True


def autotune(cfg: Config, budget_s: float = DEFAULT_BUDGET_S, trial_seconds: float = DEFAULT_TRIAL_SECONDS,
             warmup_s: float | None = None, log=log_progress) -> AutotuneResult:
    """Search ``TUNED_KEYS`` one at a time (keeping a value only when it beats the best training
    throughput by MIN_GAIN), within ``budget_s`` seconds of wall time in all (see ``Autotuner``).
    Every candidate must pass ``validate``."""
    warmup_s = default_warmup(trial_seconds) if warmup_s is None else warmup_s
    check_durations(trial_seconds, warmup_s)
    validate(cfg)
    tuner = Autotuner(cfg, budget_s, trial_seconds, warmup_s, log)
    base_fps = tuner.measure_base()
    complete = tuner.search()
    best, best_fps = tuner.best_settings, tuner.best_fps
    return AutotuneResult(budget_seconds=budget_s, elapsed_s=time.time() - tuner.started,
                          trial_seconds=trial_seconds, warmup_seconds=warmup_s, keys=list(tuner.keys),
                          complete=complete, trials=tuner.trials, base_fps=base_fps, best_fps=best_fps,
                          gain=best_fps / base_fps if base_fps else None, best=best, set_args=set_args(best),
                          toml=to_toml(with_settings(cfg, best)))
