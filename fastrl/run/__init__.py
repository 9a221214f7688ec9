"""A training run: the entry point, the checks before it starts, the parallel and serial modes,
the supervisor that watches the processes, and a torchrun job's restarts and rank heartbeat."""
