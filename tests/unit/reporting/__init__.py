"""Unit tests of fastrl.reporting."""
