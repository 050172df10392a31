"""Turn a run's ledger into hours, counts and spend. Pure: the caller passes ``now``.

Spend is charged while a tier's workers run (from ``workers_acquired`` to the event that
stops them); waiting for capacity costs nothing. Work lost to a failure is the time since
the later of the last committed checkpoint and the start of that attempt: it is redone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spotfallback.config import ON_DEMAND, Ladder
from spotfallback.events import (
    ApplicationFailed,
    CapacityObserved,
    CapacityTimedOut,
    CheckpointCommitted,
    Fatal,
    Finished,
    LedgerRecord,
    NodeFailed,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy, PolicyState


@dataclass
class TierUsage:
    name: str
    market: str
    price_per_hour: float
    running_s: float = 0.0
    waiting_s: float = 0.0
    lost_s: float = 0.0
    preemptions: int = 0
    failures: int = 0
    app_errors: int = 0
    capacity_timeouts: int = 0
    attempts: int = 0
    worker_s: float = 0.0  # running time x workers actually placed (elastic gangs vary)
    price_per_worker_hour: float | None = None

    @property
    def spend(self) -> float:
        if self.price_per_worker_hour is not None:
            return self.worker_s / 3600.0 * self.price_per_worker_hour
        return self.running_s / 3600.0 * self.price_per_hour


@dataclass
class RunSummary:
    state: PolicyState
    tiers: list[TierUsage]
    status: str  # running / finished / failed / not started
    checkpoints: list[tuple[float, int | None, str]] = field(default_factory=list)
    segments: list[tuple[int, float, float]] = field(default_factory=list)  # (tier, start, end) running
    started_at: float | None = None
    ended_at: float | None = None
    give_up_reason: str | None = None
    climbs: list[tuple[float, int, int]] = field(default_factory=list)  # (t, from tier, to tier)
    resizes: list[tuple[float, int, int]] = field(default_factory=list)  # (t, tier, workers)

    @property
    def current_tier(self) -> TierUsage:
        return self.tiers[self.state.tier]

    @property
    def spend(self) -> float:
        return sum(t.spend for t in self.tiers)

    @property
    def running_s(self) -> float:
        return sum(t.running_s for t in self.tiers)

    @property
    def useful_s(self) -> float:
        return max(0.0, sum(t.running_s - t.lost_s for t in self.tiers))

    @property
    def baseline_price_per_hour(self) -> float:
        """Price per hour of the all-on-demand alternative: the last on-demand tier, else the last tier."""
        on_demand = [t for t in self.tiers if t.market == ON_DEMAND]
        return (on_demand[-1] if on_demand else self.tiers[-1]).price_per_hour

    @property
    def on_demand_spend(self) -> float:
        """What the useful work would have cost on on-demand capacity with no interruptions."""
        return self.useful_s / 3600.0 * self.baseline_price_per_hour

    @property
    def spot_fraction(self) -> float:
        """The seed's alpha: the share of useful work done on spot tiers."""
        useful = self.useful_s
        if useful <= 0:
            return 0.0
        spot = sum(t.running_s - t.lost_s for t in self.tiers if t.market == "spot")
        return max(0.0, spot) / useful

    @property
    def wall_s(self) -> float:
        if self.started_at is None or self.ended_at is None:
            return 0.0
        return self.ended_at - self.started_at


def summarize(ladder: Ladder, records: Sequence[LedgerRecord], now: float | None = None) -> RunSummary:
    """Replay ``records``; open segments of a live run are charged up to ``now``."""
    policy = FallbackPolicy(ladder)
    state = policy.replay(r.event for r in records)
    tiers = [
        TierUsage(t.name, t.market, t.price_per_hour(), price_per_worker_hour=t.price_per_worker_hour)
        for t in ladder.tiers
    ]
    summary = RunSummary(state=state, tiers=tiers, status="not started" if not records else "running")
    run_start: tuple[int, float] | None = None  # (tier, t) of the running attempt
    run_workers = 0
    wait_start: tuple[int, float] | None = None
    last_ckpt = float("-inf")

    def close_run(t: float) -> None:
        nonlocal run_start
        if run_start is not None:
            tier, start = run_start
            end = max(start, t)
            tiers[tier].running_s += end - start
            tiers[tier].worker_s += (end - start) * (run_workers or ladder.tiers[tier].num_workers)
            summary.segments.append((tier, start, end))
            run_start = None

    def close_wait(t: float) -> None:
        nonlocal wait_start
        if wait_start is not None:
            tier, start = wait_start
            tiers[tier].waiting_s += max(0.0, t - start)
            wait_start = None

    def lose_work(t: float) -> None:
        if run_start is not None:
            tier, start = run_start
            tiers[tier].lost_s += max(0.0, t - max(start, last_ckpt))

    for i, rec in enumerate(records):
        ev, t, tier = rec.event, rec.t, min(rec.tier, len(tiers) - 1)
        if summary.started_at is None:
            summary.started_at = t
        summary.ended_at = t
        # After this record the run is on the tier the policy moved it to.
        next_tier = records[i + 1].tier if i + 1 < len(records) else state.tier
        match ev:
            case RunStarted(previous_seen=seen):
                close_run(min(t, seen) if seen else t)
                close_wait(t)
                wait_start = (tier, t)
            case WorkersAcquired(num_workers=n):
                close_wait(t)
                close_run(t)
                tiers[tier].attempts += 1
                run_start, run_workers = (tier, t), n
            case CapacityObserved():
                # Only observations the policy acted on are recorded: a climb back or a resize
                # stops the gang right after a checkpoint and waits for the new one.
                action = (rec.decision or {}).get("action")
                if action == "climb_back":
                    summary.climbs.append((t, tier, next_tier))
                elif action == "resize":
                    summary.resizes.append((t, tier, int((rec.decision or {}).get("num_workers", 0))))
                if action in ("climb_back", "resize"):
                    close_run(t)
                    close_wait(t)
                    wait_start = (next_tier, t)
            case CheckpointCommitted(step=step, path=path):
                last_ckpt = t
                summary.checkpoints.append((t, step, path))
            case Preempted() | NodeFailed() | ApplicationFailed():
                if isinstance(ev, Preempted):
                    tiers[tier].preemptions += 1
                elif isinstance(ev, NodeFailed):
                    tiers[tier].failures += 1
                else:
                    tiers[tier].app_errors += 1
                lose_work(t)
                close_run(t)
                close_wait(t)
                wait_start = (next_tier, t)
            case CapacityTimedOut():
                tiers[tier].capacity_timeouts += 1
                close_wait(t)
                wait_start = (next_tier, t)
            case Finished() | Fatal():
                close_run(t)
                close_wait(t)
    if state.status == "finished":
        summary.status = "finished"
    elif state.status == "failed":
        summary.status = "failed"
        summary.give_up_reason = state.give_up.reason if state.give_up else None
        end = summary.ended_at or 0.0
        close_run(end)
        close_wait(end)
    elif now is not None and records:
        close_run(now)
        close_wait(now)
        summary.ended_at = max(summary.ended_at or now, now)
    return summary
