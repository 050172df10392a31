"""What every command shares: the command list, the one error line, logging, output files, and opening a run by STORAGE_PATH/NAME.

Kept apart from the commands so that no command module imports another (each registers
itself in ``cli.app``); the exit codes themselves live with the errors (``spotfallback.errors``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from spotfallback.config import Ladder
from spotfallback.deploy.common import short_repr
from spotfallback.errors import (
    EXIT_BAD_INPUT,
    ConfigError,
    LedgerError,
    StorageUnavailableError,
    UsageError,
)
from spotfallback.store.files import replace_file, write_problem, written_path
from spotfallback.store.ledger import Ledger, LedgerView
from spotfallback.store.location import STATE_DIR, RunLocation, resolve_run, split_run_uri
from spotfallback.store.retry import RESUME_HINT, read_only


class CommandSummaries(TyperGroup):
    """A group whose help lists each command with the whole first paragraph of its help.

    Click cuts a command's summary to the first sentence or a few dozen characters
    ("on-demand..."); the list is where a user picks a command, so it wraps instead.
    """

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            text = (command.short_help or command.help or "").strip()
            rows.append((name, " ".join(text.split("\n\n")[0].split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


RUN_HELP = "The run as STORAGE_PATH/NAME, e.g. ./runs/digits-1 or s3://bucket/runs/digits-1."

err_console = Console(stderr=True, highlight=False)


def join_ray(address: str, verbose: bool = False) -> str | None:
    """Join the Ray cluster at ``address`` (``auto``: the one this machine belongs to).

    Returns None once joined, or why it could not in a few words: each command says what that
    means for it in its one error line, rather than Ray's traceback.
    """
    import ray

    if (silent := _silent(address)) is not None:
        return silent
    try:
        ray.init(address=address, log_to_driver=verbose, include_dashboard=False,
                 logging_level=logging.INFO if verbose else logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


# How long a head's host:port may take to accept a connection before ``join_ray`` gives up on it.
CONNECT_TIMEOUT_S = 10.0


def _silent(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why nothing accepts a connection at ``address``'s host and port, or None.

    ``ray.init`` retries an address where nothing listens for minutes, printing its own
    warnings; one connection attempt says the same in seconds. ``auto`` (Ray finds the
    address itself) and anything without a port are left to Ray.
    """
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except TimeoutError:
        return f"nothing answered at {host}:{port} within {timeout_s:g} s"
    except OSError as e:
        return f"nothing accepts connections at {host}:{port}: {e.strerror or e}"


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print ``error: message`` (taken literally, never as markup) and return the exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def one_line(message: str) -> str:
    """A several-line error (a job file's problems, one per line under its path) as one line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {'; '.join(lines[1:])}"
    return "; ".join(lines)


def check_trace_counts(trace_counts: str) -> None:
    """``--trace-counts``: what the ticks of a SkyPilot JSON trace count (``plan`` and ``backtest`` alike)."""
    if trace_counts not in ("available", "preempted"):
        raise usage_error("--trace-counts", f"must be 'available' or 'preempted', got {trace_counts!r}")


def usage_error(option: str, message: str) -> UsageError:
    """Bad input to ``option``, printed as one ``error:`` line; a path or value with a newline is shown escaped."""
    return UsageError(f"{option}: {message}".replace("\r", "\\r").replace("\n", "\\n"))


def setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s spotfallback %(message)s", "%H:%M:%S"))
    log = logging.getLogger("spotfallback")
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    if not verbose:
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def output_problem(path: Path, suffix: str | tuple[str, ...] | None, *, keep_existing: bool = False) -> str | None:
    """What is wrong with a file the command will write, or None: a directory, the suffix, a
    missing or unwritable directory (a link's, too), or (``keep_existing``: a file the user may
    have edited, such as a job file or a deployment file) one that is there already, or a link
    to one that is not; a path the system refuses to look at (a name too long) says so.

    Checked before any work, so that one bad output of several fails before any is written."""
    try:
        return _output_problem(path, suffix, keep_existing)
    except OSError as e:  # Path.is_dir() and exists() raise on a name past the system's limit
        return f"{short_repr(str(path))}: {e.strerror or e}; give a shorter path"


def same_file_problem(path: Path, inputs: Iterable[tuple[str, Path]]) -> str | None:
    """Which input the output ``path`` is (by any name or link), or None: writing there would
    replace a file the command reads, whose data would be lost."""
    for option, given in inputs:
        try:
            if path.exists() and given.exists() and os.path.samefile(path, given):
                return f"{str(path)!r} is the {option} file; write to another path"
        except OSError:
            continue  # the input's own check names it
    return None


def _output_problem(path: Path, suffix: str | tuple[str, ...] | None, keep_existing: bool) -> str | None:
    suffixes = (suffix,) if isinstance(suffix, str) else suffix
    if path.is_dir():
        return f"{str(path)!r} is a directory; give a file name"
    if suffixes and path.suffix.lower() not in suffixes:
        return f"{str(path)!r} must end in {' or '.join(suffixes)}"
    if path.parent.exists() and not path.parent.is_dir():
        return f"{str(path.parent)!r} is a file, not a directory"
    if not path.parent.is_dir():
        return f"directory {str(path.parent)!r} does not exist"
    target = Path(os.path.realpath(path))
    if not target.parent.is_dir():
        return f"{str(path)!r} links to {str(target)!r}, whose directory does not exist"
    if keep_existing and path.exists():
        return f"{str(path)!r} already exists; pass --force to overwrite it"
    if keep_existing and path.is_symlink():  # a dangling link: writing would create its target somewhere else
        return f"{str(path)!r} is a link to {str(target)!r}, which does not exist; pass --force to write there"
    if not os.access(written_path(target), os.W_OK):
        return f"{str(written_path(target))!r} is not writable; give another path"
    return None


def check_output(option: str, path: Path, suffix: str) -> None:
    """A file the command will write, refused as ``output_problem`` says, before any work."""
    problem = output_problem(path, suffix)
    if problem is not None:
        raise fail(f"{option}: {problem}")


def write_output(option: str, path: Path, data: str | bytes) -> None:
    """Write ``data`` to the file ``option`` names, whole or not at all (``replace_file``): a write
    that fails leaves the file that was there and is one ``error: option:`` line, exit 2, not a
    traceback."""
    try:
        replace_file(path, data)
    except OSError as e:
        raise fail(str(usage_error(option, write_problem(path, e)))) from None


def open_run(run: str) -> tuple[RunLocation, Ledger, Ladder]:
    """The run's location, ledger and ladder; ConfigError when RUN names no spotfallback run."""
    base, sep, query = run.partition("?")  # s3://b/runs/NAME?endpoint_override=...: options stay with the storage
    storage_path, name = split_run_uri(base)
    location = resolve_run(storage_path + sep + query, name)
    ledger = Ledger(location)
    ladder = ledger.read_ladder()
    if ladder is None:
        if ledger.has_events():
            raise ConfigError(
                f"run: {location.uri()!r} has a ledger but no {STATE_DIR}/run.json, the run's ladder, which is "
                "written when the run first starts: a copy of the run left it out (copy the whole "
                f"{STATE_DIR} directory), or it was deleted"
            )
        raise ConfigError(
            f"run: no spotfallback run at {location.uri()!r} (no {STATE_DIR}/run.json there); "
            "give STORAGE_PATH/NAME with the job file's storage_path and name"
        )
    return location, ledger, ladder


