"""fastrl-sweep: a hyperparameter search on Optuna whose every trial is a whole fastrl run.

The sweep directory::

    SWEEP_DIR/sweep.db               the Optuna storage (SQLite): studies, trials, params, curves;
                                     optuna-dashboard sqlite:///SWEEP_DIR/sweep.db shows it
    SWEEP_DIR/<study>/trial-0003/    trial 3's run directory (fastrl-train's; what it printed: trial.log);
                                     trial-0003-XXXXXXXX where trial-0003 is another study's
    SWEEP_DIR/<study>/best.toml      the best trial's configuration, as a profile fastrl-train takes
    SWEEP_DIR/<study>/.lock          held by the fastrl-sweep working on the study from here

The rules that let a sweep be killed and run again with the same command:

- A study is one sweep: what defines it (profile, env, --set, params, objective, direction,
  budget) is stored with it, and a command that defines another is refused.
- A trial runs in a folder made for it, never in one that was there: a study made anew over an
  old sweep directory (its storage deleted) leaves the old trials' folders as they are.
- A trial is finished when complete or pruned. A new trial is asked for only while finished +
  running trials are fewer than ``--trials``, so the study ends at exactly that many finished.
- A trial cut off (the sweep killed, even by SIGKILL, or interrupted) is marked failed and queued
  again with the same params (Optuna's RetryHeartbeatStaleTrialCallback), and runs before any new
  one: at once by the next fastrl-sweep on the study from this directory (holding the lock, it
  knows every trial this directory's sweeps left running is cut off); after HEARTBEAT_GRACE_S
  without a heartbeat for a sweep elsewhere sharing the storage (``--storage``).
- A trial whose run fails (an error, no finite objective) is marked failed and not retried: its
  place goes to a new trial; FAILURES_IN_A_ROW such trials in a row stop the sweep.
- Each trial reports its objective at PRUNE_RUNGS evenly spaced points of the budget (env steps,
  or trained seconds with a time budget), each point the last report at or before it: a
  MedianPruner stops a trial whose best value so far is behind the median of the completed
  trials' at the same point, after a warm-up fraction of the budget and once
  ``--prune-after-trials`` trials completed.
"""
from __future__ import annotations

import math
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config, ConfigError, load_profile, parse_override, to_toml
from ..files.run_dir import LOCK_FILE, RunDirError, RunDirLock, remove_unused_run_dir, write_atomic
from ..reporting.console import write_best_effort
from .search_space import Param, check_objective, check_params, configured
from .trial import OUTPUT_FILE, ObjectiveCurve, Rungs, TrialProcess

STORAGE_FILE = "sweep.db"
BEST_PROFILE = "best.toml"
STUDY_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # a folder of the sweep directory
DEFINITION_ATTR = "fastrl_sweep"  # the study's user attribute holding what defines it
PRUNE_RUNGS = 20
TAIL_FRACTION = 0.1  # a trial's value: its curve's mean over the last tenth of its budget
POLL_S = 0.5  # how often a trial's metrics.jsonl is read
HEARTBEAT_S = 10  # Optuna's heartbeat of a running trial
HEARTBEAT_GRACE_S = 60  # a trial without a heartbeat for this long was cut off (a storage shared between hosts)
SQLITE_BUSY_S = 60.0  # how long a write to sweep.db waits for another sweep's on the same file
FAILURES_IN_A_ROW = 3


class SweepError(ConfigError):
    """The sweep cannot go on; the message is one line that names the fix."""


