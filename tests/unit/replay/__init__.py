"""Unit tests of fastrl.replay."""
