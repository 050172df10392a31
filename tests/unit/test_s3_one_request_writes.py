"""On S3 a ledger event is one request: a create-if-absent PUT; compaction deletes in batches.

Against moto's S3 server, counted by a proxy in front of it (requests as the server sees them).
Without boto3 the same ledger takes pyarrow's path (a temporary object moved into place) and
reads the same.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow.fs as pafs
import pytest

from spotfallback.errors import LedgerError, ObjectConflictError, StorageUnavailableError
from spotfallback.events import CheckpointCommitted, RunStarted
from spotfallback.store import objects
from spotfallback.store.ledger import Ledger, LedgerTail
from spotfallback.store.location import resolve_run
from spotfallback.store.objects import s3_objects

pytest.importorskip("boto3", reason="boto3 comes with moto[server], in the dev extra")


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    from tests.support.s3server import s3_server_in_env

    with s3_server_in_env() as s3:
        yield s3


class Counted:
    """A proxy in front of the server that counts the requests it forwards, by method."""

    def __init__(self, server: Any) -> None:
        from tests.support.s3server import _REQUEST_LINE, OutageProxy

        self.counts: Counter[str] = Counter()
        self.paths: list[str] = []
        counts, paths = self.counts, self.paths

        class Counting(OutageProxy):
            def _arrived(self, data: bytes) -> tuple[str, Any]:
                for m in _REQUEST_LINE.finditer(data):
                    counts[m.group(1).decode()] += 1
                    paths.append(f"{m.group(1).decode()} {m.group(2).decode(errors='replace')}")
                return super()._arrived(data)

        self.proxy = Counting(server.endpoint).start()

    def total(self) -> int:
        return sum(self.counts.values())

    def clear(self) -> None:
        self.counts.clear()
        self.paths.clear()


@pytest.fixture
def counted(server: Any) -> Iterator[Counted]:
    c = Counted(server)
    try:
        yield c
    finally:
        c.proxy.close()


def _ledger(server: Any, counted: Counted, request: Any, compact_every: int) -> Ledger:
    """The controller's ledger of a run named after the test, on the server through the counting proxy."""
    ledger = Ledger(resolve_run(server.uri("runs", counted.proxy.endpoint), request.node.name[:40]), writer="ctl",
                    compact_every=compact_every)
    ledger.ensure_dirs()
    return ledger


def _events(n: int, start: int = 0) -> list[CheckpointCommitted]:
    return [CheckpointCommitted(1000.0 + k, step=k) for k in range(start, start + n)]


def test_an_event_written_on_s3_is_one_put(server, counted, request):
    ledger = _ledger(server, counted, request, compact_every=0)
    location = ledger.location
    counted.clear()
    written = [ledger.append(ev, 0) for ev in _events(20)]
    assert counted.counts == Counter({"PUT": 20}), counted.paths
    assert all(".tmp-" not in p for p in counted.paths)
    assert Ledger(location).read() == written


def test_compaction_on_s3_writes_one_segment_and_deletes_its_events_in_one_request(server, counted, request):
    ledger = _ledger(server, counted, request, compact_every=10)
    location = ledger.location
    counted.clear()
    written = [ledger.append(ev, 0) for ev in _events(25)]
    deletes = [p for p in counted.paths if p.startswith("POST") and "delete" in p]
    assert len(deletes) == 2 and counted.counts["DELETE"] == 0, counted.paths
    assert all(".tmp-" not in p for p in counted.paths)
    # Each compaction: two listings, the segment, the batch delete, and looking for run.json (no
    # ladder here, so no snapshot): 6 requests; no directory markers.
    assert counted.total() == 25 + 2 * 6, counted.paths
    infos = location.fs.get_file_info(pafs.FileSelector(location.path("ledger"), recursive=True))
    files = [i.path for i in infos if i.type == pafs.FileType.File]
    assert sum("/segments/" in p for p in files) == 2
    assert sum("/segments/" not in p and "/snapshot/" not in p for p in files) == 5
    assert Ledger(location).read() == written
    assert LedgerTail(location).poll() == written


def test_create_if_absent_accepts_its_own_retry_and_refuses_another_writers_object(server):
    fs = server.filesystem()
    s3 = s3_objects(fs)
    assert s3 is not None
    path = f"{server.bucket}/objects/create/event.json"
    s3.create(path, b'{"a": 1}')
    s3.create(path, b'{"a": 1}')  # a retry of our own write whose answer was lost: success
    with pytest.raises(ObjectConflictError, match="already exists with other content.*same name"):
        s3.create(path, b'{"a": 2}')
    assert s3.get(path) == b'{"a": 1}'
    assert isinstance(ObjectConflictError("x"), LedgerError)


