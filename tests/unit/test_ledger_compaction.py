"""Ledger compaction: segments hold the events exactly, and a crash at any point of it reads the same."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs
import pytest

from spotfallback.errors import LedgerError
from spotfallback.events import CheckpointCommitted, Preempted, RunStarted, WorkersAcquired
from spotfallback.store.ledger import Ledger, LedgerTail
from spotfallback.store.location import RunLocation, resolve_run
from spotfallback.store.segments import SEGMENTS_DIR, chunks_to_compact, decode_segment


class Crash(BaseException):
    """The process dies here (not an OSError: nothing retries it)."""


class HookedHandler(pafs.FileSystemHandler):
    """The local filesystem, with ``hook(op, path)`` called before each call (to crash or interleave)."""

    def __init__(self, hook: Callable[[str, str], None]) -> None:
        self.inner = pafs.LocalFileSystem()
        self.hook = hook

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def get_type_name(self) -> str:
        return "hooked-local"

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self.hook("list", selector.base_dir)
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.hook("mkdir", path)
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("no")

    def delete_file(self, path: str) -> None:
        self.hook("delete", path)
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.hook("move", dest)
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.hook("copy", dest)
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        self.hook("read", path)
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        self.hook("read", path)
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        self.hook("write", path)
        return self.inner.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        raise OSError("no appends")


def hooked(location: RunLocation, hook: Callable[[str, str], None]) -> RunLocation:
    return RunLocation(pafs.PyFileSystem(HookedHandler(hook)), location.run_dir, location.storage_path, location.name)


def write_events(location: RunLocation, n: int, writer: str = "ctl", t0: float = 1000.0) -> list:
    ledger = Ledger(location, writer=writer, compact_every=0)
    ledger.ensure_dirs()
    records = [ledger.append(RunStarted(t0), 0), ledger.append(WorkersAcquired(t0 + 1, num_workers=2), 0)]
    records += [ledger.append(CheckpointCommitted(t0 + 2 + k, step=k), 0) for k in range(n - 2)]
    return records


def loose_names(location: RunLocation) -> list[str]:
    directory = location.path("ledger")
    return sorted(n for n in os.listdir(directory) if n.endswith(".json"))


def segment_names(location: RunLocation) -> list[str]:
    directory = location.path("ledger", SEGMENTS_DIR)
    return sorted(n for n in os.listdir(directory) if n.endswith(".json")) if os.path.isdir(directory) else []


def ids(records: list) -> list[str]:
    return [r.id for r in records]


def test_compaction_moves_full_chunks_into_segments_and_reads_the_same(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    written = write_events(location, 23)
    ledger = Ledger(location, compact_every=5)
    assert ledger.compact() == 20
    assert len(loose_names(location)) == 3 and len(segment_names(location)) == 4
    assert ledger.read() == written
    # Each segment holds its events exactly: the same JSON as the loose objects they replace.
    first = location.path("ledger", SEGMENTS_DIR, segment_names(location)[0])
    with open(first, "rb") as f:
        entries = decode_segment(f.read(), first)
    assert [r.id for _, r in entries] == ids(written[:5])


def test_the_writer_compacts_as_it_appends_so_the_loose_tail_stays_short(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    ledger = Ledger(location, writer="ctl", compact_every=4)
    ledger.ensure_dirs()
    written = [ledger.append(CheckpointCommitted(float(k), step=k), 0) for k in range(18)]
    assert len(loose_names(location)) < 4
    assert len(segment_names(location)) == 4
    assert Ledger(location).read() == written


def test_a_run_written_before_segments_reads_and_then_compacts(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    written = write_events(location, 12)
    assert segment_names(location) == []
    driver = Ledger(location, writer="drv", compact_every=5)
    assert driver.read() == written
    # The driver's next append finds 13 loose events it has read: two chunks move, without fetching them again.
    reads: list[str] = []
    driver.location = hooked(location, lambda op, path: reads.append(path) if op == "read" else None)
    written.append(driver.append(Preempted(5000.0), 0))
    assert reads == []
    assert len(segment_names(location)) == 2 and len(loose_names(location)) == 3
    assert Ledger(location).read() == written


def test_a_late_event_from_another_writer_sorts_where_it_belongs(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    written = write_events(location, 10, t0=1000.0)
    Ledger(location, compact_every=5).compact()
    late = Ledger(location, writer="agent", compact_every=0).append(Preempted(1004.5), 0)
    names = [r.id for r in Ledger(location).read()]
    assert names == ids(written[:5]) + [late.id] + ids(written[5:])


def _mutations(location: RunLocation, n_events: int, every: int) -> int:
    """How many storage mutations one compaction makes (to crash at each in turn)."""
    count = 0

    def hook(op: str, path: str) -> None:
        nonlocal count
        if op in ("mkdir", "write", "move", "copy", "delete"):
            count += 1

    write_events(location, n_events)
    Ledger(hooked(location, hook), compact_every=every).compact()
    return count


def crash_before(k: int) -> Callable[[str, str], None]:
    """A hook under which the process dies just before its ``k``-th storage mutation."""
    calls = 0

    def hook(op: str, path: str) -> None:
        nonlocal calls
        if op in ("mkdir", "write", "move", "copy", "delete"):
            if calls == k:
                raise Crash(f"{op} {path}")
            calls += 1

    return hook


def test_a_crash_at_any_point_of_compaction_reads_the_same(tmp_path):
    total = _mutations(resolve_run(str(tmp_path), "probe"), 11, 5)
    assert total == 1 + 2 * (2 + 5)  # mkdir; per chunk: temporary write, move, five deletes
    for k in range(total):
        location = resolve_run(str(tmp_path), f"crash-{k}")
        written = write_events(location, 11)
        with pytest.raises(Crash):
            Ledger(hooked(location, crash_before(k)), compact_every=5).compact()
        assert Ledger(location).read() == written, f"crash before mutation {k}"
        assert LedgerTail(location).poll() == written
        # The next compaction finishes the job (events both loose and in a segment may move
        # again, into a second segment): nothing lost, nothing read twice.
        Ledger(location, compact_every=5).compact()
        assert Ledger(location).read() == written
        assert len(loose_names(location)) < 5


def test_a_half_written_segment_is_never_read(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    written = write_events(location, 10)
    segments = location.path("ledger", SEGMENTS_DIR)
    os.makedirs(segments)
    with open(os.path.join(segments, ".tmp-abc-00000000000000000001--00000000000000000002-x.json"), "w") as f:
        f.write('{"v": 1, "events": [["0000')
    assert Ledger(location).read() == written


def test_a_reader_racing_a_compaction_lists_again(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    written = write_events(location, 10)
    done = False

    def compact_after_first_listing(op: str, path: str) -> None:
        nonlocal done
        if op == "list" and path.endswith("/ledger") and not done:
            done = True
            return
        if op == "list" and path.endswith(SEGMENTS_DIR) and done and not segment_names(location):
            Ledger(location, compact_every=5).compact()  # between the reader's two listings

    assert Ledger(hooked(location, compact_after_first_listing)).read() == written
    assert segment_names(location)


def test_two_compactors_at_once_lose_nothing_and_duplicate_nothing(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    written = write_events(location, 10)
    other = Ledger(location, compact_every=5)
    # This one listed, then the other moved everything before it read: it stops.
    fired = False

    def other_moves_first(op: str, path: str) -> None:
        nonlocal fired
        if op == "read" and not fired:
            fired = True
            other.compact()

    assert Ledger(hooked(location, other_moves_first), compact_every=5).compact() == 0
    assert Ledger(location).read() == written
    # One that had read the events already writes its own segments of them: still read once.
    location2 = resolve_run(str(tmp_path), "r2")
    written2 = write_events(location2, 10)
    stale = Ledger(location2, compact_every=5)
    stale.read()
    Ledger(location2, compact_every=5).compact()
    stale.compact()
    assert Ledger(location2).read() == written2


def test_a_failed_compaction_does_not_fail_the_append(tmp_path, caplog):
    location = resolve_run(str(tmp_path), "r")

    def no_segments(op: str, path: str) -> None:
        if SEGMENTS_DIR in path and op in ("mkdir", "write"):
            raise PermissionError(f"denied: {path}")

    ledger = Ledger(hooked(location, no_segments), writer="ctl", compact_every=3)
    ledger.ensure_dirs()
    written = [ledger.append(CheckpointCommitted(float(k), step=k), 0) for k in range(4)]
    assert "could not compact the ledger" in caplog.text
    assert Ledger(location).read() == written


def test_damaged_or_foreign_segments_are_named(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    write_events(location, 10)
    Ledger(location, compact_every=5).compact()
    path = location.path("ledger", SEGMENTS_DIR, segment_names(location)[0])
    with open(path, "w") as f:
        json.dump({"v": 1, "events": [["x/y.json", {}]]}, f)
    with pytest.raises(LedgerError, match=r"entry 0 is not \[event object name, record\]"):
        Ledger(location).read()
    with open(path, "w") as f:
        f.write("{torn")
    with pytest.raises(LedgerError, match=f"{segment_names(location)[0]}: not valid JSON"):
        Ledger(location).read()
    os.remove(path)
    with open(os.path.join(os.path.dirname(path), "notes.txt"), "w") as f:
        f.write("hello")
    with pytest.raises(LedgerError, match="notes.txt: unexpected object"):
        Ledger(location).read()


def test_the_tail_reads_each_event_once_across_compactions(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    writer = Ledger(location, writer="ctl", compact_every=4)
    writer.ensure_dirs()
    tail = LedgerTail(location)
    written = []
    for k in range(13):
        written.append(writer.append(CheckpointCommitted(float(k), step=k), 0))
        assert tail.poll() == written
    reads: list[str] = []
    tail.location = hooked(location, lambda op, path: reads.append(path) if op == "read" else None)
    tail._ledger.location = tail.location
    assert tail.poll() == written and reads == []  # nothing new: nothing fetched


def test_chunks_are_full_and_in_name_order():
    assert chunks_to_compact(["c", "a", "b", "d", "e"], 2) == [["a", "b"], ["c", "d"]]
    assert chunks_to_compact(["a"], 2) == []
    assert chunks_to_compact(["a", "b"], 0) == []


def test_a_negative_compaction_interval_is_refused(tmp_path):
    with pytest.raises(ValueError, match="compact_every must be 0"):
        Ledger(resolve_run(str(tmp_path), "r"), compact_every=-1)


def test_a_read_costs_two_listings_and_one_fetch_per_segment_and_loose_event(tmp_path):
    location = resolve_run(str(tmp_path), "r")
    written = write_events(location, 1003)
    Ledger(location, compact_every=100).compact()
    calls: list[str] = []
    assert Ledger(hooked(location, lambda op, path: calls.append(op))).read() == written
    assert sorted(calls) == ["list"] * 2 + ["read"] * (10 + 3)


def test_on_s3_compaction_reads_the_same_and_a_moved_event_reads_as_gone(monkeypatch):
    """On moto's S3 server: segments, deletes and a missing object as pyarrow's S3 client sees them."""
    from spotfallback.store.reads import read_objects
    from tests.support.s3server import S3Server

    with S3Server() as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        location = resolve_run(server.uri("runs"), "job-1")
        writer = Ledger(location, writer="ctl", compact_every=5)
        writer.ensure_dirs()
        written = [writer.append(CheckpointCommitted(1000.0 + k, step=k), 0) for k in range(12)]
        infos = location.fs.get_file_info(pafs.FileSelector(location.path("ledger"), recursive=True))
        assert sum(1 for i in infos if i.type == pafs.FileType.File and "/segments/" in i.path) == 2
        assert Ledger(location).read() == written
        assert LedgerTail(location).poll() == written
        assert read_objects(location.fs, [location.path("ledger", "00000000000000000001-gone-finished.json")]) == [None]
