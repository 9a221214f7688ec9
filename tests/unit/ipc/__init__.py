"""Unit tests of fastrl.ipc."""
