"""The simulator: closed-form regime, engine equivalence, trace replay, checkpoints, baselines."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotfallback.config import Ladder, Tier
from spotfallback.events import (
    CheckpointCommitted,
    Continue,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy, PreemptionBudget
from spotfallback.sim.baselines import simulate_uniform_progress
from spotfallback.sim.costmodel import (
    daly_interval,
    exact_accounting,
    seed_closed_form,
    young_interval,
)
from spotfallback.sim.job import JobSpec, cycle_progress, wall_to_finish
from spotfallback.sim.results import FAILED, FINISHED, STUCK
from spotfallback.sim.simulate import simulate, simulate_many, simulated_optimal_interval
from spotfallback.sim.traces import (
    NodeEvent,
    NodeTrace,
    SpotTrace,
    load_node_trace,
    load_spot_trace,
)
from spotfallback.sim.world import (
    RateModel,
    ScriptedModel,
    compile_node_trace,
    compile_spot_trace,
    complement_trace,
    gating_note,
    world_for,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPOT = load_spot_trace(FIXTURES / "us-west-2a_v100_1.json")
SPOT4 = load_spot_trace(FIXTURES / "us-east-1f_v100_4node.json")
NODES = load_node_trace(FIXTURES / "aws-p3-trace.csv")


def two_tier(m: int, workers: int = 1, timeout: float | None = 600.0, spot_price: float = 0.1, od_price: float = 1.0) -> Ladder:
    return Ladder(
        tiers=(
            Tier.spot(workers, max_preemptions=m, capacity_timeout_s=timeout, price_per_worker_hour=spot_price),
            Tier.on_demand(workers, price_per_worker_hour=od_price),
        )
    )


# ---------------------------------------------------------------------------------------
# The closed form's regime: M failures, each costing dt, no lost work.


def test_seed_worked_example_replayed_exactly():
    # 3 h of the 5 h on spot over 5 preemptions, 0.2 h restart each: the seed's example, plus
    # the first start, which pays the 0.2 h like every restart (the seed leaves it out).
    ladder = two_tier(m=4)  # the 5th preemption leaves spot
    world = [ScriptedModel(uptimes_h=(0.8, 0.8, 0.8, 0.8, 0.8)), RateModel()]
    job = JobSpec(work_h=5, restart_overhead_h=0.2)
    res = simulate(ladder, job, world, runs=1, engine="policy")
    out = res.outcome(0)
    assert out["status"] == "finished"
    assert out["preemptions"] == 5 and out["switches"] == 1
    assert out["wall_h"] == pytest.approx(5 + 6 * 0.2)
    assert out["work_on_spot_h"] == pytest.approx(3.0)
    assert out["lost_work_h"] == 0
    # Six overheads: the first start and four restarts on spot, the fallback's on on-demand.
    exact = exact_accounting(5, 0.6, 6, 0.2, restarts_on_spot=5)
    assert out["spend"] == pytest.approx(exact.cost)  # 2.60: the seed's 2.58 plus the first start on spot
    assert exact.cost == pytest.approx(exact_accounting(5, 0.6, 5, 0.2).cost + 0.2 * 0.1)
    assert out["spot_h"] == pytest.approx(exact.spot_hours)
    alpha_time = float(res.alpha[0])
    assert seed_closed_form(5, alpha_time, 6, 0.2).cost_new == pytest.approx(out["spend"], rel=1e-9)
    # The seed's formula with alpha as the share of *work* overstates the spend by ~10%.
    assert seed_closed_form(5, 0.6, 6, 0.2).cost_new / out["spend"] == pytest.approx(2.852 / 2.6)


@pytest.mark.parametrize("m_failures", [1, 3, 6])
def test_monte_carlo_matches_closed_form_within_one_percent(m_failures):
    # Frequent preemptions guarantee M of them before the work is done; checkpoints are free,
    # so even a zero notice covers a just-in-time one and nothing is lost. (A longer notice
    # would add the hold between notice and kill to every failure.) The closed form also
    # assumes each failure costs the full dt: runs where a preemption cut a restart short
    # are outside its regime.
    work, dt = 20.0, 0.05
    ladder = two_tier(m=m_failures - 1, workers=4, od_price=1.0, spot_price=0.1)
    world = world_for(ladder, RateModel(preemptions_per_node_hour=0.25))
    job = JobSpec(work_h=work, restart_overhead_h=dt, notice_s=0)
    res = simulate(ladder, job, world, runs=4000, seed=7)
    assert (res.status == FINISHED).all() and (res.preemptions == m_failures).all()
    assert res.lost_work_h.max() == 0
    # The first start pays dt too: M + 1 overheads, all but the fallback's on spot.
    regime = np.isclose(res.wall_h, work + (m_failures + 1) * dt)
    assert regime.mean() > 0.7
    assert (res.wall_h[~regime] < work + (m_failures + 1) * dt).all()
    c_o = 4.0  # on-demand price of the gang
    spend = float(res.spend[regime].mean())
    alpha = float(res.alpha[regime].mean())
    closed = seed_closed_form(work, alpha, m_failures + 1, dt, on_demand_price=c_o)
    assert spend == pytest.approx(closed.cost_new, rel=0.01)
    alpha_work = float(res.work_on_spot_h[regime].mean()) / work
    exact = exact_accounting(work, alpha_work, m_failures + 1, dt, on_demand_price=c_o, restarts_on_spot=m_failures)
    assert spend == pytest.approx(exact.cost, rel=0.01)


# ---------------------------------------------------------------------------------------
# The fast engine gives the policy engine's outcomes, run by run.

TRACES = {"spot": SPOT, "spot4": SPOT4, "complement": complement_trace(SPOT), "nodes": NODES}


@st.composite
def scenarios(draw):
    n_tiers = draw(st.integers(1, 3))
    workers = draw(st.sampled_from([1, 2, 4, 8]))
    work_h = draw(st.sampled_from([1.0, 7.5, 40.0]))
    tiers, world = [], []
    across = draw(st.booleans())  # tiers on two Ray clusters: moves between them (climbs included) cost more
    for i in range(n_tiers):
        spot = i < n_tiers - 1 or draw(st.booleans())
        kw = dict(
            name=f"t{i}",
            market="spot" if spot else "on-demand",
            num_workers=workers,
            max_preemptions=draw(st.sampled_from([-1, 0, 1, 2, 5])),
            max_failures=draw(st.sampled_from([-1, 0, 1, 3])),
            capacity_timeout_s=draw(st.sampled_from([None, 300.0, 1800.0, 7200.0])),
            price_per_worker_hour=draw(st.sampled_from([0.3, 1.0, 3.0])),
        )
        if draw(st.booleans()):  # a deadline guard, round numbers and all (ties must break alike)
            kw["deadline_guard"] = dict(
                deadline_h=work_h * draw(st.sampled_from([1.1, 1.5, 3.0])),
                work_h=work_h * draw(st.sampled_from([1.0, 1.05])),
                pace=draw(st.sampled_from([0.0, 0.5, 1.0])),
                margin_h=draw(st.sampled_from([0.0, 0.25, 0.7])),
                first_commit_h=draw(st.sampled_from([0.0, 0.0, 0.4, 1.25])),
                reserve_h=draw(st.sampled_from([0.0, 0.0, 0.5, 2.0])),
            )
        if across:
            c = draw(st.sampled_from([0, 1]))
            kw["cluster"] = {"address": f"http://head-{c}:8265", "name": f"c{c}"}
        if i < n_tiers - 1 and draw(st.booleans()):
            kw.update(climb_back=True, min_dwell_s=draw(st.sampled_from([0.0, 600.0, 3600.0])),
                      climb_budgets=draw(st.sampled_from(["carry", "fresh"])))
        tiers.append(Tier(**kw))
        if spot and draw(st.booleans()):
            world.append(TRACES[draw(st.sampled_from(sorted(TRACES)))])
        else:
            world.append(
                RateModel(
                    preemptions_per_node_hour=draw(st.sampled_from([0.0, 0.01, 0.05, 0.3])) if spot else 0.0,
                    failures_per_node_hour=draw(st.sampled_from([0.0, 0.0, 0.005, 0.05])),
                    outage_probability=draw(st.sampled_from([0.0, 0.3, 1.0])) if spot else 0.0,
                    mean_outage_h=draw(st.sampled_from([0.1, 1.0, 4.0])),
                )
            )
    job = JobSpec(
        work_h=work_h,
        checkpoint_interval_h=draw(st.sampled_from([None, 0.3, 1.0, 2.5])),
        checkpoint_cost_h=draw(st.sampled_from([0.0, 0.02, 0.1])),
        restart_overhead_h=draw(st.sampled_from([0.0, 0.1, 0.3])),
        provisioning_delay_h=draw(st.sampled_from([0.0, 0.05, 0.5])),
        notice_s=draw(st.sampled_from([0.0, 30.0, 120.0, 600.0])),
        jit_checkpoint=draw(st.booleans()),
        checkpoint_on_request=draw(st.booleans()),
        move_restart_h=draw(st.sampled_from([0.0, 0.2])) if across else 0.0,
        move_cost=draw(st.sampled_from([0.0, 2.0])) if across else 0.0,
    )
    return Ladder(tiers=tuple(tiers)), job, world, draw(st.integers(0, 2**16))


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_engine_matches_policy_engine(scenario):
    """Budgets, capacity timeouts, deadline guards and climbing back: the same outcome, run by run.

    The policy engine feeds ``FallbackPolicy`` every event a shell would (commits with the
    remaining work, capacity observations at checkpoint ends); the fast engine re-implements
    its rules on arrays.
    """
    assert_engines_agree(*scenario)


# A draw whose last tier never lets the run finish (a large gang on the node trace, no checkpoints)
# retries until the horizon: at the simulator's default, 100x the work, one such draw of a 40 h job
# took 40 s. Five times the work still holds every drawn guard's deadline (at most 3x) and ends such
# runs stuck in both engines alike.
HORIZON_WORKS = 5.0


def assert_engines_agree(ladder, job, world, seed: int, runs: int = 25) -> None:
    """The fast engine's runs are the policy engine's, run by run; a drawn gang too big for the node trace is skipped."""
    horizon_h = HORIZON_WORKS * job.work_h
    try:
        fast = simulate(ladder, job, world, runs=runs, seed=seed, engine="fast", horizon_h=horizon_h)
    except ValueError as e:  # a gang bigger than the node trace's cluster
        assert "never has" in str(e)
        return
    assert_same_runs(fast, simulate(ladder, job, world, runs=runs, seed=seed, engine="policy", horizon_h=horizon_h))


def assert_same_runs(fast, ref) -> None:
    for i in range(fast.runs):
        a, b = fast.outcome(i), ref.outcome(i)
        for key in a:
            if isinstance(a[key], float):
                assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-9), (i, key, a, b)
            else:
                assert a[key] == b[key], (i, key, a, b)


@pytest.mark.parametrize("on_request", [False, True])
@pytest.mark.parametrize("world_name", ["spot", "spot4", "nodes", "rate"])
@pytest.mark.parametrize(("pace", "climb", "m", "budgets", "lead", "reserve"),
                         [(1.0, True, -1, "carry", 0.0, 0.0), (0.0, True, 3, "carry", 0.0, 0.0),
                          (0.5, True, 2, "fresh", 0.0, 0.0), (1.0, False, -1, "carry", 0.0, 0.0),
                          (1.0, True, -1, "carry", 0.1 + 0.7 + 5 / 60, 0.0), (1.0, False, -1, "carry", 0.1 + 0.7 + 5 / 60, 0.0),
                          (0.0, True, -1, "carry", 0.1 + 0.7 + 5 / 60, 3.0), (0.0, True, 3, "carry", 0.0, 1.5)])
def test_fast_engine_matches_policy_engine_on_guarded_climbing_ladders(world_name, pace, climb, m, budgets, lead,
                                                                       reserve, on_request):
    """The planner's ladders, which the random scenarios above rarely reach: many climbs, at checkpoint
    ends or, for a gang that checkpoints on request, at any look."""
    job = JobSpec(work_h=24, checkpoint_interval_h=0.7, checkpoint_cost_h=5 / 60, restart_overhead_h=0.1,
                  provisioning_delay_h=0.05, notice_s=120, deadline_h=36, checkpoint_on_request=on_request)
    guard = {"deadline_h": 36, "work_h": float(wall_to_finish(24, 0.7, 5 / 60)), "pace": pace, "margin_h": 0.4,
             "first_commit_h": lead, "reserve_h": reserve}
    spot = Tier.spot(4, max_preemptions=m, capacity_timeout_s=None if m == -1 else 1800, price_per_worker_hour=0.9,
                     climb_back=climb, min_dwell_s=0 if pace else 600, climb_budgets=budgets, deadline_guard=guard)
    ladder = [spot, Tier.on_demand(4, price_per_worker_hour=3.06)]
    proc = {"rate": RateModel(preemptions_per_node_hour=0.05, outage_probability=0.3, mean_outage_h=1), **TRACES}[world_name]
    world = world_for(ladder, proc)
    fast = simulate(ladder, job, world, runs=60, seed=3, engine="fast")
    ref = simulate(ladder, job, world, runs=60, seed=3, engine="policy")
    assert_same_runs(fast, ref)
    assert fast.switches.max() > (1 if climb else 0)  # it did climb back (and the guard moved it)


def test_fast_engine_covers_every_outcome_kind():
    # The equivalence test above is only as good as the paths it exercises.
    ladder = Ladder(tiers=(Tier.spot(2, max_preemptions=1, capacity_timeout_s=1800),))
    res = simulate(ladder, JobSpec(work_h=30, checkpoint_interval_h=1, checkpoint_cost_h=0.05),
                   [RateModel(preemptions_per_node_hour=0.05, outage_probability=0.5, mean_outage_h=1)], runs=500)
    assert {FINISHED, FAILED} <= set(res.status.tolist())
    assert res.capacity_timeouts.sum() > 0
    never = world_for(two_tier(-1), SpotTrace("never", 60.0, np.zeros(10, dtype=np.int64)))
    for engine in ("fast", "policy"):
        stuck = simulate(two_tier(-1, timeout=None), JobSpec(work_h=1), never, runs=3, engine=engine, horizon_h=50)
        assert (stuck.status == STUCK).all() and (stuck.wall_h == 50).all() and stuck.spend.sum() == 0
    # Capacity that never lasts the provisioning delay (one 5-minute tick in four, 12 minutes to get workers)
    # is never had: the search ends at the horizon rather than looking for ever.
    blips = world_for(two_tier(-1), SpotTrace("blips", 300.0, np.array([1, 0, 0, 0], dtype=np.int64)))
    for engine in ("fast", "policy"):
        stuck = simulate(two_tier(-1, timeout=None), JobSpec(work_h=1, provisioning_delay_h=0.2), blips, runs=3,
                         engine=engine, horizon_h=50)
        assert (stuck.status == STUCK).all() and (stuck.wall_h == 50).all() and stuck.spend.sum() == 0
    # A run past the horizon while still making progress is stuck too, in both engines.
    slow = [RateModel(preemptions_per_node_hour=2.0), RateModel()]
    job = JobSpec(work_h=20, checkpoint_interval_h=5, checkpoint_cost_h=0.5)
    a = simulate(two_tier(-1, timeout=None), job, slow, runs=20, engine="fast", horizon_h=30)
    b = simulate(two_tier(-1, timeout=None), job, slow, runs=20, engine="policy", horizon_h=30)
    assert (a.status == STUCK).any()
    assert [a.outcome(i) for i in range(20)] == [b.outcome(i) for i in range(20)]


def test_custom_rules_use_the_policy_engine():
    ladder = two_tier(m=-1)
    policy = FallbackPolicy(ladder, rules=[PreemptionBudget(0), PreemptionBudget(-1)])
    world = world_for(ladder, RateModel(preemptions_per_node_hour=0.5))
    job = JobSpec(work_h=10)
    with pytest.raises(ValueError, match="default leave rules"):
        simulate(policy, job, world, runs=5, engine="fast")
    res = simulate(policy, job, world, runs=50, seed=1)  # auto picks the policy engine
    assert (res.preemptions <= 1).all() and res.switches.sum() == res.preemptions.sum()


def test_checkpoint_commits_change_measurements_not_budget_decisions():
    # The simulators feed only the last commits of each attempt (every periodic one would
    # cost a call each): sound because a commit only updates what the policy measures
    # (remaining work, interval), which the budgets and timeouts never read.
    policy = FallbackPolicy(two_tier(m=2))
    with_commits = policy.decide(policy.initial_state(), RunStarted(t=0)).state
    without = with_commits
    for k, ev in enumerate([WorkersAcquired(t=1), Preempted(t=2), WorkersAcquired(t=3), Preempted(t=4),
                            WorkersAcquired(t=5), Preempted(t=6), WorkersAcquired(t=7), Preempted(t=8)]):
        step = policy.decide(with_commits, CheckpointCommitted(t=ev.t - 0.5, step=k, remaining_work_s=100.0 - k))
        assert step.decision == Continue()
        a, b = policy.decide(step.state, ev), policy.decide(without, ev)
        assert a.decision == b.decision
        with_commits, without = a.state, b.state
    assert with_commits.remaining_work_s == 93.0 and without.remaining_work_s is None
    assert with_commits.checkpoint_interval_s is None  # no two commits of one gang here
    measurements = dict(checkpoints=0, remaining_work_s=None, last_checkpoint_t=None, first_commit_s=None,
                        lost_s=without.lost_s)
    assert replace(with_commits, **measurements) == without


# ---------------------------------------------------------------------------------------
# Checkpoints, notices, gangs


def test_cycle_progress_and_wall_to_finish_agree():
    tau, delta = 1.0, 0.25
    for w in (0.5, 1.0, 2.3, 5.0):
        x = float(wall_to_finish(w, tau, delta))
        done, committed = cycle_progress(x, tau, delta)
        assert float(done) == pytest.approx(w)
        assert committed <= done
    done, committed = cycle_progress(3.6, tau, delta)  # 2 cycles + 1.1 h: writing the 3rd
    assert (float(done), float(committed)) == pytest.approx((3.0, 2.0))


@pytest.mark.parametrize(("notice_s", "jit", "loses"), [(600, True, False), (60, True, True), (600, False, True)])
def test_just_in_time_checkpoint_needs_a_long_enough_notice(notice_s, jit, loses):
    ladder = Ladder(tiers=(Tier.spot(4, max_preemptions=-1, capacity_timeout_s=None),))
    job = JobSpec(work_h=20, checkpoint_interval_h=2, checkpoint_cost_h=0.1, notice_s=notice_s, jit_checkpoint=jit)
    res = simulate(ladder, job, [RateModel(preemptions_per_node_hour=0.05)], runs=300, seed=3)
    assert (res.status == FINISHED).all()
    assert (res.lost_work_h.sum() > 0) == loses


def test_gang_size_scales_the_interruption_rate():
    lam, work = 0.02, 50.0
    job = JobSpec(work_h=work)  # free checkpoints, R = 0: an interruption costs nothing
    means = {}
    for n in (1, 8):
        ladder = Ladder(tiers=(Tier.spot(n, max_preemptions=-1, capacity_timeout_s=None),))
        res = simulate(ladder, job, [RateModel(preemptions_per_node_hour=lam)], runs=4000, seed=5)
        np.testing.assert_allclose(res.wall_h, work)
        means[n] = float(res.preemptions.mean())
    assert means[1] == pytest.approx(lam * work, rel=0.1)
    assert means[8] == pytest.approx(8 * lam * work, rel=0.05)


def test_capacity_timeout_switches_tier_and_waiting_is_free():
    ladder = two_tier(m=3, timeout=1800.0)
    world = [ScriptedModel(uptimes_h=(1.0,), waits_h=(0.0, 2.0)), RateModel()]
    job = JobSpec(work_h=3.0, restart_overhead_h=0.1)
    out = simulate(ladder, job, world, runs=1, engine="policy").outcome(0)
    # 1 h on spot (0.1 h first start + 0.9 h work), preempted, 0.5 h waiting in vain, then
    # on-demand: 0.1 h restart + 2.1 h work.
    assert out["capacity_timeouts"] == 1 and out["switches"] == 1 and out["final_tier"] == 1
    assert out["wall_h"] == pytest.approx(1.0 + 0.5 + 0.1 + 2.1)
    assert out["billed_h"] == pytest.approx(1.0 + 2.2)
    assert out["spend"] == pytest.approx(1.0 * 0.1 + 2.2 * 1.0)


# ---------------------------------------------------------------------------------------
# Trace processes


def test_spot_trace_lookups():
    tr = SpotTrace("t", 3600.0, np.array([1, 1, 0, 0, 1, 1, 1, 1]))
    cap = compile_spot_trace(tr, num_workers=4)  # 1-instance trace gates the whole pool
    t = np.array([0.5, 2.5, 4.0, 7.9, 8.5])
    assert cap.is_ok(t).tolist() == [True, False, True, True, True]
    assert cap.next_available(t).tolist() == [0.5, 4.0, 4.0, 7.9, 8.5]
    assert cap.hit(np.array([0.5, 4.0, 8.5])).tolist() == [2.0, 10.0, 10.0]  # repeats with period 8 h
    four = compile_spot_trace(SpotTrace("f", 60.0, np.array([4, 2, 4])), num_workers=2)
    assert four.ok.tolist() == [True, True, True]
    assert compile_spot_trace(SpotTrace("f", 60.0, np.array([4, 2, 4])), num_workers=8).ok.tolist() == [True, False, True]


def test_a_trace_recorded_for_fewer_instances_than_the_gang_is_said_to_gate_the_whole_pool():
    tr = SpotTrace("one-node", 3600.0, np.array([1, 1, 0, 1]))
    note = gating_note(tr, 8)
    assert note is not None and note.startswith("trace 'one-node' records at most 1 instance(s), and the gang has 8 workers")
    assert gating_note(tr, 1) is None
    assert gating_note(SpotTrace("four", 60.0, np.array([4, 2, 4])), 4) is None
    assert gating_note(SpotTrace("never", 60.0, np.zeros(3, dtype=np.int64)), 8) is None  # gates nothing: never any
    assert gating_note(RateModel(), 8) is None


def test_node_trace_gang_holds_the_oldest_nodes():
    ev = (NodeEvent(0, "add", "a"), NodeEvent(0, "add", "b"), NodeEvent(0, "add", "c"),
          NodeEvent(60, "remove", "b"), NodeEvent(120, "add", "d"))
    cap = compile_node_trace(NodeTrace("tiny", ev), num_workers=2)
    assert cap.ok.tolist() == [True, True, True]
    # tick 0 holds a, b: b leaves at 60 s; later the gang holds a, c until the trace repeats
    # (period 180 s) and carries on as from tick 0, so it is next hit at 180 + 60 s.
    np.testing.assert_allclose(cap.hit_h * 3600, [60, 240, 240])
    with pytest.raises(ValueError, match="never has 5 nodes"):
        compile_node_trace(NodeTrace("tiny", ev), num_workers=5)


def test_a_runs_draws_do_not_depend_on_how_far_they_were_extended_at_a_time():
    from spotfallback.sim.draws import Draws

    whole, stepwise = Draws(5, seed=3), Draws(5, seed=3)
    whole.ensure(300)
    for col in range(0, 301, 7):
        stepwise.ensure(col)
    stepwise.ensure(300)
    assert whole.cols == stepwise.cols == 304
    for name in ("e_pre", "e_fail", "u_out", "e_out"):
        assert np.array_equal(getattr(whole, name)[:, :304], getattr(stepwise, name)[:, :304])
    # Each block of 16 columns comes from its own seed, in this order.
    rng = np.random.default_rng([3, 1 + 32 // 16])
    block = slice(32, 48)
    assert np.array_equal(whole.e_pre[:, block], rng.standard_exponential((5, 16)))
    assert np.array_equal(whole.e_fail[:, block], rng.standard_exponential((5, 16)))
    assert np.array_equal(whole.u_out[:, block], rng.random((5, 16)))
    assert np.array_equal(whole.e_out[:, block], rng.standard_exponential((5, 16)))


def test_trace_replays_start_at_random_ticks_and_are_reproducible():
    ladder = two_tier(m=-1, workers=8, timeout=None)
    job = JobSpec(work_h=24, checkpoint_interval_h=1, checkpoint_cost_h=0.05, restart_overhead_h=0.1)
    a = simulate(ladder, job, world_for(ladder, SPOT), runs=200, seed=11)
    b = simulate(ladder, job, world_for(ladder, SPOT), runs=200, seed=11)
    np.testing.assert_array_equal(a.wall_h, b.wall_h)
    assert len(np.unique(np.round(a.wall_h, 6))) > 50
    assert (a.wall_h >= 24).all() and (a.status == FINISHED).all()
    nodes = simulate(ladder, job, world_for(ladder, NODES), runs=200, seed=11)
    assert (nodes.status == FINISHED).all() and nodes.preemptions.mean() > 0


# ---------------------------------------------------------------------------------------
# Checkpoint interval: Young/Daly against the simulator's own optimum


def test_daly_interval_is_near_the_simulated_optimum():
    delta, mtbf_gang, workers = 0.1, 2.0, 4
    job = JobSpec(work_h=40, checkpoint_cost_h=delta, restart_overhead_h=0.05)
    daly = daly_interval(delta, mtbf_gang)
    taus = [0.2, 0.3, 0.4, daly, 0.8, 1.1, 1.6]
    best, means = simulated_optimal_interval(job, 1 / (mtbf_gang * workers), workers, taus, runs=1500, seed=2)
    assert daly / 1.5 <= best <= daly * 1.5
    assert means[taus.index(daly)] <= min(means) * 1.01
    young = young_interval(delta, mtbf_gang)
    assert daly < young < daly * 1.15  # Young's first-order value is a little long


# ---------------------------------------------------------------------------------------
# Uniform Progress baseline


@pytest.mark.parametrize("deadline", [101.0, 115.0, 150.0, 250.0])
@pytest.mark.parametrize("same_job", [False, True])
def test_uniform_progress_always_meets_a_feasible_deadline(deadline, same_job):
    # same_job: on-demand sessions checkpoint every tau too (the same training function as
    # the ladder's) and the safety net counts those writes in the time still needed.
    job = JobSpec(work_h=80, checkpoint_interval_h=0.75, checkpoint_cost_h=0.05, restart_overhead_h=0.1,
                  provisioning_delay_h=0.05, notice_s=120, deadline_h=deadline)
    spot = Tier.spot(8, price_per_worker_hour=0.9)
    od = Tier.on_demand(8, price_per_worker_hour=3.0)
    for world in (SPOT, RateModel(preemptions_per_node_hour=0.02, outage_probability=0.3, mean_outage_h=2.0)):
        res = simulate_uniform_progress(job, spot, od, world, runs=150, seed=4, checkpoint_on_demand=same_job)
        assert res.deadline_probability() == 1.0
        od_only = 8 * 3.0 * (0.05 + float(wall_to_finish(80, 0.75, 0.05)))
        assert res.spend.max() <= od_only * 1.05
        if deadline >= 150:
            assert res.mean_spend < 0.7 * od_only and res.alpha.mean() > 0.5
    # With no spot at all it keeps pace on on-demand alone; the same job pays its writes there.
    never = SpotTrace("never", 600.0, np.zeros(100, dtype=np.int64))
    res = simulate_uniform_progress(job, spot, od, never, runs=5, seed=4, checkpoint_on_demand=same_job)
    free = simulate_uniform_progress(job, spot, od, never, runs=5, seed=4)
    assert res.deadline_probability() == 1.0 and res.alpha.max() == 0
    assert (res.spend >= free.spend - 1e-9).all() if same_job else (res.spend == free.spend).all()


def test_uniform_progress_needs_a_deadline():
    with pytest.raises(ValueError, match="deadline"):
        simulate_uniform_progress(JobSpec(work_h=1), Tier.spot(1), Tier.on_demand(1), SPOT, runs=2)


def test_simulate_many_pairs_candidates_on_the_same_draws():
    world = world_for(two_tier(0), RateModel(preemptions_per_node_hour=0.1))
    job = JobSpec(work_h=10)
    same = simulate_many([(two_tier(2), job), (two_tier(2), job)], world, runs=100, seed=9)
    np.testing.assert_array_equal(same[0].wall_h, same[1].wall_h)
    alone = simulate(two_tier(2), job, world, runs=100, seed=9)
    np.testing.assert_array_equal(alone.spend, same[0].spend)
    summary = alone.summary()
    assert set(summary) >= {"wall_h", "spend", "lost_work_h", "alpha", "interruptions", "switches"}
    d = summary["wall_h"]
    assert d.p50 <= d.p90 <= d.p99 and math.isfinite(d.mean)


@pytest.mark.parametrize("engine", ["policy", "fast"])
def test_a_move_to_another_cluster_pays_its_egress_and_longer_restart(engine):
    """Spot on one cluster, on-demand on another: each run moves once, and pays exactly that much more
    than the same ladder within one cluster (the first start is no move)."""
    east, west = {"address": "http://east:8265"}, {"address": "http://west:8265"}

    def ladder(first, second):
        return Ladder(tiers=(Tier.spot(1, max_preemptions=0, price_per_worker_hour=0.3, cluster=first),
                             Tier.on_demand(1, price_per_worker_hour=1.0, cluster=second)))

    job = JobSpec(work_h=10, checkpoint_interval_h=1.0, checkpoint_cost_h=0.05, restart_overhead_h=0.1,
                  move_restart_h=0.25, move_cost=2.0)
    world = [RateModel(preemptions_per_node_hour=0.5), RateModel()]
    across = simulate(ladder(east, west), job, world, runs=40, seed=3, engine=engine)
    within = simulate(ladder(east, east), job, world, runs=40, seed=3, engine=engine)
    moved = across.switches == 1
    assert moved.any() and (within.switches == across.switches).all()
    np.testing.assert_allclose(across.spend[moved] - within.spend[moved], 2.0 + 0.25 * 1.0)
    np.testing.assert_allclose(across.wall_h[moved] - within.wall_h[moved], 0.25)
    np.testing.assert_allclose(across.spend[~moved], within.spend[~moved])


@pytest.mark.parametrize("engine", ["policy", "fast"])
def test_a_gang_that_checkpoints_on_request_climbs_back_between_checkpoints(engine):
    """No periodic checkpoint: a run that fell to on-demand returns to spot only if it can ask for a checkpoint.

    Spot is there for 2 h, gone for 2 h, then back; the notice holds the 1-minute write, so the
    fall loses nothing. Asked, the on-demand gang saves at the first look after spot is back
    (a 5-minute grid) and the climb costs that write and one restart.
    """
    trace = SpotTrace("back", 1800.0, np.array([1] * 4 + [0] * 4 + [1] * 60, dtype=np.int64))
    ladder = [Tier.spot(1, max_preemptions=0, capacity_timeout_s=None, climb_back=True, min_dwell_s=0,
                        price_per_worker_hour=0.3),
              Tier.on_demand(1, price_per_worker_hour=1.0)]
    world = world_for(ladder, trace)
    runs = {}
    for asked in (False, True):
        job = JobSpec(work_h=10, checkpoint_cost_h=1 / 60, restart_overhead_h=0.1, notice_s=120,
                      checkpoint_on_request=asked)
        runs[asked] = simulate(ladder, job, world, runs=1, start_h=np.array([0.0]), engine=engine).outcome(0)
    stays, climbs = runs[False], runs[True]
    assert (stays["switches"], stays["final_tier"]) == (1, 1)
    assert (climbs["switches"], climbs["final_tier"]) == (2, 0)
    # On-demand from the preemption at 2 h (workers up at once, computing 0.1 h later) to the first
    # look at or after 4 h on its 5-minute grid, 2.1 + 23 / 12 h, and the write after it.
    assert climbs["billed_h"] - climbs["spot_h"] == pytest.approx(2.1 + 23 / 12 + 1 / 60 - 2.0)
    assert climbs["spend"] < stays["spend"] and climbs["lost_work_h"] == stays["lost_work_h"] == 0.0


@pytest.mark.parametrize("engine", ["policy", "fast"])
def test_a_run_climbs_back_to_spot_on_another_cluster_at_a_checkpoint_when_the_move_pays(engine):
    """Spot on cluster east, on-demand on cluster west: the moving driver looks at east's capacity and
    climbs back right after a periodic checkpoint, pricing the climb as a move (its longer restart).

    Spot is there for 2 h, gone for 2 h, then back. The moving driver cannot ask the gang for a
    checkpoint (requests travel in the gang's own cluster), so without periodic checkpoints the
    run stays on on-demand; a move restart longer than the saving keeps it there too.
    """
    trace = SpotTrace("back", 1800.0, np.array([1] * 4 + [0] * 4 + [1] * 60, dtype=np.int64))
    east, west = {"address": "http://east:8265"}, {"address": "http://west:8265"}

    def ladder(second: dict) -> list[Tier]:
        return [Tier.spot(1, max_preemptions=0, capacity_timeout_s=None, climb_back=True, min_dwell_s=0,
                          price_per_worker_hour=0.3, cluster=east),
                Tier.on_demand(1, price_per_worker_hour=1.0, cluster=second)]

    def run(second: dict, interval_h: float | None, move_h: float) -> dict:
        job = JobSpec(work_h=10, checkpoint_interval_h=interval_h, checkpoint_cost_h=1 / 60, restart_overhead_h=0.1,
                      notice_s=120, checkpoint_on_request=True, move_restart_h=move_h)
        lad = ladder(second)
        return simulate(lad, job, world_for(lad, trace), runs=1, start_h=np.array([0.0]), engine=engine).outcome(0)

    across = run(west, 0.5, 0.25)
    assert (across["switches"], across["final_tier"]) == (2, 0)
    assert across["spend"] < run(west, 0.5, 20.0)["spend"]
    assert (run(west, None, 0.25)["final_tier"], run(east, None, 0.25)["final_tier"]) == (1, 0)  # asked: within only
    assert (run(west, 0.5, 20.0)["switches"], run(west, 0.5, 20.0)["final_tier"]) == (1, 1)
    # Each move to the other cluster pays its longer restart: the on-demand gang from 2 h + 0.1 + 0.25,
    # climbing at its first checkpoint end after 4 h (a 0.5 h interval and a 1-minute write).
    cycle = 0.5 + 1 / 60
    start = 2.0 + 0.1 + 0.25
    first_end = start + math.ceil((4.0 - start) / cycle - 1e-9) * cycle
    assert across["billed_h"] - across["spot_h"] == pytest.approx(first_end - 2.0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"horizon_h": -1.0}, "horizon_h must be a positive number"),
    ({"runs": 0}, "runs must be a whole number > 0"),
    ({"seed": -1}, "seed must be a whole number >= 0"),
    ({"labels": ["a"]}, "labels gives 1 label"),
])
def test_simulate_many_refuses_what_simulate_refuses_by_name(kwargs, message):
    """It used to give every run a wall of -1 h, or NaN means with numpy warnings, or an IndexError."""
    lad = Ladder(tiers=(Tier.spot(1, price_per_worker_hour=0.3), Tier.on_demand(1, price_per_worker_hour=1.0)))
    configs = [(lad, JobSpec(work_h=2)), (lad, JobSpec(work_h=3))]
    with pytest.raises(ValueError, match=message):
        simulate_many(configs, [RateModel(preemptions_per_node_hour=0.1), RateModel()], **kwargs)


@pytest.mark.parametrize(("world", "message"), [
    (["a.json", RateModel()], r"world\[0\]: expected a SpotTrace, .* got str 'a.json' \(a trace file's path: read it with load_process"),
    ("trace.json", "world: expected one process per tier"),
])
def test_a_world_that_holds_no_processes_is_refused_by_name(world, message):
    lad = [Tier.spot(1, price_per_worker_hour=0.3), Tier.on_demand(1, price_per_worker_hour=1.0)]
    with pytest.raises(TypeError, match=message):
        simulate(lad, JobSpec(work_h=2), world, runs=2)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"uptimes_h": (-1.0,)}, r"uptimes_h\[0\]: expected hours, 0 or more, got -1.0"),
    ({"uptimes_h": (math.nan,)}, r"uptimes_h\[0\]"),
    ({"uptimes_h": (), "waits_h": (math.inf,)}, r"waits_h\[0\]: expected hours, 0 or more and finite"),
    ({"uptimes_h": (), "kind": "crash"}, "kind: expected 'preempt' or 'fail'"),
])
def test_a_scripted_process_refuses_hours_no_run_could_have(kwargs, message):
    """A negative uptime finished work early; a NaN one never returned."""
    with pytest.raises(ValueError, match=message):
        ScriptedModel(**kwargs)
    assert ScriptedModel(uptimes_h=(math.inf, 0.0)).uptimes_h[0] == math.inf


def test_a_job_spec_longer_than_any_training_run_is_refused():
    """A simulation's time grows with the work: 1e9 hours never returned."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="work_h"):
        JobSpec(work_h=1e9)
    with pytest.raises(ValidationError, match="deadline_h"):
        JobSpec(work_h=10, deadline_h=2e5)
