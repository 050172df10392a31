"""A local filesystem that fails on purpose: storage outages on cue, in every process of a run.

``faulty_filesystem(control_dir)`` is a pyarrow ``PyFileSystem`` delegating to the local
filesystem. While ``control_dir/outage_until`` holds a time in the future, every call raises
``OSError`` (a connection refused, as far as the caller can tell). The switch lives in files,
not in memory, because Ray pickles the filesystem into its controller and worker processes.
``FaultControl.arm(match, duration_s)`` starts an outage at the exact moment a file whose path
contains ``match`` is opened for writing, so a test can cut storage in the middle of a
checkpoint upload.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs


class FaultControl:
    """The test's side of the switch; ``outages`` counts the outages that actually began."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def _write(self, name: str, text: str) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)

    def start(self, duration_s: float) -> None:
        self._write("outage_until", str(time.time() + duration_s))
        self._count()

    def stop(self) -> None:
        (self.dir / "outage_until").unlink(missing_ok=True)
        (self.dir / "arm").unlink(missing_ok=True)

    def arm(self, match: str, duration_s: float) -> None:
        self._write("arm", json.dumps({"match": match, "duration_s": duration_s}))

    @property
    def armed(self) -> bool:
        return (self.dir / "arm").exists()

    @property
    def outages(self) -> int:
        path = self.dir / "count"
        return int(path.read_text()) if path.exists() else 0

    def _count(self) -> None:
        self._write("count", str(self.outages + 1))

    def down(self) -> bool:
        try:
            return time.time() < float((self.dir / "outage_until").read_text())
        except (OSError, ValueError):
            return False

    def trigger(self, path: str) -> bool:
        """Begin the armed outage if ``path`` matches (each arming fires once, in one process)."""
        arm = self.dir / "arm"
        try:
            spec = json.loads(arm.read_text())
        except (OSError, ValueError):
            return False
        if spec["match"] not in path:
            return False
        claimed = self.dir / f".arm.{os.getpid()}"
        try:
            os.replace(arm, claimed)  # atomic: only one process fires
        except OSError:
            return False
        claimed.unlink()
        self.start(float(spec["duration_s"]))
        return True


class FaultyHandler(pafs.FileSystemHandler):
    """LocalFileSystem, except during an outage. Picklable (holds a path and a filesystem)."""

    def __init__(self, control_dir: str) -> None:
        self.control_dir = str(control_dir)
        self.inner = pafs.LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FaultyHandler) and other.control_dir == self.control_dir

    def __ne__(self, other: object) -> bool:
        return not self == other

    def _check(self, what: str) -> None:
        if FaultControl(self.control_dir).down():
            raise OSError(f"injected storage outage: cannot {what} (connection refused)")

    def get_type_name(self) -> str:
        return "faulty-local"

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        self._check("stat")
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self._check("list")
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._check("mkdir")
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._check("rmdir")
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._check("rmdir")
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to empty the root")

    def delete_file(self, path: str) -> None:
        self._check("delete")
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._check("move")
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self._check("copy")
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        self._check("read")
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        self._check("read")
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        control = FaultControl(self.control_dir)
        if control.trigger(path):
            raise OSError(f"injected storage outage began while writing {path}")
        self._check("write")
        return self.inner.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        self._check("append")
        return self.inner.open_append_stream(path, metadata=metadata)


def faulty_filesystem(control_dir: str | os.PathLike[str]) -> pafs.FileSystem:
    FaultControl(control_dir)  # creates the directory
    return pafs.PyFileSystem(FaultyHandler(str(control_dir)))
