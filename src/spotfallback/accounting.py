"""Turn a run's ledger into hours, counts and spend. Pure: the caller passes ``now``.

Spend is charged while a tier's workers run (from ``workers_acquired`` to the event that
stops them); waiting for capacity costs nothing. Work lost to a failure is the time since
the later of the last committed checkpoint and the start of that attempt: it is redone.

The replay is a fold (``fold``, then ``summarize`` closes what is open): its ``Carry`` can be
stored and carried on over the events written since, with the same result as a replay of all.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from spotfallback.config import ON_DEMAND, Ladder
from spotfallback.events import (
    ApplicationFailed,
    CapacityObserved,
    CapacityTimedOut,
    CheckpointCommitted,
    ClusterUnreachable,
    Fatal,
    Finished,
    GiveUp,
    InfoEvent,
    LedgerRecord,
    NodeFailed,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy, PolicyState, TierStats


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
    checkpoints: list[tuple[float, int | None, str]] = field(default_factory=list)  # from a stored carry: the latest only
    checkpoint_count: int = 0  # every checkpoint committed
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


def _tier_usages(ladder: Ladder) -> list[TierUsage]:
    return [TierUsage(t.name, t.market, t.price_per_hour(), price_per_worker_hour=t.price_per_worker_hour) for t in ladder.tiers]


@dataclass
class Carry:
    """A fold over the ledger so far: ``summarize(tail, start=carry)`` equals a replay of it all.

    Why: a run lasts weeks; a reader that starts from a stored carry replays only the events
    written since (``store.ledger_snapshot``). The last record waits in ``pending`` because how
    it is accounted depends on the tier of the record after it.
    """

    summary: RunSummary
    events: int = 0
    pending: LedgerRecord | None = None
    run_start: tuple[int, float] | None = None  # (tier, t) of the running attempt
    run_workers: int = 0
    wait_start: tuple[int, float] | None = None
    last_ckpt: float | None = None

    def to_json(self, keep_checkpoints: int | None = None) -> dict[str, Any]:
        """JSON for a stored snapshot; ``keep_checkpoints`` keeps only the latest ones (the count stays whole)."""
        s = self.summary
        ckpts = s.checkpoints if keep_checkpoints is None else s.checkpoints[len(s.checkpoints) - min(keep_checkpoints, len(s.checkpoints)):]
        return {
            "state": asdict(s.state), "tiers": [asdict(t) for t in s.tiers], "checkpoints": [list(c) for c in ckpts],
            "checkpoint_count": s.checkpoint_count, "segments": [list(x) for x in s.segments], "started_at": s.started_at,
            "ended_at": s.ended_at, "climbs": [list(x) for x in s.climbs], "resizes": [list(x) for x in s.resizes],
            "events": self.events, "pending": None if self.pending is None else self.pending.to_json(),
            "run_start": None if self.run_start is None else list(self.run_start), "run_workers": self.run_workers,
            "wait_start": None if self.wait_start is None else list(self.wait_start), "last_ckpt": self.last_ckpt,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Carry:
        """The carry ``to_json`` stored; ``KeyError``/``TypeError``/``ValueError`` when it is not one."""
        summary = RunSummary(
            state=_state_from_json(data["state"]), tiers=[TierUsage(**t) for t in data["tiers"]], status="running",
            checkpoints=[(float(t), step, path) for t, step, path in data["checkpoints"]],
            checkpoint_count=int(data["checkpoint_count"]),
            segments=[(int(a), float(b), float(c)) for a, b, c in data["segments"]],
            started_at=data["started_at"], ended_at=data["ended_at"],
            climbs=[(float(a), int(b), int(c)) for a, b, c in data["climbs"]],
            resizes=[(float(a), int(b), int(c)) for a, b, c in data["resizes"]],
        )
        return cls(summary=summary, events=int(data["events"]),
                   pending=None if data["pending"] is None else LedgerRecord.from_json(data["pending"]),
                   run_start=_tier_time(data["run_start"]), run_workers=int(data["run_workers"]),
                   wait_start=_tier_time(data["wait_start"]), last_ckpt=data["last_ckpt"])


def _tier_time(value: Any) -> tuple[int, float] | None:
    return None if value is None else (int(value[0]), float(value[1]))


def _state_from_json(data: dict[str, Any]) -> PolicyState:
    d = dict(data)
    d["stats"] = tuple(TierStats(**{**s, "preemption_times": tuple(s["preemption_times"])}) for s in d["stats"])
    d["give_up"] = None if d["give_up"] is None else GiveUp(**d["give_up"])
    d["tier_history"] = tuple(d["tier_history"])
    d["tier_running_s"] = tuple(d["tier_running_s"])
    return PolicyState(**d)


def start_carry(ladder: Ladder) -> Carry:
    """The carry before any event."""
    return Carry(RunSummary(state=FallbackPolicy(ladder).initial_state(), tiers=_tier_usages(ladder), status="not started"))


def _close_run(ladder: Ladder, c: Carry, t: float) -> None:
    if c.run_start is not None:
        tier, start = c.run_start
        end = max(start, t)
        c.summary.tiers[tier].running_s += end - start
        c.summary.tiers[tier].worker_s += (end - start) * (c.run_workers or ladder.tiers[tier].num_workers)
        c.summary.segments.append((tier, start, end))
        c.run_start = None


def _close_wait(c: Carry, t: float) -> None:
    if c.wait_start is not None:
        tier, start = c.wait_start
        c.summary.tiers[tier].waiting_s += max(0.0, t - start)
        c.wait_start = None


# Decisions after which the run is over until a driver starts it again.
_ENDS = ("give_up", "complete")
# The tier a failed run started again (``RunStarted(reset=True)``) waits for: the policy's fresh ladder starts at the top.
RESTART_TIER = 0


def _account(ladder: Ladder, c: Carry, rec: LedgerRecord, next_tier: int) -> None:
    """Add one record to ``c`` (in place); ``next_tier``: the tier the policy moved the run to after it."""
    summary, tiers = c.summary, c.summary.tiers
    ev, t, tier = rec.event, rec.t, min(rec.tier, len(tiers) - 1)

    # Only the driver's own events date the run: an informational record comes from a notice
    # agent or a worker on another machine, whose clock may be ahead of the driver's or behind.
    if not isinstance(ev, InfoEvent):
        if summary.started_at is None:
            summary.started_at = t
        summary.ended_at = t
    # After a give-up (or a finish) nothing waits: the run lies ended until someone starts it again.
    ended = (rec.decision or {}).get("action") in _ENDS
    match ev:
        case RunStarted(previous_seen=seen, reset=reset):
            _close_run(ladder, c, min(t, seen) if seen else t)
            if reset:  # only a failed run is started again on a fresh ladder, and it waited for nothing
                c.wait_start = None  # (a carry stored by an older release may still hold the wait it opened)
            _close_wait(c, t)
            # A restart of a failed run is recorded on the tier it failed on, but starts again
            # from the first tier (the policy's fresh ladder): that is the tier it waits for.
            c.wait_start = (RESTART_TIER if reset else tier, t)
        case WorkersAcquired(num_workers=n):
            _close_wait(c, t)
            _close_run(ladder, c, t)
            tiers[tier].attempts += 1
            c.run_start, c.run_workers = (tier, t), n
        case CapacityObserved():
            # Only observations the policy acted on are recorded: a climb back or a resize
            # stops the gang right after a checkpoint and waits for the new one.
            action = (rec.decision or {}).get("action")
            if action == "climb_back":
                summary.climbs.append((t, tier, next_tier))
            elif action == "resize":
                summary.resizes.append((t, tier, int((rec.decision or {}).get("num_workers", 0))))
            if action in ("climb_back", "resize"):
                _close_run(ladder, c, t)
                _close_wait(c, t)
                c.wait_start = (next_tier, t)
        case CheckpointCommitted(step=step, path=path):
            c.last_ckpt = t
            summary.checkpoints.append((t, step, path))
            summary.checkpoint_count += 1
        case Preempted() | NodeFailed() | ApplicationFailed() | ClusterUnreachable():
            if isinstance(ev, Preempted):
                tiers[tier].preemptions += 1
            elif isinstance(ev, NodeFailed):
                tiers[tier].failures += 1
            elif isinstance(ev, ApplicationFailed):
                tiers[tier].app_errors += 1
            if c.run_start is not None:  # the work since the later of the last commit and the attempt's start is redone
                run_tier, start = c.run_start
                tiers[run_tier].lost_s += max(0.0, t - max(start, c.last_ckpt if c.last_ckpt is not None else float("-inf")))
            _close_run(ladder, c, t)
            _close_wait(c, t)
            c.wait_start = None if ended else (next_tier, t)
        case CapacityTimedOut():
            tiers[tier].capacity_timeouts += 1
            _close_wait(c, t)
            c.wait_start = None if ended else (next_tier, t)
        case Finished() | Fatal():
            _close_run(ladder, c, t)
            _close_wait(c, t)


def fold(ladder: Ladder, records: Iterable[LedgerRecord], start: Carry | None = None) -> Carry:
    """``start`` (untouched) carried over ``records``: the policy's replay and the accounting so far."""
    c = copy.deepcopy(start) if start is not None else start_carry(ladder)
    policy = FallbackPolicy(ladder)
    state = c.summary.state
    for rec in records:
        state = policy.decide(state, rec.event).state
        if c.pending is not None:
            _account(ladder, c, c.pending, rec.tier)
        c.pending = rec
        c.events += 1
    c.summary.state = state
    return c


def summarize(ladder: Ladder, records: Sequence[LedgerRecord], now: float | None = None, *,
              start: Carry | None = None) -> RunSummary:
    """Replay ``records`` (after ``start``, if given); open segments of a live run are charged up to ``now``."""
    c = fold(ladder, records, start)
    if c.pending is not None:
        _account(ladder, c, c.pending, c.summary.state.tier)
        c.pending = None
    summary, state = c.summary, c.summary.state
    summary.status = "not started" if not c.events else "running"

    if state.status == "finished":
        summary.status = "finished"
    elif state.status == "failed":
        summary.status = "failed"
        summary.give_up_reason = state.give_up.reason if state.give_up else None
        end = summary.ended_at or 0.0
        _close_run(ladder, c, end)
        _close_wait(c, end)
    elif now is not None and c.events:
        _close_run(ladder, c, now)
        _close_wait(c, now)
        summary.ended_at = max(summary.ended_at or now, now)
    return summary
