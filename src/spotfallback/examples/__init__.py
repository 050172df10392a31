"""Runnable examples; importable as ``examples.<module>`` from the repository root."""
