"""Unit tests of fastrl.files."""
