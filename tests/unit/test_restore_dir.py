"""Reading a checkpoint to restore from: each reader its own copy of a remote checkpoint, none
of the shared download directory that another reader on the node may delete under it."""

from __future__ import annotations

import contextlib
import os

import pyarrow.fs as pafs
import pytest

from spotfallback.integrations.restore_dir import checkpoint_files

pytest.importorskip("ray.train")


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
        second = second_reader.enter_context(checkpoint_files(checkpoint, prefix="r1-"))
        with checkpoint_files(checkpoint, prefix="r0-") as first:
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
