"""Sampling: rollout worker processes and the central inference batcher."""
