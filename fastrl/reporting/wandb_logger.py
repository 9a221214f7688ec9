"""Weights & Biases: a copy of a run's reports, its config, evaluations and videos.

On with ``--set logging.wandb=true`` (``logging.wandb_project``, ``wandb_entity`` and
``wandb_group`` choose where), with the ``[wandb]`` extra installed. The W&B run is named after
the run directory, keeps its files in ``RUN_DIR/wandb`` and its id in ``RUN_DIR/wandb/run_id``,
so that ``--resume`` continues the same W&B run. ``WANDB_MODE=offline`` needs no network;
``wandb sync RUN_DIR/wandb/offline-run-*`` uploads such a run later.

W&B is a mirror of metrics.jsonl, never a reason to stop or to wait: if it cannot start or fails
later (no API key, no network, its service gone) it says so once and the run goes on without it.
Every call into wandb runs on the logger's own thread, so a server that does not answer cannot
hold up the runner's budget checks or its supervision of the workers (see WandbLogger).
"""
from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from ..config import Config, ConfigError, load_run_config
from ..files.run_dir import make_dir, write_atomic

WANDB_EXTRA = "pip install 'fastrl[wandb]'"
WANDB_DIR = "wandb"  # in RUN_DIR; wandb.init(dir=RUN_DIR) writes its run folders there
RUN_ID_FILE = "run_id"  # in RUN_DIR/wandb
# W&B retries an unreachable server for 90 s by default; its thread gives up sooner and says so.
INIT_TIMEOUT_S = 30.0
QUEUE_SIZE = 256  # calls waiting for W&B, a report each mostly; past that they are dropped and counted
CLOSE_WAIT_S = 10.0  # the most the end of a run waits for W&B to finish
SERVICE_STOP_WAIT_S = 2.0  # then for W&B's service process to stop before it is killed


