"""The notice agent against real HTTP servers on loopback that speak each cloud's metadata format.

No Ray: the drain is an injected callable that records its calls. Each fake checks the
request headers the real service requires (IMDSv2 token, ``Metadata-Flavor: Google``,
``Metadata: true``) and can answer late, answer garbage or go away.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from typer.testing import CliRunner

from spotfallback.notices.agent import (
    AwsPoller,
    AzurePoller,
    GcpPoller,
    Notice,
    NoticeAgent,
    SigtermPoller,
    detect_cloud,
)

Answer = tuple[int, dict[str, str], bytes]


class FakeMetadata:
    """A metadata service on 127.0.0.1:<free port>; ``handle`` is the cloud's behaviour."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                fake.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                if fake.delay_s:
                    time.sleep(fake.delay_s)
                url = urlsplit(self.path)
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
    """GCE metadata: ``instance/preempted`` TRUE/FALSE with an ETag; hanging GETs on wait_for_change."""

    def __init__(self) -> None:
        self.value = b"FALSE"
        self.flavor_header = True
        self.honor_wait = True
        self.cv = threading.Condition()
        super().__init__()

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
        if path != "/computeMetadata/v1/instance/preempted":
            return 404, out, b""
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
        super().__init__()

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: Any) -> Answer:
        if headers.get("Metadata") != "true":
            return 400, {}, b'{"error": "Bad request. Required metadata header not specified"}'
        if path == "/metadata/instance/compute/name":
            return 200, {}, self.vm_name.encode()
        if path == "/metadata/instance/compute/azEnvironment":
            return 200, {}, b"AzurePublicCloud"
        if path == "/metadata/scheduledevents" and query.get("api-version") == ["2020-07-01"]:
            if self.raw is not None:
                return 200, {}, self.raw
            body = {"DocumentIncarnation": self.incarnation, "Events": self.events}
            return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()
        return 404, {}, b""


def preempt_event(event_id: str, not_before: float | None, resources: list[str]) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "EventStatus": "Scheduled" if not_before else "Started",
        "NotBefore": format_datetime(datetime.fromtimestamp(not_before, UTC), usegmt=True) if not_before else "",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


class Drains:
    """The injected drain: records every call; can be told to fail."""

    def __init__(self) -> None:
        self.calls: list[Notice] = []
        self.fail_next = 0

    def __call__(self, notice: Notice) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("GCS unavailable")
        self.calls.append(notice)


class Records:
    def __init__(self) -> None:
        self.calls: list[tuple[Notice, bool, str]] = []

    def __call__(self, notice: Notice, drained: bool, detail: str) -> None:
        self.calls.append((notice, drained, detail))


@pytest.fixture()
def aws():
    s = FakeAws()
    yield s
    s.close()


@pytest.fixture()
def gcp():
    s = FakeGcp()
    yield s
    s.close()


@pytest.fixture()
def azure():
    s = FakeAzure()
    yield s
    s.close()


def agent_for(poller: Any) -> tuple[NoticeAgent, Drains, Records]:
    drains, records = Drains(), Records()
    return NoticeAgent(poller, drains, record=records, interval_s=0.01), drains, records


def poll(agent: NoticeAgent, times: int) -> None:
    for _ in range(times):
        agent.poll_once()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens: connection refused


# ----------------------------------------------------------------------------- AWS


