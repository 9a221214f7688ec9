"""Weights & Biases: a copy of a run's reports, its config, evaluations and videos.

On with ``--set logging.wandb=true`` (``logging.wandb_project``, ``wandb_entity`` and
``wandb_group`` choose where), with the ``[wandb]`` extra installed. The W&B run is named after
the run directory, keeps its files in ``RUN_DIR/wandb`` and its id in ``RUN_DIR/wandb/run_id``,
so that ``--resume`` continues the same W&B run. ``WANDB_MODE=offline`` needs no network;
``wandb sync RUN_DIR/wandb/offline-run-*`` uploads such a run later.

W&B is a mirror of metrics.jsonl, never a reason to stop: if it cannot start or fails later (no
API key, no network, its service gone) it says so once and the run goes on without it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from .config import Config, ConfigError, load_run_config

WANDB_EXTRA = "pip install 'fastrl[wandb]'"
WANDB_DIR = "wandb"  # in RUN_DIR; wandb.init(dir=RUN_DIR) writes its run folders there
RUN_ID_FILE = "run_id"  # in RUN_DIR/wandb
# W&B retries an unreachable server for 90 s by default; the runner's reports wait meanwhile.
from .run_dir import make_dir, write_atomic
INIT_TIMEOUT_S = 30.0


def require_wandb() -> None:
    """ConfigError naming the extra when wandb is not installed: checked before a run starts."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError(f"logging.wandb=true needs the wandb package: {WANDB_EXTRA}") from None


def open_wandb_logger(run_dir: Path, warn: Callable[[str], None]) -> WandbLogger | None:
    """The W&B logger of the run in ``run_dir`` when its config.toml sets logging.wandb; None when
    it does not, or when W&B cannot start (said once through ``warn``)."""
    try:
        cfg = load_run_config(run_dir)
    except ConfigError:
        return None  # no config.toml: not a directory that train() prepared
    if not cfg.logging.wandb:
        return None
    try:
        return WandbLogger(Path(run_dir), cfg, warn)
    except Exception as exc:  # anything wandb.init raises: a missing API key, an unreachable server, ...
        warn(_failure_notice("could not start", exc))
        return None


class WandbLogger:
    """One W&B run per run directory. Metrics are plotted against ``env_steps`` (a metric, not
    W&B's own step): a resumed run logs steps again from its checkpoint's count, which W&B's
    monotonic step would drop."""

    def __init__(self, run_dir: Path, cfg: Config, warn: Callable[[str], None]):
        import wandb

        self.wandb = wandb
        self.warn = warn
        self.failed = False  # after one failure W&B is left alone: one notice, not one per report
        settings = cfg.logging
        self.run = wandb.init(
            project=settings.wandb_project, entity=settings.wandb_entity or None,
            group=settings.wandb_group or None, name=run_dir.name, id=_saved_run_id(run_dir), resume="allow",
            dir=str(run_dir), config=cfg.to_dict(),
            # console="off": W&B must not wrap stdout, whose one JSON line the commands promise.
            settings=wandb.Settings(console="off", silent=True, init_timeout=INIT_TIMEOUT_S))
        _save_run_id(run_dir, self.run.id)
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    def log(self, record: dict) -> None:
        """A report's finite numbers (lists and unknown figures are left out, as in TensorBoard)."""
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self._best_effort("logging", lambda: self.run.log(scalars))

    def log_video(self, path: Path, env_steps: int, key: str = "eval/video") -> None:
        """An MP4 written by fastrl.video, shown at ``env_steps``."""
        def log() -> None:
            self.run.log({"env_steps": env_steps, key: self.wandb.Video(str(path), format="mp4")})

        self._best_effort("logging a video", log)

    def close(self) -> None:
        """Finish the W&B run (after a failure too) and stop W&B's service process, which outlives
        finish() until teardown: a run leaves no process behind."""
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            run.finish()
        except Exception as exc:
            if not self.failed:
                self.warn(_failure_notice("failed while finishing", exc))
        if self.wandb.run is None or self.wandb.run is run:  # no other W&B run of this process needs it
            try:
                self.wandb.teardown()
            except Exception:
                pass  # the service is already gone: nothing to stop

    def _best_effort(self, what: str, call: Callable[[], object]) -> None:
        if self.run is None or self.failed:
            return
        try:
            call()
        except Exception as exc:
            self.failed = True
            self.warn(_failure_notice(f"failed while {what}", exc))


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
