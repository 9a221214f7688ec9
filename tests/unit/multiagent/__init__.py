"""Unit tests of fastrl.multiagent."""
