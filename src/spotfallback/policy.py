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
    CapacityTimedOut,
    CheckpointCommitted,
    Complete,
    Continue,
    Decision,
    Event,
    Fatal,
    Finished,
    GiveUp,
    NodeFailed,
    Preempted,
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


def leave_rule_for(tier: Tier) -> LeaveRule:
    return PreemptionBudget(tier.max_preemptions) | FailureBudget(tier.max_failures)


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
        if isinstance(event, RunStarted) and event.reset:
            # A failed run started again on purpose: fresh budgets, progress kept in checkpoints.
            fresh = self.initial_state()
            return Step(replace(fresh, waiting_since=event.t, checkpoints=state.checkpoints), Continue())
        if state.is_terminal:
            # Late events (a checkpoint commit racing the finish, a straggler failure) change
            # nothing; the terminal decision is repeated so the shell stays idempotent.
            return Step(state, state.give_up if state.give_up else Complete())
        t = event.t
        match event:
            case RunStarted():
                return Step(replace(state, waiting_since=t, running_since=None), Continue())
            case WorkersAcquired():
                return Step(replace(state, waiting_since=None, running_since=t), Continue())
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