def load_run(run: str, every_event: bool | Callable[[LedgerView], bool] = False,
             ) -> tuple[RunLocation, Ladder, LedgerView, dict[str, Any]]:
    """The run's location, ladder, ledger and metadata (plan, progress totals).

    The ledger is its stored snapshot and the records after it, so a run of weeks reads as fast
    as a new one; every record (no snapshot) when ``every_event`` says so, of the view read.
    Storage that cannot be reached is given ``READ_ONLY_RETRY_S`` (the command only looks).
    """
    with reading_run():
        location, ledger, ladder = open_run(run)
        view = LedgerView(None, ledger.read(ladder)) if every_event is True else ledger.read_view(ladder)
        if view.snapshot is not None and callable(every_event) and every_event(view):
            view = LedgerView(None, ledger.read(ladder))
        return location, ladder, view, ledger.read_meta() or {}


@contextmanager
def reading_run() -> Iterator[None]:
    """Reads of a run's stored files (its ledger, its driver's lease) as a command that only looks
    makes them: ``READ_ONLY_RETRY_S`` for storage that cannot be reached, and each failure one
    error line rather than a traceback."""
    try:
        with read_only():
            yield
    except ConfigError as e:
        raise fail(str(e), e.exit_code) from None
    except StorageUnavailableError as e:
        raise fail(f"cannot reach the run's storage: {str(e).removesuffix(RESUME_HINT)} Nothing was written; check the "
                   "storage path, its endpoint and credentials, or try again once it is back.", e.exit_code) from None
    except LedgerError as e:
        raise fail(f"cannot read the run's ledger: {e}", e.exit_code) from None
