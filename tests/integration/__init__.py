"""In-process runs: fastrl.train() and its parts together, on small envs."""
