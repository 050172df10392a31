"""Runnable examples, installed with the package: ``spotfallback.examples.<module>:train_fn``."""
