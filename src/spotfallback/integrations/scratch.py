"""Temporary directories that outlive no process: each is named for the process that made it.

Why: a worker killed mid-write runs no cleanup (SIGKILL: Ray kills a gang's surviving workers
when it restarts the gang after a preemption; so does the kernel's OOM killer), so the copy of
a checkpoint it was restoring from, or the checkpoint it was writing, stays in /tmp. A long job
whose node restores again and again fills that node's disk with them. Each directory made here
is named ``spotfallback-scratch-<pid namespace>-<pid>-<label>...``, and each new one first
removes those whose process is gone. Only those: another name is not ours, a live process's
directory is in use, and a pid from another pid namespace (a container sharing /tmp) says
nothing about a process here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

SCRATCH_PREFIX = "spotfallback-scratch-"


def _pid_namespace() -> int:
    """This process's pid namespace (0 where there is none to read): pids mean something only within one."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_dead_scratch(root: str | Path | None = None) -> list[Path]:
    """Remove the scratch directories under ``root`` (the temporary directory) of processes that are gone.

    Only this user's directories named by this module, of this pid namespace, whose process
    no longer exists; returns those removed. Never raises: a sweep that fails is tried again
    by the next scratch directory.
    """
    where = Path(root) if root is not None else Path(tempfile.gettempdir())
    ours = f"{SCRATCH_PREFIX}{_pid_namespace()}-"
    removed: list[Path] = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return removed
    for entry in entries:
        pid_text = entry.name[len(ours):].partition("-")[0] if entry.name.startswith(ours) else ""
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not _alive(int(pid_text)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def scratch_dir(label: str = "", root: str | Path | None = None) -> Iterator[Path]:
    """A new empty directory of this process's own, removed after; those of dead processes go first.

    ``label`` (no path separator) goes into the name, to tell what the directory was for.
    """
    if os.sep in label or (os.altsep and os.altsep in label):
        raise ValueError(f"scratch_dir: label {label!r} must not contain a path separator")
    remove_dead_scratch(root)
    prefix = f"{SCRATCH_PREFIX}{_pid_namespace()}-{os.getpid()}-{label}"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=root) as d:
        yield Path(d)
