"""Tuning: population-based training and fastrl-sweep (its search space and trials)."""
