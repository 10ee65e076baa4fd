"""Launcher, worker entry, training loop, metrics and checkpoints."""
