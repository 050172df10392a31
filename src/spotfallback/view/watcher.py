"""Progress while `spotfallback run` trains: a thread polls the run's ledger and feeds sinks.

``RunWatcher`` reads the run from storage like `status` does (never from the driver's memory)
and hands each new event and each new snapshot to its sinks: a rich live panel on a terminal,
quiet plain lines in CI logs, JSON lines for machines, MLflow. A sink that fails is dropped;
the run itself is never affected.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal, Protocol

from rich.console import Console

from spotfallback.config import Ladder
from spotfallback.events import LedgerRecord
from spotfallback.store.heartbeat import read_heartbeat
from spotfallback.store.ledger import LedgerTail
from spotfallback.store.location import RunLocation
from spotfallback.view.snapshot import DriverInfo, Snapshot, build_snapshot, read_driver
from spotfallback.view.text import describe_event, event_json, snapshot_line, snapshot_renderable

logger = logging.getLogger("spotfallback")

Mode = Literal["live", "plain", "json", "off"]


class ProgressSink(Protocol):
    """Receives what the watcher sees. Called from the watcher's thread, in order."""

    def on_event(self, record: LedgerRecord, snapshot: Snapshot, t0: float) -> None: ...

    def on_snapshot(self, snapshot: Snapshot) -> None: ...

    def close(self, snapshot: Snapshot | None) -> None: ...


class PlainSink:
    """Quiet lines for logs: every event except checkpoints, and a status line now and then."""

    def __init__(self, ladder: Ladder, console: Console, every_s: float = 60.0):
        self.ladder, self.console, self.every_s = ladder, console, every_s
        self._last = time.monotonic()

    def on_event(self, record: LedgerRecord, snapshot: Snapshot, t0: float) -> None:
        if record.event.kind == "checkpoint_committed":
            return
        line = describe_event(record, t0, self.ladder)
        if line:
            self.console.print(line, soft_wrap=True)

    def on_snapshot(self, snapshot: Snapshot) -> None:
        if time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            self.console.print(snapshot_line(snapshot), soft_wrap=True)

    def close(self, snapshot: Snapshot | None) -> None:
        if snapshot is not None:
            self.console.print(snapshot_line(snapshot), soft_wrap=True)


class LiveSink:
    """A rich live panel on a terminal, with each event printed above it as it happens."""

    def __init__(self, ladder: Ladder, console: Console):
        from rich.live import Live

        self.ladder = ladder
        self.live = Live(console=console, refresh_per_second=4, transient=False, redirect_stdout=False)
        self._started = False
        self.since = time.time()  # a resumed run's old checkpoints are history, not news

    def _show(self, snapshot: Snapshot) -> None:
        self.live.update(snapshot_renderable(snapshot))
        if not self._started:
            self._started = True
            self.live.start()

    def on_event(self, record: LedgerRecord, snapshot: Snapshot, t0: float) -> None:
        if record.event.kind == "checkpoint_committed" and record.t < self.since:
            return
        line = describe_event(record, t0, self.ladder)
        if line:
            self.live.console.print(line)

    def on_snapshot(self, snapshot: Snapshot) -> None:
        self._show(snapshot)

    def close(self, snapshot: Snapshot | None) -> None:
        if snapshot is not None:
            self._show(snapshot)
        if self._started:
            self.live.stop()


class JsonSink:
    """One JSON object per line: each event, and the snapshot whenever it changes."""

    def __init__(self, ladder: Ladder, out: IO[str]):
        self.ladder, self.out = ladder, out
        self._last_key: str | None = None

    def _write(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, default=str) + "\n")
        self.out.flush()

    def on_event(self, record: LedgerRecord, snapshot: Snapshot, t0: float) -> None:
        self._write(event_json(record, t0, self.ladder))

    def on_snapshot(self, snapshot: Snapshot) -> None:
        # A new line when something a reader acts on changes, not on every tick of the clock.
        p = snapshot.progress
        key = repr((snapshot.status, snapshot.tier_index, snapshot.workers_up, p.value if p else None,
                    snapshot.checkpoints, snapshot.give_up_reason))
        if key != self._last_key:
            self._last_key = key
            self._write({"type": "status", **snapshot.to_json()})

    def close(self, snapshot: Snapshot | None) -> None:
        if snapshot is not None:
            self._write({"type": "status", **snapshot.to_json()})


