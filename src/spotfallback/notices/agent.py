"""The notice agent: a cloud's preemption warning becomes a Ray node drain, once.

Why it exists: Ray Train 2.60 checkpoints just in time and counts the loss as a preemption
only when the node is *drained* with reason PREEMPTION and a deadline, but on plain VM
clusters nothing turns the cloud's warning into that drain. One agent runs per node, asks
the instance metadata service every few seconds (``notices.metadata``), and on a notice
drains its own Ray node with the cloud's deadline (AWS: two minutes, GCP and Azure: about 30 s;
GCP host maintenance that stops a VM with GPUs: an hour).

The rules that keep it safe: anything it cannot parse is a *problem*, logged and never
acted on; a slow or refused connection is a problem for one poll, not a crash; each notice
(identified by its content) drains at most once, and a second source re-drains only to
bring the deadline forward, or to replace a deadline the agent guessed with the cloud's; a
metadata service that answers "too many requests" is polled less often, up to
``MAX_BACKOFF_S`` apart.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from spotfallback.errors import AmbiguousRayNodeError, NoLocalRayNodeError
from spotfallback.events import PreemptionNotice
from spotfallback.notices.drain import drain_for_preemption, gcs_client
from spotfallback.notices.metadata import HOST_MAINTENANCE, Notice, Poller, PollResult
from spotfallback.notices.runlog import RunLog

logger = logging.getLogger("spotfallback")

# The longest wait between polls while the metadata service throttles them: a third of the
# shortest notice (30 s on GCP and Azure), so a notice is still seen with most of it left.
MAX_BACKOFF_S = 10.0


def _gcs_client(gcs: Any) -> Any:
    return gcs_client(gcs) if isinstance(gcs, str) else gcs


class RayDrain:
    """Drains this machine's Ray node (or ``node_id``) through the shared drain call.

    ``gcs``: the GCS address or a ``GcsClient``. Without ``node_id`` the node is looked up
    at each drain, not once at start: a Ray container restarted since then has a new node
    id, and the GCS accepts the drain of the old, dead one as a no-op. ``node_id`` holds the
    node of the last drain (the injector and the local tests pass it explicitly).
    """

    def __init__(self, gcs: Any, node_id: str | None = None) -> None:
        self.gcs = gcs
        self.fixed_node_id = node_id
        self.node_id = node_id
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            self._client = _gcs_client(self.gcs)
        return self._client

    def target(self) -> str:
        """The node the next drain goes to."""
        return self.fixed_node_id or local_node_id(self.client())

    def __call__(self, notice: Notice) -> None:
        node_id = self.target()
        what = "host maintenance" if notice.action == HOST_MAINTENANCE else "preemption"
        message = f"{notice.source} {what} notice: {notice.detail}"
        drain_for_preemption(self.client(), node_id, notice.deadline_s, message)
        self.node_id = node_id


def gcs_address_for(address: str | None) -> str:
    """``host:port`` of the GCS: from ``address``, else RAY_ADDRESS, else this node's cluster.

    "This node's cluster" is the address ``ray start`` (head or worker) writes to
    ``$RAY_TMPDIR/ray/ray_current_cluster`` (``/tmp/ray/...`` by default): a sidecar that
    shares that directory with the Ray container finds it there. Unlike Ray's ``auto``, it
    never falls back to any GCS process it can see: the node to drain must be this one's.
    Raises ConnectionError when there is no address, ValueError for a malformed one.
    """
    from ray._common.utils import get_ray_address_file
    from ray._private.services import canonicalize_bootstrap_address

    # Ray documents None as "read this node's address file"; its annotation says str.
    found = canonicalize_bootstrap_address(address or os.environ.get("RAY_ADDRESS") or None)  # type: ignore[arg-type]
    if found is None:
        raise ConnectionError(
            f"no Ray address: --address and RAY_ADDRESS are unset and {get_ray_address_file(None)} "
            "(written by `ray start` on this node) does not exist"
        )
    _, _, port = found.rpartition(":")
    if not (port.isdigit() and 0 < int(port) < 2**16):  # Ray would retry it for a minute, and fail
        raise ValueError(f"{found!r}: {port!r} is not a port; give host:PORT with a port of 1-65535 (the GCS's, 6379 by default)")
    return found


def local_node_id(gcs: Any, ip: str | None = None) -> str:
    """The one live Ray node with this machine's address (``ip``: that address, if known).

    The address is the one this machine uses to reach the GCS, as ``ray start`` picks it.
    Raises NoLocalRayNodeError when there is none, AmbiguousRayNodeError when several
    raylets share it (a local test cluster, several nodes per VM).
    """
    from ray._private.services import get_node_ip_address
    from ray.core.generated import gcs_pb2

    client = _gcs_client(gcs)
    if ip is None:
        ip = get_node_ip_address(gcs if isinstance(gcs, str) else getattr(client, "address", None))
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
    infos = client.get_all_node_info(timeout=10)
    mine = sorted(nid.hex() for nid, info in infos.items() if info.state == alive and info.node_manager_address == ip)
    if not mine:
        raise NoLocalRayNodeError(f"no live Ray node has this machine's address {ip} (is Ray running here?)")
    if len(mine) > 1:
        raise AmbiguousRayNodeError(
            f"{len(mine)} live Ray nodes have this machine's address {ip}: pass the one to drain with "
            f"--node-id (or SPOTFALLBACK_NODE_ID), e.g. {mine[0]}"
        )
    return mine[0]


class LedgerRecorder:
    """Records each notice in the run's ledger as a ``PreemptionNotice`` (after the drain)."""

    def __init__(self, run_log: RunLog, node_id: str) -> None:
        self.run_log = run_log
        self.node_id = node_id

    def __call__(self, notice: Notice, drained: bool, detail: str) -> None:
        event = PreemptionNotice(
            t=time.time(),
            node_id=self.node_id,
            deadline_s=notice.deadline_s,
            source=notice.source,
            action=notice.action,
            drained=drained,
        )
        self.run_log.append_soon(event, {"detail": detail, "key": notice.key}, wait_s=5.0)


