"""Unit tests, mirroring fastrl's packages: no training run, no process of fastrl's."""