class RunWatcher:
    """Polls a run's ledger on a thread while it trains and feeds the sinks.

    Used as ``with watcher.watch(trainer.location): trainer.fit()``. A sink that raises is
    logged and dropped; the run itself is never affected.
    """

    def __init__(
        self,
        ladder: Ladder,
        sinks: Sequence[ProgressSink],
        *,
        config: Mapping[str, Any] | None = None,
        interval_s: float = 1.0,
    ):
        self.ladder = ladder
        self.sinks = list(sinks)
        self.config = dict(config or {})
        self.interval_s = interval_s
        self.snapshot: Snapshot | None = None
        self._stop = threading.Event()
        self._t0: float | None = None

    def _poll(self, tail: LedgerTail, location: RunLocation, final: bool = False) -> None:
        records = tail.poll()
        base = tail.base
        if not records and base is None:
            return
        if self._t0 is None:
            self._t0 = (base.carry.summary.started_at if base is not None else None) or records[0].t
        driver = read_driver(location)
        now = time.time()
        if driver is None and not final:
            # This process is the driver while it watches; its lease may not be written yet.
            driver = DriverInfo(socket.gethostname(), os.getpid(), now, now + 60)
        snap = build_snapshot(
            self.ladder, records, run=location.uri(), now=now, heartbeat=read_heartbeat(location),
            driver=driver, config=self.config, base=base,
        )
        new = tail.fresh
        self.snapshot = snap
        for sink in list(self.sinks):
            try:
                for rec in new:
                    sink.on_event(rec, snap, self._t0)
                sink.on_snapshot(snap)
            except Exception:
                logger.warning("progress display %s failed; dropping it", type(sink).__name__, exc_info=True)
                self.sinks.remove(sink)

    def _loop(self, location: RunLocation) -> None:
        tail = LedgerTail(location, self.ladder)  # from the ledger's snapshot: a long run costs what a new one does
        warned = -math.inf
        while not self._stop.wait(self.interval_s):
            try:
                self._poll(tail, location)
            except Exception as e:  # storage trouble: say so once a minute, keep polling
                if time.monotonic() - warned > 60:
                    warned = time.monotonic()
                    logger.warning("progress display cannot read the run (%s); training goes on", e)
        try:
            self._poll(tail, location, final=True)
        except Exception as e:
            logger.debug("final progress poll failed: %s", e)

    @contextlib.contextmanager
    def watch(self, location: RunLocation) -> Iterator[RunWatcher]:
        thread = threading.Thread(target=self._loop, args=(location,), name="spotfallback-progress", daemon=True)
        self._stop.clear()
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=30)
            for sink in self.sinks:
                try:
                    sink.close(self.snapshot)
                except Exception:
                    logger.warning("progress display %s failed to close", type(sink).__name__, exc_info=True)


@dataclass
class WatchOptions:
    """How `spotfallback run` shows progress; ``mode=None`` picks live on a terminal, else plain."""

    mode: Mode | None = None
    mlflow: bool = False
    plain_every_s: float = field(default_factory=lambda: float(os.environ.get("SPOTFALLBACK_STATUS_EVERY_S", "60")))


def watcher_for_job(
    job: Any, options: WatchOptions | None = None, *, console: Console | None = None, out: IO[str] | None = None
) -> RunWatcher:
    """The watcher `spotfallback run` uses for ``job``: live on a TTY, plain lines otherwise, or JSON.

    ``console`` (default: stderr) is where the live panel or the plain lines go, and whether it
    is a terminal picks between them; ``out`` (default: stdout) takes the JSON lines.
    """
    options = options or WatchOptions()
    console = console or Console(stderr=True, highlight=False)
    mode = options.mode or ("live" if console.is_terminal else "plain")
    sinks: list[ProgressSink] = []
    if mode == "live":
        sinks.append(LiveSink(job.ladder, console))
    elif mode == "plain":
        sinks.append(PlainSink(job.ladder, console, every_s=options.plain_every_s))
    elif mode == "json":
        sinks.append(JsonSink(job.ladder, out or sys.stdout))
    if options.mlflow:
        from spotfallback.integrations.mlflow import MlflowSink

        sinks.append(MlflowSink(job.ladder, run_name=job.name))
    return RunWatcher(job.ladder, sinks, config=job.train_loop_config)
