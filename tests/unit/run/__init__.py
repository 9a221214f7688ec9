"""Unit tests of fastrl.run."""
