"""Several ranks: torch.distributed process groups for data-parallel learners and rank-0 metrics
(a job's restarts and its rank heartbeat belong to the run: fastrl.run)."""
