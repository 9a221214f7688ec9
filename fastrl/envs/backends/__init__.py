"""Env backends: envpool, gymnasium (with Atari through ale-py) and ViZDoom."""
