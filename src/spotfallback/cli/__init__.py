"""The `spotfallback` command line: one module per command over the library."""

from spotfallback.cli.app import app, main

__all__ = ["app", "main"]
