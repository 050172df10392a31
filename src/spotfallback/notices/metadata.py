"""Each cloud's instance metadata service, read for a preemption notice: the pollers the agent runs.

What it asks (base URL configurable, so tests point it at fake servers on loopback):

- AWS IMDSv2: ``PUT /latest/api/token`` (``X-aws-ec2-metadata-token-ttl-seconds``), then
  ``GET /latest/meta-data/spot/instance-action`` (404: nothing; 200: ``{"action", "time"}``)
  and ``GET /latest/meta-data/events/recommendations/rebalance`` (``{"noticeTime"}``: an
  earlier, softer signal, recorded, drained on only with ``act_on_rebalance``).
- GCP: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google``
  (``TRUE``/``FALSE``); with ``wait_for_change`` a hanging GET keyed by the last ETag.
- GCP: also ``instance/maintenance-event``: ``TERMINATE_ON_HOST_MAINTENANCE`` an hour before the
  host stops a VM with GPUs (60 s on other VMs; ``preempted`` stays ``FALSE``). GCE sets the key
  only on VMs with GPUs and VMs set to migrate, whose ``MIGRATE_ON_HOST_MAINTENANCE`` is a live
  migration, not a notice.
- Azure: ``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true``;
  events naming this VM that end its processes (``Preempt``, ``Terminate``, ``Reboot``,
  ``Redeploy``; not a ``Freeze``, which pauses it for seconds), ``NotBefore`` as the deadline.
  The first request switches the service on and can take two minutes.
- Kubernetes: SIGTERM to the pod; the deadline is ``terminationGracePeriodSeconds`` later.

Anything a poller cannot parse is a *problem*, logged and never acted on; a slow or refused
connection is a problem for one poll, not a crash; a service that answers "too many requests"
(HTTP 429) is asked less often for a while (``PollResult.throttled_s``).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import math
import os
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from spotfallback.cloud_notices import GCP_MAINTENANCE_NOTICE_S, GCP_PREEMPTION_NOTICE_S
from spotfallback.errors import MetadataError, MetadataThrottledError
from spotfallback.events import CANCELLED, NOTICE_HORIZON_S

logger = logging.getLogger("spotfallback")

DEFAULT_BASE_URL = "http://169.254.169.254"
CLOUDS = ("aws", "gcp", "azure", "k8s")
MAX_BODY_BYTES = 64 * 1024
# Spot notices are minutes long: a deadline past NOTICE_HORIZON_S, or long past, is not one.
MAX_PAST_S = 3600.0
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"

# Metadata services are link-local: never send these requests through an HTTP proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    headers: Mapping[str, str]  # lower-case names


def request(method: str, url: str, headers: Mapping[str, str], timeout_s: float) -> Response:
    """One HTTP request; any transport failure (refused, timeout, reset) is a MetadataError."""
    req = urllib.request.Request(url, method=method, headers=dict(headers), data=b"" if method == "PUT" else None)
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            body = resp.read(MAX_BODY_BYTES + 1)
            return Response(resp.status, body, {k.lower(): v for k, v in resp.headers.items()})
    except urllib.error.HTTPError as e:
        try:
            body = e.read(MAX_BODY_BYTES + 1)
        except (OSError, http.client.HTTPException):
            body = b""
        return Response(e.code, body, {k.lower(): v for k, v in (e.headers or {}).items()})
    except urllib.error.URLError as e:
        raise MetadataError(f"{method} {url}: {e.reason}") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise MetadataError(f"{method} {url}: {type(e).__name__}: {e}") from None


def status_error(r: Response, what: str = "") -> MetadataError:
    """The problem an unexpected status is: ``MetadataThrottledError`` for 429 (with its ``Retry-After``
    seconds, 0 if none or unreadable), else a plain ``MetadataError``."""
    message = f"{what}{': ' if what else ''}HTTP {r.status}"
    if r.status != 429:
        return MetadataError(message)
    try:
        retry_after = float(r.headers.get("retry-after", "0"))
    except ValueError:
        retry_after = 0.0  # an HTTP date, or garbage: the agent's own back-off decides
    if not math.isfinite(retry_after) or retry_after < 0:
        retry_after = 0.0
    return MetadataThrottledError(message + " (too many requests)", retry_after)


def _text(body: bytes, what: str) -> str:
    if len(body) > MAX_BODY_BYTES:
        raise MetadataError(f"{what}: answer larger than {MAX_BODY_BYTES} bytes")
    try:
        return body.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise MetadataError(f"{what}: answer is not UTF-8 text") from None


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    text = _text(body, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MetadataError(f"{what}: not JSON ({e.msg}): {text[:80]!r}") from None
    if not isinstance(data, dict):
        raise MetadataError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def parse_iso_utc(value: Any, what: str) -> float:
    """``2017-09-18T08:22:00Z`` (AWS) -> epoch seconds; a time without a zone is rejected."""
    if not isinstance(value, str):
        raise MetadataError(f"{what}: expected a time string, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise MetadataError(f"{what}: not an ISO 8601 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise MetadataError(f"{what}: time without a time zone: {value!r}")
    return parsed.timestamp()


def parse_http_date(value: Any, what: str) -> float:
    """``Mon, 19 Sep 2016 18:29:47 GMT`` (Azure ``NotBefore``) -> epoch seconds."""
    if not isinstance(value, str):
        raise MetadataError(f"{what}: expected a date string, got {value!r}")
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        raise MetadataError(f"{what}: not an HTTP date: {value!r}") from None
    if parsed.tzinfo is None:
        raise MetadataError(f"{what}: date without a time zone: {value!r}")
    return parsed.timestamp()


def plausible_deadline(deadline_s: float, now_s: float, what: str) -> float:
    """The deadline, if it can be a spot notice's; a past one (node going now) becomes now."""
    if deadline_s > now_s + NOTICE_HORIZON_S:
        raise MetadataError(f"{what}: deadline {deadline_s - now_s:.0f}s ahead is not a spot notice")
    if deadline_s < now_s - MAX_PAST_S:
        raise MetadataError(f"{what}: deadline {now_s - deadline_s:.0f}s in the past is stale")
    return max(deadline_s, now_s)


