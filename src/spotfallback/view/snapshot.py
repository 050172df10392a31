"""Where a run stands at one moment, read from storage: what `run` shows live and `status` prints.

Everything comes from the run's directory (ledger, progress heartbeat, driver lease, the notice
agents' health records), never from the driver's memory, so `spotfallback status` on another
machine shows what the driver shows. ``build_snapshot`` is pure: the caller reads storage
(``read_driver``, ``read_heartbeat``, the agents' records) and the clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spotfallback.accounting import RunSummary, summarize
from spotfallback.config import Ladder
from spotfallback.events import LedgerRecord, PreemptionNotice, finite_number
from spotfallback.store.heartbeat import PROGRESS_KEYS
from spotfallback.store.lease import read_lease
from spotfallback.store.ledger_snapshot import LedgerSnapshot, digest_records, latest_records
from spotfallback.store.location import RunLocation
from spotfallback.view.intervals import AnnouncedEviction, announced_evictions


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
        value = finite_number(metrics.get(key))  # a NaN step would print as `nan`, and as no JSON
        if value is None:
            continue
        total = None
        for source in (metrics, config or {}):
            for tk in total_keys:
                candidate = finite_number(source.get(tk))
                if candidate is not None and candidate > 0:
                    total = candidate
                    break
            if total is not None:
                break
        return TrainingProgress(key, value, total, t)
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
class AgentInfo:
    """A node's notice agent as status shows it, from its health record (``notices.health``).

    ``stale``: not heard from for several of its intervals while it should be running (dead,
    hung, or its node gone unannounced); ``gone_with_node``: stale after draining its node past
    the deadline, which is how an agent ends when its node is taken as announced.
    """

    agent: str
    host: str
    node_id: str | None
    cloud: str
    state: str  # waiting-for-ray / watching / enabling / metadata-failing / drained / stopped
    since: float
    detail: str
    last_seen: float
    deadline_s: float | None
    notices: int
    stale: bool
    gone_with_node: bool


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
    event_count: int = 0  # ledger events so far (`status --json` lists the latest under "events")
    agents: tuple[AgentInfo, ...] = ()  # notice agents, most recently heard from first
    agents_not_shown: int = 0  # older records beyond those read
    evictions: tuple[AnnouncedEviction, ...] = ()  # announced ones: held and idle time after each checkpoint
    where: str | None = None  # the tier's cluster and region, in a ladder across clusters
    app_errors: int = 0  # training-function errors on this tier: max_failures bounds them on their own count

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

    @property
    def app_errors_left(self) -> int | None:
        """Training-function errors the current tier still retries: ``max_failures`` counts them
        apart from node failures, so one budget can be spent while the other is whole."""
        return None if self.max_failures == -1 else max(0, self.max_failures - self.app_errors)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            elapsed_s=self.elapsed_s,
            checkpoint_age_s=self.checkpoint_age_s,
            preemptions_left=self.preemptions_left,
            failures_left=self.failures_left,
            app_errors_left=self.app_errors_left,
        )
        return data


_RESTARTS = ("run_started", "preempted", "node_failed", "application_failed", "capacity_timed_out")


def charge_until(records: Sequence[LedgerRecord], driver: DriverInfo | None, now: float) -> float | None:
    """Until when an open segment is charged: ``now`` while a driver is live, else its last sign of life.

    Without a live lease the driver stopped (released the lease) or died (stopped renewing
    it), and so did its workers; charging up to ``now`` would bill a dead run. A preemption
    notice is no sign of the run's life: a node's agent writes it, on the node's clock, and
    may write it after the driver died.
    """
    if not records:
        return None
    if driver is not None and driver.live(now):
        return now
    last = max((r.t for r in records if not isinstance(r.event, PreemptionNotice)), default=records[0].t)
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
    agents: Sequence[AgentInfo] = (),
    agents_not_shown: int = 0,
    base: LedgerSnapshot | None = None,
) -> Snapshot:
    """The snapshot of a run from its records (those after ``base``, the ledger's stored snapshot,
    when given). Pure: the caller reads storage and the clock.

    A run without a live driver that is neither finished nor failed is ``stalled``: its open
    segment is charged only up to the driver's last sign of life, not to ``now``.
    """
    now = time.time() if now is None else now
    latest = latest_records(base, records)  # ends as the whole ledger ends
    stalled = bool(latest) and (driver is None or not driver.live(now))
    summary = summary or summarize(ladder, records, now=charge_until(latest, driver, now),
                                   start=base.carry if base is not None else None)
    state = summary.state
    tier = ladder[min(state.tier, len(ladder) - 1)]
    stats = state.stats[state.tier]

    workers_up = 0
    if state.running_since is not None and not stalled:  # a dead driver's workers are gone
        acquired = [r for r in records if r.event.kind == "workers_acquired"]
        last_acquired = acquired[-1] if acquired else base.latest.get("workers_acquired") if base is not None else None
        if last_acquired is not None:
            workers_up = int(getattr(last_acquired.event, "num_workers", 0) or 0)

    progress = None
    candidates: list[TrainingProgress] = []
    for rec in ([base.progress] if base is not None and base.progress is not None else []) + list(records):
        if rec.event.kind == "checkpoint_committed":
            metrics = dict(rec.info.get("metrics") or {})
            step = getattr(rec.event, "step", None)
            if step is not None:
                metrics.setdefault("step", step)
            found = find_progress(metrics, rec.t, config)
            if found:
                candidates.append(found)
    # A heartbeat from before the latest restart reports progress that was lost or committed since.
    restarted = max([r.t for r in records if r.event.kind in _RESTARTS]
                    + ([t for kind, t in base.latest_t.items() if kind in _RESTARTS] if base is not None else []),
                    default=-math.inf)
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
    elif not latest:
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
        where=tier.where,
        next_tier=ladder[state.tier + 1].name if state.tier + 1 < len(ladder) else None,
        workers_up=workers_up,
        workers_wanted=tier.num_workers,
        preemptions=stats.preemptions,
        max_preemptions=tier.max_preemptions,
        failures=stats.failures,
        app_errors=stats.app_errors,
        max_failures=tier.max_failures,
        capacity_left_s=None if deadline is None else max(0.0, deadline - now),
        waiting_since=state.waiting_since if status == "waiting" else None,
        progress=progress,
        last_checkpoint_t=ckpt_t,
        last_checkpoint_step=ckpt_step,
        checkpoints=summary.checkpoint_count,
        spend=summary.spend,
        on_demand_spend=summary.on_demand_spend,
        running_s=summary.running_s,
        lost_s=sum(t.lost_s for t in summary.tiers),
        started_at=summary.started_at,
        ended_at=summary.ended_at,
        give_up_reason=summary.give_up_reason,
        driver=driver,
        event_count=len(records) + (base.events if base is not None else 0),
        agents=tuple(agents),
        agents_not_shown=agents_not_shown,
        evictions=tuple(announced_evictions(digest_records(base, records))),
    )


def read_driver(location: RunLocation) -> DriverInfo | None:
    """The run's driver lease as status shows it, or None when no driver holds it."""
    info = read_lease(location)
    if info is None:
        return None
    return DriverInfo(info.host, info.pid, info.renewed_at, info.expires_at)
