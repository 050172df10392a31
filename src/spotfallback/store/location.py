"""Where a run lives: resolve ``storage_path`` + ``name`` to a pyarrow filesystem and directory.

Ray Train keeps its checkpoints at ``{storage_path}/{name}``; spotfallback keeps its ledger
and lease beside them in ``{storage_path}/{name}/_spotfallback`` so one URI finds everything.

Also the two filesystem moves every store module makes: listing a directory that may not
exist yet, and writing an object whole (object stores have no append and no locks, so a
reader must never see half an object).
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs

from spotfallback.config import run_name_error
from spotfallback.errors import ConfigError

STATE_DIR = "_spotfallback"
# Objects being written (``write_atomically``) start with this; readers skip them.
TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class RunLocation:
    """A run's directory on some filesystem (local, NFS, S3, GCS...)."""

    fs: pafs.FileSystem
    run_dir: str  # path inside ``fs``, no scheme
    storage_path: str
    name: str

    @property
    def state_dir(self) -> str:
        return posixpath.join(self.run_dir, STATE_DIR)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.state_dir, *parts)

    def uri(self) -> str:
        return posixpath.join(self.storage_path.rstrip("/"), self.name)


def list_dir(fs: pafs.FileSystem, path: str, *, recursive: bool = False) -> list[pafs.FileInfo]:
    """List a directory that may not exist yet (an empty list then).

    pyarrow's local listing tries the directory first and only then checks that it is missing,
    so a directory created in between (``status`` or a test reading a run that is just starting)
    raises ``FileNotFoundError`` despite ``allow_not_found``. Listing again sees it.
    """
    selector = pafs.FileSelector(path, recursive=recursive, allow_not_found=True)
    for attempt in range(3):
        try:
            return fs.get_file_info(selector)
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def write_atomically(fs: pafs.FileSystem, path: str, payload: bytes) -> None:
    """Write ``payload`` to ``path`` whole: under a temporary name first, then moved into place.

    A crash mid-write leaves only a ``TMP_PREFIX`` object that readers skip, never a torn one.
    """
    directory, _, base = path.rpartition("/")
    tmp = f"{directory}/{TMP_PREFIX}{uuid.uuid4().hex}-{base}"
    with fs.open_output_stream(tmp) as out:
        out.write(payload)
    fs.move(tmp, path)


def _is_uri(path: str) -> bool:
    return "://" in path


def resolve_run(storage_path: str, name: str, filesystem: pafs.FileSystem | None = None) -> RunLocation:
    """Resolve a run's location the way Ray does (URI, or a local path, or an explicit fs)."""
    problem = run_name_error(name)
    if problem:
        raise ConfigError(f"name: {problem}")
    if not storage_path or any(ord(c) < 32 for c in storage_path):
        raise ConfigError("storage_path: must be a non-empty path or URI without control characters")
    if filesystem is not None:
        if _is_uri(storage_path):  # Ray would take 's3://b/p' as a key path 's3:/b/p' in that filesystem
            raise ConfigError(
                f"storage_path: {storage_path!r} is a URI, but storage_filesystem is given; Ray then expects the "
                f"path inside that filesystem: {storage_path.split('://', 1)[1]!r}"
            )
        root = storage_path
    elif _is_uri(storage_path):
        scheme, rest = storage_path.split("://", 1)
        if scheme != "file" and not rest.split("?", 1)[0].strip("/"):  # s3:// alone would list every bucket
            raise ConfigError(f"storage_path: {storage_path!r} names no bucket; give {scheme}://BUCKET/PREFIX")
        try:
            filesystem, root = pafs.FileSystem.from_uri(storage_path)
        except (ValueError, OSError) as e:  # pyarrow.ArrowInvalid is a ValueError
            raise ConfigError(f"storage_path: cannot open {storage_path!r}: {e}") from None
    else:
        filesystem = pafs.LocalFileSystem()
        root = os.path.abspath(os.path.expanduser(storage_path))
        storage_path = root
    return RunLocation(fs=filesystem, run_dir=posixpath.join(root, name), storage_path=storage_path, name=name)


def split_run_uri(uri: str) -> tuple[str, str]:
    """``STORAGE_PATH/NAME`` -> (storage_path, name), for commands that take one argument."""
    uri = uri.rstrip("/")
    storage_path, _, name = uri.rpartition("/")
    if not storage_path or not name:
        raise ConfigError(f"run: expected STORAGE_PATH/NAME, got {uri!r}")
    if storage_path.endswith(":/"):
        raise ConfigError(f"run: {uri!r} names a bucket, not a run; expected STORAGE_PATH/NAME")
    return storage_path, name
