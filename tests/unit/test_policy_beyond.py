"""The pure policy beyond one-way fallback: climbing back, elastic growth, preemption bursts.

No Ray: events in, decisions out, and every state must be rebuilt exactly by ``replay``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotfallback.config import Tier, make_ladder
from spotfallback.errors import ConfigError
from spotfallback.events import (
    CapacityObserved,
    CapacityTimedOut,
    CheckpointCommitted,
    ClimbBack,
    Continue,
    Event,
    GiveUp,
    NodeFailed,
    Preempted,
    Resize,
    Retry,
    RunStarted,
    SwitchTier,
    WorkersAcquired,
    event_from_json,
)
from spotfallback.policy import FallbackPolicy, PolicyState, TierStats
from tests.support.policies import run, seen


def climbing_ladder(**spot: object) -> FallbackPolicy:
    spot_tier = Tier.spot(2, max_preemptions=0, climb_back=True, min_dwell_s=300, price_per_worker_hour=1.0, **spot)
    return FallbackPolicy([spot_tier, Tier.on_demand(2, price_per_worker_hour=3.0)])


def on_demand_after_budget(t0: float = 0.0) -> list[Event]:
    """Spot preempted past its budget at t0+100, on-demand workers up at t0+110."""
    return [RunStarted(t0), WorkersAcquired(t0 + 1, 2), Preempted(t0 + 100), WorkersAcquired(t0 + 110, 2)]


# -- config -----------------------------------------------------------------------------


def test_new_fields_default_to_the_one_way_rigid_ladder():
    tier = Tier.spot(2)
    assert (tier.climb_back, tier.min_workers, tier.max_preemption_rate, tier.is_elastic) == (False, None, None, False)
    assert Tier.spot((2, 4)).model_dump()["min_workers"] == 2 and Tier.spot((2, 4)).num_workers == 4
    # Unused, the new fields stay out of stored ladders and generated files (goldens unchanged).
    assert not {"min_workers", "climb_back", "min_dwell_s", "climb_budgets", "max_preemption_rate"} & set(tier.model_dump())
    used = Tier.spot(2, climb_back=True, min_dwell_s=5, climb_budgets="fresh", max_preemption_rate={"count": 2, "window_s": 9})
    assert Tier.model_validate(used.model_dump(mode="json")) == used
    with pytest.raises(ConfigError, match="min_workers"):
        make_ladder([{"name": "s", "market": "spot", "num_workers": 2, "min_workers": 3}])
    with pytest.raises(ConfigError, match="window_s"):
        make_ladder([{"name": "s", "market": "spot", "num_workers": 2, "max_preemption_rate": {"count": 2}}])


def test_capacity_observed_round_trips_through_json():
    ev = seen(5.0, remaining=None)
    assert event_from_json(ev.to_json()) == ev
    assert ClimbBack(from_tier=1, to_tier=0, reason="r").to_json()["action"] == "climb_back"


# -- climb back -------------------------------------------------------------------------


def test_climbs_back_when_capacity_returns_after_the_dwell_and_it_pays():
    policy = climbing_ladder()
    state, decisions = run(policy, [*on_demand_after_budget(), seen(200), seen(420)])
    assert isinstance(decisions[2], SwitchTier)
    assert decisions[4] == Continue()  # only 100 s on on-demand: dwell not met
    climb = decisions[5]
    assert isinstance(climb, ClimbBack) and (climb.from_tier, climb.to_tier) == (1, 0)
    assert state.tier == 0 and state.tier_history == (0, 1, 0) and state.waiting_since == 420
    assert state.stats[1].left_reason == "climbed back to 'spot'"
    assert state.stats[0].preemptions == 1  # budgets carry over by default
    assert policy.capacity_deadline(state) == 420 + 600


def test_fresh_budgets_on_climb_and_a_carried_budget_sends_the_run_down_at_once():
    fresh = climbing_ladder(climb_budgets="fresh")
    state, _ = run(fresh, [*on_demand_after_budget(), seen(420)])
    assert state.stats[0] == TierStats()
    carry = climbing_ladder()
    events = [*on_demand_after_budget(), seen(420), WorkersAcquired(430, 2), Preempted(500)]
    state, decisions = run(carry, events)
    assert isinstance(decisions[-1], SwitchTier) and state.stats[0].preemptions == 2
    state, decisions = run(fresh, events)
    assert isinstance(decisions[-1], SwitchTier) and state.stats[0].preemptions == 1


@pytest.mark.parametrize(
    ("observation", "why"),
    [
        (seen(420, n=1), "too few workers"),
        (seen(420, remaining=30.0), "too little work left to pay for a restart"),
        (seen(420, tier=1), "already on that tier"),
    ],
)
def test_no_climb_when_it_cannot_pay_or_cannot_fit(observation, why):
    _, decisions = run(climbing_ladder(), [*on_demand_after_budget(), observation])
    assert decisions[-1] == Continue(), why


def test_no_climb_to_a_tier_that_does_not_allow_it_or_while_waiting():
    one_way = FallbackPolicy([Tier.spot(2, max_preemptions=0, price_per_worker_hour=1.0), Tier.on_demand(2, price_per_worker_hour=3.0)])
    _, decisions = run(one_way, [*on_demand_after_budget(), seen(10_000)])
    assert decisions[-1] == Continue()
    waiting = on_demand_after_budget()[:-1]  # on-demand workers not up yet
    _, decisions = run(climbing_ladder(), [*waiting, seen(10_000)])
    assert decisions[-1] == Continue()


def test_expected_re_preemption_cost_stops_a_climb_to_a_tier_that_keeps_failing():
    spot = Tier.spot(2, max_preemptions=-1, climb_back=True, min_dwell_s=0, price_per_worker_hour=2.5,
                     max_preemption_rate={"count": 4, "window_s": 10_000})
    policy = FallbackPolicy([spot, Tier.on_demand(2, price_per_worker_hour=3.0)])
    events: list[Event] = [RunStarted(0)]
    for i in range(4):  # four preemptions in 400 s of running: about 4 an hour
        events += [WorkersAcquired(i * 100 + 1, 2), Preempted(i * 100 + 100)]
    events += [WorkersAcquired(500, 2)]
    state, decisions = run(policy, events)
    assert state.tier == 1
    obs = CapacityObserved(600, tier=0, available_workers=2, remaining_work_s=7200, restart_s=600, checkpoint_interval_s=1200)
    pays, why = policy.climb_pays(state, obs)
    assert not pays and "expected re-preemption" in why
    assert policy.decide(state, obs).decision == Continue()
    calm = replace_preemptions(state, 0)
    assert policy.climb_pays(calm, obs)[0]


def replace_preemptions(state: PolicyState, n: int) -> PolicyState:
    from dataclasses import replace

    return replace(state, stats=(replace(state.stats[0], preemptions=n), *state.stats[1:]))


@settings(max_examples=150, deadline=None)
@given(
    dwell=st.sampled_from([0.0, 60.0, 300.0]),
    steps=st.lists(st.tuples(st.floats(1.0, 120.0), st.sampled_from(["seen", "gone", "preempt"])), min_size=1, max_size=60),
)
def test_never_flaps_under_alternating_availability(dwell, steps):
    """Tier changes are at least min_dwell_s apart whatever the capacity does."""
    spot = Tier.spot(2, max_preemptions=-1, climb_back=True, min_dwell_s=dwell, price_per_worker_hour=1.0,
                     climb_budgets="fresh", max_preemption_rate={"count": 1, "window_s": 1.0})
    policy = FallbackPolicy([spot, Tier.on_demand(2, price_per_worker_hour=3.0)])
    state = policy.decide(policy.initial_state(), RunStarted(0)).state
    state = policy.decide(state, WorkersAcquired(0.5, 2)).state
    t, changes = 1.0, []
    events: list[Event] = [RunStarted(0), WorkersAcquired(0.5, 2)]
    for gap, what in steps:
        t += gap
        if what == "preempt" and state.running_since is not None:
            ev: Event = Preempted(t)
        elif what == "seen":
            ev = seen(t, tier=0)
        else:
            ev = seen(t, tier=0, n=0)
        step = policy.decide(state, ev)
        events.append(ev)
        if isinstance(step.decision, ClimbBack):
            assert dwell == 0 or not changes or t - changes[-1] >= dwell
            changes.append(t)
        elif isinstance(step.decision, SwitchTier):
            changes.append(t)
        state = step.state
        if state.waiting_since is not None:  # workers come back a second later
            t += 1.0
            events.append(WorkersAcquired(t, 2))
            state = policy.decide(state, events[-1]).state
    assert policy.replay(events) == state
    climbs = state.tier_history.count(0) - 1
    if dwell:
        assert climbs <= t / dwell + 1


# -- elastic ----------------------------------------------------------------------------


def test_elastic_tier_grows_back_after_the_dwell_when_it_saves_more_than_a_restart():
    policy = FallbackPolicy([Tier.spot((2, 4), max_preemptions=5, min_dwell_s=30)])
    events: list[Event] = [RunStarted(0), WorkersAcquired(1, 4), Preempted(50), WorkersAcquired(60, 3)]
    state, decisions = run(policy, events)
    assert isinstance(decisions[2], Retry) and state.workers == 3
    assert policy.decide(state, seen(70, n=4)).decision == Continue()  # dwell
    assert policy.decide(state, seen(100, n=3)).decision == Continue()  # no more capacity
    assert policy.decide(state, seen(100, n=4, remaining=100, restart=60)).decision == Continue()  # saves 25 s < 60 s
    step = policy.decide(state, seen(100, n=9))
    assert step.decision == Resize(tier=0, num_workers=4)
    assert step.state.waiting_since == 100 and step.state.running_since is None
    rigid = FallbackPolicy([Tier.spot(4, max_preemptions=5, min_dwell_s=0)])
    state, _ = run(rigid, [RunStarted(0), WorkersAcquired(1, 3)])
    assert rigid.decide(state, seen(100, n=4)).decision == Continue()


# -- switching on observed preemption rates ---------------------------------------------


def test_a_burst_of_preemptions_leaves_before_the_count_budget_is_spent():
    burst = Tier.spot(2, max_preemptions=10, max_preemption_rate={"count": 3, "window_s": 600})
    policy = FallbackPolicy([burst, Tier.on_demand(2)])
    spread = [RunStarted(0)]
    for i in range(5):  # 5 preemptions 400 s apart: never 3 within 600 s
        spread += [WorkersAcquired(i * 400 + 1, 2), Preempted(i * 400 + 400)]
    state, decisions = run(policy, spread)
    assert state.tier == 0 and all(isinstance(d, Retry) for d in decisions if not isinstance(d, Continue))
    burst = [WorkersAcquired(3001, 2), Preempted(3100), WorkersAcquired(3101, 2), Preempted(3200)]
    state, decisions = run(policy, [*spread, *burst])
    assert isinstance(decisions[-1], Retry)  # 2000, 3100, 3200: three, but not within 600 s
    state, decisions = run(policy, [*spread, *burst, WorkersAcquired(3201, 2), Preempted(3300)])
    assert isinstance(decisions[-1], SwitchTier) and "preemption rate" in decisions[-1].reason
    assert state.stats[0].preemptions == 8 and state.stats[0].preemption_times == (3100, 3200, 3300)


# -- accounting: every climb and resize in the summary, time and spend per tier ------------


def test_summary_counts_time_and_spend_per_tier_across_a_climb_and_a_resize():
    from spotfallback.accounting import summarize
    from spotfallback.events import Finished, LedgerRecord

    spot = Tier.spot((1, 2), max_preemptions=0, climb_back=True, min_dwell_s=100, price_per_worker_hour=1.0)
    ladder = make_ladder([spot, Tier.on_demand(2, price_per_worker_hour=3.0)])
    policy = FallbackPolicy(ladder)
    events: list[Event] = [
        RunStarted(0), WorkersAcquired(0, 2), Preempted(3600),  # 1 h on spot with 2 workers
        WorkersAcquired(3600, 2), seen(7200, remaining=None),  # 1 h on on-demand, then climb
        WorkersAcquired(7200, 1), seen(9000, n=2, remaining=None),  # 0.5 h on spot with 1, grow
        WorkersAcquired(9000, 2), Finished(10800),  # 0.5 h on spot with 2
    ]
    state, records = policy.initial_state(), []
    for i, ev in enumerate(events):
        step = policy.decide(state, ev)
        records.append(LedgerRecord(id=str(i), writer="w", tier=state.tier, event=ev, decision=step.decision.to_json()))
        state = step.state
    assert [r.decision["action"] for r in records if r.event.kind == "capacity_observed"] == ["climb_back", "resize"]
    summary = summarize(ladder, records)
    assert summary.status == "finished" and summary.climbs == [(7200, 1, 0)] and summary.resizes == [(9000, 0, 2)]
    assert summary.tiers[0].running_s == pytest.approx(2 * 3600) and summary.tiers[1].running_s == pytest.approx(3600)
    assert summary.tiers[0].spend == pytest.approx(2 * 1 + 0.5 * 1 + 0.5 * 2)
    assert summary.tiers[1].spend == pytest.approx(6.0)
    assert [seg[0] for seg in summary.segments] == [0, 1, 0, 0]


# -- simulator --------------------------------------------------------------------------


def test_capacity_observations_change_nothing_on_a_one_way_ladder_and_climbing_pays():
    import numpy as np

    from spotfallback.sim.job import JobSpec
    from spotfallback.sim.planner import load_process
    from spotfallback.sim.simulate import simulate
    from spotfallback.sim.world import world_for

    trace = load_process(str(Path(__file__).resolve().parents[1] / "fixtures" / "us-west-2a_v100_1.json"))
    job = JobSpec(work_h=20, checkpoint_interval_h=0.5, checkpoint_cost_h=0.05, restart_overhead_h=0.1,
                  provisioning_delay_h=0.05, notice_s=120, deadline_h=60)
    one_way = [Tier.spot(4, max_preemptions=2, capacity_timeout_s=1800, price_per_worker_hour=0.9),
               Tier.on_demand(4, price_per_worker_hour=3.06)]
    world = world_for(one_way, trace)
    ref = simulate(one_way, job, world, runs=200, seed=1, engine="policy")
    # A ladder that may climb back makes the engine observe capacity while the run runs (as the
    # controller shell does); with a dwell no run reaches, it must not move it.
    never = [one_way[0].model_copy(update={"climb_back": True, "min_dwell_s": 1e9}), one_way[1]]
    new = simulate(never, job, world, runs=200, seed=1, engine="policy")
    for metric in ("status", "preemptions", "switches", "final_tier"):
        assert np.array_equal(getattr(ref, metric), getattr(new, metric)), metric
    for metric in ("wall_h", "spend", "lost_work_h"):
        np.testing.assert_allclose(getattr(ref, metric), getattr(new, metric), rtol=1e-9, atol=1e-9)
    climbing = [one_way[0].model_copy(update={"climb_back": True, "min_dwell_s": 3600.0}), one_way[1]]
    res = simulate(climbing, job, world, runs=200, seed=1, engine="policy")  # observes capacity, climbs back
    assert res.mean_spend < 0.9 * ref.mean_spend
    assert res.deadline_probability() >= ref.deadline_probability()
    assert res.switches.max() > 1  # it did climb, and more than once in some runs
    fast = simulate(climbing, job, world, runs=200, seed=1, engine="fast")  # climbing is vectorised too
    np.testing.assert_allclose(fast.spend, res.spend, rtol=1e-9, atol=1e-9)
    bursty = [Tier.spot(4, max_preemptions=2, max_preemption_rate={"count": 2, "window_s": 600}), one_way[1]]
    with pytest.raises(ValueError, match="engine='policy'"):
        simulate(bursty, job, world, runs=10, engine="fast")


# -- the controller shell's own logic (no cluster needed) -------------------------------


def test_label_selector_matching_follows_ray_semantics():
    from spotfallback.notices.placement import selector_matches, workers_on_node

    labels = {"ray.io/market-type": "spot", "ray.io/availability-zone": "us-east-1a"}
    assert selector_matches({"ray.io/market-type": "spot"}, labels)
    assert not selector_matches({"ray.io/market-type": "on-demand"}, labels)
    assert selector_matches({"ray.io/availability-zone": "in(us-east-1a,us-east-1b)"}, labels)
    assert not selector_matches({"ray.io/availability-zone": "!in(us-east-1a)"}, labels)
    assert selector_matches({"ray.io/node-group": "!gpu"}, labels)  # absent key: not equal
    assert workers_on_node({"CPU": 8.0, "GPU": 2.0}, {"CPU": 2.0, "GPU": 1.0}) == 2


def test_capacity_watch_observes_only_after_a_checkpoint_of_the_running_gang():
    from spotfallback.events import CheckpointCommitted
    from spotfallback.policy import DEFAULT_RESTART_S
    from spotfallback.runtime.capacity import CapacityWatch

    watch = CapacityWatch()
    watch.poll_s, watch.after_checkpoint_s = 5.0, 30.0
    assert not watch.due(100.0, running_since=50.0)  # no checkpoint yet
    watch.record(CheckpointCommitted(40.0, remaining_work_s=900), Continue())
    assert not watch.due(100.0, running_since=50.0)  # that checkpoint was the previous gang's
    watch.record(CheckpointCommitted(90.0, remaining_work_s=800), Continue())
    assert watch.due(100.0, running_since=50.0) and not watch.due(102.0, running_since=50.0)  # throttled
    assert not watch.due(200.0, running_since=50.0)  # too long after the checkpoint
    assert watch.remaining_work_s == 800 and watch.checkpoint_interval_s == 50.0
    assert watch.restart_s == DEFAULT_RESTART_S
    watch.record(Preempted(210.0), Retry(tier=0))
    watch.record(WorkersAcquired(235.0, 2), Continue())
    assert watch.restart_s == 25.0 and watch.checkpoints == []


def test_the_work_left_now_counts_from_the_running_gangs_latest_report():
    from spotfallback.events import CheckpointCommitted
    from spotfallback.runtime.capacity import CapacityWatch

    watch = CapacityWatch()
    assert watch.remaining_now_s(100.0, running_since=50.0) is None  # nothing reported
    watch.record(CheckpointCommitted(90.0, remaining_work_s=800), Continue())
    assert watch.remaining_now_s(100.0, running_since=50.0) == 790.0  # from the commit
    watch.reported(120.0, 760.0)  # a plain report: further along than the commit says
    assert watch.remaining_now_s(130.0, running_since=50.0) == 750.0
    watch.reported(140.0, None)  # a report without the metric changes nothing
    assert watch.remaining_now_s(130.0, running_since=50.0) == 750.0
    watch.record(Preempted(150.0), Retry(tier=0))
    watch.record(WorkersAcquired(170.0, 2), Continue())
    # The next gang resumes from the commit (800 s left): until it reports, its time since the start counts.
    assert watch.remaining_now_s(200.0, running_since=170.0) == 770.0
    watch.reported(230.0, 790.0)  # the restore took most of it
    assert watch.remaining_now_s(240.0, running_since=170.0) == 780.0
    assert watch.remaining_now_s(2000.0, running_since=170.0) == 0.0


def test_no_climb_when_the_deadline_slack_cannot_absorb_a_failed_climb():
    policy = climbing_ladder()
    state, _ = run(policy, on_demand_after_budget())
    tight = CapacityObserved(420, tier=0, available_workers=2, remaining_work_s=36000, restart_s=60, slack_s=300)
    pays, why = policy.climb_pays(state, tight)
    assert not pays and "slack" in why
    assert policy.decide(state, tight).decision == Continue()
    roomy = CapacityObserved(420, tier=0, available_workers=2, remaining_work_s=36000, restart_s=60, slack_s=36000)
    assert isinstance(policy.decide(state, roomy).decision, ClimbBack)


# -- deadline guard: Uniform Progress as a leave rule and a climb test -------------------

H = 3600.0


def guarded(pace: float = 1.0, climb: bool = False, timeout: float | None = None, **extra: object) -> FallbackPolicy:
    """Spot with a guard: 5 h of work due 10 h after the start (line slope 1/2), margin 0.5 h."""
    guard = {"deadline_h": 10, "work_h": 5, "pace": pace, "margin_h": 0.5}
    spot = Tier.spot(2, max_preemptions=-1, capacity_timeout_s=timeout, price_per_worker_hour=1.0,
                     deadline_guard=guard, climb_back=climb, min_dwell_s=0, **extra)
    return FallbackPolicy([spot, Tier.on_demand(2, price_per_worker_hour=3.0)])


def one_hour_done() -> list[Event]:
    """1 h of the 5 h committed at t = 1 h: on schedule until 2 h, behind by the margin at 2.5 h."""
    return [RunStarted(0), WorkersAcquired(60, 2), CheckpointCommitted(H, remaining_work_s=4 * H)]


def test_guard_leaves_after_a_failure_only_once_behind_schedule():
    policy = guarded()
    state, decisions = run(policy, [*one_hour_done(), Preempted(2.4 * H)])
    assert isinstance(decisions[-1], Retry) and state.started_at == 0 and state.remaining_work_s == 4 * H
    state, decisions = run(policy, [*one_hour_done(), Preempted(2.6 * H)])
    assert isinstance(decisions[-1], SwitchTier) and "behind schedule" in decisions[-1].reason
    assert state.tier == 1 and "deadline_h=10" in state.stats[0].left_reason


def test_a_shrunk_gang_behind_schedule_moves_down_while_running_but_the_last_tier_is_never_given_up():
    guard = {"deadline_h": 10, "work_h": 5, "pace": 1.0, "margin_h": 0.5}
    spot = Tier.spot((2, 4), max_preemptions=-1, capacity_timeout_s=None, deadline_guard=guard, min_dwell_s=0,
                     price_per_worker_hour=1.0)
    # 9 h left for 2 workers is 4.5 h of the full gang's work: 0.5 h done, due by 1 h (+ 0.5 h margin).
    start = [RunStarted(0), WorkersAcquired(60, 2), CheckpointCommitted(H, remaining_work_s=9 * H)]
    still_two = CapacityObserved(1.6 * H, tier=0, available_workers=2, remaining_work_s=9 * H, restart_s=60)
    two_tiers = FallbackPolicy([spot, Tier.on_demand(4, price_per_worker_hour=3.0)])
    state, _ = run(two_tiers, start)
    step = two_tiers.decide(state, still_two)
    assert isinstance(step.decision, SwitchTier) and "running 2 of 4 workers" in step.decision.reason
    assert step.state.tier == 1 and step.state.running_since is None
    alone = FallbackPolicy([spot])
    state, _ = run(alone, start)
    step = alone.decide(state, still_two)
    assert not isinstance(step.decision, SwitchTier | GiveUp) and step.state.status == "running"


def test_a_guard_on_the_last_tier_neither_cuts_its_wait_nor_stops_a_late_run():
    """With no tier below, such a guard could only end a run that would finish late, its progress unused."""
    guard = {"deadline_h": 10, "work_h": 5, "pace": 1.0, "margin_h": 0.5}
    policy = FallbackPolicy([Tier.on_demand(2, price_per_worker_hour=3.0, capacity_timeout_s=None, deadline_guard=guard)])
    state, decisions = run(policy, [*one_hour_done(), NodeFailed(9.8 * H)])  # 4 h left, 0.2 h to the deadline
    assert isinstance(decisions[-1], Retry) and policy.capacity_deadline(state) is None
    state, decisions = run(policy, [*one_hour_done(), NodeFailed(9.8 * H), WorkersAcquired(12 * H, 2)])
    assert state.status == "running"
    # Above it, the same guard still moves the run down.
    two = FallbackPolicy([Tier.spot(2, max_preemptions=-1, capacity_timeout_s=None, price_per_worker_hour=1.0,
                                    deadline_guard=guard),
                          Tier.on_demand(2, price_per_worker_hour=3.0, capacity_timeout_s=None, deadline_guard=guard)])
    state, decisions = run(two, [*one_hour_done(), NodeFailed(9.8 * H)])
    assert isinstance(decisions[-1], SwitchTier) and two.capacity_deadline(state) is None


def test_guard_cuts_the_capacity_wait_where_the_run_would_fall_behind():
    policy = guarded()
    state, _ = run(policy, [*one_hour_done(), Preempted(2 * H)])
    assert policy.capacity_deadline(state) == pytest.approx(2.5 * H)  # progress frozen: 2 h + margin
    step = policy.decide(state, CapacityTimedOut(2.5 * H, waited_s=0.5 * H))
    assert isinstance(step.decision, SwitchTier) and "behind schedule" in step.decision.reason
    # A capacity timeout that comes first is still a capacity timeout.
    timed = guarded(timeout=600)
    state, _ = run(timed, [*one_hour_done(), Preempted(2 * H)])
    assert timed.capacity_deadline(state) == 2 * H + 600
    step = timed.decide(state, CapacityTimedOut(2 * H + 600, waited_s=600))
    assert "capacity_timeout_s=600" in step.decision.reason


def test_slack_rule_alone_waits_as_long_as_the_deadline_allows():
    policy = guarded(pace=0.0)
    state, decisions = run(policy, [*one_hour_done(), Preempted(5.4 * H)])
    assert isinstance(decisions[-1], Retry)  # 10 h - 4 h left - 0.5 h margin = 5.5 h
    assert policy.capacity_deadline(state) == pytest.approx(5.5 * H)
    _, decisions = run(policy, [*one_hour_done(), Preempted(5.6 * H)])
    assert isinstance(decisions[-1], SwitchTier) and "slack" in decisions[-1].reason


def test_guard_stops_waiting_a_first_commit_early_so_a_gang_lost_before_it_commits_keeps_the_margin():
    policy = guarded(pace=0.0)
    lead = FallbackPolicy([policy.tiers[0].model_copy(update={"deadline_guard": policy.tiers[0].deadline_guard
                                                            .model_copy(update={"first_commit_h": 1.0})}),
                           policy.tiers[1]])
    state, _ = run(lead, [*one_hour_done(), Preempted(2 * H)])
    assert lead.capacity_deadline(state) == pytest.approx(4.5 * H)  # 10 - 4 left - 0.5 margin - 1 lead
    step = lead.decide(state, CapacityTimedOut(4.5 * H, waited_s=2.5 * H))
    assert isinstance(step.decision, SwitchTier) and "first commit (1.00 h)" in step.decision.reason
    # A gang up just before the cut-off, lost just before its first commit: the margin is still there.
    lost_at = 5.5 * H - 2  # its first commit was due at 4.5 h - 1 s + 1 h
    state, decisions = run(lead, [*one_hour_done(), Preempted(2 * H), WorkersAcquired(4.5 * H - 1, 2),
                                  Preempted(lost_at)])
    assert 10 * H - lost_at - state.remaining_work_s >= 0.5 * H
    assert lead.capacity_deadline(state) == lost_at  # no new gang: it leaves with the margin intact
    # The lead is only for starting a gang: one that runs is left where the slack alone says.
    state, decisions = run(lead, [*one_hour_done(), Preempted(5.4 * H)])
    assert isinstance(decisions[-1], Retry) and lead.capacity_deadline(state) == 5.4 * H


def test_climbing_back_to_a_guarded_tier_needs_the_lead_ahead_too():
    def policy(first_commit_h: float) -> FallbackPolicy:
        base = guarded(climb=True)
        g = base.tiers[0].deadline_guard
        assert g is not None
        spot = base.tiers[0].model_copy(update={"deadline_guard": g.model_copy(update={"first_commit_h": first_commit_h})})
        return FallbackPolicy([spot, base.tiers[1]])

    events = [*one_hour_done(), Preempted(2.6 * H), WorkersAcquired(2.7 * H, 2)]
    # Schedule 5 h for 2.5 h left at 4 h: ahead by 1 h, more than two restarts (20 min) ...
    for lead, climbs in ((0.0, True), (0.6, True), (0.7, False)):  # ... and than a lead of 0.6 h, not 0.7 h
        p = policy(lead)
        state, _ = run(p, events)
        step = p.decide(state, seen(4 * H, remaining=2.5 * H, restart=600))
        assert isinstance(step.decision, ClimbBack) is climbs, lead


def test_guard_without_progress_reports_assumes_nothing_was_done():
    policy = guarded()
    state, _ = run(policy, [RunStarted(0), WorkersAcquired(60, 2), Preempted(0.4 * H)])
    assert policy.capacity_deadline(state) == pytest.approx(0.5 * H)  # 0 done: the margin only
    late_start = [RunStarted(0), RunStarted(7 * H)]  # a driver restart keeps the first start
    state, _ = run(policy, late_start)
    assert state.started_at == 0 and policy.capacity_deadline(state) == 7 * H  # already behind: now


def test_climbs_back_to_a_guarded_tier_only_when_ahead_by_two_restarts():
    policy = guarded(climb=True)
    events = [*one_hour_done(), Preempted(2.6 * H), WorkersAcquired(2.7 * H, 2)]
    state, _ = run(policy, events)
    # 1.5 h done by 3 h: on schedule exactly, not two restarts (2 x 600 s) ahead of it.
    assert policy.decide(state, seen(3 * H, remaining=3.5 * H, restart=600)).decision == Continue()
    step = policy.decide(state, seen(4 * H, remaining=2.5 * H, restart=600))  # schedule 5 h >= 4 h 20 min
    assert isinstance(step.decision, ClimbBack) and "ahead of schedule" in step.decision.reason
    assert step.state.remaining_work_s == 2.5 * H
    # Never when the slack is down to the margin, however far ahead of the line.
    late = policy.decide(state, seen(6.9 * H, remaining=2.8 * H, restart=600))
    assert late.decision == Continue()


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(60.0, 1800.0), st.sampled_from(["seen", "gone", "preempt"])),
                      min_size=1, max_size=60))
def test_guarded_climbs_never_flap_under_alternating_availability(steps):
    """Between leaving a guarded tier (behind schedule) and climbing back to it (two restarts
    ahead), the run must gain margin + two restarts of schedule: at least 40 min here."""
    policy = guarded(pace=1.0, climb=True)
    state = policy.decide(policy.initial_state(), RunStarted(0)).state
    state = policy.decide(state, WorkersAcquired(1, 2)).state
    t, done, last_change, changes = 1.0, 0.0, None, 0
    for gap, what in steps:
        t += gap
        if state.running_since is not None:
            done += gap  # work advances only while a gang runs
        remaining = max(5 * H - done, 0.0)
        if what == "preempt" and state.running_since is not None:
            state = policy.decide(state, CheckpointCommitted(t - 1, remaining_work_s=remaining)).state
            step = policy.decide(state, Preempted(t))
        else:
            step = policy.decide(state, seen(t, tier=0, n=2 if what == "seen" else 0, remaining=remaining, restart=600))
        if isinstance(step.decision, ClimbBack | SwitchTier):
            if isinstance(step.decision, ClimbBack):
                assert last_change is not None and t - last_change >= 0.5 * H + 1200 - 1e-6
            last_change, changes = t, changes + 1
        state = step.state
        if state.waiting_since is not None:
            t += 30.0
            state = policy.decide(state, WorkersAcquired(t, 2)).state


def reserved(reserve_h: float) -> FallbackPolicy:
    """``guarded(pace=0, climb=True)`` whose guard keeps ``reserve_h`` of slack for climbing back."""
    base = guarded(pace=0.0, climb=True)
    g = base.tiers[0].deadline_guard
    assert g is not None
    spot = base.tiers[0].model_copy(update={"deadline_guard": g.model_copy(update={"reserve_h": reserve_h})})
    return FallbackPolicy([spot, base.tiers[1]])


def test_a_reserve_leaves_early_enough_to_climb_back_when_capacity_returns():
    # 4 h left at 2 h; on-demand from there keeps the slack where it left.
    for reserve, leave_h, climbs in ((0.0, 5.5, False), (1.0, 4.5, True)):
        policy = reserved(reserve)
        events: list[Event] = [*one_hour_done(), Preempted(2 * H)]
        state, _ = run(policy, events)
        assert policy.capacity_deadline(state) == pytest.approx(leave_h * H)  # 10 - 4 left - 0.5 margin - reserve
        events += [CapacityTimedOut(leave_h * H, waited_s=(leave_h - 2) * H)]
        _, decisions = run(policy, events)
        assert isinstance(decisions[-1], SwitchTier) and ("reserve_h=1" in decisions[-1].reason) is climbs
        # Spot is back 0.5 h later, with 0.5 h of the work done on on-demand: the same slack as on leaving.
        events += [WorkersAcquired(leave_h * H + 60, 2), seen((leave_h + 0.5) * H, remaining=3.5 * H, restart=600)]
        state, decisions = run(policy, events)
        assert isinstance(decisions[-1], ClimbBack) is climbs
    # The climb spends the reserve: its own gang is given the margin to come up (not the 6 h the margin
    # alone would allow, 10 - 3.5 left - 0.5, nor the 5 h the reserve would), and runs on the margin alone.
    assert policy.just_climbed(state) and policy.capacity_deadline(state) == pytest.approx(5.5 * H)
    _, decisions = run(policy, [*events, CapacityTimedOut(5.5 * H, waited_s=0.5 * H)])  # gone again before it came up
    assert isinstance(decisions[-1], SwitchTier) and "reserve_h=1" in decisions[-1].reason
    events += [WorkersAcquired(5.1 * H, 2), seen(5.5 * H, remaining=3.2 * H, restart=600)]  # slack 1.3 h
    state, decisions = run(policy, events)
    assert not policy.just_climbed(state) and not isinstance(decisions[-1], SwitchTier) and state.tier == 0
    # Its next failure finds less than the margin and the reserve: it leaves at once, without waiting.
    events += [CheckpointCommitted(5.9 * H, remaining_work_s=3.0 * H), Preempted(6 * H)]
    state, decisions = run(policy, events)
    assert isinstance(decisions[-1], SwitchTier) and "reserve_h=1" in decisions[-1].reason and state.tier == 1


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(60.0, 1800.0), st.sampled_from(["seen", "gone", "preempt"])),
                      min_size=1, max_size=60), reserve=st.sampled_from([0.5, 1.0, 2.0]))
def test_a_reserve_climbs_only_with_the_margin_and_two_restarts_of_slack_and_is_on_time(steps, reserve):
    """Whatever the availability, every climb to a reserve guard leaves the margin for a fall after
    its two restarts, and the run never waits on spot past the margin: it finishes on time."""
    policy = reserved(reserve)
    state = policy.decide(policy.initial_state(), RunStarted(0)).state
    state = policy.decide(state, WorkersAcquired(1, 2)).state
    t, done = 1.0, 0.0
    for gap, what in steps:
        deadline_at = policy.capacity_deadline(state)
        if deadline_at is not None and t + gap >= deadline_at:  # the wait ends at the guard's cut-off
            t = max(deadline_at, t)
            state = policy.decide(state, CapacityTimedOut(t, waited_s=0.0)).state
        else:
            t += gap
            if state.running_since is not None:
                done += gap
            remaining = max(5 * H - done, 0.0)
            if what == "preempt" and state.running_since is not None and state.tier == 0:
                state = policy.decide(state, CheckpointCommitted(t - 1, remaining_work_s=remaining)).state
                step = policy.decide(state, Preempted(t))
            else:
                step = policy.decide(state, seen(t, tier=0, n=2 if what == "seen" else 0, remaining=remaining, restart=600))
            if isinstance(step.decision, ClimbBack):
                assert 10 * H - t - remaining >= 0.5 * H + 1200 - 1e-6
            state = step.state
        # Capacity comes up 30 s later: on-demand always, spot when it was just seen.
        if state.waiting_since is not None and (state.tier == 1 or what == "seen"):
            t += 30.0
            state = policy.decide(state, WorkersAcquired(t, 2)).state
    assert 10 * H - t - max(5 * H - done, 0.0) >= 0.0  # on time from here, on on-demand at the latest


def test_deadline_guard_config_is_validated_and_round_trips():
    tier = guarded().tiers[0]
    assert Tier.model_validate(tier.model_dump(mode="json")) == tier
    assert "deadline_guard" not in Tier.spot(2).model_dump()  # unused: left out of files
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.deadline_guard\.pace"):
        make_ladder([{"name": "s", "market": "spot", "num_workers": 1,
                      "deadline_guard": {"deadline_h": 5, "work_h": 4, "pace": 1.5}}])
    with pytest.raises(ConfigError, match="deadline_guard.work_h"):
        make_ladder([{"name": "s", "market": "spot", "num_workers": 1, "deadline_guard": {"deadline_h": 5}}])


# -- expected-cost exit -------------------------------------------------------------------


def stormy(n_preemptions: int, exit_on: bool = True, remaining: float | None = 2 * H) -> tuple[FallbackPolicy, list]:
    """Spot (1/worker-h) then on-demand (3/worker-h), 2 workers each. The first gang commits
    400 s and 700 s after its start (restore 100 s, interval 300 s) and loses 90 s of work;
    then the gangs are preempted 90 s after they start, before any commit."""
    spot = Tier.spot(2, max_preemptions=-1, price_per_worker_hour=1.0, expected_cost_exit=exit_on)
    policy = FallbackPolicy([spot, Tier.on_demand(2, price_per_worker_hour=3.0)])
    events: list[Event] = [RunStarted(0), WorkersAcquired(100, 2),
                           CheckpointCommitted(500, remaining_work_s=remaining), CheckpointCommitted(800, remaining_work_s=remaining)]
    t = 890.0
    for _ in range(n_preemptions):
        events += [Preempted(t), WorkersAcquired(t + 600, 2)]  # waiting 600 s for capacity costs nothing
        t += 690.0
    return policy, events[:-1]


def test_expected_cost_exit_leaves_when_the_observed_rate_makes_spot_dearer():
    from spotfallback.policy import EXIT_PRIOR_H, expected_cost

    policy, events = stormy(1)
    state, decisions = run(policy, events)
    assert isinstance(decisions[-1], Retry)
    assert (state.restore_s, state.checkpoint_interval_s, state.lost_s, state.interruptions) == (100, 300, 90, 1)
    lo, hi = 1, 400  # the first storm long enough to leave: bisect on the number of preemptions
    while hi - lo > 1:
        mid = (lo + hi) // 2
        left, _ = run(*stormy(mid))
        lo, hi = (lo, mid) if left.tier == 1 else (mid, hi)
    n = hi
    policy, events = stormy(n)
    state, decisions = run(policy, events)
    assert isinstance(decisions[-1], SwitchTier) and "expected cost of staying" in decisions[-1].reason
    # It leaves exactly where staying costs more than moving, by the model: 190 s wasted per
    # interruption (100 s restore + 90 s of lost work), the waits for capacity not counted,
    # the rate over the run's running hours plus four calm ones.
    assert 50 < n < 200
    waste_h = 190 / H
    for k, leaves in ((n - 1, False), (n, True)):
        policy, events = stormy(k)
        before, _ = run(policy, events)
        stay = expected_cost(2.0, policy.observed_interruption_rate(before, 0, EXIT_PRIOR_H), waste_h, 2.0)
        assert (stay > 6.0 * 100 / H + 6.0 * 2.0) == leaves
    # The same storm without the exit, or without progress reports, stays on spot.
    for quiet in (stormy(n, exit_on=False), stormy(n, remaining=None)):
        _, decisions = run(*quiet)
        assert isinstance(decisions[-1], Retry)
