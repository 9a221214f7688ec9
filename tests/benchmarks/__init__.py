"""The benchmark scripts' own tests, on tiny budgets."""