# ----------------------------------------------------------------------------- notices


@dataclass(frozen=True)
class Notice:
    """One warning from the cloud.

    ``key`` identifies it: the same notice polled again has the same key and is not acted on
    twice. ``deadline_s``: when the node goes (epoch seconds; None: unknown). ``actionable``:
    False for signals that are only recorded (AWS rebalance recommendation by default).
    """

    source: str
    key: str
    action: str
    deadline_s: float | None
    actionable: bool = True
    detail: str = ""
    # The deadline is the agent's guess, not the cloud's word (a rebalance recommendation names no
    # time): a later notice that names one drains again with it, even if it is later.
    estimated: bool = False
    # The key (or key prefix, before a ':') of the notices this one takes back (an Azure event cancelled
    # before its time): recorded only where one of them drained the node.
    cancels: str = ""


@dataclass
class PollResult:
    """What one poll found: notices, problems (a failed or unreadable answer), and ``pending``:
    a known wait that is neither (Azure Scheduled Events switching on), shown as the agent's state."""

    notices: list[Notice] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    # Some request was refused as too many (HTTP 429): the service's Retry-After in seconds (0 when it
    # gave none); the agent waits at least that, and backs off, before the next poll. None: not throttled.
    throttled_s: float | None = None

    def failed(self, line: str, error: MetadataError) -> None:
        """Add ``line`` (naming ``error``) to the problems, noting a throttled request."""
        self.problems.append(line)
        if isinstance(error, MetadataThrottledError):
            self.throttled_s = max(self.throttled_s or 0.0, error.retry_after_s)

    @classmethod
    def failure(cls, line: str, error: MetadataError) -> PollResult:
        """A poll that found nothing but the problem ``line``."""
        result = cls()
        result.failed(line, error)
        return result

    def __add__(self, other: PollResult) -> PollResult:
        throttled = [t for t in (self.throttled_s, other.throttled_s) if t is not None]
        return PollResult(self.notices + other.notices, self.problems + other.problems, self.pending + other.pending,
                          max(throttled) if throttled else None)


