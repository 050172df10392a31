"""Benchmarks: what spotfallback costs and saves, side by side with plain Ray Train.

``python -m bench [--quick] [--only NAME ...]`` runs them (see ``bench/cli.py``) and writes
``docs/benchmarks.md``. Each ``bench_*.py`` module also runs on its own.
"""
