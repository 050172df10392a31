"""On S3 the driver lease is taken with one conditional write: no settle time, and one winner of a race.

Against moto's S3 server (which checks ``If-None-Match`` and ``If-Match`` as S3 does).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spotfallback.errors import DriverAlreadyRunningError
from spotfallback.store import lease as lease_module
from spotfallback.store.lease import DriverLease, LeaseInfo
from spotfallback.store.location import resolve_run
from spotfallback.store.objects import s3_objects

pytest.importorskip("boto3", reason="boto3 comes with moto[server], in the dev extra")

SLOW_SETTLE_S = 5.0  # what write-then-verify would wait; the conditional path must not


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    from tests.support.s3server import s3_server_in_env

    with s3_server_in_env() as s3:
        yield s3


@pytest.fixture
def location(server, request):
    return resolve_run(server.uri("runs"), request.node.name[:40].replace("[", "-").replace("]", ""))


def _stale_lease(location: Any, *, host: str = "gone-host") -> None:
    """A lease left by a driver on another host that stopped renewing long ago."""
    s3 = s3_objects(location.fs)
    assert s3 is not None
    info = LeaseInfo("dead-token", host, 12345, time.time() - 120, time.time() - 60)
    s3.put(location.path(lease_module.LEASE_FILE), json.dumps(info.to_json()).encode())


def test_acquire_on_s3_takes_no_settle_time_and_refuses_a_second_driver(location, monkeypatch):
    def write_then_verify(self: DriverLease) -> None:
        raise AssertionError("the lease was taken by write-then-verify, which waits its settle time")

    monkeypatch.setattr(DriverLease, "_write", write_then_verify)  # the settle path's write; not timed: CI is shared
    first = DriverLease(location, ttl_s=30, settle_s=SLOW_SETTLE_S)
    first.acquire()
    try:
        assert first._s3 is not None  # the conditional path, which never sleeps
        assert first.read() is not None and first.read().token == first.token
        with pytest.raises(DriverAlreadyRunningError, match="another driver is running this run"):
            DriverLease(location, ttl_s=30, settle_s=SLOW_SETTLE_S).acquire()
    finally:
        first.release()
    assert first.read() is None
    second = DriverLease(location, ttl_s=30, settle_s=SLOW_SETTLE_S)
    second.acquire()  # released: free again
    second.release()


def test_an_expired_lease_is_taken_over_and_remembered(location):
    _stale_lease(location)
    lease = DriverLease(location, ttl_s=30, settle_s=SLOW_SETTLE_S)
    lease.acquire()
    try:
        assert lease.previous is not None and lease.previous.token == "dead-token"
        assert lease.read().token == lease.token
    finally:
        lease.release()


@pytest.mark.parametrize("stale", [False, True], ids=["no-lease", "expired-lease"])
def test_two_drivers_that_read_the_same_lease_at_once_exactly_one_wins(location, stale, monkeypatch):
    if stale:
        _stale_lease(location)
    both_read = threading.Barrier(2, timeout=10)
    read_versioned = DriverLease._read_versioned

    def read_then_wait(self: DriverLease, s3: Any) -> Any:
        found = read_versioned(self, s3)
        both_read.wait()  # both hold the same version before either writes
        return found

    monkeypatch.setattr(DriverLease, "_read_versioned", read_then_wait)
    leases = [DriverLease(location, ttl_s=30, settle_s=SLOW_SETTLE_S) for _ in range(2)]
    outcomes: dict[int, BaseException | None] = {}

    def acquire(i: int) -> None:
        try:
            leases[i].acquire()
            outcomes[i] = None
        except BaseException as e:
            outcomes[i] = e

    threads = [threading.Thread(target=acquire, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    monkeypatch.setattr(DriverLease, "_read_versioned", read_versioned)
    winners = [i for i, e in outcomes.items() if e is None]
    assert len(winners) == 1, outcomes
    loser = outcomes[1 - winners[0]]
    assert isinstance(loser, DriverAlreadyRunningError)
    assert leases[winners[0]].read().token == leases[winners[0]].token
    leases[winners[0]].release()


def test_renewal_is_conditional_and_stops_when_the_lease_was_taken(location, caplog):
    lease = DriverLease(location, ttl_s=0.6, settle_s=0)
    lease.acquire()
    try:
        time.sleep(0.5)  # renewed at least once (every ttl/3)
        renewed = lease.read()
        assert renewed is not None and renewed.token == lease.token
        _stale_lease(location, host="other-host")  # another driver's write replaces ours
        lease_module.logger.addHandler(caplog.handler)  # whatever an earlier test did to propagation
        try:
            with caplog.at_level(logging.ERROR, logger=lease_module.__name__):
                deadline = time.monotonic() + 5
                while lease._thread is not None and lease._thread.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.05)
        finally:
            lease_module.logger.removeHandler(caplog.handler)
        assert lease._thread is not None and not lease._thread.is_alive()
        assert any("was taken by host other-host" in r.getMessage() for r in caplog.records)
        assert lease.read().token == "dead-token"  # the renewal did not overwrite the new holder
    finally:
        lease.release()
    assert lease.read().token == "dead-token"  # release leaves another driver's lease alone


def test_without_boto3_the_lease_on_s3_is_write_then_verify(location, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    lease = DriverLease(location, ttl_s=30, settle_s=0.3)
    t0 = time.monotonic()
    lease.acquire()
    try:
        assert time.monotonic() - t0 >= 0.3
        assert lease.read().token == lease.token
    finally:
        lease.release()


def test_a_store_that_ignores_conditional_writes_keeps_write_then_verify(location, monkeypatch):
    from spotfallback.store import objects

    def ignoring(self, bucket, key, path, payload, **condition):  # an S3-compatible store without conditions
        return real(self, bucket, key, path, payload)

    real = objects.S3Objects._put
    monkeypatch.setattr(objects.S3Objects, "_put", ignoring)
    monkeypatch.setattr(objects, "_HONOURS", {})
    lease = DriverLease(location, ttl_s=30, settle_s=0.5)
    t0 = time.monotonic()
    lease.acquire()
    try:
        assert lease._s3 is None and time.monotonic() - t0 >= 0.5  # waited out the settle time
        with pytest.raises(DriverAlreadyRunningError):
            DriverLease(location, ttl_s=30, settle_s=0.5).acquire()
    finally:
        lease.release()
    monkeypatch.setattr(objects, "_HONOURS", {})
    monkeypatch.setattr(objects.S3Objects, "_put", real)
    assert s3_objects(location.fs).honours_conditions(location.path(lease_module.CONDITIONS_PROBE))