def test_aws_nothing_pending_means_no_drain_and_uses_imdsv2(aws):
    agent, drains, records = agent_for(AwsPoller(aws.url))
    poll(agent, 3)
    assert drains.calls == [] and records.calls == [] and agent.problems == []
    assert aws.tokens_issued == 1  # the token is reused until it nears expiry
    token_put = [r for r in aws.requests if r[1] == "/latest/api/token"]
    assert token_put[0][0] == "PUT" and token_put[0][2]["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    gets = [r for r in aws.requests if r[0] == "GET"]
    assert len(gets) == 6 and all(r[2]["x-aws-ec2-metadata-token"] == aws.token for r in gets)


def test_aws_instance_action_drains_once_with_the_cloud_deadline(aws):
    when = int(time.time()) + 120
    aws.instance_action = json.dumps({"action": "terminate", "time": iso(when)}).encode()
    agent, drains, records = agent_for(AwsPoller(aws.url))
    poll(agent, 4)
    assert len(drains.calls) == 1
    notice = drains.calls[0]
    assert (notice.source, notice.action, notice.deadline_s) == ("aws", "terminate", float(when))
    assert [(n.key, drained) for n, drained, _ in records.calls] == [(notice.key, True)]


def test_aws_expired_token_is_renewed(aws):
    agent, drains, _ = agent_for(AwsPoller(aws.url))
    agent.poll_once()
    aws.token = "AQAEAtoken-2"  # the old one is now refused with 401
    aws.instance_action = json.dumps({"action": "stop", "time": iso(time.time() + 100)}).encode()
    agent.poll_once()
    assert aws.tokens_issued == 2 and [n.action for n in drains.calls] == ["stop"]


@pytest.mark.parametrize(
    "body",
    [
        b"<html>Service Unavailable</html>",
        b"[]",
        b'{"action": "terminate"}',
        b'{"action": "explode", "time": "2030-01-01T00:00:00Z"}',
        b'{"action": "terminate", "time": "in two minutes"}',
        b'{"action": "terminate", "time": "2099-01-01T00:00:00Z"}',
        b'{"action": "terminate", "time": "2001-01-01T00:00:00Z"}',
        b'{"action": "terminate", "time": "2030-01-01T00:00:00"}',
        b"\xff\xfe\x00garbage",
        b'{"action": "terminate", "time": "' + b"9" * 70000 + b'"}',
    ],
    ids=["html", "list", "no-time", "bad-action", "bad-time", "far-future", "stale", "no-zone", "binary", "huge"],
)
def test_aws_never_drains_on_garbage_and_recovers(aws, body):
    aws.instance_action = body
    agent, drains, records = agent_for(AwsPoller(aws.url))
    poll(agent, 2)
    assert drains.calls == [] and records.calls == []
    assert agent.problems and all("instance-action" in p for p in agent.problems)
    aws.instance_action = json.dumps({"action": "terminate", "time": iso(time.time() + 60)}).encode()
    poll(agent, 2)
    assert len(drains.calls) == 1


def test_aws_token_refused_is_a_problem_not_a_drain(aws):
    aws.token_status = 403
    aws.instance_action = json.dumps({"action": "terminate", "time": iso(time.time() + 60)}).encode()
    agent, drains, _ = agent_for(AwsPoller(aws.url))
    poll(agent, 2)
    assert drains.calls == [] and any("token: HTTP 403" in p for p in agent.problems)


def test_aws_rebalance_is_recorded_and_only_drained_when_asked(aws):
    aws.rebalance = b'{"noticeTime": "2024-05-01T10:00:00Z"}'
    agent, drains, records = agent_for(AwsPoller(aws.url))
    poll(agent, 3)
    assert drains.calls == []
    assert [(n.source, drained) for n, drained, _ in records.calls] == [("aws-rebalance", False)]

    acting, drains2, _ = agent_for(AwsPoller(aws.url, act_on_rebalance=True, rebalance_deadline_s=300))
    poll(acting, 2)
    assert len(drains2.calls) == 1 and drains2.calls[0].deadline_s == pytest.approx(time.time() + 300, abs=5)
    # The real notice comes later with an earlier deadline: drained again, to bring it forward.
    aws.instance_action = json.dumps({"action": "terminate", "time": iso(time.time() + 110)}).encode()
    poll(acting, 2)
    assert [n.source for n in drains2.calls] == ["aws-rebalance", "aws"]


def test_a_later_deadline_from_a_second_notice_does_not_drain_again(aws):
    aws.instance_action = json.dumps({"action": "terminate", "time": iso(time.time() + 60)}).encode()
    agent, drains, records = agent_for(AwsPoller(aws.url, act_on_rebalance=True, rebalance_deadline_s=120))
    agent.poll_once()
    aws.rebalance = b'{"noticeTime": "2024-05-01T10:00:00Z"}'
    agent.poll_once()
    assert [n.source for n in drains.calls] == ["aws"]
    assert [(n.source, drained) for n, drained, _ in records.calls] == [("aws", True), ("aws-rebalance", False)]
    assert "already draining" in records.calls[1][2]


# ----------------------------------------------------------------------------- GCP


def test_gcp_false_then_true_drains_once_with_thirty_seconds(gcp):
    now = [1_000.0]
    agent, drains, records = agent_for(GcpPoller(gcp.url, clock=lambda: now[0]))
    poll(agent, 2)
    assert drains.calls == [] and agent.problems == []
    gcp.set(b"TRUE")
    agent.poll_once()
    now[0] += 5
    poll(agent, 2)
    assert len(drains.calls) == 1 and drains.calls[0].deadline_s == 1_030.0
    assert len(records.calls) == 1 and all(r[2]["metadata-flavor"] == "Google" for r in gcp.requests)


@pytest.mark.parametrize("body", [b"", b"true?", b"YES", b"TRUE\nFALSE", b"\x00\x01"])
def test_gcp_garbage_never_drains(gcp, body):
    gcp.set(body)
    agent, drains, _ = agent_for(GcpPoller(gcp.url))
    poll(agent, 2)
    assert drains.calls == [] and len(agent.problems) == 2


def test_gcp_answer_without_the_flavor_header_is_not_trusted(gcp):
    gcp.flavor_header = False
    gcp.set(b"TRUE")
    agent, drains, _ = agent_for(GcpPoller(gcp.url))
    agent.poll_once()
    assert drains.calls == [] and "Metadata-Flavor" in agent.problems[0]


def test_gcp_wait_for_change_wakes_on_the_notice(gcp):
    poller = GcpPoller(gcp.url, wait_for_change=True, wait_timeout_s=20)
    agent, drains, _ = agent_for(poller)
    agent.poll_once()  # learns the ETag
    assert poller.blocking
    threading.Timer(0.5, gcp.set, args=(b"TRUE",)).start()
    t0 = time.monotonic()
    agent.poll_once()  # hangs until the value changes
    waited = time.monotonic() - t0
    assert len(drains.calls) == 1 and 0.4 < waited < 5
    query = parse_qs(urlsplit(gcp.requests[-1][1]).query)
    assert query["wait_for_change"] == ["true"] and query["last_etag"] == [f"etag-{b'FALSE'.hex()}"]


def test_hanging_get_that_returns_at_once_does_not_spin(gcp):
    gcp.honor_wait = False  # a server (or proxy) that ignores wait_for_change
    agent, drains, _ = agent_for(GcpPoller(gcp.url, wait_for_change=True))
    agent.interval_s = 0.1
    stop = threading.Event()
    threading.Timer(0.6, stop.set).start()
    agent.run(stop)
    assert 3 <= len(gcp.requests) <= 9 and drains.calls == []


# ----------------------------------------------------------------------------- Azure


def test_azure_acts_only_on_preempt_for_this_vm_using_not_before(azure):
    agent, drains, records = agent_for(AzurePoller(azure.url))
    agent.poll_once()
    assert drains.calls == [] and agent.problems == []
    not_before = int(time.time()) + 30
    azure.events = [
        {"EventId": "A1", "EventType": "Freeze", "Resources": [azure.vm_name], "NotBefore": ""},
        preempt_event("B2", not_before, ["other-vm"]),
    ]
    agent.poll_once()
    assert drains.calls == []
    azure.events.append(preempt_event("C3", not_before, ["other-vm", azure.vm_name.upper()]))
    azure.incarnation += 1
    poll(agent, 3)
    assert [(n.key, n.deadline_s) for n in drains.calls] == [("azure:C3", float(not_before))]
    assert len(records.calls) == 1


def test_azure_started_preempt_with_blank_not_before_means_now(azure):
    azure.events = [preempt_event("D4", None, [azure.vm_name])]
    agent, drains, _ = agent_for(AzurePoller(azure.url))
    agent.poll_once()
    assert len(drains.calls) == 1 and drains.calls[0].deadline_s == pytest.approx(time.time(), abs=2)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"DocumentIncarnation": 3}',
        b'{"Events": "Preempt"}',
        b'{"Events": [42, {"EventType": "Preempt", "Resources": ["spot-vm-3"]}]}',
        b'{"Events": [{"EventId": "E5", "EventType": "Preempt", "Resources": "spot-vm-3", "NotBefore": ""}]}',
        b'{"Events": [{"EventId": "E6", "EventType": "Preempt", "Resources": ["spot-vm-3"], "NotBefore": "soon"}]}',
    ],
    ids=["not-json", "no-events", "events-not-list", "no-event-id", "resources-not-list", "bad-not-before"],
)
def test_azure_garbage_never_drains(azure, raw):
    azure.raw = raw
    agent, drains, _ = agent_for(AzurePoller(azure.url))
    poll(agent, 2)
    assert drains.calls == [] and agent.problems