class Poller(Protocol):
    source: str

    def poll(self) -> PollResult: ...


class AwsPoller:
    """EC2 IMDSv2: spot instance-action (drain) and rebalance recommendation (record or drain)."""

    source = "aws"
    TOKEN_PATH = "/latest/api/token"
    ACTION_PATH = "/latest/meta-data/spot/instance-action"
    REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
    ACTIONS = ("terminate", "stop", "hibernate")

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout_s: float = 2.0,
        token_ttl_s: int = 21600,
        act_on_rebalance: bool = False,
        rebalance_deadline_s: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.token_ttl_s = token_ttl_s
        self.act_on_rebalance = act_on_rebalance
        self.rebalance_deadline_s = rebalance_deadline_s
        self.clock = clock
        self._token: str | None = None
        self._token_expires = 0.0

    def _token_value(self) -> str:
        if self._token is not None and self.clock() < self._token_expires - 60:
            return self._token
        self._token = None
        r = request(
            "PUT",
            self.base_url + self.TOKEN_PATH,
            {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
            self.timeout_s,
        )
        if r.status != 200:
            raise status_error(r, "IMDSv2 token")
        token = _text(r.body, "IMDSv2 token")
        if not token or len(token) > 4096 or not token.isprintable() or " " in token:
            raise MetadataError(f"IMDSv2 token: unusable token {token[:40]!r}")
        self._token, self._token_expires = token, self.clock() + self.token_ttl_s
        return token

    def _get(self, path: str) -> Response:
        for _ in range(2):
            r = request("GET", self.base_url + path, {"X-aws-ec2-metadata-token": self._token_value()}, self.timeout_s)
            if r.status != 401:
                return r
            self._token = None  # expired or revoked: fetch a new one, once
        raise MetadataError(f"{path}: HTTP 401 with a fresh token")

    def poll(self) -> PollResult:
        result = PollResult()
        for name, check in (("instance-action", self._instance_action), ("rebalance", self._rebalance)):
            try:
                notice = check()
            except MetadataError as e:
                result.failed(f"aws {name}: {e}", e)
                continue
            if notice is not None:
                result.notices.append(notice)
        return result

    def _instance_action(self) -> Notice | None:
        r = self._get(self.ACTION_PATH)
        if r.status == 404:
            return None
        if r.status != 200:
            raise status_error(r)
        data = _json_object(r.body, "instance-action")
        action, when = data.get("action"), data.get("time")
        if action not in self.ACTIONS:
            raise MetadataError(f"unknown action {action!r}")
        now = self.clock()
        deadline = plausible_deadline(parse_iso_utc(when, "instance-action time"), now, "instance-action")
        if action == "hibernate":
            # EC2 gives a hibernating spot instance no two-minute warning: it begins at once, whatever `time` says.
            deadline = min(deadline, now)
        return Notice("aws", f"aws:{action}:{when}", str(action), deadline, detail=f"spot instance-action {action} at {when}")

    def _rebalance(self) -> Notice | None:
        r = self._get(self.REBALANCE_PATH)
        if r.status == 404:
            return None
        if r.status != 200:
            raise status_error(r)
        data = _json_object(r.body, "rebalance recommendation")
        when = data.get("noticeTime")
        parse_iso_utc(when, "rebalance noticeTime")
        deadline = self.clock() + self.rebalance_deadline_s if self.act_on_rebalance else None
        return Notice(
            "aws-rebalance",
            f"aws-rebalance:{when}",
            "rebalance",
            deadline,
            actionable=self.act_on_rebalance,
            detail=f"rebalance recommendation at {when}",
            estimated=True,
        )


GCP_TERMINATE = "TERMINATE_ON_HOST_MAINTENANCE"
HOST_MAINTENANCE = "host-maintenance"  # the notice's action: drained like a preemption, recorded as this
GCP_MAINTENANCE_VALUES = ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", GCP_TERMINATE)


class GcpPoller:
    """GCE metadata ``instance/preempted`` and ``instance/maintenance-event``.

    A preemption gives ``notice_s`` (30 s, or the Spot VM's extended notice); a host maintenance
    that stops the VM gives ``maintenance_notice_s`` (``GCP_GPU_MAINTENANCE_NOTICE_S`` on a VM
    with GPUs, which the deployment files set) and is drained the same way (the gang trains on,
    then checkpoints just in time) but recorded as ``host-maintenance``; a live migration is not
    a notice.
    ``wait_for_change`` turns the ``preempted`` poll into a hanging GET of at most
    ``wait_timeout_s``, which bounds how late a maintenance event is seen.

    GCE dates neither: the deadline counts from the last answer that did not announce it (the
    notice began after that), or from a hanging GET's answer, which comes with the change; so it
    errs early by up to one poll interval, never late, however far apart throttling spaces the polls.
    """

    source = "gcp"
    PATH = "/computeMetadata/v1/instance/preempted"
    MAINTENANCE_PATH = "/computeMetadata/v1/instance/maintenance-event"

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout_s: float = 2.0,
        notice_s: float = GCP_PREEMPTION_NOTICE_S,
        maintenance_notice_s: float = GCP_MAINTENANCE_NOTICE_S,
        wait_for_change: bool = False,
        wait_timeout_s: int = 15,
        maintenance: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.notice_s = notice_s
        self.maintenance_notice_s = maintenance_notice_s
        self.wait_for_change = wait_for_change
        self.wait_timeout_s = wait_timeout_s
        self.maintenance = maintenance
        self.clock = clock
        self._etag: str | None = None
        self._seen_at: float | None = None
        self._maintenance_seen_at: float | None = None
        self._clear_at: float | None = None  # the last answer FALSE: a preemption since began after it
        self._maintenance_clear_at: float | None = None  # likewise for the maintenance event

    @property
    def blocking(self) -> bool:
        """Whether the next poll is a hanging GET (it needs the ETag of a first, plain one)."""
        return self.wait_for_change and self._etag is not None

    def poll(self) -> PollResult:
        return (self._poll_maintenance() if self.maintenance else PollResult()) + self._poll_preempted()

    def _get(self, url: str, timeout: float, what: str) -> tuple[str, Response]:
        r = request("GET", url, {"Metadata-Flavor": "Google"}, timeout)
        if r.status != 200:
            raise status_error(r)
        if r.headers.get("metadata-flavor") != "Google":
            raise MetadataError("answer without 'Metadata-Flavor: Google': not the GCE metadata server")
        return _text(r.body, what), r

    def _poll_maintenance(self) -> PollResult:
        try:
            value, _ = self._get(self.base_url + self.MAINTENANCE_PATH, self.timeout_s, "maintenance-event")
            if value not in GCP_MAINTENANCE_VALUES:
                raise MetadataError(f"expected one of {', '.join(GCP_MAINTENANCE_VALUES)}, got {value[:40]!r}")
        except MetadataError as e:
            return PollResult.failure(f"gcp maintenance-event: {e}", e)
        if value != GCP_TERMINATE:
            self._maintenance_seen_at = None  # over, or a live migration: nothing to drain
            self._maintenance_clear_at = self.clock()
            return PollResult()
        if self._maintenance_seen_at is None:
            self._maintenance_seen_at = self.clock() if self._maintenance_clear_at is None else self._maintenance_clear_at
        deadline = self._maintenance_seen_at + self.maintenance_notice_s
        key = f"gcp:maintenance:{self._maintenance_seen_at:.0f}"
        detail = f"instance/maintenance-event is {GCP_TERMINATE}"
        return PollResult([Notice("gcp", key, HOST_MAINTENANCE, deadline, detail=detail)])

    def _poll_preempted(self) -> PollResult:
        url, timeout, hanging = self.base_url + self.PATH, self.timeout_s, self.blocking
        if hanging:
            query = {"wait_for_change": "true", "timeout_sec": str(int(self.wait_timeout_s)), "last_etag": self._etag}
            url += "?" + urllib.parse.urlencode(query)
            timeout += self.wait_timeout_s
        try:
            value, r = self._get(url, timeout, "preempted")
            if value not in ("TRUE", "FALSE"):
                raise MetadataError(f"expected TRUE or FALSE, got {value[:40]!r}")
        except MetadataError as e:
            # A hanging GET that failed (a server that never answers it, a proxy cutting it)
            # is followed by a plain, short one: one hang lost, not every poll.
            self._etag = None
            return PollResult.failure(f"gcp preempted: {e}", e)
        self._etag = r.headers.get("etag") or None
        if value == "FALSE":
            self._clear_at = self.clock()
            return PollResult()
        if self._seen_at is None:  # a hanging GET answers as the value changes
            self._seen_at = self.clock() if hanging or self._clear_at is None else self._clear_at
        deadline = self._seen_at + self.notice_s
        return PollResult([Notice("gcp", "gcp:preempted", "preempt", deadline, detail="instance/preempted is TRUE")])


# Azure's Scheduled Events that end this VM's processes, and the notice's action for each: a Spot
# eviction, a scale set's delete (its terminate notification), a reboot or a move to another host
# (both platform maintenance). Minimum notice: 30 s, 5-15 min (configured), 15 min, 10 min.
AZURE_DRAINED = {"Preempt": "preempt", "Terminate": "terminate", "Reboot": HOST_MAINTENANCE, "Redeploy": HOST_MAINTENANCE}

# Azure switches Scheduled Events on at a VM's first request to the endpoint: that request can
# take up to two minutes, and events flow within five minutes of it.
AZURE_FIRST_CALL_S = 120.0
AZURE_EVENTS_FLOW_S = 300.0


class AzurePoller:
    """Azure Scheduled Events for this VM that end its processes (``AZURE_DRAINED``), ``NotBefore``
    as the deadline; one cancelled before its time is recorded (``action: cancelled``).

    Until the endpoint has answered once, a request may take ``first_timeout_s`` instead of
    ``timeout_s`` (the first one switches the service on), and a request that gets no answer
    is ``pending`` ("enabling"), not a problem, for ``enabling_s``; after that it is a problem
    again. For ``enabling_s`` after the first answer the poll stays ``pending`` too: events
    may not flow yet, so an empty list does not yet mean "no eviction coming".
    """

    source = "azure"
    PATH = "/metadata/scheduledevents?api-version=2020-07-01"
    NAME_PATH = "/metadata/instance/compute/name?api-version=2020-09-01&format=text"

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout_s: float = 2.0,
        first_timeout_s: float = AZURE_FIRST_CALL_S,
        enabling_s: float = AZURE_EVENTS_FLOW_S,
        vm_name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.first_timeout_s = max(first_timeout_s, timeout_s)
        self.enabling_s = enabling_s
        self.vm_name = vm_name
        self.clock = clock
        self.first_asked_at: float | None = None
        self.answered_at: float | None = None  # the service's first answer: it is on
        self._events: dict[str, tuple[str, float]] = {}  # EventId -> (EventType, deadline) of this VM's notices

    @property
    def answered(self) -> bool:
        """Whether the service has answered at all: until then a request with no answer is a wait
        (``pending``), which is no answer to one that does not poll again (``notice-agent --once``)."""
        return self.answered_at is not None

    @property
    def enabling(self) -> bool:
        """Whether Scheduled Events may still be switching on (no answer, or events not flowing yet)."""
        return self.answered_at is None or self.clock() < self.answered_at + self.enabling_s

    def _fetch_vm_name(self) -> str:
        r = request("GET", self.base_url + self.NAME_PATH, {"Metadata": "true"}, self.timeout_s)
        if r.status != 200:
            raise status_error(r, "compute/name")
        name = _text(r.body, "compute/name")
        if not name or not name.isprintable() or len(name) > 256:
            raise MetadataError(f"compute/name: unusable name {name[:40]!r}")
        return name

    def poll(self) -> PollResult:
        result = PollResult()
        if self.vm_name is None:
            # Events for every VM of an availability set / scale-set group arrive here; the
            # name tells ours apart. Unknown name: act on every Preempt rather than miss ours.
            try:
                self.vm_name = self._fetch_vm_name()
            except MetadataError as e:
                result.failed(f"azure {e}", e)
        if self.first_asked_at is None:
            self.first_asked_at = self.clock()
        first = self.answered_at is None
        try:
            r = request("GET", self.base_url + self.PATH, {"Metadata": "true"}, self.first_timeout_s if first else self.timeout_s)
        except MetadataError as e:  # no answer at all
            if first and self.clock() < self.first_asked_at + self.enabling_s:
                result.pending.append(f"enabling Scheduled Events: no answer yet, the first can take two minutes ({e})")
            else:
                result.failed(f"azure scheduledevents: {e}", e)
            return result
        try:
            if r.status != 200:
                raise status_error(r)
            data = _json_object(r.body, "scheduledevents")
            events = data.get("Events")
            if not isinstance(events, list):
                raise MetadataError("no 'Events' list")
        except MetadataError as e:
            result.failed(f"azure scheduledevents: {e}", e)
            return result
        if first:
            self.answered_at = self.clock()
        if self.enabling:
            result.pending.append("enabling Scheduled Events: answering; events can take five minutes to start flowing")
        for event in events:
            try:
                notice = self._notice(event)
            except MetadataError as e:
                result.problems.append(f"azure scheduledevents: {e}")
                continue
            if notice is not None:
                result.notices.append(notice)
        result.notices += self._cancelled({e.get("EventId") for e in events if isinstance(e, dict)})
        return result

    def _notice(self, event: Any) -> Notice | None:
        """The notice an event is for this VM, or None. Its key holds the ``NotBefore`` (``started``
        once blank), so an event that starts early, or is moved earlier, drains again sooner."""
        if not isinstance(event, dict):
            raise MetadataError(f"event is not an object: {event!r:.60}")
        kind = event.get("EventType")
        if kind not in AZURE_DRAINED:
            return None  # a Freeze pauses the VM for seconds and keeps its memory: the gang lives on
        event_id = event.get("EventId")
        if not isinstance(event_id, str) or not event_id:
            raise MetadataError(f"{kind} event without an EventId")
        resources = event.get("Resources") or []
        if not isinstance(resources, list) or not all(isinstance(x, str) for x in resources):
            raise MetadataError(f"event {event_id}: 'Resources' is not a list of names")
        if resources and self.vm_name and self.vm_name.lower() not in {x.lower() for x in resources}:
            return None  # another VM of the group is being preempted
        if resources and not self.vm_name and kind != "Preempt":
            # Whose it is waits for the name (asked again next poll): a scale set's scale-in or a
            # neighbour's maintenance must not drain every VM of the group; these come minutes ahead.
            return None
        now = self.clock()
        not_before = event.get("NotBefore") or ""
        status = event.get("EventStatus", "")
        detail = f"{kind} {event_id} ({status}) NotBefore {not_before or 'now'}"
        key = f"azure:{event_id}:{not_before or 'started'}"
        if not not_before:
            deadline = now  # blank NotBefore: the event has started
        else:
            deadline = parse_http_date(not_before, f"event {event_id} NotBefore")
            if kind != "Preempt" and deadline > now + NOTICE_HORIZON_S:
                # Maintenance Azure plans days ahead (a host predicted to fail): recorded now, drained
                # once it is within the hour, as GCE's host maintenance is.
                return Notice("azure", key + ":scheduled", AZURE_DRAINED[kind], deadline, actionable=False,
                              detail=f"{detail}: drained from {NOTICE_HORIZON_S / 60:g} minutes before")
            deadline = plausible_deadline(deadline, now, f"event {event_id}")
        self._events[event_id] = (kind, deadline)
        return Notice("azure", key, AZURE_DRAINED[kind], deadline, detail=detail)

    def _cancelled(self, listed: set[Any]) -> list[Notice]:
        """Events this VM was given notice of that left the list before their time: Azure cancelled
        them. The agent records one only where it drained for it: Ray cannot take a drain back."""
        now, gone = self.clock(), []
        for event_id, (kind, deadline) in list(self._events.items()):
            if event_id in listed:
                continue
            del self._events[event_id]
            if now < deadline:
                gone.append(Notice("azure", f"azure:{event_id}:cancelled", CANCELLED, None, actionable=False,
                                   detail=f"{kind} {event_id} left the Scheduled Events before its NotBefore: Azure "
                                          "cancelled it; the drain made for it stays (Ray cannot take a drain back)",
                                   cancels=f"azure:{event_id}"))
        return gone


class SigtermPoller:
    """Kubernetes: SIGTERM to the pod is the notice; the node goes after the grace period."""

    source = "k8s"

    def __init__(self, grace_s: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.grace_s = grace_s
        self.clock = clock
        self.received_at: float | None = None
        self._after: Callable[[], None] | None = None

    def install(self, after: Callable[[], None] | None = None) -> Any:
        """Handle SIGTERM (main thread only); returns the previous handler.

        ``after`` runs in the handler once the signal is noted (the agent's ``wake``, so the
        drain does not wait for the next poll); it must not take locks.
        """
        self._after = after
        return signal.signal(signal.SIGTERM, self.on_signal)

    def on_signal(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:
        if self.received_at is None:
            self.received_at = self.clock()
        if self._after is not None:
            self._after()

    def poll(self) -> PollResult:
        if self.received_at is None:
            return PollResult()
        deadline = self.received_at + self.grace_s
        return PollResult([Notice("k8s", "k8s:sigterm", "sigterm", deadline, detail=f"SIGTERM; grace {self.grace_s:g}s")])


def make_poller(cloud: str, base_url: str = DEFAULT_BASE_URL, *, timeout_s: float = 2.0, **options: Any) -> Poller:
    """The poller for ``cloud`` (aws, gcp, azure, k8s); options are its keyword arguments."""
    if cloud == "aws":
        return AwsPoller(base_url, timeout_s=timeout_s, **options)
    if cloud == "gcp":
        return GcpPoller(base_url, timeout_s=timeout_s, **options)
    if cloud == "azure":
        return AzurePoller(base_url, timeout_s=timeout_s, **options)
    if cloud == "k8s":
        return SigtermPoller(**options)
    raise ValueError(f"unknown cloud {cloud!r}; expected one of {', '.join(CLOUDS)}")


def detect_cloud(
    base_url: str = DEFAULT_BASE_URL,
    *,
    timeout_s: float = 1.0,
    env: Mapping[str, str] | None = None,
    dmi_dir: str | os.PathLike[str] = "/sys/class/dmi/id",
) -> str | None:
    """Which cloud this machine runs on: Kubernetes, then the firmware's vendor, then probes."""
    env = os.environ if env is None else env
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "k8s"
    dmi = {}
    for name in ("sys_vendor", "product_name", "bios_vendor", "chassis_asset_tag"):
        try:
            dmi[name] = (Path(dmi_dir) / name).read_text().strip().lower()
        except OSError:
            dmi[name] = ""
    vendor = " ".join(dmi.values())
    if "amazon" in vendor:
        return "aws"
    if "google" in vendor:
        return "gcp"
    if dmi["chassis_asset_tag"] == AZURE_ASSET_TAG:
        return "azure"
    base = base_url.rstrip("/")
    probes: list[tuple[str, str, str, dict[str, str]]] = [
        ("gcp", "GET", "/computeMetadata/v1/instance/id", {"Metadata-Flavor": "Google"}),
        ("azure", "GET", "/metadata/instance/compute/azEnvironment?api-version=2020-09-01&format=text", {"Metadata": "true"}),
        ("aws", "PUT", AwsPoller.TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": "60"}),
    ]
    for cloud, method, path, headers in probes:
        try:
            r = request(method, base + path, headers, timeout_s)
        except MetadataError:
            continue
        if r.status != 200 or not r.body.strip():
            continue
        if cloud == "gcp" and r.headers.get("metadata-flavor") != "Google":
            continue
        return cloud
    return None
