"""Local files a command writes for the user (job files, deployment files, pictures, tables): whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path


def written_path(target: Path) -> Path:
    """What writing ``target`` changes: the file itself if it is a device or a pipe (written in
    place), else its directory (a new file is renamed into it)."""
    return target if target.exists() and not target.is_file() else target.parent


def replace_file(path: Path, data: str | bytes) -> None:
    """Write ``data`` (a str as UTF-8) to ``path``, whole or not at all; OSError if it cannot be.

    It goes to a temporary file beside the target, then is renamed over it, so a write that
    fails (no permission, a full disk) leaves the file that was there, such as a job file the
    user edited. A link is followed and its target replaced, keeping that file's permissions; a
    device or pipe (/dev/stdout) is written in place.
    """
    payload = data.encode() if isinstance(data, str) else data
    target = Path(os.path.realpath(path))
    if written_path(target) == target:
        with target.open("wb") as f:
            f.write(payload)
        return
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())  # a full disk or lost mount shows here, before the old file is gone
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_problem(path: Path, e: OSError) -> str:
    """Why ``path`` could not be written, and the fix, for one error line."""
    target = Path(os.path.realpath(path))
    where = repr(str(path)) + (f" (a link to {str(target)!r})" if path.is_symlink() else "")
    fix = "free some space or give another path" if e.errno == errno.ENOSPC else "give a path that can be written"
    return f"cannot write {where}: {e.strerror or e}; {fix}"
