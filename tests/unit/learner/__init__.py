"""Unit tests of fastrl.learner."""
