"""Unit tests of fastrl.distributed."""
