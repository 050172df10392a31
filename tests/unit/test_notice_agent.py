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
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from typer.testing import CliRunner

from spotfallback.cloud_notices import GCP_GPU_MAINTENANCE_NOTICE_S
from spotfallback.notices.agent import MAX_BACKOFF_S, NoticeAgent
from spotfallback.notices.metadata import (
    AwsPoller,
    AzurePoller,
    GcpPoller,
    Notice,
    SigtermPoller,
    detect_cloud,
)
from tests.support.metadata_fakes import (
    FakeAws,
    FakeAzure,
    FakeGcp,
    FakeMetadata,
    iso,
    scheduled_event,
)


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


def event_of(notice: Notice) -> str:
    """``azure:EVENT_ID`` of an Azure notice's key (the rest is its NotBefore, which may change)."""
    return ":".join(notice.key.split(":")[:2])


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



def test_aws_hibernate_drains_at_once_whatever_its_time_says(aws):
    """EC2's interruption notices: a spot instance set to hibernate gets no two-minute warning,
    its hibernation begins at once; a stop keeps the notice's time, as a termination does."""
    when = int(time.time()) + 120
    aws.instance_action = json.dumps({"action": "hibernate", "time": iso(when)}).encode()
    before = time.time()
    agent, drains, _ = agent_for(AwsPoller(aws.url))
    poll(agent, 2)
    (notice,) = drains.calls
    assert notice.action == "hibernate" and before <= notice.deadline_s <= time.time()
    aws.instance_action = json.dumps({"action": "stop", "time": iso(when)}).encode()
    agent, drains, _ = agent_for(AwsPoller(aws.url))
    poll(agent, 2)
    assert [(n.action, n.deadline_s) for n in drains.calls] == [("stop", float(when))]

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
        b"",
        b" \n",
    ],
    ids=["html", "list", "no-time", "bad-action", "bad-time", "far-future", "stale", "no-zone", "binary", "huge", "empty", "blank"],
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


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[]", b"{}", b'{"noticeTime": "soon"}', b'{"noticeTime": "2024-05-01T10:00:00"}', b'{"noticeTime": 7}'],
    ids=["empty", "not-json", "list", "no-time", "bad-time", "no-zone", "number"],
)
def test_aws_malformed_rebalance_never_drains_and_does_not_hide_the_instance_action(aws, body):
    aws.rebalance = body
    agent, drains, records = agent_for(AwsPoller(aws.url, act_on_rebalance=True))
    poll(agent, 2)
    assert drains.calls == [] and records.calls == []
    assert len(agent.problems) == 2 and all(p.startswith("aws rebalance:") for p in agent.problems)
    when = int(time.time()) + 100
    aws.instance_action = json.dumps({"action": "terminate", "time": iso(when)}).encode()
    poll(agent, 3)
    assert [(n.source, n.deadline_s) for n in drains.calls] == [("aws", float(when))]


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


def test_gcp_host_maintenance_that_terminates_drains_once_with_sixty_seconds(gcp):
    """A VM without GPUs stops 60 s after maintenance-event says TERMINATE; preempted stays FALSE."""
    now = [5_000.0]
    agent, drains, records = agent_for(GcpPoller(gcp.url, clock=lambda: now[0]))
    gcp.maintenance = b"MIGRATE_ON_HOST_MAINTENANCE"  # a live migration: the VM keeps running
    poll(agent, 2)
    assert drains.calls == [] and agent.problems == []
    gcp.maintenance = b"TERMINATE_ON_HOST_MAINTENANCE"
    agent.poll_once()
    now[0] += 10
    poll(agent, 2)
    assert [(n.action, n.deadline_s) for n in drains.calls] == [("host-maintenance", 5_060.0)]
    assert len(records.calls) == 1 and gcp.value == b"FALSE"


@pytest.mark.parametrize("how", ["poller", "sidecar-env"])
def test_gcp_host_maintenance_of_a_gpu_vm_is_dated_an_hour_out(gcp, how):
    """GCE gives a VM with GPUs an hour's notice of a stop for host maintenance: drained then, the
    gang trains on for the hour (and a replacement comes up) rather than moving within a minute."""
    gcp.maintenance = b"TERMINATE_ON_HOST_MAINTENANCE"
    if how == "poller":
        now = [5_000.0]
        agent, drains, _ = agent_for(GcpPoller(gcp.url, maintenance_notice_s=GCP_GPU_MAINTENANCE_NOTICE_S, clock=lambda: now[0]))
        poll(agent, 2)
        assert [(n.action, n.deadline_s) for n in drains.calls] == [("host-maintenance", 8_600.0)]
        return
    env = {"SPOTFALLBACK_CLOUD": "gcp", "SPOTFALLBACK_METADATA_URL": gcp.url, "SPOTFALLBACK_GCP_MAINTENANCE_NOTICE_S": "3600"}
    result = _cli(["notice-agent", "--once", "--dry-run"], env)
    assert result.exit_code == 0, result.output
    line = json.loads([ln for ln in result.stdout.splitlines() if ln.startswith("{")][0])
    assert line["action"] == "host-maintenance" and line["deadline_s"] == pytest.approx(time.time() + 3600, abs=30)