def require_wandb() -> None:
    """ConfigError naming the extra when wandb is not installed: checked before a run starts."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError(f"logging.wandb=true needs the wandb package: {WANDB_EXTRA}") from None


def open_wandb_logger(run_dir: Path, warn: Callable[[str], None]) -> WandbLogger | None:
    """The W&B logger of the run in ``run_dir`` when its config.toml sets logging.wandb, else
    None. It returns at once: W&B starts on the logger's thread (and says through ``warn``, once,
    if it cannot)."""
    try:
        cfg = load_run_config(run_dir)
    except ConfigError:
        return None  # no config.toml: not a directory that train() prepared
    if not cfg.logging.wandb:
        return None
    return WandbLogger(Path(run_dir), cfg, warn)


class WandbLogger:
    """One W&B run per run directory. Metrics are plotted against ``env_steps`` (a metric, not
    W&B's own step): a resumed run logs steps again from its checkpoint's count, which W&B's
    monotonic step would drop.

    Every call into wandb (import, init, log, video upload, finish) runs in order on one daemon
    thread, fed by a queue of QUEUE_SIZE calls: the caller never waits for W&B. A call that finds
    the queue full is dropped and counted (one notice). What the thread has to say is said
    through ``warn`` on the caller's thread, at its next call. ``close()`` waits CLOSE_WAIT_S at
    most."""

    def __init__(self, run_dir: Path, cfg: Config, warn: Callable[[str], None]):
        self.run_dir = run_dir
        self.warn = warn
        self.wandb = None  # the module, once the thread has imported it
        self.run = None
        self.failed = False  # after one failure W&B is left alone: one notice, not one per report
        self.closed = False
        self.dropped = 0
        self.calls: queue.Queue = queue.Queue(QUEUE_SIZE)
        self.notices: queue.SimpleQueue = queue.SimpleQueue()
        self.calls.put(lambda: self._start(cfg))
        self.thread = threading.Thread(target=self._serve, name="fastrl-wandb", daemon=True)
        self.thread.start()

    def log(self, record: dict) -> None:
        """A report's finite numbers (lists and unknown figures are left out, as in TensorBoard)."""
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self._submit("logging", lambda: self.run.log(scalars))

    def log_video(self, path: Path, env_steps: int, key: str = "eval/video") -> None:
        """An MP4 written by fastrl.evaluation.video, shown at ``env_steps``."""
        def log() -> None:
            self.run.log({"env_steps": env_steps, key: self.wandb.Video(str(path), format="mp4")})

        self._submit("logging a video", log)

    def close(self) -> None:
        """Let the thread send what is queued, finish the W&B run and stop W&B's service process
        (a run leaves no process behind), for CLOSE_WAIT_S at most: past that the run ends
        without W&B (_abandon)."""
        if self.closed:
            return
        self.closed = True
        deadline = time.monotonic() + CLOSE_WAIT_S
        try:
            self.calls.put(None, timeout=CLOSE_WAIT_S)  # the thread finishes W&B on it, then ends
        except queue.Full:
            pass
        self.thread.join(max(0.0, deadline - time.monotonic()))
        self._say_notices()
        if self.dropped:
            self.warn(f"[fastrl] Weights & Biases missed {self.dropped} report(s) it could not keep up with; "
                      f"metrics.jsonl has every report")
        if self.thread.is_alive():
            self.warn(f"[fastrl] Weights & Biases did not finish within {CLOSE_WAIT_S:.0f} s (a slow or unreachable "
                      f"server); the run ends without it: metrics.jsonl has every report, and `wandb sync` on the "
                      f"run's folder in {self.run_dir / WANDB_DIR} uploads what W&B kept")
            if self.wandb is not None and self.wandb.run in (None, self.run):  # no other W&B run needs it
                _abandon(self.wandb)

    def _submit(self, what: str, call: Callable[[], object]) -> None:
        self._say_notices()
        if self.failed or self.closed:
            return
        try:
            self.calls.put_nowait(lambda: self._best_effort(what, call))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                self.warn("[fastrl] Weights & Biases is not keeping up (a slow or unreachable server): reports are "
                          "left out of W&B while it catches up, counted at the end; metrics.jsonl has every report")

    def _say_notices(self) -> None:
        while True:
            try:
                notice = self.notices.get_nowait()
            except queue.Empty:
                return
            self.warn(notice)

    # On the logger's thread:

    def _serve(self) -> None:
        while (call := self.calls.get()) is not None:
            call()
        self._finish()

    def _start(self, cfg: Config) -> None:
        try:
            import wandb

            self.wandb = wandb
            settings = cfg.logging
            self.run = wandb.init(
                project=settings.wandb_project, entity=settings.wandb_entity or None,
                group=settings.wandb_group or None, name=self.run_dir.name, id=_saved_run_id(self.run_dir),
                resume="allow", dir=str(self.run_dir), config=cfg.to_dict(),
                # console="off": W&B must not wrap stdout, whose one JSON line the commands promise.
                settings=wandb.Settings(console="off", silent=True, init_timeout=INIT_TIMEOUT_S))
            _save_run_id(self.run_dir, self.run.id)
            self.run.define_metric("env_steps")
            self.run.define_metric("*", step_metric="env_steps")
        except Exception as exc:  # anything wandb.init raises: a missing API key, an unreachable server, ...
            self.failed = True
            self.notices.put(_failure_notice("could not start", exc))

    def _best_effort(self, what: str, call: Callable[[], object]) -> None:
        if self.run is None or self.failed:
            return
        try:
            call()
        except Exception as exc:
            self.failed = True
            self.notices.put(_failure_notice(f"failed while {what}", exc))

    def _finish(self) -> None:
        """Finish the W&B run (after a failure too) and stop W&B's service process, which outlives
        finish() until teardown (and which a failed init may have started)."""
        if self.wandb is None:
            return  # never imported: nothing started
        if self.run is not None:
            try:
                self.run.finish()
            except Exception as exc:
                if not self.failed:
                    self.notices.put(_failure_notice("failed while finishing", exc))
        if self.wandb.run in (None, self.run):  # no other W&B run of this process needs it
            _teardown_quietly(self.wandb)


def _abandon(wandb) -> None:
    """Leave a W&B that does not answer: its exit hook would wait for its service at interpreter
    exit, and its service (wandb-core, a child process) would hold the run's console and pipes
    until its own timeout. Teardown takes the hook off first, then waits for the service: on a
    daemon thread; the service is stopped here. W&B's own analytics are turned off first: the init
    that fails when its service goes would report itself to the same silent server from an exit
    hook, holding the interpreter's exit for its HTTP timeouts (12 s measured)."""
    _disable_wandb_analytics()
    threading.Thread(target=_teardown_quietly, args=(wandb,), name="fastrl-wandb-teardown", daemon=True).start()
    services = []
    for child in psutil.Process().children():
        try:
            if child.name() == "wandb-core":
                child.terminate()
                services.append(child)
        except psutil.Error:
            pass  # already gone
    # Told to stop, wandb-core still tries its server for ~15 s, holding the run's console pipes.
    _, alive = psutil.wait_procs(services, timeout=SERVICE_STOP_WAIT_S)
    for service in alive:
        try:
            service.kill()
        except psutil.Error:
            pass


def _disable_wandb_analytics() -> None:
    try:  # wandb >= 0.25; older releases send no such analytics
        from wandb.analytics.opentelemetry.opentelemetry_proxy import disable
    except ImportError:
        return
    disable()


def _teardown_quietly(wandb) -> None:
    try:
        wandb.teardown()
    except Exception:
        pass  # the service is already gone: nothing to stop


def _saved_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run this run directory logged to before; None the first time (W&B picks one)."""
    path = run_dir / WANDB_DIR / RUN_ID_FILE
    return path.read_text().strip() if path.is_file() else None


def _save_run_id(run_dir: Path, run_id: str) -> None:
    write_atomic(make_dir(run_dir / WANDB_DIR) / RUN_ID_FILE, run_id + "\n")


def _failure_notice(what: str, exc: Exception) -> str:
    detail = str(exc).strip().splitlines()
    return (f"[fastrl] Weights & Biases {what} ({type(exc).__name__}: {detail[0][:200] if detail else ''}); "
            f"training goes on without it, metrics.jsonl has every report")
