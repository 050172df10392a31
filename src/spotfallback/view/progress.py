"""Where a run stands, read from storage: what `spotfallback run` shows live and `status` prints.

Everything comes from the run's directory (ledger, progress heartbeat, driver lease), never
from the driver's memory, so `spotfallback status` on another machine shows what the driver
shows. ``build_snapshot`` is pure; ``RunWatcher`` polls the ledger on a thread while
``fit()`` runs and hands each new event and each new snapshot to its sinks (a rich live
display on a terminal, quiet plain lines in CI logs, JSON lines for machines, MLflow).
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
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Literal, Protocol

import pyarrow.fs as pafs
from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from spotfallback.accounting import RunSummary, summarize
from spotfallback.config import Ladder
from spotfallback.store.ledger import FORMAT_VERSION, LedgerError, LedgerRecord, _write_atomic
from spotfallback.store.location import RunLocation, list_dir

logger = logging.getLogger("spotfallback")

HEARTBEAT_FILE = "progress.json"
# The controller writes the latest reported metrics at most this often (one small object).
HEARTBEAT_INTERVAL_S = float(os.environ.get("SPOTFALLBACK_PROGRESS_INTERVAL_S", "2"))

# Which reported metric counts as progress, and which keys hold its total (metrics first,
# then the train_loop_config). The first progress key present wins.
PROGRESS_KEYS: dict[str, tuple[str, ...]] = {
    "step": ("total_steps", "max_steps", "num_steps"),
    "global_step": ("total_steps", "max_steps", "num_steps"),
    "iteration": ("total_iterations", "max_iterations", "num_iterations"),
    "epoch": ("num_epochs", "epochs", "total_epochs", "max_epochs"),
}

Mode = Literal["live", "plain", "json", "off"]


def progress_totals(config: Mapping[str, Any] | None) -> dict[str, float]:
    """The progress totals a ``train_loop_config`` gives (``total_steps``, ``num_epochs``...).

    The run keeps them in its metadata so ``status`` on another machine, without the job file,
    can show a total and a bar.
    """
    keys = {k for totals in PROGRESS_KEYS.values() for k in totals}
    return {
        k: v
        for k, v in (config or {}).items()
        if k in keys and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    }


# ---------------------------------------------------------------------------------------
# The progress heartbeat: the latest reported metrics, overwritten in place.


def scalar_metrics(metrics: Mapping[str, Any] | None, limit: int = 24) -> dict[str, Any]:
    """The JSON-safe scalars of a metrics dict (numbers, booleans, short strings), at most ``limit``."""
    out: dict[str, Any] = {}
    for key, value in (metrics or {}).items():
        if len(out) >= limit:
            break
        plain = isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value))
        if plain or (isinstance(value, str) and len(value) <= 100):
            out[str(key)] = value
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
            with contextlib.suppress(Exception):
                item = value.item()
                if isinstance(item, int | float) and math.isfinite(item):
                    out[str(key)] = item
    return out


def write_heartbeat(location: RunLocation, tier: int, metrics: Mapping[str, Any]) -> None:
    """Overwrite the run's heartbeat; never raises (progress display must not break training)."""
    payload = json.dumps(
        {"v": FORMAT_VERSION, "t": time.time(), "tier": tier, "metrics": scalar_metrics(metrics)}
    ).encode()
    try:
        _write_atomic(location.fs, location.path(HEARTBEAT_FILE), payload)
    except Exception:  # one missed heartbeat is harmless; the next report writes again
        logger.debug("could not write the progress heartbeat", exc_info=True)


def read_heartbeat(location: RunLocation) -> dict[str, Any] | None:
    """The latest heartbeat, or None when there is none or it cannot be read."""
    path = location.path(HEARTBEAT_FILE)
    try:
        if location.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        data = json.loads(location.fs.open_input_stream(path).readall())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict) or not isinstance(data.get("t"), int | float):
        return None
    return data


