"""Unit tests of fastrl.models."""