def test_gcp_maintenance_and_preemption_together_drain_for_the_earlier_deadline(gcp):
    now = [5_000.0]
    agent, drains, records = agent_for(GcpPoller(gcp.url, clock=lambda: now[0]))
    gcp.maintenance = b"TERMINATE_ON_HOST_MAINTENANCE"
    agent.poll_once()
    now[0] += 5
    gcp.set(b"TRUE")  # then a preemption: 30 s after the last FALSE, before the maintenance's 60 s
    poll(agent, 2)
    assert [(n.action, n.deadline_s) for n in drains.calls] == [("host-maintenance", 5_060.0), ("preempt", 5_030.0)]


@pytest.mark.parametrize("what", ["preempted", "maintenance"])
def test_gcp_notice_is_dated_from_the_last_answer_without_it_however_late_it_is_seen(gcp, what):
    """GCE dates neither notice: one seen a throttled poll late still ends 30 s (60 s) after the
    last answer that did not have it, not after the poll that saw it."""
    now = [7_000.0]
    agent, drains, _ = agent_for(GcpPoller(gcp.url, clock=lambda: now[0]))
    agent.poll_once()
    now[0] += 9  # the next poll comes late: the service throttled the agent
    if what == "preempted":
        gcp.set(b"TRUE")
    else:
        gcp.maintenance = b"TERMINATE_ON_HOST_MAINTENANCE"
    agent.poll_once()
    assert [n.deadline_s for n in drains.calls] == [7_030.0 if what == "preempted" else 7_060.0]


def test_gcp_maintenance_is_asked_every_poll_even_when_nothing_changes(gcp):
    """GCE skips the 60 s warning for a VM that has not asked since the last event."""
    agent, _, _ = agent_for(GcpPoller(gcp.url))
    poll(agent, 3)
    asked = [r for r in gcp.requests if r[1] == "/computeMetadata/v1/instance/maintenance-event"]
    assert len(asked) == 3 and all(r[2]["metadata-flavor"] == "Google" for r in asked)


def test_gcp_maintenance_garbage_is_a_problem_not_a_drain(gcp):
    gcp.maintenance = b"TERMINATE"
    agent, drains, _ = agent_for(GcpPoller(gcp.url))
    agent.poll_once()
    assert drains.calls == [] and agent.problems[0].startswith("gcp maintenance-event: expected one of")


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


@pytest.mark.parametrize("status", [404, 500, 503])
def test_gcp_error_status_never_drains_then_recovers(gcp, status):
    gcp.set(b"TRUE")
    gcp.status = status
    now = [2_000.0]
    agent, drains, _ = agent_for(GcpPoller(gcp.url, clock=lambda: now[0]))
    poll(agent, 2)
    assert drains.calls == [] and agent.problems == [f"gcp preempted: HTTP {status}"] * 2
    gcp.status = 200
    poll(agent, 1)
    now[0] += 5
    poll(agent, 2)
    assert [n.deadline_s for n in drains.calls] == [2_030.0]  # first seen when it answered, + 30 s


def test_gcp_hanging_get_that_never_returns_costs_one_hang_then_the_notice_drains_once(gcp):
    gcp.hang_waits = True
    poller = GcpPoller(gcp.url, timeout_s=0.3, wait_for_change=True, wait_timeout_s=1)
    agent, drains, _ = agent_for(poller)
    agent.poll_once()  # plain GET: FALSE, learns the ETag
    last_false = time.time()
    assert poller.blocking and agent.problems == []
    t0 = time.monotonic()
    agent.poll_once()  # the hanging GET: the server never answers
    assert 1.0 < time.monotonic() - t0 < 3.0  # bounded by timeout_sec + the request timeout
    assert drains.calls == [] and len(agent.problems) == 1 and not poller.blocking
    gcp.set(b"TRUE")
    agent.poll_once()  # a plain GET again: the notice gets through
    agent.poll_once()  # hanging again, never answered: still one drain
    assert len(drains.calls) == 1
    # Dated from the last answer without it: the lost hang may have hidden its start.
    assert drains.calls[0].deadline_s == pytest.approx(last_false + 30, abs=0.5)


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

    def asked() -> int:
        return sum("/instance/preempted" in r[1] for r in gcp.requests)

    def stop_after_three() -> None:  # it keeps asking: three requests, however slow a loaded machine
        deadline = time.monotonic() + 30
        while asked() < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()

    threading.Thread(target=stop_after_three, daemon=True).start()
    t0 = time.monotonic()
    agent.run(stop)
    # Not a spin: each answer that comes at once is followed by the interval, so three take two of them.
    assert asked() >= 3 and time.monotonic() - t0 >= 2 * agent.interval_s * 0.9 and drains.calls == []


