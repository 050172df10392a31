"""One live driver per run: a lease with expiry in the run's state directory.

Object stores have no exclusive create, so acquisition is write-then-verify: write a lease
with a fresh token, wait a settle period, read it back; the driver whose token survived owns
the run. A background thread renews the lease; a killed driver stops renewing and its lease
expires after ``ttl_s``. A lease from a dead process on this same host is taken over at once.
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
from dataclasses import dataclass

import pyarrow.fs as pafs

from spotfallback.errors import ConfigError, DriverAlreadyRunningError, LedgerError
from spotfallback.store.location import RunLocation, write_atomically
from spotfallback.store.retry import call_with_retry

logger = logging.getLogger(__name__)

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

    def __init__(self, location: RunLocation, ttl_s: float | None = None, settle_s: float | None = None):
        self.location = location
        self.ttl_s = lease_ttl_s(ttl_s)
        self.settle_s = settle_s if settle_s is not None else min(1.0, self.ttl_s / 10)
        self.token = uuid.uuid4().hex
        self.previous: LeaseInfo | None = None  # a stale lease this driver took over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> str:
        return self.location.path(LEASE_FILE)

    def read(self) -> LeaseInfo | None:
        fs = self.location.fs

        def load() -> bytes | None:
            if fs.get_file_info(self.path).type != pafs.FileType.File:
                return None
            return fs.open_input_stream(self.path).readall()

        raw = call_with_retry(load, "read the driver lease", permanent=LedgerError)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return LeaseInfo(**{k: data[k] for k in ("token", "host", "pid", "renewed_at", "expires_at")})
        except (ValueError, KeyError, TypeError):
            logger.warning("ignoring unreadable driver lease at %s", self.path)
            return None

    def _write(self) -> None:
        now = time.time()
        info = LeaseInfo(self.token, socket.gethostname(), os.getpid(), now, now + self.ttl_s)
        payload = json.dumps(info.to_json()).encode()
        call_with_retry(
            lambda: write_atomically(self.location.fs, self.path, payload), "write the driver lease", permanent=LedgerError
        )

    def _holder_is_live(self, info: LeaseInfo) -> bool:
        if info.token == self.token:
            return False
        if info.host == socket.gethostname() and not _pid_alive(info.pid):
            return False
        return info.expires_at > time.time()

    def acquire(self) -> None:
        call_with_retry(
            lambda: self.location.fs.create_dir(self.location.state_dir, recursive=True), "create the run directory",
            permanent=LedgerError,
        )
        current = self.read()
        if current is not None and self._holder_is_live(current):
            raise DriverAlreadyRunningError(self._refusal(current))
        self.previous = current
        self._write()
        time.sleep(self.settle_s)
        winner = self.read()
        if winner is None or winner.token != self.token:
            raise DriverAlreadyRunningError(self._refusal(winner) if winner else "lost the race for the driver lease")
        self._thread = threading.Thread(target=self._renew_loop, name="spotfallback-lease", daemon=True)
        self._thread.start()

    def refuse_if_held(self) -> None:
        """Raise ``DriverAlreadyRunningError`` if another live driver holds the lease; writes nothing.

        Lets a caller refuse before it starts anything expensive; ``acquire()`` checks again.
        """
        current = self.read()
        if current is not None and self._holder_is_live(current):
            raise DriverAlreadyRunningError(self._refusal(current))

    def _refusal(self, info: LeaseInfo) -> str:
        left = max(0.0, info.expires_at - time.time())
        return (
            f"another driver is running this run ({self.location.uri()}): host {info.host}, pid {info.pid}, "
            f"lease renewed {time.time() - info.renewed_at:.0f}s ago. Wait for it to finish, stop it, or, if it "
            f"is dead, retry after its lease expires in {left:.0f}s."
        )

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                current = self.read()
                if current is not None and current.token != self.token:
                    logger.error("driver lease on %s was taken by host %s pid %s", self.path, current.host, current.pid)
                    return
                self._write()
            except Exception:  # keep renewing through transient storage trouble
                logger.warning("could not renew the driver lease", exc_info=True)

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
