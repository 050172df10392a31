"""The pure policy's cost cap: a cheaper tier only while the run can still cost no more than the last tier alone.

Prices and times are powers of two where it matters, so the boundary case is exact.
"""

from __future__ import annotations

from spotfallback.config import CostCap, Tier
from spotfallback.events import (
    CapacityTimedOut,
    CheckpointCommitted,
    ClimbBack,
    Continue,
    Decision,
    Event,
    Preempted,
    Retry,
    RunStarted,
    SwitchTier,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy, PolicyState
from tests.support import policies

# The last tier alone: 1.0/h x (10 h of work + a 0.5 h restart) = 10.5.
CAP = CostCap(work_h=10.0, restart_h=0.5, first_commit_h=0.5)
# One hour on spot at 0.25/h (0.25), one lost attempt held in hand (0.25 x 0.5), the rest on on-demand with a restart:
# the cap holds with up to 10.5 - 0.25 - 0.125 - 0.5 = 9.625 h of work left.
EDGE_S = 9.625 * 3600.0


def spot(name: str = "spot", **kw: object) -> Tier:
    fields: dict[str, object] = dict(name=name, market="spot", num_workers=1, max_preemptions=-1,
                                     capacity_timeout_s=None, price_per_worker_hour=0.25, cost_cap=CAP)
    fields.update(kw)
    return Tier(**fields)  # type: ignore[arg-type]


def ladder(*tiers: Tier) -> FallbackPolicy:
    return FallbackPolicy([*tiers, Tier.on_demand(1, price_per_worker_hour=1.0)])


def run(policy: FallbackPolicy, events: list[Event]) -> tuple[PolicyState, Decision]:
    """The state after ``events`` and the decision on the last of them (replay checked)."""
    state, decisions = policies.run(policy, events)
    return state, decisions[-1]


def hour_on_spot(remaining_s: float | None) -> list[Event]:
    """Start, an hour on spot (a commit reporting ``remaining_s`` if given), then a preemption."""
    events: list[Event] = [RunStarted(t=0.0), WorkersAcquired(t=0.0, num_workers=1)]
    if remaining_s is not None:
        events.append(CheckpointCommitted(t=1800.0, remaining_work_s=remaining_s))
    return [*events, Preempted(t=3600.0)]


def test_the_run_stays_while_the_cap_holds_with_equality():
    state, decision = run(ladder(spot()), hour_on_spot(EDGE_S))
    assert isinstance(decision, Retry) and state.tier == 0
    assert state.spent == 0.25


def test_the_run_moves_to_the_last_tier_once_the_cap_would_break():
    policy = ladder(spot())
    state, decision = run(policy, hour_on_spot(EDGE_S + 1.0))
    assert isinstance(decision, SwitchTier) and (decision.from_tier, decision.to_tier) == (0, 1)
    assert "cost_cap" in decision.reason


def test_the_cap_skips_the_middle_tiers_to_the_last():
    state, decision = run(ladder(spot(), spot("spot-2")), hour_on_spot(EDGE_S + 1.0))
    assert isinstance(decision, SwitchTier) and decision.to_tier == 2


def test_unknown_remaining_work_never_trips_the_cap():
    events: list[Event] = [RunStarted(t=0.0), WorkersAcquired(t=0.0, num_workers=1), Preempted(t=100 * 3600.0)]
    state, decision = run(ladder(spot()), events)
    assert isinstance(decision, Retry) and state.spent == 25.0  # far more than on-demand alone, but nothing known


def test_a_tier_without_a_cap_stays():
    state, decision = run(ladder(spot(cost_cap=None)), hour_on_spot(EDGE_S + 1.0))
    assert isinstance(decision, Retry)


def test_the_factor_widens_the_cap():
    # 1.25 x 10.5 leaves 13.125 - 0.875 = 12.25 h of work in hand.
    wide = spot(cost_cap=CAP.model_copy(update={"factor": 1.25}))
    assert isinstance(run(ladder(wide), hour_on_spot(12.25 * 3600.0))[1], Retry)
    assert isinstance(run(ladder(wide), hour_on_spot(12.25 * 3600.0 + 1.0))[1], SwitchTier)


def test_a_move_by_another_rule_skips_a_capped_next_tier():
    # A capacity timeout on the first tier: the run would go to spot-2, whose cap no longer holds.
    events: list[Event] = [*hour_on_spot(EDGE_S + 1.0)[:-1], Preempted(t=3600.0)]
    first = spot(cost_cap=None, capacity_timeout_s=600.0)
    state, _ = run(ladder(first, spot("spot-2")), events)
    step = ladder(first, spot("spot-2")).decide(state, CapacityTimedOut(t=3600.0 + 600.0, waited_s=600.0))
    assert isinstance(step.decision, SwitchTier) and step.decision.to_tier == 2
    assert "skipping 'spot-2'" in step.decision.reason


def test_no_climb_back_to_a_tier_whose_cap_would_break():
    def climb(cap: CostCap | None) -> object:
        policy = ladder(spot(cost_cap=cap, climb_back=True, min_dwell_s=0.0))
        state, decision = run(policy, hour_on_spot(EDGE_S + 1.0))
        if cap is not None:
            assert isinstance(decision, SwitchTier)  # the cap sent it down
        else:
            state = policy.decide(state, CapacityTimedOut(t=3600.0, waited_s=0.0)).state  # sent down otherwise
        state = policy.decide(state, WorkersAcquired(t=3600.0, num_workers=1)).state
        free = policies.seen(4 * 3600.0, n=1, remaining=EDGE_S + 1.0 - 3 * 3600.0, restart=360.0,
                             checkpoint_interval_s=1800.0)
        return policy.decide(state, free).decision

    assert isinstance(climb(None), ClimbBack)  # the climb pays ...
    assert isinstance(climb(CAP), Continue)  # ... but on-demand has been paying for its work since: no slack came back


def test_a_tie_with_the_cap_within_float_rounding_does_not_break_it():
    """The policy sums spend from seconds, the fast engine from hours: at an exact tie both must stay."""
    from spotfallback.policy import over_cap

    limit = 2.0 * 7.64  # a run whose spend, risk and rest on the last tier add up to the cap exactly
    assert not over_cap(1.74 + 0.3 + 2.0 * 6.62, limit) and not over_cap(limit * (1 + 1e-12), limit)
    assert over_cap(limit + 0.01, limit) and over_cap(limit * 1.001, limit)