def test_azure_garbage_event_beside_a_real_one_does_not_hide_it(azure):
    azure.events = ["junk", preempt_event("F7", time.time() + 40, [azure.vm_name])]
    agent, drains, _ = agent_for(AzurePoller(azure.url))
    agent.poll_once()
    assert [n.key for n in drains.calls] == ["azure:F7"] and len(agent.problems) == 1


# ----------------------------------------------------------------------------- faults, every cloud


def _notice_pending(fake: FakeMetadata) -> None:
    if isinstance(fake, FakeAws):
        fake.instance_action = json.dumps({"action": "terminate", "time": iso(time.time() + 90)}).encode()
    elif isinstance(fake, FakeGcp):
        fake.set(b"TRUE")
    else:
        fake.events = [preempt_event("G8", time.time() + 40, [fake.vm_name])]


POLLERS: dict[str, Callable[[str], Any]] = {
    "aws": lambda url: AwsPoller(url, timeout_s=0.3),
    "gcp": lambda url: GcpPoller(url, timeout_s=0.3),
    "azure": lambda url: AzurePoller(url, timeout_s=0.3),
}
FAKES: dict[str, Callable[[], FakeMetadata]] = {"aws": FakeAws, "gcp": FakeGcp, "azure": FakeAzure}


@pytest.mark.parametrize("cloud", sorted(POLLERS))
def test_slow_answers_time_out_without_draining_then_recover(cloud):
    fake = FAKES[cloud]()
    try:
        _notice_pending(fake)
        fake.delay_s = 1.0
        agent, drains, _ = agent_for(POLLERS[cloud](fake.url))
        t0 = time.monotonic()
        agent.poll_once()
        assert time.monotonic() - t0 < 2.5  # bounded by the request timeout, not the server
        assert drains.calls == [] and agent.problems
        fake.delay_s = 0.0
        poll(agent, 2)
        assert len(drains.calls) == 1
    finally:
        fake.close()