# ----------------------------------------------------------------------------- Azure


def test_azure_first_call_may_take_long_while_scheduled_events_switch_on(azure):
    """The first request switches the service on (up to two minutes): waited for, not a failure;
    events may take five more minutes to flow, which the poll reports as a wait, not as "all clear"."""
    now = [1_000.0]
    poller = AzurePoller(azure.url, timeout_s=0.2, first_timeout_s=3.0, enabling_s=300, vm_name="spot-vm-3", clock=lambda: now[0])
    agent, drains, _ = agent_for(poller)
    azure.delays_s = [0.8]  # four times the normal request timeout
    result = poller.poll()
    assert result.problems == [] and result.pending and "enabling Scheduled Events" in result.pending[0]
    now[0] += 301  # events flow now
    assert poller.poll().pending == []
    azure.delays_s = [0.8]  # once on, a slow answer is a failure again, after the normal timeout
    t0 = time.monotonic()
    agent.poll_once()
    assert time.monotonic() - t0 < 0.7
    assert len(agent.problems) == 1 and "enabling" not in agent.problems[0] and drains.calls == []


def test_azure_no_answer_while_switching_on_is_a_wait_until_the_patience_runs_out(azure):
    now = [1_000.0]
    poller = AzurePoller(azure.url, timeout_s=0.1, first_timeout_s=0.3, enabling_s=300, vm_name="spot-vm-3", clock=lambda: now[0])
    azure.delays_s = [1.0, 1.0]
    first = poller.poll()
    assert first.problems == [] and "no answer yet, the first can take two minutes" in first.pending[0]
    now[0] += 301  # five minutes without an answer: not switching on, broken
    late = poller.poll()
    assert late.pending == [] and late.problems[0].startswith("azure scheduledevents: ")


def test_azure_refusal_while_switching_on_is_a_problem_at_once(azure):
    azure.status = 500
    result = AzurePoller(azure.url, timeout_s=0.2, vm_name="spot-vm-3").poll()
    assert result.pending == [] and result.problems == ["azure scheduledevents: HTTP 500"]


def test_azure_acts_only_on_events_for_this_vm_using_not_before(azure):
    agent, drains, records = agent_for(AzurePoller(azure.url))
    agent.poll_once()
    assert drains.calls == [] and agent.problems == []
    not_before = int(time.time()) + 30
    azure.events = [
        {"EventId": "A1", "EventType": "Freeze", "Resources": [azure.vm_name], "NotBefore": ""},
        scheduled_event("B2", not_before, ["other-vm"]),
    ]
    agent.poll_once()
    assert drains.calls == []
    azure.events.append(scheduled_event("C3", not_before, ["other-vm", azure.vm_name.upper()]))
    azure.incarnation += 1
    poll(agent, 3)
    assert [(event_of(n), n.deadline_s) for n in drains.calls] == [("azure:C3", float(not_before))]
    assert len(records.calls) == 1


def test_azure_started_preempt_with_blank_not_before_means_now(azure):
    azure.events = [scheduled_event("D4", None, [azure.vm_name])]
    agent, drains, _ = agent_for(AzurePoller(azure.url))
    agent.poll_once()
    assert len(drains.calls) == 1 and drains.calls[0].deadline_s == pytest.approx(time.time(), abs=2)


