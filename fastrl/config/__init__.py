"""Configuration: the one declaration of every key, profiles and ``--set``, the reference page."""