def test_two_writers_with_one_id_do_not_overwrite_each_others_event(server, request):
    location = resolve_run(server.uri("runs"), request.node.name[:40])
    first, second = Ledger(location, writer="same", compact_every=0), Ledger(location, writer="same", compact_every=0)
    first.ensure_dirs()
    kept = first.append(RunStarted(5000.0), 0)
    with pytest.raises(LedgerError, match="already exists with other content"):
        second.append(RunStarted(5000.0), 0)  # same name, another record id
    assert Ledger(location).read() == [kept]


def test_batch_delete_takes_one_request_per_batch_and_ignores_missing_keys(server, counted, monkeypatch):
    fs = server.filesystem(counted.proxy.endpoint)
    s3 = s3_objects(fs)
    assert s3 is not None
    paths = [f"{server.bucket}/objects/delete/{k:03d}.json" for k in range(25)]
    for path in paths:
        s3.put(path, b"{}")
    monkeypatch.setattr(objects, "DELETE_BATCH", 10)
    counted.clear()
    s3.delete([*paths, f"{server.bucket}/objects/delete/never-written.json"])
    assert counted.total() == 3 and counted.counts["POST"] == 3, counted.paths
    listed = fs.get_file_info(pafs.FileSelector(f"{server.bucket}/objects/delete", allow_not_found=True))
    assert [i for i in listed if i.type == pafs.FileType.File] == []


def test_an_outage_during_a_one_request_write_is_waited_out(server, counted, request, monkeypatch):
    monkeypatch.setenv("SPOTFALLBACK_STORAGE_RETRY_S", "20")
    ledger = _ledger(server, counted, request, compact_every=0)
    location = ledger.location
    proxy = counted.proxy

    def back_after_the_write_met_it() -> None:
        # Storage returns once the write has been refused and retried a while: on a loaded
        # machine a fixed-length outage could end before the write reached it.
        deadline = time.monotonic() + 15
        while proxy.refused == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        proxy.restore()

    proxy.cut("test")
    restorer = threading.Thread(target=back_after_the_write_met_it, daemon=True)
    restorer.start()
    record = ledger.append(RunStarted(1.0), 0)
    restorer.join()
    assert proxy.refused > 0
    assert Ledger(location).read() == [record]


def test_storage_gone_for_good_stops_a_one_request_write_with_the_usual_error(server, counted, request, monkeypatch):
    monkeypatch.setenv("SPOTFALLBACK_STORAGE_RETRY_S", "1")
    ledger = _ledger(server, counted, request, compact_every=0)
    counted.proxy.cut("test")
    with pytest.raises(StorageUnavailableError, match="write ledger event"):
        ledger.append(RunStarted(1.0), 0)


def test_without_boto3_s3_takes_pyarrows_path_says_so_once_and_reads_the_same(server, counted, request, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` now raises ImportError
    monkeypatch.setattr(objects, "_told_no_boto3", False)
    ledger = _ledger(server, counted, request, compact_every=5)
    location = ledger.location
    counted.clear()
    objects.logger.addHandler(caplog.handler)  # whatever an earlier test did to propagation
    try:
        with caplog.at_level(logging.INFO, logger=objects.__name__):
            assert s3_objects(location.fs) is None
            written = [ledger.append(ev, 0) for ev in _events(12)]
    finally:
        objects.logger.removeHandler(caplog.handler)
    told = list({id(r): r for r in caplog.records if r.name == objects.__name__ and "is not installed" in r.getMessage()}.values())
    assert len(told) == 1 and told[0].levelno == logging.INFO
    assert any(".tmp-" in p for p in counted.paths)  # the temporary object, moved into place
    assert counted.counts["DELETE"] > 0 and not any("delete" in p for p in counted.paths if p.startswith("POST /"))
    assert Ledger(location).read() == written


def test_other_stores_keep_pyarrows_path(tmp_path):
    assert s3_objects(pafs.LocalFileSystem()) is None
    assert s3_objects(resolve_run(str(tmp_path), "job").fs) is None


def test_an_error_no_wait_can_fix_stops_a_one_request_write_at_once(server, monkeypatch):
    monkeypatch.setenv("SPOTFALLBACK_STORAGE_RETRY_S", "30")
    location = resolve_run(server.uri("runs").replace(f"s3://{server.bucket}/", "s3://no-such-bucket/"), "job")
    t0 = time.monotonic()
    with pytest.raises(LedgerError, match="write ledger event .*NoSuchBucket") as info:
        Ledger(location, writer="ctl", compact_every=0).append(RunStarted(1.0), 0)
    assert not isinstance(info.value, StorageUnavailableError)
    assert time.monotonic() - t0 < 5
