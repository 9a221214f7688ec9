"""What the run's processes share: the shared-memory arena, the slot protocol, pipes and child
set-up, weight publication, host/device transfer and the heap settings."""
