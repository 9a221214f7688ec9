"""Unit tests of fastrl.config."""
