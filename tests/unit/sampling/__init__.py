"""Unit tests of fastrl.sampling."""
