"""The fallback decision logic: events in, decisions out.

Pure: no Ray, no I/O, no clock. The live runner (inside Ray Train's controller), the ledger
replay after a driver crash and the simulator all drive this one module, so what the
simulator predicts is what the runner does.

Leaving a tier is decided by small composable rules in the manner of tenacity's stop
strategies (``PreemptionBudget(3) | FailureBudget(2)``); the capacity timeout is a deadline
the shell watches (``capacity_deadline``) and reports back as ``CapacityTimedOut``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from .config import Ladder, Tier, make_ladder
from .events import (
    ApplicationFailed,
    CapacityObserved,
    CapacityTimedOut,
    CheckpointCommitted,
    ClimbBack,
    Complete,
    Continue,
    Decision,
    Event,
    Fatal,
    Finished,
    GiveUp,
    InfoEvent,
    NodeFailed,
    Preempted,
    Resize,
    Retry,
    RunStarted,
    SwitchTier,
    WorkersAcquired,
)

Status = Literal["running", "finished", "failed"]


@dataclass(frozen=True)
class TierStats:
    """What has happened on one tier so far."""

    preemptions: int = 0
    failures: int = 0
    app_errors: int = 0
    capacity_timeouts: int = 0
    left_reason: str | None = None
    preemption_times: tuple[float, ...] = ()  # latest ones, kept only for a max_preemption_rate


@dataclass(frozen=True)
class PolicyState:
    """Everything the policy needs to decide; rebuilt exactly by replaying the ledger."""

    tier: int
    stats: tuple[TierStats, ...]
    waiting_since: float | None = None
    running_since: float | None = None
    checkpoints: int = 0
    status: Status = "running"
    give_up: GiveUp | None = None
    tier_history: tuple[int, ...] = field(default=())
    tier_since: float | None = None  # when the run last changed tier (climb-back dwell)
    workers: int = 0  # size of the gang now running or last run (elastic tiers)
    tier_running_s: tuple[float, ...] = ()  # running time per tier (observed preemption rates)

    @property
    def current(self) -> TierStats:
        return self.stats[self.tier]

    @property
    def is_terminal(self) -> bool:
        return self.status != "running"


# ---------------------------------------------------------------------------------------
# Leave rules: each answers "should the run leave this tier now, and why?"


class LeaveRule:
    """A condition on a tier's stats that makes the run leave the tier."""

    def reason(self, stats: TierStats) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __or__(self, other: LeaveRule) -> LeaveRule:
        return AnyRule((self, other))


@dataclass(frozen=True)
class AnyRule(LeaveRule):
    rules: tuple[LeaveRule, ...]

    def reason(self, stats: TierStats) -> str | None:
        for rule in self.rules:
            why = rule.reason(stats)
            if why:
                return why
        return None

    def __or__(self, other: LeaveRule) -> LeaveRule:
        return AnyRule((*self.rules, other))


@dataclass(frozen=True)
class PreemptionBudget(LeaveRule):
    """Leave after more than ``limit`` preemptions (-1: never)."""

    limit: int

    def reason(self, stats: TierStats) -> str | None:
        if self.limit != -1 and stats.preemptions > self.limit:
            return f"preemption budget spent ({stats.preemptions} preemptions, max_preemptions={self.limit})"
        return None


@dataclass(frozen=True)
class FailureBudget(LeaveRule):
    """Leave after more than ``limit`` node failures without notice (-1: never)."""

    limit: int

    def reason(self, stats: TierStats) -> str | None:
        if self.limit != -1 and stats.failures > self.limit:
            return f"failure budget spent ({stats.failures} node failures, max_failures={self.limit})"
        return None


@dataclass(frozen=True)
class PreemptionBurst(LeaveRule):
    """Leave when ``count`` preemptions fell within ``window_s`` seconds (a sliding window)."""

    count: int
    window_s: float

    def reason(self, stats: TierStats) -> str | None:
        times = stats.preemption_times
        if len(times) >= self.count and times[-1] - times[-self.count] <= self.window_s:
            span = times[-1] - times[-self.count]
            return (
                f"preemption rate too high ({self.count} preemptions within {span:.0f}s, "
                f"max_preemption_rate={self.count} per {self.window_s:g}s)"
            )
        return None