@dataclass
class SweepSpec:
    """One fastrl-sweep command line."""

    profile: str
    params: list[Param]
    objective: str
    trials: int
    study: str
    sweep_dir: Path
    env: str | None = None
    overrides: list[str] = field(default_factory=list)
    direction: str = "maximize"
    budget_env_steps: int = 0
    budget_seconds: float = 0.0
    storage: str | None = None
    jobs: int = 1
    pruner: str = "median"
    prune_warmup: float = 0.25
    prune_after_trials: int = 3
    seed: int | None = None

    @property
    def study_dir(self) -> Path:
        return Path(self.sweep_dir) / self.study

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(Path(self.sweep_dir) / STORAGE_FILE).resolve()}"

    @property
    def profile_arg(self) -> str:
        """The profile as every trial names it: a profile file by its absolute path."""
        path = Path(self.profile)
        return str(path.resolve()) if path.suffix == ".toml" and path.is_file() else self.profile

    @property
    def axis(self) -> tuple[str, float]:
        """The budget's axis (a metrics.jsonl key) and the budget on it."""
        if self.budget_env_steps:
            return "env_steps", self.budget_env_steps
        return "trained_seconds", self.budget_seconds

    @property
    def x_key(self) -> str:
        """Where on the budget's axis a report puts the objective: an evaluation's figures are
        the weights' at eval_at_env_steps."""
        axis, _ = self.axis
        return "eval_at_env_steps" if axis == "env_steps" and self.objective.startswith("eval") else axis

    def budget_args(self) -> list[str]:
        if self.budget_env_steps:
            return ["--train-for-env-steps", str(self.budget_env_steps)]
        return ["--train-for-seconds", repr(self.budget_seconds)]

    def definition(self) -> dict:
        """What makes this sweep the study it is (not --trials or --jobs: a study may be extended
        or run wider)."""
        axis, budget = self.axis
        return {"profile": self.profile_arg, "env": self.env, "set": list(self.overrides),
                "params": sorted(p.spec for p in self.params), "objective": self.objective,
                "direction": self.direction, "budget": f"{budget:g} {axis}"}


def base_config(spec: SweepSpec) -> Config:
    """The profile with --env and every --set: what each trial starts from, with its budget."""
    env = [("env.id", spec.env)] if spec.env else []
    return configured(load_profile(spec.profile), [*env, *(parse_override(text) for text in spec.overrides)])


def trial_config(cfg: Config, spec: SweepSpec, values: dict[str, str]) -> Config:
    """``cfg`` with a trial's params (``--set`` texts) and the sweep's budget, validated."""
    return configured(cfg, [*values.items(), ("train_for_env_steps", spec.budget_env_steps),
                            ("train_for_seconds", spec.budget_seconds)])


def check_spec(spec: SweepSpec) -> tuple[Config, list[Param]]:
    """Every refusal that needs no trial: ConfigError, one line. Returns the base config and the
    params with their choices typed."""
    if not STUDY_NAME.fullmatch(spec.study):
        raise ConfigError(f"--study '{spec.study}': use letters, digits, '_', '.' and '-' (it names a folder)")
    if spec.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {spec.trials}")
    if spec.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {spec.jobs}")
    if bool(spec.budget_env_steps) == bool(spec.budget_seconds):
        raise ConfigError("give each trial one budget: --budget-env-steps N or --budget-seconds S")
    if spec.budget_env_steps < 0 or not (spec.budget_seconds >= 0 and math.isfinite(spec.budget_seconds)):
        raise ConfigError("the budget must be > 0")
    if not 0 <= spec.prune_warmup < 1:
        raise ConfigError(f"--prune-warmup is a fraction of the budget in [0, 1), got {spec.prune_warmup}")
    if spec.prune_after_trials < 0:
        raise ConfigError(f"--prune-after-trials must be >= 0, got {spec.prune_after_trials}")
    if not spec.params:
        raise ConfigError("nothing to search: add --param KEY=DISTRIBUTION:ARGS (e.g. "
                          "--param learner.lr=loguniform:1e-5:1e-2)")
    cfg = base_config(spec)
    params = check_params(spec.params, cfg, spec.overrides)
    check_objective(spec.objective, cfg)
    trial_config(cfg, spec, {})
    return cfg, params


def _optuna():
    """Optuna, quiet: the sweep prints its own lines, and the heartbeat and retry it relies on
    are marked experimental."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("fastrl-sweep needs optuna: pip install 'fastrl[sweep]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # The sweep records the heartbeats itself, as a trial's process runs (Study.optimize would).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    return optuna


def storage_errors(optuna) -> tuple[type[Exception], ...]:
    """What a storage raises when its database fails (locked, gone, refused): Optuna's wrapper
    and SQLAlchemy's own errors."""
    import sqlalchemy.exc

    return optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError


