"""A Ray Train checkpoint's files in a directory of this process's own, for restoring from.

Why not ``Checkpoint.as_directory``: the processes on one node that read the same checkpoint share
its download directory, and the first to finish deletes it once it sees no other reader's lock.
A worker that takes its lock just after that check (a slow start, a busy machine) then waits for
the download the first one made and finds the directory gone: Ray 2.60 raises "Checkpoint
directory ... does not exist", which fails the attempt as an error in the training function.
Several workers share a node on every multi-GPU machine, so the restore after a preemption
would spend the tier's training-error budget on a race.

The copy is a ``scratch_dir``: one left by a worker killed while it read is removed by the next.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spotfallback.integrations.scratch import scratch_dir


@contextlib.contextmanager
def checkpoint_files(checkpoint: Any, label: str = "restore-") -> Iterator[Path]:
    """The files of ``checkpoint`` (a ``ray.train.Checkpoint``) in a directory to read, removed after.

    A checkpoint on a local filesystem is read where it is, as ``as_directory`` does; one in
    remote storage is downloaded into a scratch directory no other process uses (``label`` goes
    into its name), and the copies of workers killed while they read are removed first.
    """
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        yield Path(checkpoint.path)
        return
    with scratch_dir(label) as d:
        yield Path(checkpoint.to_directory(str(d)))