class HeartbeatThrottle:
    """Lets one heartbeat through per interval; the controller keeps one per run."""

    def __init__(self, interval_s: float = HEARTBEAT_INTERVAL_S):
        self.interval_s = interval_s
        self._last = -math.inf
        self._lock = threading.Lock()

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._last < self.interval_s:
                return False
            self._last = now
            return True


# ---------------------------------------------------------------------------------------
# Snapshot: everything shown about a run at one moment. Pure.


@dataclass(frozen=True)
class TrainingProgress:
    """A progress metric: its name, latest value, total (if known) and when it was reported."""

    key: str
    value: float
    total: float | None
    t: float

    @property
    def fraction(self) -> float | None:
        if self.total is None or self.total <= 0:
            return None
        return max(0.0, min(1.0, self.value / self.total))


def find_progress(
    metrics: Mapping[str, Any], t: float, config: Mapping[str, Any] | None = None
) -> TrainingProgress | None:
    """The first progress key of ``PROGRESS_KEYS`` in ``metrics``, with its total if known."""
    for key, total_keys in PROGRESS_KEYS.items():
        value = metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        total = None
        for source in (metrics, config or {}):
            for tk in total_keys:
                candidate = source.get(tk)
                if isinstance(candidate, int | float) and not isinstance(candidate, bool) and candidate > 0:
                    total = float(candidate)
                    break
            if total is not None:
                break
        return TrainingProgress(key, float(value), total, t)
    return None


@dataclass(frozen=True)
class DriverInfo:
    """The driver lease as status shows it: who drives the run and whether it is alive."""

    host: str
    pid: int
    renewed_at: float
    expires_at: float

    def live(self, now: float) -> bool:
        return self.expires_at > now


@dataclass(frozen=True)
class Snapshot:
    """Where a run stands: tier, budget, workers, progress, checkpoint, spend."""

    run: str
    status: str  # not started / waiting / running / finished / failed / stalled
    now: float
    tier_index: int
    tier: str
    market: str
    next_tier: str | None
    workers_up: int
    workers_wanted: int
    preemptions: int
    max_preemptions: int
    failures: int
    max_failures: int
    capacity_left_s: float | None  # while waiting for workers with a deadline
    waiting_since: float | None
    progress: TrainingProgress | None
    last_checkpoint_t: float | None
    last_checkpoint_step: int | None
    checkpoints: int
    spend: float
    on_demand_spend: float
    running_s: float
    lost_s: float
    started_at: float | None
    ended_at: float | None
    give_up_reason: str | None = None
    driver: DriverInfo | None = None
    events: int = 0

    @property
    def elapsed_s(self) -> float:
        if self.started_at is None:
            return 0.0
        end = self.ended_at if self.status in ("finished", "failed", "stalled") and self.ended_at else self.now
        return max(0.0, end - self.started_at)

    @property
    def checkpoint_age_s(self) -> float | None:
        return None if self.last_checkpoint_t is None else max(0.0, self.now - self.last_checkpoint_t)

    @property
    def preemptions_left(self) -> int | None:
        """Preemptions the current tier still tolerates (None: unlimited)."""
        return None if self.max_preemptions == -1 else max(0, self.max_preemptions - self.preemptions)

    @property
    def failures_left(self) -> int | None:
        return None if self.max_failures == -1 else max(0, self.max_failures - self.failures)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            elapsed_s=self.elapsed_s,
            checkpoint_age_s=self.checkpoint_age_s,
            preemptions_left=self.preemptions_left,
            failures_left=self.failures_left,
        )
        return data


_RESTARTS = ("run_started", "preempted", "node_failed", "application_failed", "capacity_timed_out")


def charge_until(records: Sequence[LedgerRecord], driver: DriverInfo | None, now: float) -> float | None:
    """Until when an open segment is charged: ``now`` while a driver is live, else its last sign of life.

    Without a live lease the driver stopped (released the lease) or died (stopped renewing
    it), and so did its workers; charging up to ``now`` would bill a dead run.
    """
    if not records:
        return None
    if driver is not None and driver.live(now):
        return now
    last = records[-1].t
    return max(last, driver.renewed_at) if driver is not None else last


