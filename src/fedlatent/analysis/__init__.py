"""Diagnostics, tables and plots: they read models and tensors and never train."""