def storage_failure(url: str, exc: BaseException) -> str:
    """The one line for a storage that failed as the sweep worked: the database's own words
    (Optuna's wrapper blames the data), and what to do."""
    seen = set()
    while id(exc) not in seen and (exc.__cause__ or exc.__context__) is not None:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    fix = ("another program may be writing it, or its file system lacks working POSIX locks (NFS): pass --storage "
           "with a server database (docs/sweeps.md)" if url.startswith("sqlite") else "check the database server")
    return f"the storage {url} failed ({first}); {fix}, then run the same command to go on"


def open_study(spec: SweepSpec):
    """The study of ``spec`` in its storage (in the sweep directory, which exists, unless
    ``--storage``), made or continued; ConfigError for a storage that cannot be opened or a
    study that is another sweep."""
    optuna = _optuna()
    url = spec.storage_url
    engine = {"connect_args": {"timeout": SQLITE_BUSY_S}} if url.startswith("sqlite") else {}
    try:
        storage = optuna.storages.RDBStorage(
            url, engine_kwargs=engine, heartbeat_interval=HEARTBEAT_S, grace_period=HEARTBEAT_GRACE_S,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback())
    except Exception as exc:  # sqlalchemy's and the drivers' errors: a URL, a server, a file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot open the storage {url}: {first}; pass an SQLAlchemy URL (sqlite:///PATH, "
                          f"postgresql://...) with --storage") from None
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=spec.prune_after_trials,
                                          n_warmup_steps=int(spec.prune_warmup * spec.axis[1]))
              if spec.pruner == "median" else optuna.pruners.NopPruner())
    study = optuna.create_study(storage=storage, study_name=spec.study, direction=spec.direction,
                                sampler=optuna.samplers.TPESampler(seed=spec.seed), pruner=pruner,
                                load_if_exists=True)
    ours, saved = spec.definition(), study.user_attrs.get(DEFINITION_ATTR)
    if saved is None:
        if study.get_trials(deepcopy=False):
            raise ConfigError(f"study '{spec.study}' in {url} was not made by fastrl-sweep: pass another --study")
        study.set_user_attr(DEFINITION_ATTR, ours)
    elif saved != ours:
        differ = "; ".join(f"{k}: {saved.get(k)!r} there, {ours[k]!r} here" for k in ours if saved.get(k) != ours[k])
        raise ConfigError(f"study '{spec.study}' in {url} is another sweep ({differ}): run it with the command "
                          f"that started it, or pass another --study")
    return study


@dataclass
class SweepResult:
    table: str
    best_profile: Path | None
    summary: str