def build_snapshot(
    ladder: Ladder,
    records: Sequence[LedgerRecord],
    *,
    run: str = "",
    now: float | None = None,
    heartbeat: Mapping[str, Any] | None = None,
    driver: DriverInfo | None = None,
    config: Mapping[str, Any] | None = None,
    summary: RunSummary | None = None,
) -> Snapshot:
    """The snapshot of a run from its records. Pure: the caller reads storage and the clock.

    A run without a live driver that is neither finished nor failed is ``stalled``: its open
    segment is charged only up to the driver's last sign of life, not to ``now``.
    """
    now = time.time() if now is None else now
    stalled = bool(records) and (driver is None or not driver.live(now))
    summary = summary or summarize(ladder, records, now=charge_until(records, driver, now))
    state = summary.state
    tier = ladder[min(state.tier, len(ladder) - 1)]
    stats = state.stats[state.tier]

    workers_up = 0
    if state.running_since is not None and not stalled:  # a dead driver's workers are gone
        acquired = [r for r in records if r.event.kind == "workers_acquired"]
        if acquired:
            workers_up = int(getattr(acquired[-1].event, "num_workers", 0) or 0)

    progress = None
    candidates: list[TrainingProgress] = []
    for rec in records:
        if rec.event.kind == "checkpoint_committed":
            metrics = dict(rec.info.get("metrics") or {})
            step = getattr(rec.event, "step", None)
            if step is not None:
                metrics.setdefault("step", step)
            found = find_progress(metrics, rec.t, config)
            if found:
                candidates.append(found)
    # A heartbeat from before the latest restart reports progress that was lost or committed since.
    restarted = max((r.t for r in records if r.event.kind in _RESTARTS), default=-math.inf)
    if heartbeat is not None and float(heartbeat["t"]) > restarted:
        found = find_progress(heartbeat.get("metrics") or {}, float(heartbeat["t"]), config)
        if found:
            candidates.append(found)
    if candidates:
        progress = max(candidates, key=lambda p: p.t)

    ckpt_t, ckpt_step = (summary.checkpoints[-1][0], summary.checkpoints[-1][1]) if summary.checkpoints else (None, None)
    if state.status == "finished":
        status = "finished"
    elif state.status == "failed":
        status = "failed"
    elif not records:
        status = "not started"
    elif stalled:
        status = "stalled"
    elif state.running_since is not None:
        status = "running"
    else:
        status = "waiting"
    deadline = None
    if status == "waiting" and state.waiting_since is not None and tier.capacity_timeout_s is not None:
        deadline = state.waiting_since + tier.capacity_timeout_s
    return Snapshot(
        run=run,
        status=status,
        now=now,
        tier_index=state.tier,
        tier=tier.name,
        market=tier.market,
        next_tier=ladder[state.tier + 1].name if state.tier + 1 < len(ladder) else None,
        workers_up=workers_up,
        workers_wanted=tier.num_workers,
        preemptions=stats.preemptions,
        max_preemptions=tier.max_preemptions,
        failures=stats.failures,
        max_failures=tier.max_failures,
        capacity_left_s=None if deadline is None else max(0.0, deadline - now),
        waiting_since=state.waiting_since if status == "waiting" else None,
        progress=progress,
        last_checkpoint_t=ckpt_t,
        last_checkpoint_step=ckpt_step,
        checkpoints=len(summary.checkpoints),
        spend=summary.spend,
        on_demand_spend=summary.on_demand_spend,
        running_s=summary.running_s,
        lost_s=sum(t.lost_s for t in summary.tiers),
        started_at=summary.started_at,
        ended_at=summary.ended_at,
        give_up_reason=summary.give_up_reason,
        driver=driver,
        events=len(records),
    )


