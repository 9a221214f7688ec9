"""Unit tests of fastrl.tuning."""
