"""The in-learner replay: a ring buffer of env streams with prioritized sampling, and its storage."""
