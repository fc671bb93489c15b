"""Constrained and adaptive stochastic optimizers (pure PyTorch, no Lightning import)."""

