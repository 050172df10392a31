"""One live driver per run: a lease with expiry in the run's state directory.

Where the store has conditional writes (S3 with boto3, ``store.objects``), acquisition is one
of them: create the lease only if there is none (``If-None-Match: *``), or take over a dead
driver's only while it is still the version that was read (``If-Match`` on its ETag); of two
drivers at once, exactly one write succeeds, so there is nothing to wait for. Renewals are
conditional too, so a driver whose lease was taken over finds out at its next renewal.

Elsewhere (GCS, Azure Blob, local disk and NFS) there is no exclusive create, so acquisition is
write-then-verify: write a lease with a fresh token, wait a settle period, read it back; the
driver whose token survived owns the run. A background thread renews the lease; a killed
driver stops renewing and its lease expires after ``ttl_s``. A lease from a dead process on
this same host is taken over at once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pyarrow.fs as pafs

from spotfallback.durations import ago
from spotfallback.errors import (
    ConfigError,
    DriverAlreadyRunningError,
    LedgerError,
    ObjectConflictError,
)
from spotfallback.events import finite_number
from spotfallback.store.location import RunLocation, write_atomically
from spotfallback.store.objects import S3Objects, s3_objects
from spotfallback.store.retry import call_with_retry

logger = logging.getLogger(__name__)

# Written once per process and bucket to check that the store refuses a failed condition.
CONDITIONS_PROBE = "conditional-writes.probe"

LEASE_FILE = "lease.json"


@dataclass(frozen=True)
class LeaseInfo:
    token: str
    host: str
    pid: int
    renewed_at: float
    expires_at: float

    def to_json(self) -> dict:
        return self.__dict__.copy()


TTL_ENV = "SPOTFALLBACK_LEASE_TTL_S"


def lease_ttl_s(ttl_s: float | None = None) -> float:
    """The lease's time to live: ``ttl_s``, else ``SPOTFALLBACK_LEASE_TTL_S``, else 30 s.

    Why checked: a zero, negative or NaN TTL would make every lease look expired, so a second
    driver would take over a live run instead of being refused.
    """
    source = "lease_ttl_s"
    if ttl_s is None:
        source, raw = TTL_ENV, os.environ.get(TTL_ENV, "30")
        try:
            ttl_s = float(raw)
        except ValueError:
            raise ConfigError(f"{TTL_ENV}: {raw!r} is not a number of seconds") from None
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s) or ttl_s <= 0:
        raise ConfigError(f"{source}: must be a positive, finite number of seconds, got {ttl_s!r}")
    return float(ttl_s)


def parse_lease(raw: bytes, where: str) -> LeaseInfo | None:
    """The lease in ``raw``, or None (with a warning naming ``where``) when it is not one.

    Why each field's type is checked: a lease whose times are text would pass a plain parse and
    then break every comparison with the clock, in the driver and in ``status`` alike.
    """
    try:
        data = json.loads(raw)
        info = LeaseInfo(**{k: data[k] for k in ("token", "host", "pid", "renewed_at", "expires_at")})
    except (ValueError, KeyError, TypeError):
        info = None
    times_ok = info is not None and all(
        finite_number(v) is not None for v in (info.renewed_at, info.expires_at)
    )
    if info is None or not times_ok or not isinstance(info.token, str) or not isinstance(info.host, str) \
            or isinstance(info.pid, bool) or not isinstance(info.pid, int):
        logger.warning("ignoring unreadable driver lease at %s", where)
        return None
    return info


def read_lease(location: RunLocation, file: str = LEASE_FILE) -> LeaseInfo | None:
    """The lease in the run's ``file``, or None when there is none or it cannot be parsed;
    ``LedgerError`` when the storage refuses it (no access), after the storage retry rule.

    Apart from ``DriverLease`` because readers (``status``, ``report``) need no TTL: a bad
    ``SPOTFALLBACK_LEASE_TTL_S`` concerns drivers, not someone looking at a run.
    """
    fs, path = location.fs, location.path(file)

    def load() -> bytes | None:
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        return fs.open_input_stream(path).readall()

    raw = call_with_retry(load, "read the driver lease", permanent=LedgerError)
    return None if raw is None else parse_lease(raw, path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DriverLease:
    """Acquire with ``acquire()``, give back with ``release()``; or use as a context manager."""

    def __init__(self, location: RunLocation, ttl_s: float | None = None, settle_s: float | None = None,
                 file: str = LEASE_FILE, on_lost: Callable[[LeaseInfo], None] | None = None):
        self.location = location
        self.file = file  # another file for another role (the driver that moves a run between clusters)
        self.ttl_s = lease_ttl_s(ttl_s)
        self.settle_s = settle_s if settle_s is not None else min(1.0, self.ttl_s / 10)
        self.token = uuid.uuid4().hex
        self.previous: LeaseInfo | None = None  # a stale lease this driver took over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._s3: S3Objects | None = None  # conditional writes, where the store has them
        self._etag = ""  # the version of the lease this driver wrote last (conditional writes)
        # Set once another holder has the lease: this one must stop writing the run at once (``on_lost`` says so).
        self.lost: LeaseInfo | None = None
        self._on_lost = on_lost

    @property
    def path(self) -> str:
        return self.location.path(self.file)

    def read(self) -> LeaseInfo | None:
        return read_lease(self.location, self.file)

    def _payload(self) -> bytes:
        now = time.time()
        info = LeaseInfo(self.token, socket.gethostname(), os.getpid(), now, now + self.ttl_s)
        return json.dumps(info.to_json()).encode()

    def _write(self) -> None:
        payload = self._payload()
        call_with_retry(
            lambda: write_atomically(self.location.fs, self.path, payload), "write the driver lease", permanent=LedgerError
        )

    def _read_versioned(self, s3: S3Objects) -> tuple[LeaseInfo | None, str] | None:
        """The lease and its ETag (an unreadable one: ``None`` and its ETag); ``None`` if there is none."""
        found = call_with_retry(partial(s3.get_versioned, self.path), "read the driver lease", permanent=LedgerError)
        return None if found is None else (parse_lease(found[0], self.path), found[1])

    def _acquire_conditionally(self, s3: S3Objects) -> None:
        """Create the lease, or take over the version found, in one conditional write: no settle time."""
        found = self._read_versioned(s3)
        current, etag = found if found is not None else (None, "")
        if current is not None and self.holder_is_live(current):
            raise DriverAlreadyRunningError(self._refusal(current))
        self.previous = current
        payload = self._payload()
        try:
            if found is None:
                write = partial(s3.create, self.path, payload)
            else:
                write = partial(s3.replace, self.path, payload, etag)
            self._etag = call_with_retry(write, "write the driver lease", permanent=LedgerError)
        except ObjectConflictError:  # another driver wrote it between our read and our write
            winner = self.read()
            raise DriverAlreadyRunningError(
                self._refusal(winner) if winner is not None else "lost the race for the driver lease"
            ) from None

    def _renew_conditionally(self, s3: S3Objects) -> LeaseInfo | None:
        """Renew the lease if it is still this driver's version; else the lease that replaced it (``None``: renewed)."""
        try:
            self._etag = call_with_retry(partial(s3.replace, self.path, self._payload(), self._etag),
                                         "renew the driver lease", permanent=LedgerError)
            return None
        except ObjectConflictError:
            pass
        found = self._read_versioned(s3)
        if found is None:  # deleted by hand: written again, unless another driver has been quicker
            try:
                self._etag = call_with_retry(partial(s3.create, self.path, self._payload()), "write the driver lease",
                                             permanent=LedgerError)
                return None
            except ObjectConflictError:
                found = self._read_versioned(s3)
        current, etag = found if found is not None else (None, "")
        if current is not None and current.token == self.token:
            self._etag = etag  # ours all along (a version whose answer was lost): renewed next time
            return None
        return current or LeaseInfo("", "?", 0, 0.0, 0.0)

    def holder_is_live(self, info: LeaseInfo) -> bool:
        """Whether ``info`` is another holder's lease that still counts (not expired, its process not known dead)."""
        if info.token == self.token:
            return False
        if info.host == socket.gethostname() and not _pid_alive(info.pid):
            return False
        return info.expires_at > time.time()

    def acquire(self) -> None:
        s3 = s3_objects(self.location.fs)
        conditional = s3 is not None and s3.can_replace and call_with_retry(
            partial(s3.honours_conditions, self.location.path(CONDITIONS_PROBE)), "check the store's conditional writes",
            permanent=LedgerError)
        self._s3 = s3 if conditional else None
        if self._s3 is not None:
            self._acquire_conditionally(self._s3)
            self._start_renewing()
            return
        call_with_retry(
            lambda: self.location.fs.create_dir(self.location.state_dir, recursive=True), "create the run directory",
            permanent=LedgerError,
        )
        current = self.read()
        if current is not None and self.holder_is_live(current):
            raise DriverAlreadyRunningError(self._refusal(current))
        self.previous = current
        self._write()
        time.sleep(self.settle_s)
        winner = self.read()
        if winner is None or winner.token != self.token:
            raise DriverAlreadyRunningError(self._refusal(winner) if winner else "lost the race for the driver lease")
        self._start_renewing()

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="spotfallback-lease", daemon=True)
        self._thread.start()

    def refuse_if_held(self) -> None:
        """Raise ``DriverAlreadyRunningError`` if another live driver holds the lease; writes nothing.

        Lets a caller refuse before it starts anything expensive; ``acquire()`` checks again.
        """
        current = self.read()
        if current is not None and self.holder_is_live(current):
            raise DriverAlreadyRunningError(self._refusal(current))

    def _refusal(self, info: LeaseInfo) -> str:
        """Why a second driver is refused. The lease is dated by its writer's clock: one renewed on a
        machine whose clock is ahead reads "renewed 12s ahead of this machine's clock", not a negative age."""
        now = time.time()
        left = max(0.0, info.expires_at - now)
        return (
            f"another driver is running this run ({self.location.uri()}): host {info.host}, pid {info.pid}, "
            f"lease renewed {ago(now - info.renewed_at)}. Wait for it to finish, stop it, or, if it "
            f"is dead, retry after its lease expires in {left:.0f}s."
        )

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if self._s3 is not None:
                    taken = self._renew_conditionally(self._s3)
                    if taken is not None:
                        self._taken(taken)
                        return
                    continue
                current = self.read()
                if current is not None and current.token != self.token:
                    self._taken(current)
                    return
                self._write()
            except Exception:  # keep renewing through transient storage trouble
                logger.warning("could not renew the driver lease", exc_info=True)

    def _taken(self, holder: LeaseInfo) -> None:
        """Another driver took the lease (this one was cut off from the storage past its TTL): fence this one off."""
        logger.error("driver lease on %s was taken by host %s pid %s: this driver stops", self.path, holder.host, holder.pid)
        self.lost = holder
        if self._on_lost is not None:
            self._on_lost(holder)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            current = self.read()
            if current is not None and current.token == self.token:
                self.location.fs.delete_file(self.path)
        except Exception:
            logger.warning("could not release the driver lease at %s", self.path, exc_info=True)

    def __enter__(self) -> DriverLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
