"""The notice agent's health record: what `spotfallback status` shows for each node's agent.

Why it exists: an agent that cannot do its job fails silently otherwise. Waiting for a Ray node
that never comes up, a metadata service that does not answer, Azure Scheduled Events still
switching on: each leaves evictions on its node undrained, and in a pod (``restartPolicy:
Never``) nothing restarts an agent that gave up. So each agent started with ``--run`` keeps
one small JSON object in the run's state directory (``agents/<agent>.json``), rewritten on
every change of state and every ``every_s`` seconds; ``status`` lists them and flags an agent
not heard from for ``STALE_BEATS`` intervals.

``AgentHealth`` and its transitions are pure (the caller passes the clock); ``HealthReporter``
writes on a thread of its own, through the store's retry rule bounded by the interval, so a
storage outage costs heartbeats, never a poll or a drain.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import pyarrow.fs as pafs
from pydantic import TypeAdapter, ValidationError

from spotfallback.events import FORMAT_VERSION
from spotfallback.notices.metadata import Notice
from spotfallback.store.location import TMP_PREFIX, RunLocation, list_dir, write_atomically
from spotfallback.store.retry import call_with_retry, retry_limit_s

logger = logging.getLogger("spotfallback")

AGENTS_DIR = "agents"
HEALTH_EVERY_S = 30.0
# Missed heartbeats before `status` calls an agent stale (dead, hung, or its node gone).
STALE_BEATS = 3
MAX_DETAIL = 300
# `status` reads the records written most recently, at most this many (a long run replaces many nodes).
MAX_SHOWN = 32


class AgentState(StrEnum):
    WAITING_FOR_RAY = "waiting-for-ray"  # no Ray node to drain yet (sidecar started first, or Ray is down)
    WATCHING = "watching"
    ENABLING = "enabling"  # Azure Scheduled Events switching on: notices may not come yet
    METADATA_FAILING = "metadata-failing"  # the last poll failed: a notice now would be missed
    DRAINED = "drained"  # a notice drained the node: it goes at ``deadline_s``, and the agent with it
    STOPPED = "stopped"


@dataclass(frozen=True)
class AgentHealth:
    """One agent's state as last written. ``since``: when the state began; ``t``: when it was
    last true (written); ``every_s``: how often it is rewritten, so a reader can tell a stale one."""

    agent: str
    host: str
    pid: int
    cloud: str
    node_id: str | None
    state: AgentState
    since: float
    detail: str
    started_at: float
    t: float
    every_s: float = HEALTH_EVERY_S
    deadline_s: float | None = None
    notices: int = 0
    v: int = FORMAT_VERSION

    @classmethod
    def starting(cls, agent: str, cloud: str, now: float, *, every_s: float = HEALTH_EVERY_S, node_id: str | None = None) -> AgentHealth:
        return cls(
            agent=agent, host=socket.gethostname(), pid=os.getpid(), cloud=cloud, node_id=node_id,
            state=AgentState.WAITING_FOR_RAY, since=now, detail="starting", started_at=now, t=now, every_s=every_s,
        )

    def _to(self, state: AgentState, now: float, detail: str = "", **changes: object) -> AgentHealth:
        since = self.since if state is self.state else now
        return dataclasses.replace(self, state=state, since=since, detail=detail[:MAX_DETAIL], t=now, **changes)  # type: ignore[arg-type]

    def waiting_for_ray(self, now: float, reason: str) -> AgentHealth:
        return self._to(AgentState.WAITING_FOR_RAY, now, reason)

    def watching(self, now: float, node_id: str | None) -> AgentHealth:
        return self._to(AgentState.WATCHING, now, node_id=node_id)

    def after_poll(self, now: float, problems: Sequence[str], pending: Sequence[str], handled: Sequence[Notice], drained: Sequence[Notice]) -> AgentHealth:
        """The state after one poll. A drained node stays drained (Ray does not undrain it); else a
        failed poll is ``metadata-failing``, a known wait ``enabling``, anything else ``watching``."""
        notices = self.notices + len(handled)
        if drained:
            last = drained[-1]
            deadline = min((n.deadline_s for n in drained if n.deadline_s is not None), default=self.deadline_s)
            return self._to(AgentState.DRAINED, now, f"{last.source} {last.action}: {last.detail}", deadline_s=deadline, notices=notices)
        if self.state is AgentState.DRAINED:
            return dataclasses.replace(self, t=now, notices=notices)
        if problems:
            return self._to(AgentState.METADATA_FAILING, now, problems[0], notices=notices)
        if pending:
            return self._to(AgentState.ENABLING, now, pending[0], notices=notices)
        return self._to(AgentState.WATCHING, now, notices=notices)

    def stopped(self, now: float, reason: str) -> AgentHealth:
        return self._to(AgentState.STOPPED, now, reason)

    def stale(self, now: float) -> bool:
        """Not heard from for ``STALE_BEATS`` intervals while it should be running."""
        return self.state is not AgentState.STOPPED and now - self.t > STALE_BEATS * self.every_s

    def gone_with_node(self, now: float) -> bool:
        """Stale after draining its node past the deadline: the node went, as announced."""
        return self.state is AgentState.DRAINED and self.stale(now) and (self.deadline_s is None or now > self.deadline_s)

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


_ADAPTER = TypeAdapter(AgentHealth)


def agent_name(host: str | None = None, node_id: str | None = None) -> str:
    """The record's name: the host (a pod's name in Kubernetes), plus the node id when several
    agents share one host; an agent restarted on the same node overwrites its own record."""
    name = host or socket.gethostname() or "agent"
    if node_id:
        name = f"{name}-{node_id[:12]}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:120]


def health_path(location: RunLocation, agent: str) -> str:
    return location.path(AGENTS_DIR, f"{agent}.json")


def read_agents(location: RunLocation, limit: int = MAX_SHOWN) -> tuple[list[AgentHealth], int]:
    """The health records of the run's agents, most recently heard from first, at most ``limit``
    (the most recently written), and how many more there are. Unreadable records are skipped:
    status must show what it can."""
    infos = [
        i
        for i in list_dir(location.fs, location.path(AGENTS_DIR))
        if i.type == pafs.FileType.File and i.base_name.endswith(".json") and not i.base_name.startswith(TMP_PREFIX)
    ]
    infos.sort(key=lambda i: i.mtime_ns or 0, reverse=True)
    out = []
    for info in infos[:limit]:
        try:
            with location.fs.open_input_stream(info.path) as f:
                out.append(_ADAPTER.validate_python(json.loads(f.readall())))
        except (OSError, ValueError, ValidationError) as e:
            logger.debug("skipping the agent record %s: %s", info.path, e)
    out.sort(key=lambda h: h.t, reverse=True)
    return out, max(0, len(infos) - limit)


class HealthReporter:
    """Keeps one agent's record in the run's storage: on each change of state, and every ``every_s``.

    One writer thread, so writes never overlap or land out of order. Each write rides out a
    storage outage for at most ``every_s`` (the store's retry rule), then waits for the next beat.
    """

    def __init__(self, location: RunLocation, health: AgentHealth) -> None:
        self.location = location
        self.path = health_path(location, health.agent)
        self._health = health
        self._wake = threading.Event()
        self._closing = False
        self._failing: str | None = None
        self._dir_ready = False
        self.writes = 0
        self._thread = threading.Thread(target=self._loop, name="spotfallback-agent-health", daemon=True)
        self._thread.start()

    @property
    def health(self) -> AgentHealth:
        return self._health

    def update(self, health: AgentHealth) -> None:
        """The agent's state now; a change of state (or of what it says) is written at once."""
        old, self._health = self._health, health
        if (old.state, old.detail, old.node_id, old.deadline_s) != (health.state, health.detail, health.node_id, health.deadline_s):
            self._wake.set()

    def close(self, final: AgentHealth, wait_s: float = 5.0) -> bool:
        """Write ``final`` (the stopped record) and stop; True if it was written within ``wait_s``."""
        self._health = final
        self._closing = True
        self._wake.set()
        self._thread.join(wait_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            closing = self._closing
            self._write(closing)
            if closing:
                return
            self._wake.wait(self._health.every_s)
            self._wake.clear()

    def _write(self, final: bool) -> None:
        health = self._health if final else dataclasses.replace(self._health, t=time.time())
        payload = json.dumps(health.to_json()).encode()
        limit = min(retry_limit_s(), health.every_s)

        def put() -> None:
            if not self._dir_ready:  # the agent may start before the run's first driver made any
                self.location.fs.create_dir(self.location.path(AGENTS_DIR), recursive=True)
                self._dir_ready = True
            write_atomically(self.location.fs, self.path, payload)

        try:
            call_with_retry(put, f"write {self.path}", limit)
        except Exception as e:  # a lost heartbeat is logged once, never raised into the agent
            if str(e) != self._failing:
                logger.warning("notice agent: could not write its health record: %s", e)
            self._failing = str(e)
            return
        if self._failing is not None:
            logger.info("notice agent: health record written again")
        self._failing = None
        self.writes += 1
