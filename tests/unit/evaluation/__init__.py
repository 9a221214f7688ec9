"""Unit tests of fastrl.evaluation."""
