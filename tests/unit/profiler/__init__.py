"""Unit tests of fastrl.profiler."""
