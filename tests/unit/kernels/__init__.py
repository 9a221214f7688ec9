"""Unit tests of fastrl.kernels: each kernel against a brute-force reference."""
