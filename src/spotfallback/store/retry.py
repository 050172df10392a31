"""Storage outages, ridden out: the one retry rule of every storage call spotfallback makes.

Why one rule: the ledger, the driver lease, the checkpoint repair and the filesystem Ray is
handed all meet the same outages, so they wait the same way (a bounded, logged back-off up to
``SPOTFALLBACK_STORAGE_RETRY_S``, default 120 s, read by each process: set it cluster-wide)
and give up on the same errors at once (``is_permanent``: a missing object, no access). An
outage shorter than the limit only pauses the run; a longer one stops it with
``StorageUnavailableError``, and everything written before is intact.

The filesystem (``retrying``): Ray Train's own storage calls (the workers' checkpoint
uploads, the controller's checkpoint snapshot) fail on the first refused connection; the
training function then sees an error and the run restarts, or gives up as if the code were
broken. ``FallbackTrainer`` hands Ray this wrapper around the run's filesystem instead. A
file up to 64 MiB (Ray's copy chunk) is written and read as one whole object under retry, so
a retry never resumes half way through a stream: it lands all or nothing (as on S3). Larger
files are streamed; only opening them is retried (see ``_Upload``).
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from spotfallback.errors import StorageUnavailableError

logger = logging.getLogger("spotfallback")

T = TypeVar("T")

RETRY_ENV = "SPOTFALLBACK_STORAGE_RETRY_S"
WHOLE_READ_BYTES = 64 * 1024 * 1024  # Ray's copy chunk: larger objects are streamed
DEFAULT_RETRY_S = 120.0
# A command that only reads (status, report) has nothing to ride out: a wrong endpoint or an
# outage is better said within seconds than after the run's two minutes.
READ_ONLY_RETRY_S = 20.0
RESUME_HINT = (" Everything written before is intact; run the same command again once storage is back to resume "
               "from the latest checkpoint.")
_read_only: ContextVar[bool] = ContextVar("spotfallback_read_only", default=False)
# Errors no wait can fix: retrying them would only delay the real message.
PERMANENT_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)
PERMANENT_MARKS = (
    "ACCESS_DENIED", "NO_SUCH_BUCKET", "InvalidAccessKeyId", "SignatureDoesNotMatch",  # S3
    # Azure Blob: a wrong key or SAS, an identity without a role on the container, no such container.
    "AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch", "ContainerNotFound",
    "PERMISSION_DENIED", "UNAUTHENTICATED",  # GCS
)  # fmt: skip


def retry_limit_s() -> float:
    """This process's storage outage limit in seconds (0 turns retrying off); without
    ``SPOTFALLBACK_STORAGE_RETRY_S``, 120 s, or 20 s inside ``read_only()``."""
    default = READ_ONLY_RETRY_S if _read_only.get() else DEFAULT_RETRY_S
    raw = os.environ.get(RETRY_ENV, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        logger.warning("ignoring %s=%r: not a number; using %gs", RETRY_ENV, raw, default)
        return default
    return max(0.0, value)


@contextmanager
def read_only() -> Iterator[None]:
    """Storage calls made inside wait ``READ_ONLY_RETRY_S`` by default: for commands that only look."""
    token = _read_only.set(True)
    try:
        yield
    finally:
        _read_only.reset(token)


def _quiet(e: BaseException) -> str:
    # Ray retries an upload whose error text carries an AWS retry token ("AWS Error
    # NETWORK_CONNECTION"); after our own bounded wait the error must stop there.
    return str(e).replace("AWS Error ", "AWS error ")


def is_permanent(error: OSError) -> bool:
    """Whether no wait can fix ``error`` (a missing object, no access): it is raised at once."""
    return isinstance(error, PERMANENT_ERRORS) or any(mark in str(error) for mark in PERMANENT_MARKS)


def call_with_retry(
    fn: Callable[[], T], what: str, limit_s: float | None = None, *, permanent: type[Exception] | None = None
) -> T:
    """``fn()``, retrying transient ``OSError`` for up to ``limit_s`` (default: ``retry_limit_s()``).

    Inside ``read_only()``, a try that would end past the limit, taking as long as the last one,
    is not started: such a command ends by its limit. Past the limit: ``StorageUnavailableError``. A permanent error (``is_permanent``) is not
    retried: raised as it is (the filesystem Ray is handed: Ray and pyarrow act on its type),
    or, given ``permanent``, as that error naming ``what`` (the ledger, the lease: their
    callers catch ``LedgerError``).
    """
    limit = retry_limit_s() if limit_s is None else limit_s
    start = time.monotonic()
    delay = 0.2
    while True:
        attempt_start = time.monotonic()
        try:
            return fn()
        except OSError as e:
            if is_permanent(e):
                if permanent is None:
                    raise
                raise permanent(f"storage error while trying to {what}: {type(e).__name__}: {_quiet(e)}") from e
            now = time.monotonic()
            waited = now - start
            # A run tries up to the limit, so that an outage shorter than it only pauses the run.
            # A command that only reads ends by its limit: its next try would take about as long
            # as this one (an S3 client retries inside each call), so one that would end past the
            # limit is not started.
            next_try = now - attempt_start if _read_only.get() else 0.0
            if waited + delay + next_try > limit:
                raise StorageUnavailableError(
                    f"storage unavailable for {waited:.0f}s (limit {limit:g}s, {RETRY_ENV}) while trying to "
                    f"{what}: {type(e).__name__}: {_quiet(e)}." + RESUME_HINT
                ) from None
            logger.warning("storage error while trying to %s (%s); retrying in %.1fs", what, _quiet(e), delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


class _Upload(io.RawIOBase):
    """An output stream whose first ``write`` stores the complete object, retried as a whole.

    Why in ``write`` and not in ``close``: ``pyarrow.fs.copy_files`` (Ray's checkpoint upload)
    drops an error raised by a Python stream's ``close``, so a failed upload would look like a
    success. Ray copies in 64 MiB chunks, so a file up to that size is one ``write``: stored
    whole or not at all, with its error seen by the caller. A larger file switches to
    streaming through the inner filesystem at its second chunk (retrying only the opening);
    a failure while closing such a file can only be caught by its checkpoint's manifest.
    """

    def __init__(self, inner: pafs.FileSystem, path: str, metadata: Any, limit_s: float | None):
        super().__init__()
        self._inner, self._path, self._metadata, self._limit = inner, path, metadata, limit_s
        self._first: bytes | None = None  # the stored content while the file is one chunk
        self._stream: Any = None  # the inner stream once the file is longer than one chunk
        self._pos = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def _store(self, payload: bytes) -> None:
        def upload() -> None:
            with self._inner.open_output_stream(self._path, metadata=self._metadata) as out:
                out.write(payload)

        call_with_retry(upload, f"write {self._path}", self._limit)

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        if self._stream is not None:
            self._stream.write(chunk)
        elif self._first is None:
            self._store(chunk)
            self._first = chunk
        else:
            self._stream = call_with_retry(
                lambda: self._inner.open_output_stream(self._path, metadata=self._metadata), f"write {self._path}", self._limit
            )
            self._stream.write(self._first)
            self._stream.write(chunk)
            self._first = b""
        self._pos += len(chunk)
        return len(chunk)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._stream is not None:
                self._stream.close()
            elif self._first is None:
                self._store(b"")  # an empty file: never written to
        finally:
            self._first = None
            super().close()


class RetryingHandler(pafs.FileSystemHandler):
    """Delegates to ``inner``; see the module docstring. Picklable, so Ray ships it to workers."""

    def __init__(self, inner: pafs.FileSystem, limit_s: float | None = None):
        self.inner = inner
        self.limit_s = limit_s  # None: each process reads SPOTFALLBACK_STORAGE_RETRY_S

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetryingHandler) and self.inner.equals(other.inner) and self.limit_s == other.limit_s

    def __ne__(self, other: object) -> bool:
        return not self == other

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        return call_with_retry(fn, what, self.limit_s)

    def get_type_name(self) -> str:
        return f"spotfallback-retry+{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self._retry(lambda: self.inner.get_file_info(paths), f"look up {', '.join(paths[:3])}")

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self._retry(lambda: self.inner.get_file_info(selector), f"list {selector.base_dir}")

    def create_dir(self, path: str, recursive: bool) -> None:
        self._retry(lambda: self.inner.create_dir(path, recursive=recursive), f"create {path}")

    def delete_dir(self, path: str) -> None:
        self._retry(lambda: self.inner.delete_dir(path), f"delete {path}")

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._retry(lambda: self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok), f"empty {path}")

    def delete_root_dir_contents(self) -> None:
        self._retry(lambda: self.inner.delete_dir_contents("/", accept_root_dir=True), "empty the root")

    def delete_file(self, path: str) -> None:
        self._retry(lambda: self.inner.delete_file(path), f"delete {path}")

    def move(self, src: str, dest: str) -> None:
        self._retry(lambda: self.inner.move(src, dest), f"move {src}")

    def copy_file(self, src: str, dest: str) -> None:
        self._retry(lambda: self.inner.copy_file(src, dest), f"copy {src}")

    def _open_for_reading(self, path: str, random_access: bool) -> pa.NativeFile:
        """Up to ``WHOLE_READ_BYTES``: the whole object, fetched under retry; larger: the inner stream."""

        def read() -> pa.NativeFile:
            info = self.inner.get_file_info(path)
            if info.type == pafs.FileType.File and info.size is not None and info.size <= WHOLE_READ_BYTES:
                with self.inner.open_input_stream(path) as f:
                    return pa.BufferReader(f.read_buffer())
            return self.inner.open_input_file(path) if random_access else self.inner.open_input_stream(path)

        return self._retry(read, f"read {path}")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._open_for_reading(path, random_access=False)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._open_for_reading(path, random_access=True)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return pa.PythonFile(_Upload(self.inner, path, metadata, self.limit_s), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self._retry(lambda: self.inner.open_append_stream(path, metadata=metadata), f"append to {path}")


def retrying(fs: pafs.FileSystem, limit_s: float | None = None) -> pafs.FileSystem:
    """``fs`` wrapped so that its calls ride out outages (returned as is if already wrapped)."""
    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, RetryingHandler):
        return fs
    return pafs.PyFileSystem(RetryingHandler(fs, limit_s))


def storage_failure(error: BaseException | None) -> StorageUnavailableError | None:
    """The ``StorageUnavailableError`` behind a Ray Train failure (controller or any worker), if any.

    Such a failure is neither the code's fault nor the capacity's: it must not spend a tier's
    budget, and nothing can be written to the ledger about it while storage is away.
    """
    seen: set[int] = set()
    todo: list[Any] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, StorageUnavailableError):
            return StorageUnavailableError(*e.args)  # a fresh one: the found one sits inside ``error``
        todo.extend([e.__cause__, e.__context__, getattr(e, "controller_failure", None), getattr(e, "_base_exc", None)])
        todo.extend((getattr(e, "worker_failures", None) or {}).values())
    return None


def ray_run_config(run_config: Any, location: Any) -> Any:
    """The ``RunConfig`` handed to Ray: same run, its filesystem wrapped by ``retrying``.

    Ray then takes ``storage_path`` as a path inside that filesystem (its rule for a custom
    filesystem), which is the run's root as ``resolve_run`` found it. Local paths are not
    wrapped (see below).
    """
    import dataclasses
    import posixpath

    if isinstance(location.fs, pafs.LocalFileSystem):
        # A local or NFS path stays Ray's own: Ray reads its checkpoints in place instead of
        # downloading them (and an NFS hard mount blocks through an outage rather than failing).
        return run_config
    if retry_limit_s() > 0:
        fs = retrying(location.fs)
    elif run_config.storage_filesystem is not None:
        return run_config  # retries off, and Ray already has the user's filesystem
    else:
        # Retries off, a URI: the filesystem resolve_run built, unwrapped (Azure's comes from the
        # environment, which Ray's own reading of the URI would not do).
        fs = location.fs
    return dataclasses.replace(run_config, storage_path=posixpath.dirname(location.run_dir), storage_filesystem=fs)