@pytest.mark.parametrize("status", [400, 500, 503])
def test_azure_error_status_never_drains_then_recovers(azure, status):
    not_before = int(time.time()) + 30
    azure.events = [scheduled_event("H9", not_before, [azure.vm_name])]
    azure.status = status
    agent, drains, _ = agent_for(AzurePoller(azure.url))
    poll(agent, 2)
    assert drains.calls == [] and agent.problems == [f"azure scheduledevents: HTTP {status}"] * 2
    azure.status = 200
    poll(agent, 3)
    assert [(event_of(n), n.deadline_s) for n in drains.calls] == [("azure:H9", float(not_before))]


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
    azure.events = ["junk", scheduled_event("F7", time.time() + 40, [azure.vm_name])]
    agent, drains, _ = agent_for(AzurePoller(azure.url))
    agent.poll_once()
    assert [event_of(n) for n in drains.calls] == ["azure:F7"] and len(agent.problems) == 1


@pytest.mark.parametrize(("kind", "action"), [("Terminate", "terminate"), ("Reboot", "host-maintenance"),
                                             ("Redeploy", "host-maintenance")])
def test_azure_events_that_end_the_vms_processes_drain_like_a_preemption(azure, kind, action):
    not_before = int(time.time()) + 600
    azure.events = [scheduled_event("T1", not_before, [azure.vm_name], kind=kind)]
    agent, drains, records = agent_for(AzurePoller(azure.url))
    poll(agent, 2)
    assert [(event_of(n), n.action, n.deadline_s) for n in drains.calls] == [("azure:T1", action, float(not_before))]
    assert records.calls[0][1] is True and kind in records.calls[0][2]


def test_azure_maintenance_planned_days_ahead_is_recorded_then_drained_within_the_hour(azure):
    now = [time.time()]
    not_before = int(now[0]) + 3 * 86400  # a host predicted to fail: Azure warns days ahead
    azure.events = [scheduled_event("R2", not_before, [azure.vm_name], kind="Reboot")]
    agent, drains, records = agent_for(AzurePoller(azure.url, clock=lambda: now[0]))
    poll(agent, 2)
    assert drains.calls == [] and agent.problems == []
    assert [(event_of(n), n.key.endswith(":scheduled"), drained) for n, drained, _ in records.calls] == [("azure:R2", True, False)]
    now[0] = not_before - 3000.0  # 50 minutes before
    poll(agent, 2)
    assert [(event_of(n), n.deadline_s) for n in drains.calls] == [("azure:R2", float(not_before))]
    # A Spot eviction is never announced that far ahead: such a Preempt is a problem, not a record.
    azure.events = [scheduled_event("P3", now[0] + 5 * 86400, [azure.vm_name])]
    agent.poll_once()
    assert len(drains.calls) == 1 and "not a spot notice" in agent.problems[-1]


def test_azure_event_cancelled_before_its_time_is_recorded_and_the_drain_stays(azure):
    now = [time.time()]
    azure.events = [scheduled_event("C5", now[0] + 900, [azure.vm_name], kind="Reboot")]
    agent, drains, records = agent_for(AzurePoller(azure.url, clock=lambda: now[0]))
    agent.poll_once()
    azure.events = []  # Azure cancelled it: the event leaves the list
    poll(agent, 2)
    assert [event_of(n) for n in drains.calls] == ["azure:C5"]
    assert [(n.key, n.action, drained) for n, drained, _ in records.calls] == [
        (drains.calls[0].key, "host-maintenance", True), ("azure:C5:cancelled", "cancelled", False)]
    assert "Ray cannot take a drain back" in records.calls[1][2]
    # One that leaves the list after its NotBefore has happened: nothing to record.
    azure.events = [scheduled_event("D6", now[0] + 30, [azure.vm_name])]
    agent.poll_once()
    now[0] += 60
    azure.events = []
    poll(agent, 2)
    assert [event_of(n) for n, _, _ in records.calls][2:] == ["azure:D6"]


def test_azure_event_that_starts_early_drains_again_with_a_deadline_of_now(azure):
    """An event approved early (by any VM of the set, or a user's restart) starts before its NotBefore,
    which goes blank: the drain's deadline must come forward, or Ray Train would wait minutes too long."""
    now = [time.time()]
    azure.events = [scheduled_event("S1", now[0] + 900, [azure.vm_name], kind="Reboot")]
    agent, drains, _ = agent_for(AzurePoller(azure.url, clock=lambda: now[0]))
    poll(agent, 2)
    now[0] += 60
    azure.events = [scheduled_event("S1", None, [azure.vm_name], kind="Reboot")]  # Started
    poll(agent, 2)
    assert [(event_of(n), n.deadline_s) for n in drains.calls] == [("azure:S1", pytest.approx(now[0] + 840, abs=1)),
                                                                    ("azure:S1", now[0])]


