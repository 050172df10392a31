"""Many small objects read and deleted at once, on a thread pool.

Why: an object store answers one request in milliseconds (loopback) to tens of milliseconds
(a cloud region), so a ledger read one GET after another costs its length times that. pyarrow
releases the GIL during its requests, so threads overlap them. Each object goes through the
one retry rule (``retry.call_with_retry``); a missing object is ``None`` rather than an error,
because a compaction may have moved it into a segment between listing and reading.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pyarrow.fs as pafs

from spotfallback.errors import LedgerError
from spotfallback.store.retry import call_with_retry

T = TypeVar("T")

# Enough to hide a cloud's latency, few enough not to be throttled (S3 takes thousands per second per prefix).
MAX_THREADS = 16


def _in_parallel(fn: Callable[[str], T], paths: Sequence[str]) -> list[T]:
    if len(paths) <= 1:
        return [fn(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(paths)), thread_name_prefix="spotfallback-io") as pool:
        return list(pool.map(fn, paths))


def read_objects(fs: pafs.FileSystem, paths: Sequence[str], *, limit_s: float | None = None) -> list[bytes | None]:
    """The content of each of ``paths`` (``None`` where it does not exist), in the same order.

    ``limit_s`` as for ``call_with_retry`` (0: fail at the first error, for a reader that polls
    again anyway). Errors that no wait can fix are ``LedgerError`` naming the object.
    """

    def read(path: str) -> bytes | None:
        def once() -> bytes | None:
            try:
                with fs.open_input_stream(path) as stream:
                    return bytes(stream.readall())
            except FileNotFoundError:
                return None

        return call_with_retry(once, f"read {path}", limit_s, permanent=LedgerError)

    return _in_parallel(read, paths)


def delete_objects(fs: pafs.FileSystem, paths: Sequence[str]) -> None:
    """Delete each of ``paths``; one already gone (another process deleted it) is no error."""

    def delete(path: str) -> None:
        def once() -> None:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)

        call_with_retry(once, f"delete {path}", permanent=LedgerError)

    _in_parallel(delete, paths)
