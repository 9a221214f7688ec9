"""What a run keeps on disk: the run directory's rules and lock, atomic writes, checkpoints."""
