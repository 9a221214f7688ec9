"""Reporting: metrics, the console and train.log, W&B, timers, learning curves and figures."""
