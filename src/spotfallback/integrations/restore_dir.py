"""A Ray Train checkpoint's files in a directory of this process's own, for restoring from.

Why not ``Checkpoint.as_directory``: the processes on one node that read the same checkpoint share
its download directory, and the first to finish deletes it once it sees no other reader's lock.
A worker that takes its lock just after that check (a slow start, a busy machine) then waits for
the download the first one made and finds the directory gone: Ray 2.60 raises "Checkpoint
directory ... does not exist", which fails the attempt as an error in the training function.
Several workers share a node on every multi-GPU machine, so the restore after a preemption
would spend the tier's training-error budget on a race.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def checkpoint_files(checkpoint: Any, prefix: str = "spotfallback-restore-") -> Iterator[Path]:
    """The files of ``checkpoint`` (a ``ray.train.Checkpoint``) in a directory to read, removed after.

    A checkpoint on a local filesystem is read where it is, as ``as_directory`` does; one in
    remote storage is downloaded into a temporary directory no other process uses.
    """
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        yield Path(checkpoint.path)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        yield Path(checkpoint.to_directory(d))
