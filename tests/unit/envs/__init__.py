"""Unit tests of fastrl.envs."""
