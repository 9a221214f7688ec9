"""Elastic restarts: a restarted attempt of a torchrun job resumes its run by itself.

Under ``torchrun --max-restarts N``, when one rank fails torch elastic stops every rank and
starts the group again, TORCHELASTIC_RESTART_COUNT counting the restarts. The agent's store
(MASTER_ADDR:MASTER_PORT) outlives the attempts and nothing else of the job does, so it is what
tells a restart of this job from another job started on the same run directory
(TORCHELASTIC_RUN_ID alone cannot: it is "none" unless ``--rdzv-id`` or ``--standalone`` set it).

- The first attempt's rank 0, once it has claimed the run directory by the usual rules, draws a
  job token, puts it in the store and records it with the run id in ``RUN_DIR/elastic.json``.
- A later attempt's rank 0 continues the run when the store's token is the record's: from its
  newest checkpoint, or, with none yet, afresh (what the dead attempt wrote is removed). Anything
  else is not this job's run, and the usual rules apply ("already holds a run" refused).
- Rank 0 puts that decision in the store under the attempt; the other ranks follow it.
- The record lists each restart: the checkpoint it resumed and the wall time it lost, from that
  checkpoint's save (without one: the run's start) to the restart's resume (its run directory
  ready, its processes about to start). Metrics report ``restarts`` and ``restart_lost_s`` (the
  losses summed).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..distributed import process_group as distributed
from ..distributed.process_group import DistInfo
from ..files.checkpoint import list_checkpoints
from ..files.run_dir import ELASTIC_RECORD, LOCK_FILE, RunDirError, RunDirLock, lock_holder, write_atomic
from .plan import RunError

JOB_KEY = "fastrl/job"
DECISION_KEY = "resume"


@dataclass
class ElasticAttempt:
    """This rank's attempt of an elastic torchrun job (``restart`` 0: the first)."""

    restart: int
    run_id: str
    store: object  # a client of the agent's torch.distributed.TCPStore
    timeout_s: float  # dist_timeout_s: how long to wait for rank 0's decision (half of it for the dead attempt)
    job: str = ""  # the job's token, once known
    same_job: bool = False  # a restart of the job whose run is in the run directory
    record: dict = field(default_factory=dict)

    def settle(self, run_dir: Path, resume: bool, overwrite: bool, dist_info: DistInfo) -> tuple[bool, bool]:
        """(resume, overwrite) for this attempt, from the command's flags. A restart of the same job
        continues its run: resumed from a checkpoint, else replaced."""
        if self.restart == 0:
            return resume, overwrite
        key = distributed.attempt_prefix(DECISION_KEY)
        if not dist_info.is_main:
            try:
                return self.store.get(key) == b"1", False
            except RuntimeError:  # DistStoreError: rank 0 never decided (it failed, or is not there)
                raise RunError(f"restart {self.restart}: rank 0 did not say within dist_timeout_s whether to "
                               f"resume the run; see rank 0's error") from None
        self.record = read_record(run_dir)
        stored = self.store.get(JOB_KEY).decode() if self.store.check([JOB_KEY]) else ""
        self.same_job = bool(stored) and self.record.get("job") == stored and self.record.get("run_id") == self.run_id
        if self.same_job:
            self.job = stored
            # The dead attempt's last process (its learner) holds the lock while it writes a
            # final checkpoint: count the checkpoints once it is done. Half the timeout: the other
            # ranks, which started about now, wait the whole of it for this decision.
            waited = self.timeout_s / 2
            try:
                RunDirLock.take(run_dir, waited).release()
            except RunDirError:
                holder = lock_holder(run_dir / LOCK_FILE)
                raise RunError(f"restart {self.restart}: run directory '{run_dir}' is still in use by {holder} "
                               f"after {waited:g} s, half of dist_timeout_s (the other ranks wait dist_timeout_s "
                               f"for rank 0's decision); raise dist_timeout_s if the dead attempt's final "
                               f"checkpoint takes longer") from None
            resume = resume or bool(list_checkpoints(run_dir))
            overwrite = not resume
        self.store.set(key, "1" if resume else "0")
        return resume, overwrite

    def claim(self, run_dir: Path, resumed: bool) -> dict:
        """Rank 0, once the run directory is ready: record the job (a first attempt draws its token)
        and this restart; returns the metrics of the job's restarts."""
        now = time.time()
        if self.restart == 0 or not self.same_job:
            self.job = uuid.uuid4().hex
            self.store.set(JOB_KEY, self.job)
            self.record = {"run_id": self.run_id, "job": self.job, "started_at": now, "restarts": []}
        else:
            newest = list_checkpoints(run_dir)[-1] if resumed else None
            since = newest.stat().st_mtime if newest is not None else self.record["started_at"]
            # A restart that resumes the checkpoint the previous one resumed lost only what came since
            # that restart: the time before it is counted already.
            previous = self.record["restarts"][-1].get("resumed_at", 0.0) if self.record["restarts"] else 0.0
            self.record["restarts"].append({"restart": self.restart, "checkpoint": newest.name if newest else None,
                                            "lost_s": round(max(0.0, now - max(since, previous)), 3),
                                            "resumed_at": now})
            if newest is None:
                self.record["started_at"] = now
        write_atomic(run_dir / ELASTIC_RECORD, json.dumps(self.record, indent=1))
        return self.metrics()

    def metrics(self) -> dict:
        """``restarts`` of this job and the wall time they lost (``restart_lost_s``)."""
        lost = sum(entry["lost_s"] for entry in self.record.get("restarts", ()))
        return {"restarts": self.restart, "restart_lost_s": lost}


def current_attempt(timeout_s: float) -> ElasticAttempt | None:
    """This rank's attempt when torchrun may restart it (``--max-restarts`` > 0, the agent hosting
    the store); None otherwise (a plain launch, or restarts off: a failure ends the job)."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) <= 0 or not distributed.uses_agent_store():
        return None
    try:
        store = distributed.connect_store(int(os.environ.get("WORLD_SIZE", 1)), False, timeout_s)
    except RuntimeError as exc:  # DistNetworkError, DistStoreError
        raise RunError(f"cannot reach torchrun's store at {os.environ.get('MASTER_ADDR')}:"
                       f"{os.environ.get('MASTER_PORT')} ({str(exc).splitlines()[0][:200]}); check that node 0's "
                       f"torchrun is up") from None
    return ElasticAttempt(distributed.restart_count(), os.environ.get("TORCHELASTIC_RUN_ID", "none"), store, timeout_s)


def read_record(run_dir: Path) -> dict:
    """``RUN_DIR/elastic.json`` ({} when missing or unreadable: then no restart matches it)."""
    try:
        record = json.loads((Path(run_dir) / ELASTIC_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
