"""The pure fallback policy, without Ray: ladders of 1, 2 and 4 tiers, -1 budgets, any event order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotfallback.config import Tier
from spotfallback.events import (
    ApplicationFailed,
    CapacityTimedOut,
    CheckpointCommitted,
    Complete,
    Continue,
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
    event_from_json,
)
from spotfallback.policy import FailureBudget, FallbackPolicy, PreemptionBudget, TierStats


def run(policy: FallbackPolicy, events: list[Event]):
    state = policy.initial_state()
    decisions = []
    for e in events:
        step = policy.decide(state, e)
        state = step.state
        decisions.append(step.decision)
    return state, decisions


def two_tiers(**spot):
    spot.setdefault("max_preemptions", 1)
    return FallbackPolicy([Tier.spot(2, **spot), Tier.on_demand(2, max_failures=3)])


def test_second_preemption_leaves_spot_when_max_preemptions_is_1():
    state, decisions = run(
        two_tiers(),
        [RunStarted(0), WorkersAcquired(1), Preempted(5), WorkersAcquired(6), Preempted(9)],
    )
    assert decisions[2] == Retry(tier=0)
    assert isinstance(decisions[4], SwitchTier) and (decisions[4].from_tier, decisions[4].to_tier) == (0, 1)
    assert "preemption budget" in decisions[4].reason
    assert state.tier == 1 and state.stats[0].preemptions == 2 and state.tier_history == (0, 1)
    assert state.waiting_since == 9


def test_minus_one_budget_stays_forever():
    policy = FallbackPolicy([Tier.spot(2, max_preemptions=-1, max_failures=-1), Tier.on_demand(2)])
    events = [e for i in range(200) for e in (WorkersAcquired(3 * i), Preempted(3 * i + 1), NodeFailed(3 * i + 2))]
    state, decisions = run(policy, events)
    assert state.tier == 0 and state.stats[0].preemptions == 200 and state.stats[0].failures == 200
    assert not any(isinstance(d, SwitchTier | GiveUp) for d in decisions)


def test_node_failures_count_separately_from_preemptions():
    policy = FallbackPolicy([Tier.spot(1, max_preemptions=5, max_failures=1), Tier.on_demand(1)])
    state, decisions = run(policy, [Preempted(1), Preempted(2), NodeFailed(3), NodeFailed(4)])
    assert decisions[:3] == [Retry(0), Retry(0), Retry(0)]
    assert isinstance(decisions[3], SwitchTier) and "failure budget" in decisions[3].reason


def test_application_errors_never_move_down_and_give_up_after_max_failures():
    policy = FallbackPolicy([Tier.spot(2, max_failures=2), Tier.on_demand(2)])
    fail = [ApplicationFailed(t, "ValueError", "bad step") for t in (1, 2, 3)]
    state, decisions = run(policy, fail)
    assert decisions[:2] == [Retry(0), Retry(0)]
    assert isinstance(decisions[2], GiveUp) and decisions[2].cause == "application"
    assert "ValueError: bad step" in decisions[2].reason
    assert state.tier == 0 and state.status == "failed"


def test_capacity_timeout_moves_on_and_deadline_follows_the_tier():
    policy = FallbackPolicy(
        [Tier.spot(2, capacity_timeout_s=60), Tier.on_demand(2, capacity_timeout_s=None)]
    )
    state = policy.decide(policy.initial_state(), RunStarted(100)).state
    assert policy.capacity_deadline(state) == 160
    step = policy.decide(state, CapacityTimedOut(160, waited_s=60))
    assert isinstance(step.decision, SwitchTier) and "capacity_timeout_s=60" in step.decision.reason
    assert policy.capacity_deadline(step.state) is None  # on-demand waits forever, as configured
    step = policy.decide(step.state, WorkersAcquired(170))
    assert step.state.waiting_since is None and policy.capacity_deadline(step.state) is None


def test_every_tier_unavailable_gives_up_naming_each_tier_and_why():
    policy = FallbackPolicy(
        [
            Tier.spot(2, name="spot-a", capacity_timeout_s=10),
            Tier.spot(2, name="spot-b", max_preemptions=0),
            Tier(name="reserved", market="reserved", num_workers=2, capacity_timeout_s=5),
            Tier.on_demand(2, capacity_timeout_s=5),
        ]
    )
    state, decisions = run(
        policy,
        [RunStarted(0), CapacityTimedOut(10, 10), WorkersAcquired(11), Preempted(12), CapacityTimedOut(17, 5), CapacityTimedOut(22, 5)],
    )
    final = decisions[-1]
    assert isinstance(final, GiveUp) and final.cause == "exhausted"
    for name in ("spot-a", "spot-b", "reserved", "on-demand"):
        assert name in final.reason
    assert "capacity_timeout_s=10" in final.reason and "preemption budget" in final.reason
    assert state.tier_history == (0, 1, 2, 3)


def test_one_tier_ladder_gives_up_when_its_budget_is_spent():
    policy = FallbackPolicy([Tier.on_demand(1, max_failures=0)])
    _, decisions = run(policy, [NodeFailed(1)])
    assert isinstance(decisions[0], GiveUp) and decisions[0].cause == "exhausted"


def test_fatal_and_finished_are_terminal_and_late_events_change_nothing():
    policy = two_tiers()
    state, decisions = run(policy, [WorkersAcquired(1), Finished(2), Preempted(3), CheckpointCommitted(4)])
    assert decisions[1:] == [Complete(), Complete(), Complete()]
    assert state.stats[0].preemptions == 0
    state, decisions = run(policy, [Fatal(1, "no access to bucket"), Preempted(2)])
    assert isinstance(decisions[0], GiveUp) and decisions[0].cause == "fatal"
    assert decisions[1] == decisions[0]


def test_reset_after_give_up_starts_a_fresh_ladder_and_keeps_checkpoint_count():
    policy = FallbackPolicy([Tier.spot(1, max_preemptions=0), Tier.on_demand(1, max_failures=0)])
    state, _ = run(policy, [CheckpointCommitted(1), Preempted(2), NodeFailed(3)])
    assert state.status == "failed"
    step = policy.decide(state, RunStarted(10, reset=True))
    assert step.state.status == "running" and step.state.tier == 0 and step.state.checkpoints == 1
    assert step.state.stats[0] == TierStats()


def test_leave_rules_compose():
    rule = PreemptionBudget(1) | FailureBudget(0)
    assert rule.reason(TierStats(preemptions=1)) is None
    assert "preemption" in rule.reason(TierStats(preemptions=2))
    assert "failure" in rule.reason(TierStats(failures=1))


# -- properties over arbitrary ladders and event orders ----------------------------------

budgets = st.integers(min_value=-1, max_value=4)
tiers_st = st.lists(
    st.builds(
        lambda i, p, f, c: Tier(name=f"t{i}", market="spot" if i % 2 == 0 else "on-demand", num_workers=1,
                                max_preemptions=p, max_failures=f, capacity_timeout_s=c),
        st.just(0), budgets, budgets, st.one_of(st.none(), st.floats(1, 100)),
    ),
    min_size=1,
    max_size=4,
).map(lambda ts: [t.model_copy(update={"name": f"t{i}"}) for i, t in enumerate(ts)])

event_st = st.one_of(
    st.builds(RunStarted, st.just(0.0)),
    st.builds(WorkersAcquired, st.just(0.0), st.integers(1, 4)),
    st.builds(CheckpointCommitted, st.just(0.0)),
    st.builds(Preempted, st.just(0.0)),
    st.builds(NodeFailed, st.just(0.0)),
    st.builds(ApplicationFailed, st.just(0.0), st.just("E"), st.just("m")),
    st.builds(CapacityTimedOut, st.just(0.0), st.floats(0, 100)),
    st.builds(Fatal, st.just(0.0), st.just("x")),
    st.builds(Finished, st.just(0.0)),
)


@settings(max_examples=300, deadline=None)
@given(tiers_st, st.lists(event_st, max_size=40))
def test_invariants_hold_for_any_ladder_and_event_order(tiers, raw_events):
    policy = FallbackPolicy(tiers)
    events = [type(e)(**{**e.__dict__, "t": float(i)}) for i, e in enumerate(raw_events)]
    state = policy.initial_state()
    for e in events:
        before = state
        step = policy.decide(state, e)
        state, d = step.state, step.decision
        # The tier only moves down, one rung at a time, and only with a SwitchTier decision.
        assert state.tier in (before.tier, before.tier + 1)
        assert (state.tier == before.tier + 1) == isinstance(d, SwitchTier)
        assert 0 <= state.tier < len(tiers)
        # Counts never decrease and never exceed a finite budget by more than one.
        for b, a, tier in zip(before.stats, state.stats, tiers, strict=True):
            assert a.preemptions >= b.preemptions and a.failures >= b.failures
            if tier.max_preemptions != -1:
                assert a.preemptions <= tier.max_preemptions + 1
        # An application error never moves the run to another tier.
        if isinstance(e, ApplicationFailed):
            assert not isinstance(d, SwitchTier)
        # Terminal states are sticky.
        if before.is_terminal:
            assert state == before
        if isinstance(d, GiveUp):
            assert state.status == "failed" and state.give_up == d
        if isinstance(d, Continue):
            assert state.tier == before.tier
    # Replaying the same events gives the same state: the ledger's promise.
    assert policy.replay(events) == state


@settings(max_examples=200, deadline=None)
@given(st.lists(event_st, max_size=20))
def test_events_round_trip_through_json(raw_events):
    for e in raw_events:
        assert event_from_json(e.to_json()) == e


@pytest.mark.parametrize(
    "bad",
    [{"kind": "nope", "t": 1}, {"kind": "preempted"}, {"kind": "preempted", "t": "x"}, {"kind": "preempted", "t": 1, "zzz": 2}, [],
     {"kind": "preempted", "t": -5}, {"kind": "preempted", "t": float("nan")}],
)
def test_malformed_event_json_is_a_clear_error(bad):
    with pytest.raises(ValueError):
        event_from_json(bad)


def test_a_record_of_a_newer_spotfallback_says_to_upgrade():
    from spotfallback.events import LedgerRecord

    with pytest.raises(ValueError, match=r"unknown event kind 'spot_price_observed'.*upgrade spotfallback"):
        event_from_json({"kind": "spot_price_observed", "t": 1})
    record = {"v": 2, "id": "x", "writer": "w", "tier": 0, "event": {"kind": "preempted", "t": 1}}
    with pytest.raises(ValueError, match=r"^unsupported ledger format version 2 \(this spotfallback reads version 1; a newer "):
        LedgerRecord.from_json(record)
    with pytest.raises(ValueError, match=r"^unsupported ledger format version '1'$"):
        LedgerRecord.from_json({**record, "v": "1"})
