"""Reading a checkpoint to restore from: each reader its own copy of a remote checkpoint, none
of the shared download directory that another reader on the node may delete under it; and the
copies (any scratch directory) of processes killed before they could remove them, removed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from spotfallback.integrations.restore_dir import checkpoint_files
from spotfallback.integrations.scratch import (
    SCRATCH_PREFIX,
    _pid_namespace,
    remove_dead_scratch,
    scratch_dir,
)

pytest.importorskip("ray.train")

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _remote_checkpoint(root):
    """A checkpoint Ray reads through a filesystem other than the local one, as gs:// or s3:// are."""
    from ray.train import Checkpoint

    (root / "ckpt").mkdir()
    (root / "ckpt" / "model.pt").write_bytes(b"weights")
    remote = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
    return Checkpoint("ckpt", filesystem=remote)


def test_readers_of_a_remote_checkpoint_each_get_their_own_copy_removed_after(tmp_path):
    checkpoint = _remote_checkpoint(tmp_path)
    with contextlib.ExitStack() as second_reader:
        second = second_reader.enter_context(checkpoint_files(checkpoint, label="r1-"))
        with checkpoint_files(checkpoint, label="r0-") as first:
            assert first != second and not first.is_relative_to(tmp_path)
            assert (first / "model.pt").read_bytes() == b"weights"
        # The first reader is done while the second still reads: nothing of the second's is gone
        # (with as_directory both read one shared directory, which the first may delete).
        assert not first.exists() and (second / "model.pt").read_bytes() == b"weights"
    assert not second.exists()
    assert not os.path.exists(checkpoint._get_temporary_checkpoint_dir())  # Ray's shared one: never made
    assert (tmp_path / "ckpt" / "model.pt").exists()  # the checkpoint itself untouched


def test_a_local_checkpoint_is_read_where_it_is(tmp_path):
    from ray.train import Checkpoint

    (tmp_path / "model.pt").write_bytes(b"w")
    with checkpoint_files(Checkpoint.from_directory(str(tmp_path))) as d:
        assert d == tmp_path
    assert (tmp_path / "model.pt").exists()


# A child that takes a scratch directory (or a copy of a remote checkpoint), says where, and
# waits inside it for the parent to kill it: what a worker killed mid-restore leaves behind.
_HOLD_SCRATCH = """
import sys, time
from spotfallback.integrations.scratch import scratch_dir
with scratch_dir("held-") as d:
    (d / "part").write_bytes(b"x" * 1000)
    print(d, flush=True)
    time.sleep(600)
"""

_HOLD_RESTORE = """
import sys, time
import pyarrow.fs as pafs
from ray.train import Checkpoint
from spotfallback.integrations.restore_dir import checkpoint_files
remote = pafs.SubTreeFileSystem(sys.argv[1], pafs.LocalFileSystem())
with checkpoint_files(Checkpoint("ckpt", filesystem=remote), label="killed-") as d:
    print(d, flush=True)
    time.sleep(600)
"""


def _hold(code: str, tmp: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    assert line, f"the child exited {child.wait(timeout=60)} before it took a directory"
    return child, Path(line)


def _kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)  # a preemption's kill: no cleanup runs
    child.wait(timeout=60)


def test_a_copy_left_by_a_reader_killed_while_it_read_is_removed_by_the_next_reader(tmp_path, monkeypatch):
    checkpoint = _remote_checkpoint(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    killed, left = _hold(_HOLD_RESTORE, tmp, str(tmp_path))
    assert left.parent == tmp and (left / "model.pt").read_bytes() == b"weights"
    _kill(killed)
    assert left.exists()  # SIGKILL: the child's own cleanup never ran
    with checkpoint_files(checkpoint) as d:
        assert not left.exists() and (d / "model.pt").read_bytes() == b"weights"
    assert not d.exists() and [p for p in tmp.iterdir() if p.name.startswith(SCRATCH_PREFIX)] == []


def test_only_the_scratch_directories_of_dead_processes_are_removed(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    live, live_dir = _hold(_HOLD_SCRATCH, tmp)
    dead, dead_dir = _hold(_HOLD_SCRATCH, tmp)
    try:
        _kill(dead)
        ours = f"{SCRATCH_PREFIX}{_pid_namespace()}-{dead.pid}-"
        assert dead_dir.name.startswith(ours) and live_dir.name.startswith(f"{SCRATCH_PREFIX}{_pid_namespace()}-{live.pid}-")
        not_ours = [
            tmp / f"spotfallback-restore-{dead.pid}-x",  # another name: not made here
            tmp / f"{SCRATCH_PREFIX}{_pid_namespace() + 1}-{dead.pid}-x",  # another pid namespace's pid
            tmp / f"{SCRATCH_PREFIX}{_pid_namespace()}-notapid-x",
        ]
        for d in not_ours:
            d.mkdir()
        (tmp / f"{ours}file").write_text("a file, not a directory")
        with scratch_dir("next-", root=tmp) as mine:
            assert not dead_dir.exists()
            assert (live_dir / "part").exists() and all(d.exists() for d in not_ours) and (tmp / f"{ours}file").exists()
            assert mine.name.startswith(f"{SCRATCH_PREFIX}{_pid_namespace()}-{os.getpid()}-next-")
            assert remove_dead_scratch(tmp) == []  # this process's own: alive
        assert not mine.exists()
    finally:
        _kill(live)
    assert remove_dead_scratch(tmp) == [live_dir] and not live_dir.exists()


def test_a_label_with_a_path_separator_is_refused(tmp_path):
    with pytest.raises(ValueError, match="path separator"), scratch_dir("../x", root=tmp_path):
        pass