def test_azure_cancellation_is_recorded_only_for_an_event_that_drained_the_node(azure):
    now = [time.time()]
    azure.events = [scheduled_event("N1", now[0] + 900, [azure.vm_name], kind="Redeploy")]
    agent, drains, records = agent_for(AzurePoller(azure.url, clock=lambda: now[0]))
    drains.fail_next = 1  # the GCS did not answer: no drain, retried at the next poll
    agent.poll_once()
    azure.events = []  # cancelled before the retry
    poll(agent, 2)
    assert drains.calls == [] and records.calls == []


def test_azure_neighbours_maintenance_waits_for_this_vms_name(azure):
    """Events of every VM of a scale set arrive here: while the name lookup fails (throttled), a
    neighbour's scale-in or maintenance drains nothing; a Preempt still counts (30 s is too short to wait)."""
    now = [time.time()]
    azure.events = [scheduled_event("M1", now[0] + 600, ["other-vm-7"], kind="Terminate")]
    poller = AzurePoller(azure.url, clock=lambda: now[0])
    agent, drains, _ = agent_for(poller)
    azure.throttled = 1  # the name lookup (the poll's first request) is refused as too many
    agent.poll_once()
    assert drains.calls == [] and poller.vm_name is None
    azure.events.append(scheduled_event("M2", now[0] + 30, ["other-vm-7"]))
    azure.throttled = 1
    agent.poll_once()
    assert [event_of(n) for n in drains.calls] == ["azure:M2"]
    agent.poll_once()  # the name is known now: the neighbour's events are not this VM's
    assert poller.vm_name == azure.vm_name and len(drains.calls) == 1


# ----------------------------------------------------------------------------- faults, every cloud


def _notice_pending(fake: FakeMetadata) -> None:
    if isinstance(fake, FakeAws):
        fake.instance_action = json.dumps({"action": "terminate", "time": iso(time.time() + 90)}).encode()
    elif isinstance(fake, FakeGcp):
        fake.set(b"TRUE")
    else:
        fake.events = [scheduled_event("G8", time.time() + 40, [fake.vm_name])]