class Sweep:
    """Runs a checked ``spec``'s trials, ``spec.jobs`` at a time, until the study has
    ``spec.trials`` finished ones; ``run()`` returns its table and best profile."""

    def __init__(self, spec: SweepSpec, cfg: Config, params: list[Param], study):
        self.optuna = _optuna()
        self.spec, self.cfg, self.params, self.study = spec, cfg, params, study
        self.distributions = {p.key: p.distribution() for p in params}
        self.owner = f"{socket.gethostname()}:{spec.study_dir.resolve()}"
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.failures_in_a_row = 0
        self.error = ""
        self.crash: BaseException | None = None

    def run(self) -> SweepResult:
        """Work until the study is done. A KeyboardInterrupt (or any exception) here stops every
        running trial, marks it cut off and queues it again, then goes on up."""
        self.retry_cut_off(self.owner)
        workers = [threading.Thread(target=self._work, name=f"fastrl-sweep-{i}", daemon=True)
                   for i in range(self.spec.jobs)]
        for worker in workers:
            worker.start()
        try:
            # Not Thread.join: on Python < 3.13 a KeyboardInterrupt inside join(timeout) can leave the
            # thread marked as stopped while it runs, and the stop below would not wait for it.
            while any(worker.is_alive() for worker in workers):
                time.sleep(0.2)
        except BaseException:
            # The running trials' runners are writing their final checkpoints: a second Ctrl-C
            # must not leave them unwatched.
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_IGN)
            self.stopping.set()
            for worker in workers:
                worker.join()
            raise
        if self.crash is not None:
            raise self.crash
        if self.error:
            raise SweepError(self.error)
        return self.result()

    def finished(self) -> int:
        states = self.optuna.trial.TrialState
        return len(self.study.get_trials(deepcopy=False, states=(states.COMPLETE, states.PRUNED)))

    def retry_cut_off(self, owner: str) -> None:
        """Fail and queue again every trial ``owner`` (this directory's sweeps) left running."""
        for trial in self.study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,)):
            if trial.user_attrs.get("sweep") == owner:
                self._fail_and_retry(trial._trial_id)
                self.say(f"trial {trial.number} was cut off: queued again")

    def _fail_and_retry(self, trial_id: int) -> None:
        storage = self.study._storage
        try:
            storage.set_trial_state_values(trial_id, state=self.optuna.trial.TrialState.FAIL)
        except self.optuna.exceptions.UpdateFinishedTrialError:
            return  # another sweep on a shared storage got there first
        storage.get_heartbeat_stale_trial_callback()(self.study, storage.get_trial(trial_id))

    def _work(self) -> None:
        try:
            while not self.stopping.is_set():
                trial = self._next_trial()
                if trial is None:
                    return
                try:
                    self._run_trial(trial)
                except self.optuna.exceptions.UpdateFinishedTrialError:
                    # Its heartbeats stopped for HEARTBEAT_GRACE_S (the sweep suspended, say): a
                    # sweep failed it as cut off and queued it again; the retry is the trial now.
                    self.say(f"trial {trial.number} was marked cut off while it ran (no heartbeat for "
                             f"{HEARTBEAT_GRACE_S} s): its run stopped, its retry runs instead")
        except BaseException as exc:  # a defect: the main thread raises it, the others stop
            self.crash = exc
            self.stopping.set()

    def _next_trial(self):
        """A new trial (or one queued again), or None once the study has its trials."""
        states = self.optuna.trial.TrialState
        while not self.stopping.is_set():
            with self.lock:
                self.optuna.storages.fail_stale_trials(self.study)
                finished = self.finished()
                if finished >= self.spec.trials:
                    return None
                running = len(self.study.get_trials(deepcopy=False, states=(states.RUNNING,)))
                if finished + running < self.spec.trials:
                    trial = self.study.ask(self.distributions)
                    self.study._storage.record_heartbeat(trial._trial_id)
                    trial.set_user_attr("sweep", self.owner)
                    trial.set_user_attr("run_dir", str(self.new_run_dir(trial.number)))
                    return trial
            self.stopping.wait(POLL_S)  # every place taken: one may fail and free its place
        return None

    def new_run_dir(self, number: int) -> Path:
        """A folder made for trial ``number``: trial-NNNN, or trial-NNNN-XXXXXXXX (a name no
        other folder has) where trial-NNNN is taken. A study runs each trial number once, so
        what is there is another study's (one made anew over this directory): it is left alone,
        and a link there is never followed."""
        path = self.spec.study_dir / f"trial-{number:04d}"
        try:
            path.mkdir()
        except FileExistsError:
            taken, path = path, Path(tempfile.mkdtemp(prefix=f"{path.name}-", dir=self.spec.study_dir))
            self.say(f"trial {number}: {taken} is another study's, left as it is: this trial runs in {path}")
        return path

    def _run_trial(self, trial) -> None:
        spec = self.spec
        values = {p.key: p.set_text(trial.params[p.key]) for p in self.params}
        run_dir = Path(trial.user_attrs["run_dir"])
        shown = " ".join(f"{k}={v}" for k, v in values.items())
        retried = self.study._storage.get_trial_system_attrs(trial._trial_id).get("failed_trial")
        self.say(f"trial {trial.number}{f' (retry of {retried})' if retried is not None else ''}: {shown} -> {run_dir}")
        try:
            trial_config(self.cfg, spec, values)
        except ConfigError as exc:
            return self._failed(trial, f"its config is refused: {exc}")
        command = [sys.executable, "-m", "fastrl.cli", "--profile", spec.profile_arg,
                   *(["--env", spec.env] if spec.env else []),
                   *(arg for text in [*spec.overrides, *(f"{k}={v}" for k, v in values.items())]
                     for arg in ("--set", text)),
                   "--run-dir", str(run_dir), "--quiet", *spec.budget_args()]
        proc = TrialProcess(command, run_dir)
        curve = ObjectiveCurve(run_dir / "metrics.jsonl", spec.objective, spec.x_key)
        rungs = Rungs(spec.axis[1], PRUNE_RUNGS)
        beat = time.monotonic()
        try:
            while proc.running():
                if self.stopping.wait(POLL_S):
                    proc.stop()
                    self._fail_and_retry(trial._trial_id)
                    return None
                reported = self._report(trial, curve, rungs)
                if reported and trial.should_prune():
                    proc.stop()
                    self._tell(trial, state=self.optuna.trial.TrialState.PRUNED)
                    step, value = reported
                    return self._finished(trial, f"pruned at {step:,} {spec.axis[0]}: {spec.objective} {value:.4g}")
                if time.monotonic() - beat >= HEARTBEAT_S:
                    self.study._storage.record_heartbeat(trial._trial_id)
                    beat = time.monotonic()
            proc.reap()
            self._report(trial, curve, rungs)
        except BaseException:
            proc.stop()
            raise
        if proc.returncode != 0:
            return self._failed(trial, f"fastrl-train exited with {proc.returncode}: {proc.last_line()} (see "
                                       f"{run_dir / OUTPUT_FILE})")
        value = curve.tail_mean(spec.axis[1] * TAIL_FRACTION)
        if value is None:
            return self._failed(trial, f"{run_dir / 'metrics.jsonl'} has no finite {spec.objective}: raise the "
                                       f"budget, or pick an objective the run reports")
        self._tell(trial, value)
        return self._finished(trial, f"complete: {spec.objective} {value:.4g}")

    def _tell(self, trial, value=None, state=None) -> None:
        """Study.tell, raising UpdateFinishedTrialError (as the storage does for a report) for a
        trial another sweep has failed meanwhile."""
        if self.study._storage.get_trial(trial._trial_id).state.is_finished():
            raise self.optuna.exceptions.UpdateFinishedTrialError(f"trial {trial.number} is finished")
        self.study.tell(trial, value, state=state)

    @staticmethod
    def _report(trial, curve: ObjectiveCurve, rungs: Rungs) -> tuple[int, float] | None:
        """Report the rungs the new points pass; the last (step, value) reported, if any."""
        reported = None
        for x, value in curve.read():
            for reported in rungs.passed(x, value):
                trial.report(reported[1], reported[0])
        return reported

    def _finished(self, trial, outcome: str) -> None:
        with self.lock:
            self.failures_in_a_row = 0
            finished = self.finished()
        self.say(f"trial {trial.number} {outcome} ({finished}/{self.spec.trials} finished)")

    def _failed(self, trial, message: str) -> None:
        trial.set_user_attr("error", message)
        self._tell(trial, state=self.optuna.trial.TrialState.FAIL)
        self.say(f"trial {trial.number} failed: {message}")
        with self.lock:
            self.failures_in_a_row += 1
            if self.failures_in_a_row >= FAILURES_IN_A_ROW and not self.error:
                self.error = (f"{FAILURES_IN_A_ROW} trials in a row failed, the last (trial {trial.number}) as "
                              f"{message}; fix that and run the same command to go on")
                self.stopping.set()

    def say(self, text: str) -> None:
        write_best_effort(sys.stderr, f"[fastrl-sweep] {text}")

    def result(self) -> SweepResult:
        trials = self.study.get_trials(deepcopy=False)
        states = self.optuna.trial.TrialState
        complete = [t for t in trials if t.state == states.COMPLETE]
        best = self.study.best_trial if complete else None
        table = trials_table(trials, self.params, self.spec.objective, best.number if best else None)
        if best is None:
            return SweepResult(table, None, "no trial completed: no best profile written")
        path = self.write_best_profile(best)
        summary = (f"best: trial {best.number}, {self.spec.objective} {best.value:.4g}; its configuration: {path} "
                   f"(fastrl-train --profile {path}); dashboard: optuna-dashboard {self.spec.storage_url}")
        return SweepResult(table, path, summary)

    def write_best_profile(self, best) -> Path:
        """The base profile's values with every --set and the best trial's params, as a profile
        TOML (the profile's own budget: the sweep's was for comparing trials), written atomically
        (a link there is replaced, not written through)."""
        values = {p.key: p.set_text(best.params[p.key]) for p in self.params}
        cfg = configured(self.cfg, values.items())
        sets = "".join(f" --set {text}" for text in self.spec.overrides)
        header = (f"# fastrl-sweep study '{self.spec.study}', trial {best.number}: {self.spec.objective} "
                  f"{best.value:.6g} ({self.spec.direction}), in {self.spec.axis[1]:g} {self.spec.axis[0]}\n"
                  f"# profile {self.spec.profile_arg}{f' --env {self.spec.env}' if self.spec.env else ''}{sets}\n"
                  f"# params: {' '.join(f'{k}={v}' for k, v in values.items())}\n")
        path = self.spec.study_dir / BEST_PROFILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, header + to_toml(cfg))
        return path