Drain = Callable[[Notice], None]
Record = Callable[[Notice, bool, str], None]
# After each poll: what it found, the notices it handled for the first time and those it drained
# (the agent's health record follows it).
Observe = Callable[[PollResult, list[Notice], list[Notice]], None]


class NoticeAgent:
    """Polls one source and drains (through ``drain``) at most once per notice.

    ``drain`` and ``record`` are injected so the agent is testable without Ray; a failed drain
    is retried on the next poll (the notice is not marked handled), a failed record is logged.
    ``observe`` sees each poll's outcome (the health record follows it); it must not raise.
    """

    def __init__(
        self,
        poller: Poller,
        drain: Drain,
        *,
        record: Record | None = None,
        observe: Observe | None = None,
        interval_s: float = 2.0,
    ) -> None:
        self.poller = poller
        self.drain = drain
        self.record = record
        self.observe = observe
        self.interval_s = interval_s
        self.handled: dict[str, Notice] = {}
        self.drained: list[Notice] = []
        self.problems: list[str] = []
        self._drained_deadline: float | None = None  # deadline of the last drain (inf: none)
        self._drained_estimate = False  # the last drain's deadline was the agent's guess
        self.backoff_s = 0.0  # the wait between polls while the service throttles them (0: not throttled)
        self.drain_failures: list[str] = []  # the last poll's failed drains (retried at the next)
        self._said: set[str] = set()  # the last poll's problems and waits: logged once while they last
        self._poll_now = False  # a plain flag: wake() runs in signal handlers

    def poll_once(self) -> list[Notice]:
        """One poll; returns the notices handled (drained or recorded) for the first time."""
        self.drain_failures = []
        try:
            result = self.poller.poll()
        except Exception as e:  # a bug in a poller must not stop the agent
            logger.exception("notice poller failed")
            result = PollResult(problems=[f"{type(e).__name__}: {e}"])
        self.problems.extend(result.problems)
        for line in result.problems:
            if line not in self._said:  # a persisting problem is logged once, not every poll
                logger.warning("notice agent: %s", line)
        for line in result.pending:
            if line not in self._said:
                logger.info("notice agent: %s", line)
        self._said = {*result.problems, *result.pending}
        self._pace(result.throttled_s)
        handled, drained_before = [], len(self.drained)
        for notice in result.notices:
            if notice.key not in self.handled and self._handle(notice):
                handled.append(notice)
        if self.observe is not None:
            self.observe(result, handled, self.drained[drained_before:])
        return handled

    def _handle(self, notice: Notice) -> bool:
        detail, drained = notice.detail, False
        if notice.cancels and not any(d.key == notice.cancels or d.key.startswith(notice.cancels + ":") for d in self.drained):
            self.handled[notice.key] = notice  # it takes back no drain of this agent's: nothing to say
            return False
        if notice.actionable:
            deadline = math.inf if notice.deadline_s is None else notice.deadline_s
            if self._drained_deadline is not None and notice.estimated and not self._drained_estimate:
                detail += "; the node is already draining with the cloud's own deadline"
            elif (self._drained_deadline is not None and deadline >= self._drained_deadline
                    and not (self._drained_estimate and not notice.estimated)):
                detail += "; the node is already draining with an earlier or equal deadline"
            else:
                try:
                    self.drain(notice)
                except Exception as e:
                    logger.error("notice agent: could not drain for %s (%s); retrying next poll", notice.key, e)
                    self.drain_failures.append(f"{notice.key}: {e}")
                    return False
                drained = True
                self._drained_deadline, self._drained_estimate = deadline, notice.estimated
                self.drained.append(notice)
                left = "unknown" if notice.deadline_s is None else f"{notice.deadline_s - time.time():.1f}s"
                logger.warning("%s notice (%s): %s; Ray node drained, deadline in %s", notice.action, notice.source, notice.detail, left)
        else:
            logger.info("notice (%s) recorded, not acted on: %s", notice.source, notice.detail)
        self.handled[notice.key] = notice
        if self.record is not None:
            try:
                self.record(notice, drained, detail)
            except Exception as e:
                logger.warning("notice agent: could not record %s: %s", notice.key, e)
        return True

    def _pace(self, throttled_s: float | None) -> None:
        """Back off while the service throttles: double the wait (from the interval), at least its
        Retry-After, at most ``MAX_BACKOFF_S``; back to the interval once a poll is not throttled."""
        if throttled_s is None:
            self.backoff_s = 0.0
            return
        doubled = 2.0 * max(self.backoff_s, self.interval_s)
        self.backoff_s = min(max(doubled, throttled_s), max(MAX_BACKOFF_S, self.interval_s))

    def wake(self) -> None:
        """Poll now instead of at the end of the current wait (safe in a signal handler)."""
        self._poll_now = True

    def run(self, stop: threading.Event | None = None, *, max_polls: int | None = None) -> None:
        """Poll until ``stop`` is set (or ``max_polls`` polls), at most once per ``interval_s``
        (``backoff_s`` while throttled) unless woken.

        A hanging GET that waited longer than the interval is followed at once by the next.
        """
        stop = stop or threading.Event()
        polls, waited = 0, 0.0
        while not stop.is_set():
            started = time.monotonic()
            self._poll_now = False
            self.poll_once()
            polls += 1
            if max_polls is not None and polls >= max_polls:
                return
            if self.backoff_s > max(waited, self.interval_s):
                logger.warning("notice agent: the metadata service throttles the polls; next in %.3gs", self.backoff_s)
            waited = self.backoff_s
            due = started + (self.interval_s if self.drain_failures else max(self.interval_s, self.backoff_s))
            while not stop.is_set() and not self._poll_now:
                left = due - time.monotonic()
                if left <= 0:
                    break
                stop.wait(min(left, 0.1))
