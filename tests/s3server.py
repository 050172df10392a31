"""A real S3 API on loopback for the tests: ``moto[server]`` in a subprocess, and an outage switch.

Nothing is installed or started at import time. ``S3Server`` starts ``python -m moto.server``
on 127.0.0.1 at a free port, waits until it answers, creates a bucket, and stops the process
by its pid. moto keeps objects in memory only, so a storage outage is made in front of it:
``OutageProxy`` forwards a second port to moto and can refuse every connection for a while,
which is what a client sees when the storage endpoint goes away and comes back, with the data
still there.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with code {self.proc.returncode}")
            try:
                urllib.request.urlopen(f"http://{self.endpoint}/", timeout=1).close()
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not answer within 30 s") from None
                time.sleep(0.2)
        self.filesystem().create_dir(self.bucket)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OutageProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; ``cut()`` refuses and drops connections until ``restore()``."""

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
        self.refused = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> OutageProxy:
        self._thread.start()
        return self

    def cut(self) -> None:
        """Storage goes away: open connections are reset, new ones are closed at once."""
        self._down.set()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    s.close()

    def restore(self) -> None:
        self._down.clear()

    def close(self) -> None:
        self._stop.set()
        self.cut()
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
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

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