@pytest.mark.parametrize("cloud", sorted(POLLERS))
def test_connection_refused_is_survived(cloud):
    agent, drains, _ = agent_for(POLLERS[cloud](closed_port_url()))
    stop = threading.Event()
    agent.run(stop, max_polls=3)
    assert drains.calls == [] and len(agent.problems) >= 3


def test_failed_drain_is_retried_and_still_happens_once(gcp):
    gcp.set(b"TRUE")
    agent, drains, records = agent_for(GcpPoller(gcp.url))
    drains.fail_next = 1
    agent.poll_once()
    assert drains.calls == [] and records.calls == []
    poll(agent, 3)
    assert len(drains.calls) == 1 and len(records.calls) == 1


def test_failing_recorder_does_not_stop_the_agent(gcp):
    gcp.set(b"TRUE")

    def broken(*_: Any) -> None:
        raise OSError("bucket unreachable")

    drains = Drains()
    agent = NoticeAgent(GcpPoller(gcp.url), drains, record=broken)
    poll(agent, 2)
    assert len(drains.calls) == 1


def test_run_loop_stops_and_paces_itself(aws):
    agent, _, _ = agent_for(AwsPoller(aws.url))
    agent.interval_s = 0.05
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    agent.run(stop)
    polls = sum(1 for r in aws.requests if r[1].endswith("instance-action"))
    assert time.monotonic() - t0 < 2 and 3 <= polls <= 12


