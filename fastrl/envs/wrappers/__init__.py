"""Wrappers over any backend's envs: image preprocessing and action subsets."""