def trials_table(trials, params: list[Param], objective: str, best: int | None) -> str:
    """One line per trial: number, state, objective (a pruned trial's last reported value and
    its step in parentheses), params, run directory and a note."""
    retried_as = {t.system_attrs["retry_history"][-1]: t.number for t in trials if t.system_attrs.get("retry_history")}
    header = ["trial", "state", objective, *(p.key for p in params), "run dir", "note"]
    rows = [header]
    for t in sorted(trials, key=lambda t: t.number):
        if t.value is not None:
            value = f"{t.value:.4g}"
        elif t.intermediate_values:
            step, last = max(t.intermediate_values.items())
            value = f"({last:.4g} at {step:,})"
        else:
            value = "-"
        params_shown = [_shown(p, t.params[p.key]) if p.key in t.params else "-" for p in params]
        note = ("best" if t.number == best else f"cut off; retried as {retried_as[t.number]}"
                if t.number in retried_as else t.user_attrs.get("error", ""))
        rows.append([str(t.number), t.state.name.lower(), value, *params_shown, t.user_attrs.get("run_dir", "-"), note])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]).rstrip() for row in rows)


def _shown(param: Param, value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return param.set_text(value) if param.kind == "choice" else str(value)


def _lock_holder(path: Path) -> str:
    """The fastrl-sweep holding a study's lock, by the pid it recorded."""
    try:
        return f"pid {int(path.read_text().split()[0])}"
    except (OSError, ValueError, IndexError):  # it took the lock a moment ago and has not written its pid yet
        return "another fastrl-sweep"


def make_study_dir(spec: SweepSpec) -> list[Path]:
    """Make SWEEP_DIR/STUDY; the folders it made, outermost first. ConfigError, one line, for a
    path that cannot be a folder."""
    study_dir = spec.study_dir
    for path, what in ((Path(spec.sweep_dir), f"--sweep-dir '{spec.sweep_dir}' is a file: pass a folder (one is made "
                                              f"if missing)"),
                       (study_dir, f"'{study_dir}' is a file, where study '{spec.study}' keeps its trials: move it, "
                                   f"or pass another --study")):
        if path.exists() and not path.is_dir():
            raise ConfigError(what)
    made = [path for path in reversed([study_dir, *study_dir.parents]) if not path.exists()]
    try:
        study_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make the sweep's folder '{study_dir}' ({exc.strerror}): pass a writable "
                          f"--sweep-dir") from None
    return made


def remove_made(made: list[Path]) -> None:
    """Remove the folders make_study_dir made while they hold nothing but the study's lock file:
    a refused sweep leaves nothing behind."""
    for path in reversed(made):
        remove_unused_run_dir(path)
        if path.exists():
            return


def run_sweep(spec: SweepSpec) -> SweepResult:
    """Check ``spec``, take the study's lock and run it to the end (module docstring)."""
    cfg, params = check_spec(spec)
    spec.params = params
    optuna = _optuna()  # before anything is made: a refused sweep leaves nothing behind
    made = make_study_dir(spec)
    try:
        lock = RunDirLock.take(spec.study_dir)
    except RunDirError:
        raise ConfigError(f"study '{spec.study}' in '{spec.sweep_dir}' is being run by "
                          f"{_lock_holder(spec.study_dir / LOCK_FILE)}: wait for it or stop it, or pass another "
                          f"--study") from None
    try:
        try:
            lock.record_pid()
            study = open_study(spec)
        except BaseException:
            lock.release()
            remove_made(made)
            raise
        return Sweep(spec, cfg, params, study).run()
    except storage_errors(optuna) as exc:
        raise SweepError(storage_failure(spec.storage_url, exc)) from None
    finally:
        lock.release()
