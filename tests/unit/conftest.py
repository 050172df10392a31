"""Fixtures the unit tests of several commands share."""

from __future__ import annotations

import errno
import os

import pytest
import typer

from spotfallback.cli.app import _register_subcommands, app


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    """The whole `spotfallback` app, every command registered once per process."""
    if not getattr(_register_subcommands, "done", False):
        _register_subcommands()
        _register_subcommands.done = True  # type: ignore[attr-defined]
    return app


@pytest.fixture
def disk_full_on_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``os.fsync`` fails as a full disk would: a file written whole before it replaces another
    fails there, with the old one still in place."""

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