# ---------------------------------------------------------------------------------------
# Text: one line per event, and the snapshot as a rich renderable.


def money(x: float) -> str:
    """Dollars to the cent, with two more digits below a dollar (short runs cost cents)."""
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4f}"


def duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


_FAULTS = {
    "preempted": "[yellow]preemption[/]",
    "node_failed": "[yellow]node lost without notice[/]",
    "capacity_timed_out": "[yellow]no capacity in time[/]",
    "application_failed": "[red]error in the training function[/]",
}


def describe_event(record: LedgerRecord, t0: float, ladder: Ladder) -> str | None:
    """One rich-markup line for a ledger event (None for events not worth a line)."""
    ev = record.event
    tiers = ladder.tiers
    tier = tiers[min(record.tier, len(tiers) - 1)].name
    at = f"[dim]{duration(record.t - t0):>7}[/]"
    decision = record.decision or {}
    match ev.kind:
        case "run_started":
            again = " again with fresh budgets" if getattr(ev, "reset", False) else ""
            return f"{at}  run started{again}; waiting for [bold]{tier}[/] workers"
        case "workers_acquired":
            return f"{at}  {getattr(ev, 'num_workers', 0)} workers up on [bold]{tier}[/]"
        case "checkpoint_committed":
            step = getattr(ev, "step", None)
            return f"{at}  checkpoint committed" + (f" at step {step}" if step is not None else "")
        case "preempted" | "node_failed" | "capacity_timed_out" | "application_failed":
            what = _FAULTS[ev.kind]
            action = decision.get("action")
            if action == "switch_tier":
                to = tiers[int(decision.get("to_tier", record.tier + 1))].name
                then = f"[bold magenta]→ fall back to {to}[/] ({decision.get('reason', '')})"
            elif action == "retry":
                then = f"→ restart on {tier} from the latest checkpoint; waiting for workers"
            elif action == "give_up":
                then = f"[bold red]→ give up[/]: {decision.get('reason', '')}"
            else:
                then = f"→ {action}"
            return f"{at}  {what} on [bold]{tier}[/] {then}"
        case "fatal":
            return f"{at}  [bold red]fatal:[/] {getattr(ev, 'message', '')}"
        case "finished":
            return f"{at}  [green]finished[/] on [bold]{tier}[/]"
        case "capacity_observed" if decision.get("action") == "climb_back":
            to = tiers[int(decision.get("to_tier", record.tier))].name
            return f"{at}  capacity back on {to} [bold green]→ climb back from {tier} to {to}[/] ({decision.get('reason', '')})"
        case "capacity_observed" if decision.get("action") == "resize":
            return f"{at}  capacity changed [bold]→ resize {tier} to {decision.get('num_workers')} workers[/]"
        case "preemption_notice":
            deadline = getattr(ev, "deadline_s", None)
            left = f", {duration(deadline - record.t)} before the node goes" if deadline else ""
            source = getattr(ev, "source", "") or "notice"
            drained = "; node drained" if getattr(ev, "drained", False) else ""
            return f"{at}  [yellow]preemption notice[/] ({source}{left}) on [bold]{tier}[/]{drained}"
        case "jit_checkpoint":
            outcome, step = getattr(ev, "outcome", ""), getattr(ev, "step", None)
            at_step = f" of step {step}" if step is not None else ""
            detail = getattr(ev, "detail", "")
            if outcome == "started":
                return f"{at}  just-in-time checkpoint{at_step} started on [bold]{tier}[/] ({detail})"
            if outcome == "reported":
                return f"{at}  [green]just-in-time checkpoint{at_step} reported[/] on [bold]{tier}[/] ({detail})"
            if outcome == "missed":
                return f"{at}  [red]just-in-time checkpoint{at_step} missed[/] on [bold]{tier}[/]: {detail}"
    # Kinds added later (notices, observations...): named plainly with their set fields.
    fields = [f"{k}={v}" for k, v in ev.to_json().items() if k not in ("kind", "t") and v not in (None, "", False)]
    what = ev.kind.replace("_", " ") + (f" ({', '.join(fields[:2])})" if fields else "")
    if decision.get("action") == "switch_tier":
        to = tiers[int(decision.get("to_tier", record.tier))].name
        return f"{at}  {what} on [bold]{tier}[/] [bold magenta]→ move to {to}[/] ({decision.get('reason', '')})"
    return f"{at}  {what} on [bold]{tier}[/]"


