"""A file written for the user is replaced whole or not at all."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from spotfallback.store.files import replace_file, write_problem, written_path


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path, disk_full_on_sync):
    path = tmp_path / "job.yaml"
    path.write_text("edited by hand\n")
    with pytest.raises(OSError) as e:
        replace_file(path, "new\n")
    assert path.read_text() == "edited by hand\n" and sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]
    assert write_problem(path, e.value) == f"cannot write {str(path)!r}: {os.strerror(errno.ENOSPC)}; free some space or give another path"


def test_a_link_is_followed_and_its_target_replaced_keeping_its_permissions(tmp_path):
    target = tmp_path / "real.csv"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    replace_file(link, b"new")
    assert link.is_symlink() and target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert "(a link to" in write_problem(link, PermissionError(errno.EACCES, "Permission denied"))


def test_a_device_is_written_in_place_and_a_new_file_through_its_directory(tmp_path):
    assert written_path(Path("/dev/null")) == Path("/dev/null")  # no temporary file beside it in /dev
    replace_file(Path("/dev/null"), "x")
    assert written_path(tmp_path / "new.png") == tmp_path
