"""Loopback fakes of the clouds' instance metadata services (AWS IMDSv2, GCP, Azure Scheduled Events).

Each fake checks the request headers the real service requires (IMDSv2 token,
``Metadata-Flavor: Google``, ``Metadata: true``) and can answer late, answer garbage or go away.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Answer = tuple[int, dict[str, str], bytes]


class FakeMetadata:
    """A metadata service on 127.0.0.1:<free port>; ``handle`` is the cloud's behaviour."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.throttled = 0  # how many of the next requests are refused as too many (HTTP 429)
        self.retry_after: str | None = None  # the Retry-After header those refusals carry
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                fake.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                if fake.delay_s:
                    time.sleep(fake.delay_s)
                url = urlsplit(self.path)
                if fake.throttled:
                    fake.throttled -= 1
                    status, headers, body = 429, ({"Retry-After": fake.retry_after} if fake.retry_after else {}), b"Too Many Requests"
                else:
                    status, headers, body = fake.handle(self.command, url.path, parse_qs(url.query), self.headers)
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (timeout): nothing to answer
                    pass

            do_GET = do_PUT = _serve  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: Any) -> Answer:
        return 404, {}, b""

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeAws(FakeMetadata):
    """EC2 IMDSv2: a token first, then the spot endpoints (404 when there is nothing)."""

    def __init__(self) -> None:
        self.token = "AQAEAtoken-1"
        self.tokens_issued = 0
        self.instance_action: bytes | None = None
        self.rebalance: bytes | None = None
        self.token_status = 200
        super().__init__()

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: Any) -> Answer:
        if path == "/latest/api/token":
            if method != "PUT" or not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, {}, b"missing TTL header"
            if self.token_status != 200:
                return self.token_status, {}, b""
            self.tokens_issued += 1
            return 200, {}, self.token.encode()
        if headers.get("X-aws-ec2-metadata-token") != self.token:
            return 401, {}, b""
        if path == "/latest/meta-data/spot/instance-action":
            return (404, {}, b"") if self.instance_action is None else (200, {}, self.instance_action)
        if path == "/latest/meta-data/events/recommendations/rebalance":
            return (404, {}, b"") if self.rebalance is None else (200, {}, self.rebalance)
        return 404, {}, b""


class FakeGcp(FakeMetadata):
    """GCE metadata: ``instance/preempted`` TRUE/FALSE with an ETag; hanging GETs on wait_for_change;
    ``instance/maintenance-event`` (``maintenance``: NONE, MIGRATE_ON_HOST_MAINTENANCE, TERMINATE_ON_HOST_MAINTENANCE)."""

    def __init__(self) -> None:
        self.value = b"FALSE"
        self.maintenance = b"NONE"
        self.flavor_header = True
        self.honor_wait = True
        self.status = 200  # what instance/preempted answers with (non-200: an empty body)
        self.hang_waits = False  # hanging GETs never answer (until close)
        self.released = threading.Event()
        self.cv = threading.Condition()
        super().__init__()

    def close(self) -> None:
        self.released.set()
        super().close()

    def set(self, value: bytes) -> None:
        with self.cv:
            self.value = value
            self.cv.notify_all()

    def etag(self) -> str:
        return f"etag-{self.value.hex()}"

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: Any) -> Answer:
        if headers.get("Metadata-Flavor") != "Google":
            return 403, {}, b"Missing Metadata-Flavor:Google header."
        out = {"Metadata-Flavor": "Google"} if self.flavor_header else {}
        if path == "/computeMetadata/v1/instance/id":
            return 200, out, b"4520031799277581759"
        if path == "/computeMetadata/v1/instance/maintenance-event":
            return 200, out, self.maintenance
        if path != "/computeMetadata/v1/instance/preempted":
            return 404, out, b""
        if self.status != 200:
            return self.status, out, b""
        if query.get("wait_for_change") == ["true"] and self.hang_waits:
            self.released.wait(30)
        if query.get("wait_for_change") == ["true"] and self.honor_wait:
            timeout = float(query.get("timeout_sec", ["60"])[0])
            with self.cv:
                if query.get("last_etag", [""])[0] == self.etag():
                    self.cv.wait_for(lambda: query["last_etag"][0] != self.etag(), timeout)
        with self.cv:
            return 200, {**out, "ETag": self.etag()}, self.value


class FakeAzure(FakeMetadata):
    """Azure IMDS: Scheduled Events (api-version 2020-07-01) and the VM's name."""

    def __init__(self, vm_name: str = "spot-vm-3") -> None:
        self.vm_name = vm_name
        self.events: list[Any] = []
        self.incarnation = 1
        self.raw: bytes | None = None
        self.status = 200  # what scheduledevents answers with (non-200: an error body)
        self.delays_s: list[float] = []  # seconds the next scheduledevents answers take, one each
        super().__init__()

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: Any) -> Answer:
        if path == "/metadata/scheduledevents" and self.delays_s:
            time.sleep(self.delays_s.pop(0))  # the first call enables the service: slow
        if headers.get("Metadata") != "true":
            return 400, {}, b'{"error": "Bad request. Required metadata header not specified"}'
        if path == "/metadata/instance/compute/name":
            return 200, {}, self.vm_name.encode()
        if path == "/metadata/instance/compute/azEnvironment":
            return 200, {}, b"AzurePublicCloud"
        if path == "/metadata/scheduledevents" and query.get("api-version") == ["2020-07-01"]:
            if self.status != 200:
                return self.status, {"Content-Type": "application/json"}, b'{"error": "Internal Server Error"}'
            if self.raw is not None:
                return 200, {}, self.raw
            body = {"DocumentIncarnation": self.incarnation, "Events": self.events}
            return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()
        return 404, {}, b""


def scheduled_event(event_id: str, not_before: float | None, resources: list[str], kind: str = "Preempt") -> dict[str, Any]:
    """One Azure Scheduled Event (a Spot eviction by default) as the service lists it."""
    return {
        "EventId": event_id,
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "EventStatus": "Scheduled" if not_before else "Started",
        "NotBefore": format_datetime(datetime.fromtimestamp(not_before, UTC), usegmt=True) if not_before else "",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