def event_json(record: LedgerRecord, t0: float, ladder: Ladder) -> dict[str, Any]:
    """A ledger event as one JSON-lines object."""
    tier = ladder[min(record.tier, len(ladder) - 1)]
    return {
        "type": "event",
        "elapsed_s": round(record.t - t0, 3),
        "tier": tier.name,
        **record.event.to_json(),
        "decision": record.decision,
    }


def _budget(left: int | None, limit: int) -> str:
    return "unlimited" if left is None else f"{left} of {limit} left"


def snapshot_renderable(snap: Snapshot) -> RenderableType:
    """The snapshot as a small rich grid (the same for `run` and `status`)."""
    colour = {"running": "green", "waiting": "yellow", "finished": "green", "failed": "red", "stalled": "red"}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    state = f"[{colour.get(snap.status, 'white')}]{snap.status}[/]"
    if snap.status == "stalled":
        state += " (no live driver; `spotfallback run` the same job resumes it)"
    grid.add_row("run", f"{snap.run}  {state}  after {duration(snap.elapsed_s)}")
    nxt = f"then {snap.next_tier}" if snap.next_tier else "last tier"
    grid.add_row(
        "tier",
        f"{snap.tier} ({snap.market}, tier {snap.tier_index + 1}, {nxt}); "
        f"preemptions {_budget(snap.preemptions_left, snap.max_preemptions)}, "
        f"node failures {_budget(snap.failures_left, snap.max_failures)}",
    )
    workers = f"{snap.workers_up}/{snap.workers_wanted} up"
    if snap.status == "waiting" and snap.waiting_since is not None:
        workers += f"; waiting {duration(snap.now - snap.waiting_since)}"
        if snap.capacity_left_s is not None:
            workers += f", capacity timeout in {duration(snap.capacity_left_s)}"
    grid.add_row("workers", workers)
    p = snap.progress
    if p is not None:
        shown = f"{p.key} {p.value:g}" + (f"/{p.total:g}" if p.total is not None else "")
        if p.fraction is not None:
            bar = ProgressBar(total=1.0, completed=p.fraction, width=30)
            grid.add_row("progress", Group(Text(f"{shown}  ({p.fraction:.0%})"), bar))
        else:
            grid.add_row("progress", shown)
    if snap.last_checkpoint_t is not None:
        step = f"step {snap.last_checkpoint_step}, " if snap.last_checkpoint_step is not None else ""
        if snap.status in ("running", "waiting"):
            when = f"{duration(snap.checkpoint_age_s)} ago"
        else:  # an ended run: when in the run, not how long ago
            when = f"at {duration(snap.last_checkpoint_t - (snap.started_at or snap.last_checkpoint_t))} into the run"
        grid.add_row("checkpoint", f"{snap.checkpoints} committed; latest {step}{when}")
    else:
        grid.add_row("checkpoint", "none committed yet")
    saved = 1 - snap.spend / snap.on_demand_spend if snap.on_demand_spend > 0 else None
    cost = f"{money(snap.spend)} so far; all on-demand for the same progress {money(snap.on_demand_spend)}"
    if saved is not None:
        cost += f" ({saved:+.0%} saved)"
    if snap.lost_s > 0:  # redone work, or the hold after a just-in-time checkpoint: billed, not progress
        cost += f"; {duration(snap.lost_s)} lost to interruptions"
    grid.add_row("spend", cost)
    if snap.driver is not None:
        alive = "live" if snap.driver.live(snap.now) else "gone"
        grid.add_row("driver", f"{snap.driver.host} pid {snap.driver.pid}, {alive}, seen {duration(snap.now - snap.driver.renewed_at)} ago")
    if snap.give_up_reason:
        grid.add_row("gave up", Text(snap.give_up_reason, style="red"))
    return grid