POLLERS: dict[str, Callable[[str], Any]] = {
    "aws": lambda url: AwsPoller(url, timeout_s=0.3),
    "gcp": lambda url: GcpPoller(url, timeout_s=0.3),
    # Past the first call, which may take two minutes (tested above).
    "azure": lambda url: AzurePoller(url, timeout_s=0.3, first_timeout_s=0.3, enabling_s=0),
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


def test_each_persisting_problem_is_logged_once_not_every_poll(caplog):
    """Two endpoints failing together (the metadata service is down) must not flood the log."""
    agent, _, _ = agent_for(AwsPoller(closed_port_url(), timeout_s=0.3))
    with caplog.at_level("WARNING", logger="spotfallback"):
        poll(agent, 4)
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notice agent: aws")]
    assert len(agent.problems) == 8 and len(warned) == 2, warned
    assert {w.split(":")[1].strip() for w in warned} == {"aws instance-action", "aws rebalance"}


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
    # Stopped soon after the event, and paced: at most one poll per interval (0.5 s / 0.05 s), not a
    # busy loop. A loaded machine may poll fewer times; it may not poll more.
    assert time.monotonic() - t0 < 10 and 1 <= polls <= 12, polls


# ----------------------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_throttled_service_is_polled_less_often_then_at_the_interval_again(cloud, aws, gcp, azure):
    fake = {"aws": aws, "gcp": gcp, "azure": azure}[cloud]
    poller = {"aws": lambda: AwsPoller(aws.url), "gcp": lambda: GcpPoller(gcp.url),
              "azure": lambda: AzurePoller(azure.url, vm_name=azure.vm_name)}[cloud]()
    agent = NoticeAgent(poller, Drains(), interval_s=2.0)
    fake.throttled = 1000
    waits = []
    for _ in range(5):
        agent.poll_once()
        waits.append(agent.backoff_s)
    assert waits == [4.0, 8.0, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert agent.problems and all("HTTP 429 (too many requests)" in p for p in agent.problems)
    fake.throttled = 0
    _notice_pending(fake)
    handled = agent.poll_once()
    assert agent.backoff_s == 0.0 and [n.source for n in handled] == [cloud]


def test_a_throttled_poll_waits_at_least_the_services_retry_after(azure):
    azure.throttled, azure.retry_after = 2, "0.5"
    agent = NoticeAgent(AzurePoller(azure.url, vm_name=azure.vm_name), Drains(), interval_s=0.01)
    t0 = time.monotonic()
    agent.run(max_polls=3)
    assert time.monotonic() - t0 >= 1.0  # two throttled polls, each followed by Retry-After's 0.5 s
    assert agent.backoff_s == 0.0 and len(agent.problems) == 2
    azure.throttled, azure.retry_after = 1, "Wed, 21 Oct 2015 07:28:00 GMT"  # a date, not seconds: the doubling alone
    agent.poll_once()
    assert agent.backoff_s == pytest.approx(0.02)


def test_the_clouds_deadline_replaces_a_guessed_one_even_when_later(aws):
    aws.rebalance = b'{"noticeTime": "2024-05-01T10:00:00Z"}'
    agent, drains, records = agent_for(AwsPoller(aws.url, act_on_rebalance=True, rebalance_deadline_s=30))
    agent.poll_once()
    when = int(time.time()) + 110
    aws.instance_action = json.dumps({"action": "terminate", "time": iso(when)}).encode()
    poll(agent, 2)
    assert [(n.source, n.estimated) for n in drains.calls] == [("aws-rebalance", True), ("aws", False)]
    assert drains.calls[1].deadline_s == float(when)


def test_a_guessed_deadline_never_replaces_the_clouds_even_when_earlier(aws):
    when = int(time.time()) + 110
    aws.instance_action = json.dumps({"action": "terminate", "time": iso(when)}).encode()
    agent, drains, records = agent_for(AwsPoller(aws.url, act_on_rebalance=True, rebalance_deadline_s=30))
    agent.poll_once()
    aws.rebalance = b'{"noticeTime": "2024-05-01T10:00:00Z"}'
    agent.poll_once()
    assert [(n.source, n.deadline_s) for n in drains.calls] == [("aws", float(when))]
    assert "already draining with the cloud's own deadline" in records.calls[1][2]


def test_a_notice_seen_in_a_partly_throttled_poll_is_still_drained(gcp):
    gcp.set(b"TRUE")
    gcp.throttled = 1  # maintenance-event, asked first, is refused; preempted answers
    agent = NoticeAgent(GcpPoller(gcp.url), drains := Drains(), interval_s=2.0)
    agent.poll_once()
    assert [n.action for n in drains.calls] == ["preempt"] and agent.backoff_s == 4.0


def test_retry_after_is_honoured_only_up_to_the_longest_back_off(azure):
    azure.throttled, azure.retry_after = 1, "3600"
    agent = NoticeAgent(AzurePoller(azure.url, vm_name=azure.vm_name), Drains(), interval_s=2.0)
    agent.poll_once()
    assert agent.backoff_s == MAX_BACKOFF_S


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


def _cli(args: list[str], env: dict[str, str] | None = None) -> Any:
    from spotfallback.cli.app import _register_subcommands, app

    _register_subcommands()
    return CliRunner().invoke(app, args, env=env)


def _ledger_records(storage: str, name: str, timeout_s: float = 10.0) -> list[Any]:
    """The run's ledger once something is in it (the agent writes beside the drain, bounded)."""
    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import resolve_run

    deadline = time.time() + timeout_s
    while True:
        records = Ledger(resolve_run(storage, name)).read()
        if records or time.time() > deadline:
            return records
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["flags", "sidecar-env"])
def test_cli_once_dry_run_prints_and_records_the_notice(gcp, tmp_path, how):
    gcp.set(b"TRUE")
    run = f"{tmp_path}/runs/job-1"
    if how == "flags":
        args = ["--cloud", "gcp", "--metadata-url", gcp.url, "--run", run]
        env: dict[str, str] = {}
    else:  # the KubeRay sidecar's contract: everything through the environment
        args, env = [], {"SPOTFALLBACK_CLOUD": "gcp", "SPOTFALLBACK_METADATA_URL": gcp.url, "SPOTFALLBACK_RUN": run}
    result = _cli(["notice-agent", *args, "--once", "--dry-run"], env)
    assert result.exit_code == 0, result.output
    line = json.loads([ln for ln in result.stdout.splitlines() if ln.startswith("{")][0])
    assert (line["source"], line["action"], line["drained"]) == ("gcp", "preempt", False)
    records = _ledger_records(str(tmp_path / "runs"), "job-1")
    assert [(r.event.kind, r.event.source, r.event.drained) for r in records] == [("preemption_notice", "gcp", False)]
    assert records[0].decision == {"action": "continue"} and records[0].tier == 0


NO_ANSWER = "the one poll (--once) did not get an answer it could use from the"


def _once(cloud: str, url: str, *extra: str) -> Any:
    return _cli(["notice-agent", "--cloud", cloud, "--metadata-url", url, "--timeout", "0.3", "--once", "--dry-run", *extra])


def _said_no_answer(result: Any) -> str:
    """The one error line of a --once that got no answer (exit 1, no traceback)."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    said = [line for line in result.output.splitlines() if NO_ANSWER in line]
    assert len(said) == 1 and said[0].startswith("error: "), result.output
    return said[0]


@pytest.mark.parametrize(
    ("cloud", "extra"),
    [("aws", []), ("gcp", []), ("azure", []), ("azure", ["--azure-vm-name", "spot-vm-3", "--azure-first-timeout", "0.3"])],
    ids=["aws", "gcp", "azure", "azure-named-vm"],
)
def test_cli_once_that_gets_no_answer_exits_1_naming_it(cloud, extra):
    """--once is the docs' "what would happen now" check: a poll with every request refused is no
    all-clear. On Azure the first request's "no answer yet" too (a wait only to an agent that polls again)."""
    url = closed_port_url()
    line = _said_no_answer(_once(cloud, url, *extra))
    assert f"{cloud} metadata service at {url}: " in line and "Connection refused" in line
    assert "--metadata-url" in line and "--cloud" in line


def test_cli_once_that_is_throttled_says_the_service_is_there(azure):
    azure.throttled = 100
    line = _said_no_answer(_once("azure", azure.url, "--azure-vm-name", "spot-vm-3"))
    assert "HTTP 429 (too many requests)" in line and "refuses requests as too many" in line and "--cloud" not in line


def test_a_failed_drain_is_named_for_the_poll_that_saw_the_notice(gcp):
    gcp.set(b"TRUE")
    agent, drains, _ = agent_for(GcpPoller(gcp.url))
    drains.fail_next = 1
    agent.poll_once()
    assert agent.drain_failures == ["gcp:preempted: GCS unavailable"]
    agent.poll_once()
    assert agent.drain_failures == [] and len(drains.calls) == 1


def test_cli_once_with_an_answer_it_cannot_use_exits_1_naming_it(gcp):
    gcp.status = 500  # instance/preempted fails; maintenance-event answers NONE
    assert "gcp preempted: HTTP 500" in _said_no_answer(_once("gcp", gcp.url))


@pytest.mark.parametrize("cloud", sorted(FAKES))
def test_cli_once_that_gets_an_answer_exits_0(cloud):
    """No notice is an answer; so is Azure's first one, though events may take minutes to flow."""
    fake = FAKES[cloud]()
    try:
        result = _once(cloud, fake.url)
    finally:
        fake.close()
    assert result.exit_code == 0 and NO_ANSWER not in result.output, result.output
    assert not [ln for ln in result.stdout.splitlines() if ln.startswith("{")]  # no notice


def test_cli_once_with_a_notice_beside_a_failing_endpoint_exits_0_with_the_notice(gcp):
    gcp.set(b"TRUE")
    gcp.maintenance = b"SOMETHING_NEW"  # a problem, but the poll did get its notice
    result = _once("gcp", gcp.url)
    assert result.exit_code == 0 and NO_ANSWER not in result.output, result.output
    assert json.loads(result.stdout.splitlines()[0])["source"] == "gcp"


def test_cli_rejects_unknown_cloud_and_undetectable_machine():
    assert _cli(["notice-agent", "--cloud", "ibm", "--dry-run", "--once"]).exit_code == 2
    dead = closed_port_url()
    if detect_cloud(dead, timeout_s=0.2) is not None:
        pytest.skip("this machine names its cloud by firmware or environment")
    result = _cli(["notice-agent", "--metadata-url", dead, "--timeout", "0.2", "--dry-run", "--once"])
    assert result.exit_code == 2 and "could not detect the cloud" in result.output


def test_cli_names_the_environment_variable_of_a_bad_value():
    result = _cli(["notice-agent", "--once", "--dry-run"], {"SPOTFALLBACK_CLOUD": "eks-karpenter"})
    assert result.exit_code == 2
    assert "--cloud (SPOTFALLBACK_CLOUD): 'eks-karpenter' is not one of auto, aws, gcp, azure, k8s" in result.output
    result = _cli(["notice-agent", "--once", "--dry-run", "--cloud", "k8s"], {"SPOTFALLBACK_K8S_GRACE_S": "half a minute"})
    assert result.exit_code == 2 and "SPOTFALLBACK_K8S_GRACE_S" in result.output


def test_cli_malformed_ray_address_fails_at_once_without_waiting(gcp):
    t0 = time.monotonic()
    result = _cli(["notice-agent", "--cloud", "gcp", "--metadata-url", gcp.url, "--once"], {"RAY_ADDRESS": "head:port:x"})
    assert result.exit_code == 2 and "cannot find the Ray node to drain: Invalid address format" in result.output
    assert time.monotonic() - t0 < 20  # not the --ray-wait of 120 s


@pytest.mark.parametrize("address", ["head:99999", "head:0", "10.0.0.1:http"])
def test_cli_ray_address_without_a_port_fails_at_once_naming_it(gcp, address):
    """Ray would try such an address for about a minute, printing its C++ warnings, and fail."""
    t0 = time.monotonic()
    result = _cli(["notice-agent", "--cloud", "gcp", "--metadata-url", gcp.url, "--once", "--address", address])
    assert result.exit_code == 2, result.output
    assert f"cannot find the Ray node to drain: '{address}': '{address.rsplit(':', 1)[1]}' is not a port" in result.output
    assert time.monotonic() - t0 < 20


def test_cli_k8s_sidecar_drains_on_sigterm_at_once_with_the_grace_period(tmp_path):
    """The real process, configured only by the sidecar's environment; SIGTERM wakes the poll."""
    import subprocess
    import sys

    env = {
        **os.environ,
        "SPOTFALLBACK_CLOUD": "k8s",
        "SPOTFALLBACK_K8S_GRACE_S": "25",
        "SPOTFALLBACK_RUN": f"{tmp_path}/runs/job-2",
    }
    cmd = [sys.executable, "-m", "spotfallback.cli", "notice-agent", "--dry-run", "--interval", "60"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        assert "watching k8s notices" in proc.stderr.readline()
        time.sleep(0.3)  # the first poll (nothing) is done; the next is 60 s away
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        line = json.loads(proc.stdout.readline())
        assert time.time() - sent < 5  # woken by the signal, not by the 60 s interval
        assert (line["source"], line["action"]) == ("k8s", "sigterm")
        assert line["deadline_s"] == pytest.approx(sent + 25, abs=1.5)
        records = _ledger_records(str(tmp_path / "runs"), "job-2")
        assert [(r.event.kind, r.event.source) for r in records] == [("preemption_notice", "k8s")]
        assert proc.poll() is None  # a k8s agent outlives SIGTERM: the kubelet ends it after the grace period
    finally:
        proc.kill()
        proc.wait(10)


def test_drain_deadline_is_epoch_milliseconds_and_a_past_one_becomes_now_plus_one():
    from spotfallback.notices.drain import deadline_ms_for

    assert deadline_ms_for(None) == 0  # Ray: no deadline
    assert deadline_ms_for(1_000.25, now_s=900.0) == 1_000_250
    assert deadline_ms_for(800.0, now_s=900.0) == 900_001  # past: now + 1 ms (0 would mean none)
    assert deadline_ms_for(900.0, now_s=900.0) == 900_001
    assert deadline_ms_for(0.0, now_s=900.0) == 900_001
    assert abs(deadline_ms_for(time.time() - 5) - time.time() * 1000) < 1_000  # default now: the clock


def test_local_injector_drains_and_records_through_the_agents_path(tmp_path):
    """The injector's notice: the agent's RayDrain (same Ray call) and LedgerRecorder (same record)."""
    from types import SimpleNamespace

    from ray.core.generated import autoscaler_pb2

    from spotfallback.local.injector import Injector

    calls: list[tuple[Any, ...]] = []

    class Gcs:
        def drain_node(self, *args: Any) -> tuple[bool, str]:
            calls.append(args)
            return True, ""

    node = SimpleNamespace(node_id="ab" * 28, market="spot")
    cluster = SimpleNamespace(node=lambda n: node, gcs_client=lambda: Gcs())
    injector = Injector(cluster, run=f"{tmp_path}/runs/job-3")  # type: ignore[arg-type]
    try:
        before = time.time()
        injector.drain(node.node_id, notice_s=20)
    finally:
        injector.close()
    ((node_id, reason, message, deadline_ms),) = calls
    assert (node_id, reason) == (node.node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"))
    assert message.startswith("injector preemption notice: ") and before + 19.999 <= deadline_ms / 1000 <= time.time() + 20
    (record,) = _ledger_records(str(tmp_path / "runs"), "job-3")
    ev = record.event
    assert (ev.kind, ev.source, ev.action, ev.drained, ev.node_id) == ("preemption_notice", "injector", "preempt", True, node.node_id)
    assert ev.deadline_s == pytest.approx(deadline_ms / 1000, abs=0.002)
    assert [a.action for a in injector.actions()] == ["drain"]