def leave_rule_for(tier: Tier) -> LeaveRule:
    rule = PreemptionBudget(tier.max_preemptions) | FailureBudget(tier.max_failures)
    if tier.max_preemption_rate is not None:
        rule = rule | PreemptionBurst(tier.max_preemption_rate.count, tier.max_preemption_rate.window_s)
    return rule


# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    state: PolicyState
    decision: Decision


class FallbackPolicy:
    """Walks a run down the ladder. ``decide`` is a pure function of (state, event)."""

    def __init__(self, tiers: Ladder | Sequence[Tier], rules: Sequence[LeaveRule] | None = None):
        self.ladder = make_ladder(tiers)
        self.rules = tuple(rules) if rules is not None else tuple(leave_rule_for(t) for t in self.ladder.tiers)
        if len(self.rules) != len(self.ladder):
            raise ValueError("one leave rule per tier is required")

    @property
    def tiers(self) -> tuple[Tier, ...]:
        return self.ladder.tiers

    def initial_state(self) -> PolicyState:
        return PolicyState(tier=0, stats=tuple(TierStats() for _ in self.tiers), tier_history=(0,))

    def capacity_deadline(self, state: PolicyState) -> float | None:
        """Time by which the current tier's workers must be up, or None for no deadline."""
        if state.is_terminal or state.waiting_since is None:
            return None
        timeout = self.tiers[state.tier].capacity_timeout_s
        return None if timeout is None else state.waiting_since + timeout

    def replay(self, events: Iterable[Event], state: PolicyState | None = None) -> PolicyState:
        state = state or self.initial_state()
        for event in events:
            state = self.decide(state, event).state
        return state

    def decide(self, state: PolicyState, event: Event) -> Step:
        if isinstance(event, InfoEvent):
            # Notices and just-in-time checkpoints are for the timeline; the failure they
            # announce arrives as its own Preempted event.
            return Step(state, Continue())
        if isinstance(event, RunStarted) and event.reset:
            # A failed run started again on purpose: fresh budgets, progress kept in checkpoints.
            fresh = self.initial_state()
            return Step(replace(fresh, waiting_since=event.t, checkpoints=state.checkpoints), Continue())
        if state.is_terminal:
            # Late events (a checkpoint commit racing the finish, a straggler failure) change
            # nothing; the terminal decision is repeated so the shell stays idempotent.
            return Step(state, state.give_up if state.give_up else Complete())
        t = event.t
        if isinstance(event, Preempted | NodeFailed | ApplicationFailed):
            state = self._ran(state, t)
        match event:
            case RunStarted():
                return Step(replace(state, waiting_since=t, running_since=None), Continue())
            case WorkersAcquired(num_workers=n):
                return Step(replace(state, waiting_since=None, running_since=t, workers=n), Continue())
            case CapacityObserved():
                return self._observed(state, event)
            case CheckpointCommitted():
                return Step(replace(state, checkpoints=state.checkpoints + 1), Continue())
            case Finished():
                return Step(replace(state, status="finished", waiting_since=None, running_since=None), Complete())
            case Fatal(message=message):
                return self._give_up(state, "fatal", message)
            case Preempted():
                return self._infrastructure(state, t, preemptions=1)
            case NodeFailed():
                return self._infrastructure(state, t, failures=1)
            case CapacityTimedOut(waited_s=waited):
                stats = replace(state.current, capacity_timeouts=state.current.capacity_timeouts + 1)
                state = self._with_stats(state, stats)
                timeout = self.tiers[state.tier].capacity_timeout_s
                limit = f"within capacity_timeout_s={timeout:g}" if timeout is not None else "(the cluster cannot fit this tier)"
                return self._leave(state, t, f"no capacity {limit} (waited {waited:.1f}s)")
            case ApplicationFailed(error_type=etype, message=message):
                stats = replace(state.current, app_errors=state.current.app_errors + 1)
                state = self._with_stats(state, stats)
                limit = self.tiers[state.tier].max_failures
                if limit != -1 and stats.app_errors > limit:
                    return self._give_up(
                        state,
                        "application",
                        f"the training function failed {stats.app_errors} times on tier "
                        f"{self.tiers[state.tier].name!r} (max_failures={limit}): {etype}: {message}",
                    )
                return Step(replace(state, waiting_since=t, running_since=None), Retry(tier=state.tier))
        raise TypeError(f"unknown event {event!r}")

    # -- helpers -------------------------------------------------------------------------

    def _with_stats(self, state: PolicyState, stats: TierStats) -> PolicyState:
        all_stats = list(state.stats)
        all_stats[state.tier] = stats
        return replace(state, stats=tuple(all_stats))

    def _infrastructure(self, state: PolicyState, t: float, preemptions: int = 0, failures: int = 0) -> Step:
        stats = replace(
            state.current,
            preemptions=state.current.preemptions + preemptions,
            failures=state.current.failures + failures,
        )
        rate = self.tiers[state.tier].max_preemption_rate
        if preemptions and rate is not None:
            stats = replace(stats, preemption_times=(*stats.preemption_times, t)[-rate.count :])
        state = self._with_stats(state, stats)
        why = self.rules[state.tier].reason(stats)
        if why:
            return self._leave(state, t, why)
        return Step(replace(state, waiting_since=t, running_since=None), Retry(tier=state.tier))

    def _leave(self, state: PolicyState, t: float, why: str) -> Step:
        stats = replace(state.current, left_reason=why)
        state = self._with_stats(state, stats)
        nxt = state.tier + 1
        if nxt >= len(self.tiers):
            return self._give_up(state, "exhausted", self.exhausted_message(state))
        step_state = replace(
            state,
            tier=nxt,
            waiting_since=t,
            running_since=None,
            tier_history=(*state.tier_history, nxt),
            tier_since=t,
        )
        return Step(step_state, SwitchTier(from_tier=state.tier, to_tier=nxt, reason=why))

    def _give_up(self, state: PolicyState, cause: str, reason: str) -> Step:
        decision = GiveUp(cause=cause, reason=reason)  # type: ignore[arg-type]
        return Step(replace(state, status="failed", give_up=decision, waiting_since=None, running_since=None), decision)

    def exhausted_message(self, state: PolicyState) -> str:
        lines = ["every tier of the ladder was left:"]
        for tier, stats in zip(self.tiers, state.stats, strict=True):
            lines.append(f"  - {tier.name} ({tier.market}): {stats.left_reason or 'not reached'}")
        return "\n".join(lines)

    # -- beyond one-way fallback: climbing back and growing elastic tiers -----------------

    def _ran(self, state: PolicyState, t: float) -> PolicyState:
        """Add the attempt that ends at ``t`` to its tier's running time."""
        if state.running_since is None:
            return state
        running = list(state.tier_running_s) or [0.0] * len(self.tiers)
        running[state.tier] += max(0.0, t - state.running_since)
        return replace(state, tier_running_s=tuple(running))

    def climb_dwell_s(self, state: PolicyState, to: int) -> float:
        """``min_dwell_s``, doubled for each earlier climb back to ``to`` (at most 16x).

        A run climbs back to a tier again only after it was sent down from it again, so each
        repeat is evidence that the tier's returning capacity does not last.
        """
        hist = state.tier_history
        climbs = sum(1 for a, b in zip(hist, hist[1:], strict=False) if b == to and a > b)
        return self.tiers[to].min_dwell_s * 2 ** min(climbs, 4)

    def gang_rate(self, tier: int, workers: int) -> float:
        """Price per hour of ``workers`` workers on ``tier``."""
        return workers * self.tiers[tier].price_per_worker_hour

    def observed_preemption_rate(self, state: PolicyState, tier: int) -> float:
        """Preemptions per running hour seen on ``tier``, smoothed by one preemption-free hour.

        The extra hour keeps a tier with one early preemption from looking hopeless and an
        unseen tier from looking perfect to no end.
        """
        running_h = (state.tier_running_s[tier] if state.tier_running_s else 0.0) / 3600.0
        return state.stats[tier].preemptions / (running_h + 0.25)

    def climb_pays(self, state: PolicyState, event: CapacityObserved) -> tuple[bool, str]:
        """Remaining work x price difference against one restart + expected re-preemption cost."""
        cur, to = state.tier, event.tier
        w_cur = state.workers or self.tiers[cur].num_workers
        w_to = min(event.available_workers, self.tiers[to].num_workers)
        rate_cur, rate_to = self.gang_rate(cur, w_cur), self.gang_rate(to, w_to)
        if event.remaining_work_s is None:
            return rate_to < rate_cur, f"{rate_to:.2f}/h instead of {rate_cur:.2f}/h, remaining work unknown"
        rem_cur_h = event.remaining_work_s / 3600.0
        rem_to_h = rem_cur_h * w_cur / max(w_to, 1)  # data parallel: work scales with the gang
        saving = rem_cur_h * rate_cur - rem_to_h * rate_to
        restart_h = event.restart_s / 3600.0
        per_preemption = (restart_h + event.checkpoint_interval_s / 7200.0) * rate_to
        stats_to = state.stats[to] if self.tiers[to].climb_budgets == "carry" else TierStats()
        if self.rules[to].reason(replace(stats_to, preemptions=stats_to.preemptions + 1)):
            per_preemption += restart_h * rate_cur  # the next preemption sends the run back down
        expected = self.observed_preemption_rate(state, to) * rem_to_h * per_preemption
        cost = restart_h * rate_to + expected
        why = f"saves {saving:.2f} against {restart_h * rate_to:.2f} restart + {expected:.2f} expected re-preemption"
        if event.slack_s is not None:
            # A deadline: the climb and each expected re-preemption (with the fall back down
            # and a wait for capacity) must fit in the slack, or the cheaper tier is a gamble.
            n_pre = self.observed_preemption_rate(state, to) * rem_to_h
            timeout = self.tiers[to].capacity_timeout_s or 0.0
            lose_s = (rem_to_h - rem_cur_h) * 3600.0
            needed = lose_s + (1.0 + n_pre) * (timeout + 2 * event.restart_s + event.checkpoint_interval_s / 2)
            if event.slack_s < needed:
                return False, f"slack {event.slack_s:.0f}s < {needed:.0f}s needed before the deadline"
        return saving > cost, why

    def _observed(self, state: PolicyState, event: CapacityObserved) -> Step:
        t, to, cur = event.t, event.tier, state.tier
        if state.running_since is None or not 0 <= to < len(self.tiers):
            return Step(state, Continue())
        tier = self.tiers[to]
        if to == cur:
            return self._grow(state, event)
        since = state.tier_since if state.tier_since is not None else state.running_since
        if (
            to > cur
            or not tier.climb_back
            or event.available_workers < tier.fewest_workers
            or t - since < self.climb_dwell_s(state, to)
        ):
            return Step(state, Continue())
        pays, why = self.climb_pays(state, event)
        if not pays:
            return Step(state, Continue())
        reason = f"capacity back on {tier.name!r} ({event.available_workers} workers): {why}"
        state = self._ran(state, t)
        stats = list(state.stats)
        stats[cur] = replace(stats[cur], left_reason=f"climbed back to {tier.name!r}")
        stats[to] = TierStats() if tier.climb_budgets == "fresh" else replace(stats[to], left_reason=None)
        new = replace(
            state,
            stats=tuple(stats),
            tier=to,
            waiting_since=t,
            running_since=None,
            tier_since=t,
            tier_history=(*state.tier_history, to),
        )
        return Step(new, ClimbBack(from_tier=cur, to_tier=to, reason=reason))

    def _grow(self, state: PolicyState, event: CapacityObserved) -> Step:
        """An elastic gang below its maximum restarts larger when that saves more than a restart."""
        tier = self.tiers[state.tier]
        target = min(event.available_workers, tier.num_workers)
        assert state.running_since is not None
        if not tier.is_elastic or target <= state.workers or event.t - state.running_since < tier.min_dwell_s:
            return Step(state, Continue())
        if event.remaining_work_s is not None:
            saved_s = event.remaining_work_s * (1.0 - state.workers / target)
            if saved_s <= event.restart_s:
                return Step(state, Continue())
        state = replace(self._ran(state, event.t), waiting_since=event.t, running_since=None)
        return Step(state, Resize(tier=state.tier, num_workers=target))