def print_wide(console: Console, table: Table) -> None:
    """Print a table at its natural width: numbers cut to '…' on a narrow or piped console help nobody."""
    from rich.measure import Measurement

    needed = Measurement.get(console, console.options.update_width(1000), table).maximum
    width = console.width
    console.width = max(width, needed)  # print(width=...) cannot exceed the console's own width
    try:
        console.print(table)
    finally:
        console.width = width


def snapshot_line(snap: Snapshot) -> str:
    """The snapshot as one plain line, for CI logs."""
    parts = [f"{snap.status} on {snap.tier}", f"workers {snap.workers_up}/{snap.workers_wanted}"]
    if snap.progress is not None:
        p = snap.progress
        parts.append(f"{p.key} {p.value:g}" + (f"/{p.total:g}" if p.total is not None else ""))
    if snap.last_checkpoint_t is not None:
        parts.append(f"checkpoint {snap.last_checkpoint_step} ({duration(snap.checkpoint_age_s)} ago)")
    parts.append(f"spend {money(snap.spend)} vs {money(snap.on_demand_spend)} on-demand")
    return f"[dim]{duration(snap.elapsed_s):>7}[/]  " + " · ".join(parts)


# ---------------------------------------------------------------------------------------
# Reading a run from storage.


class LedgerTail:
    """Reads a ledger incrementally: each poll lists the directory and reads only new objects."""

    def __init__(self, location: RunLocation):
        self.location = location
        self._records: dict[str, LedgerRecord] = {}
        self._ids: set[str] = set()

    def poll(self) -> list[LedgerRecord]:
        fs = self.location.fs
        directory = self.location.path("ledger")
        infos = list_dir(fs, directory)
        for info in sorted(infos, key=lambda i: i.path):
            name = info.base_name
            if info.type != pafs.FileType.File or name.startswith(".tmp-") or not name.endswith(".json"):
                continue
            if info.path in self._records:
                continue
            try:
                data = json.loads(fs.open_input_stream(info.path).readall())
            except (OSError, ValueError) as e:
                raise LedgerError(f"{info.path}: cannot read ledger event ({e})") from None
            record = LedgerRecord.from_json(data, info.path)
            self._records[info.path] = record
        out: list[LedgerRecord] = []
        seen: set[str] = set()
        for path in sorted(self._records):
            rec = self._records[path]
            if rec.id not in seen:
                seen.add(rec.id)
                out.append(rec)
        return out


def read_driver(location: RunLocation) -> DriverInfo | None:
    from spotfallback.store.lease import DriverLease

    info = DriverLease(location).read()
    if info is None:
        return None
    return DriverInfo(info.host, info.pid, info.renewed_at, info.expires_at)


# ---------------------------------------------------------------------------------------
# Sinks and the watcher.


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
        self._seen = 0
        self._t0: float | None = None

    def _poll(self, tail: LedgerTail, location: RunLocation, final: bool = False) -> None:
        records = tail.poll()
        if not records:
            return
        if self._t0 is None:
            self._t0 = records[0].t
        driver = read_driver(location)
        now = time.time()
        if driver is None and not final:
            # This process is the driver while it watches; its lease may not be written yet.
            driver = DriverInfo(socket.gethostname(), os.getpid(), now, now + 60)
        snap = build_snapshot(
            self.ladder, records, run=location.uri(), now=now, heartbeat=read_heartbeat(location),
            driver=driver, config=self.config,
        )
        new = records[self._seen :]
        self._seen = len(records)
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
        tail = LedgerTail(location)
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