# ----------------------------------------------------------------------------- Kubernetes


def test_sigterm_is_a_notice_with_the_grace_period():
    poller = SigtermPoller(grace_s=25)
    agent, drains, _ = agent_for(poller)
    agent.poll_once()
    assert drains.calls == []
    previous = poller.install()
    try:
        sent = time.time()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        poll(agent, 3)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(drains.calls) == 1
    assert drains.calls[0].deadline_s == pytest.approx(sent + 25, abs=1)


# ----------------------------------------------------------------------------- detection, CLI


def test_detect_cloud_by_metadata_environment_and_firmware(aws, gcp, azure, tmp_path):
    empty = tmp_path / "no-dmi"
    assert detect_cloud(aws.url, env={}, dmi_dir=empty) == "aws"
    assert detect_cloud(gcp.url, env={}, dmi_dir=empty) == "gcp"
    assert detect_cloud(azure.url, env={}, dmi_dir=empty) == "azure"
    assert detect_cloud(closed_port_url(), env={}, dmi_dir=empty, timeout_s=0.3) is None
    assert detect_cloud(closed_port_url(), env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, dmi_dir=empty) == "k8s"
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    (dmi / "sys_vendor").write_text("Amazon EC2\n")
    assert detect_cloud(closed_port_url(), env={}, dmi_dir=dmi) == "aws"


def _cli(args: list[str]) -> Any:
    from spotfallback.cli import _register_subcommands, app

    _register_subcommands()
    return CliRunner().invoke(app, args)


def test_cli_once_dry_run_prints_and_records_the_notice(gcp, tmp_path):
    from spotfallback.ledger import Ledger
    from spotfallback.storage import resolve_run

    gcp.set(b"TRUE")
    run = f"{tmp_path}/runs/job-1"
    result = _cli(["notice-agent", "--cloud", "gcp", "--metadata-url", gcp.url, "--once", "--dry-run", "--run", run])
    assert result.exit_code == 0, result.output
    line = json.loads([ln for ln in result.stdout.splitlines() if ln.startswith("{")][0])
    assert (line["source"], line["action"], line["drained"]) == ("gcp", "preempt", False)
    deadline = time.time() + 10
    while time.time() < deadline:  # the ledger write runs beside the agent, bounded
        records = Ledger(resolve_run(str(tmp_path / "runs"), "job-1")).read()
        if records:
            break
        time.sleep(0.05)
    assert [(r.event.kind, r.event.source, r.event.drained) for r in records] == [("preemption_notice", "gcp", False)]
    assert records[0].decision == {"action": "continue"} and records[0].tier == 0


def test_cli_rejects_unknown_cloud_and_undetectable_machine():
    assert _cli(["notice-agent", "--cloud", "ibm", "--dry-run", "--once"]).exit_code == 2
    dead = closed_port_url()
    if detect_cloud(dead, timeout_s=0.2) is not None:
        pytest.skip("this machine names its cloud by firmware or environment")
    result = _cli(["notice-agent", "--metadata-url", dead, "--timeout", "0.2", "--dry-run", "--once"])
    assert result.exit_code == 2 and "could not detect the cloud" in result.output
