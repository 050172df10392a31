"""The hindsight optimum: no policy beats it, it matches a brute-force search, it finishes in time."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotfallback.config import ClusterRef, Ladder, Tier
from spotfallback.errors import OptimumTooLargeError
from spotfallback.sim import optimum
from spotfallback.sim.baselines import simulate_uniform_progress
from spotfallback.sim.draws import run_offsets
from spotfallback.sim.job import JobSpec, wall_to_finish
from spotfallback.sim.optimum import Markets, hindsight_optimum, optimum_for, start_optima
from spotfallback.sim.simulate import simulate
from spotfallback.sim.spread import Spread
from spotfallback.sim.traces import SpotTrace, load_node_trace, load_spot_trace
from spotfallback.sim.world import RateModel, compile_spot_trace, world_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def ladders(spot_price: float, od_price: float, deadline_h: float, work_h: float) -> list[Ladder]:
    """The kinds of ladder the planner and users write: one-way, guarded, climbing back, spot forever."""
    od = Tier.on_demand(1, price_per_worker_hour=od_price)
    guard = {"deadline_h": deadline_h, "work_h": work_h, "pace": 1.0, "margin_h": 0.3}
    spots = [
        Tier.spot(1, max_preemptions=-1, capacity_timeout_s=None, price_per_worker_hour=spot_price),
        Tier.spot(1, max_preemptions=1, capacity_timeout_s=1800, price_per_worker_hour=spot_price),
        Tier.spot(1, max_preemptions=-1, capacity_timeout_s=None, price_per_worker_hour=spot_price,
                  deadline_guard=guard),
        Tier.spot(1, max_preemptions=-1, capacity_timeout_s=None, price_per_worker_hour=spot_price,
                  deadline_guard=guard, climb_back=True, min_dwell_s=0),
        Tier.spot(1, max_preemptions=3, capacity_timeout_s=3600, price_per_worker_hour=spot_price, climb_back=True,
                  min_dwell_s=600),
    ]
    return [Ladder(tiers=(s, od)) for s in spots] + [Ladder(tiers=(od,))]


@st.composite
def worlds(draw):
    n = draw(st.integers(4, 40))
    avail = draw(st.lists(st.sampled_from([0, 1, 1]), min_size=n, max_size=n))
    trace = SpotTrace("random", draw(st.sampled_from([300.0, 600.0, 1800.0])), np.array(avail, dtype=np.int64))
    work = draw(st.sampled_from([1.0, 3.0, 6.0]))
    job = JobSpec(
        work_h=work,
        checkpoint_interval_h=draw(st.sampled_from([None, 0.5, 1.0])),
        checkpoint_cost_h=draw(st.sampled_from([0.0, 0.02, 0.1])),
        restart_overhead_h=draw(st.sampled_from([0.0, 0.1, 0.25])),
        provisioning_delay_h=draw(st.sampled_from([0.0, 0.05, 0.2])),
        notice_s=draw(st.sampled_from([0.0, 120.0, 600.0])),
        jit_checkpoint=draw(st.booleans()),
        checkpoint_on_request=draw(st.booleans()),
        deadline_h=work * draw(st.sampled_from([1.1, 1.5, 2.5])),
    )
    return trace, job, draw(st.sampled_from([0.1, 0.3, 0.9])), draw(st.integers(0, 1000))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_no_policy_spends_less_than_the_optimum_on_random_traces(world):
    """Every ladder kind, both engines' outcome (one engine runs each), and Uniform Progress, run by run."""
    trace, job, spot_price, seed = world
    assert job.deadline_h is not None
    starts = np.arange(0, trace.duration_s / 3600, trace.gap_seconds / 3600)[:12]
    for ladder in ladders(spot_price, 1.0, job.deadline_h, job.work_h):
        w = world_for(ladder, trace)
        res = simulate(ladder, job, w, runs=len(starts), start_h=starts)
        opt = np.array([o.spend for o in optimum_for(ladder, job, w, starts)])
        on_time = res.met_deadline()
        assert (opt[on_time] <= res.spend[on_time] + 1e-9).all(), (ladder.tiers[0], res.spend, opt)
    for same_job in (False, True):
        up = simulate_uniform_progress(job, Tier.spot(1, price_per_worker_hour=spot_price),
                                       Tier.on_demand(1, price_per_worker_hour=1.0), trace, runs=10, seed=seed,
                                       checkpoint_on_demand=same_job)
        offsets = run_offsets([compile_spot_trace(trace, 1)], 10, seed)
        opt = np.array([o.spend for o in optimum_for(ladders(spot_price, 1.0, 1, 1)[0], job,
                                                     [trace, RateModel()], offsets)])
        on_time = up.met_deadline()
        assert (opt[on_time] <= up.spend[on_time] + 1e-9).all()


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.lists(st.sampled_from([0, 1, 1]), min_size=4, max_size=40), st.sampled_from([0.0, 0.1, 0.3]),
       st.sampled_from([0.0, 0.2]))
def test_no_ladder_across_clusters_spends_less_than_the_optimum_that_prices_its_moves(world, other, move_h, move_cost):
    """Two spot pools on two clusters, on-demand on the first: the optimum pays each move as the engines do."""
    trace, job, spot_price, _ = world
    job = job.model_copy(update={"move_restart_h": move_h, "move_cost": move_cost})
    assert job.deadline_h is not None
    east, west = (ClusterRef(address=f"http://{n}:8265", name=n) for n in ("east", "west"))
    starts = np.arange(0, trace.duration_s / 3600, trace.gap_seconds / 3600)[:8]
    pool_b = SpotTrace("other", trace.gap_seconds, np.array(other, dtype=np.int64))
    one_way, climbing = dict(max_preemptions=1, capacity_timeout_s=1800), dict(max_preemptions=-1, capacity_timeout_s=600,
                                                                               climb_back=True, min_dwell_s=0)
    for first, second in ((one_way, one_way), (climbing, dict(max_preemptions=2, capacity_timeout_s=None))):
        ladder = Ladder(tiers=(  # climbs back to spot-east from on-demand on its cluster
            Tier.spot(1, name="spot-east", price_per_worker_hour=spot_price, cluster=east, **first),
            Tier.spot(1, name="spot-west", price_per_worker_hour=spot_price, cluster=west, **second),
            Tier.on_demand(1, price_per_worker_hour=1.0, cluster=east),
        ))
        w = [trace, pool_b, RateModel()]
        opt = np.array([o.spend for o in optimum_for(ladder, job, w, starts)])
        for engine in ("fast", "policy"):
            res = simulate(ladder, job, w, runs=len(starts), start_h=starts, engine=engine)
            on_time = res.met_deadline()
            assert (opt[on_time] <= res.spend[on_time] + 1e-9).all(), (engine, res.spend, opt)


def test_a_run_that_must_change_cluster_and_its_optimum_both_pay_the_move():
    """Spot on the first cluster for an hour, then only on the second, and no time to wait for it: the ladder and
    the optimum both run the two sessions and pay the one move between them."""
    east, west = (ClusterRef(address=f"http://{n}:8265", name=n) for n in ("east", "west"))
    ladder = Ladder(tiers=(
        Tier.spot(1, name="spot-east", price_per_worker_hour=0.3, cluster=east, max_preemptions=0, capacity_timeout_s=600),
        Tier.spot(1, name="spot-west", price_per_worker_hour=0.3, cluster=west, max_preemptions=0, capacity_timeout_s=600),
        Tier.on_demand(1, price_per_worker_hour=1.0, cluster=east),
    ))
    world = [SpotTrace("east", 1800.0, np.array([1, 1] + [0] * 40)), SpotTrace("west", 1800.0, np.array([0, 0] + [1] * 40)),
             RateModel()]
    job = JobSpec(work_h=3, restart_overhead_h=0.1, checkpoint_cost_h=0.0, checkpoint_interval_h=0.1, provisioning_delay_h=0.0,
                  notice_s=0.0, jit_checkpoint=False, deadline_h=4, move_restart_h=0.2, move_cost=0.5)
    for engine in ("fast", "policy"):
        res = simulate(ladder, job, world, runs=1, start_h=[0.0], engine=engine)
        assert res.met_deadline()[0] and res.switches[0] == 1
        (opt,) = optimum_for(ladder, job, world, [0.0])
        assert opt.sessions == 2 and opt.spend <= res.spend[0] + 1e-9
        assert res.spend[0] - opt.spend < 0.05  # the same two sessions, the move paid by both
        assert opt.spend == pytest.approx(0.5 + 0.3 * (0.1 + 0.2 + 3 + 0.1))


# ---------------------------------------------------------------------------------------
# Brute force: every schedule on a fine grid


def brute_force_across(pools: list[list[int]], clusters: list[int], od_cluster: int, gap_h: float, job: JobSpec,
                       p_spot: float, p_od: float, step: float) -> float:
    """Least spend over every schedule whose starts and stops lie on a ``step`` grid, for spot pools
    (``pools``, all at ``p_spot``) and on-demand on Ray clusters.

    A session is looked for at a grid moment (with capacity, for spot), acquired ``prov``
    later (spot: if capacity is there then), runs ``R`` without progress, then works until it
    stops (spot: at the latest where the trace stops that gang) with one checkpoint write, or
    finishes; a start on another cluster than the last session's pays ``job.move_restart_h``
    more restart and ``job.move_cost`` (the first start is no move). Nothing here knows the
    optimum's structure: on-demand sessions may stop anywhere, spot sessions early, and idling
    is free.
    """
    caps = [compile_spot_trace(SpotTrace(f"p{i}", gap_h * 3600, np.array(a, dtype=np.int64)), 1) for i, a in enumerate(pools)]
    W, D, R, d, prov = job.work_h, job.deadline_h, job.restart_overhead_h, job.checkpoint_cost_h, job.provisioning_delay_h
    assert D is not None
    grid = [k * step for k in range(round(D / step) + 1)]
    markets = [(None, p_od, od_cluster)] + [(cap, p_spot, c) for cap, c in zip(caps, clusters, strict=True)]

    @functools.cache
    def best(k: int, pk: int, last: int) -> float:  # idle at grid k with pk steps of progress, last on cluster `last`
        rem = W - pk * step
        out = math.inf
        for look in grid[k:]:
            for cap, price, cluster in markets:
                a = look + prov
                if cap is not None and not (cap.is_ok(np.array([look]))[0] and cap.is_ok(np.array([a]))[0]):
                    continue
                stop = min(float(cap.hit(np.array([a]))[0]), D) if cap is not None else D
                moved = last >= 0 and cluster != last
                restart, paid = R + job.move_restart_h * moved, job.move_cost * moved
                if a + restart + rem <= stop + 1e-9:
                    out = min(out, paid + price * (restart + rem))
                for e in grid:
                    if e <= a + restart + d + 1e-9 or e > stop + 1e-9 or e >= D:
                        continue
                    gain = e - a - restart - d
                    if gain >= rem - 1e-9:
                        continue
                    out = min(out, paid + price * (e - a) + best(round(e / step), pk + round(gain / step), cluster))
        return out

    return best(0, 0, -1)


def brute_force(avail: list[int], gap_h: float, job: JobSpec, p_spot: float, p_od: float, step: float) -> float:
    """``brute_force_across`` for one spot pool, on the cluster on-demand is on (so nothing moves)."""
    return brute_force_across([avail], [0], 0, gap_h, job, p_spot, p_od, step)


@pytest.mark.parametrize(
    ("avail", "work", "deadline", "R", "d", "prov"),
    [
        ([1, 1, 0, 1, 1, 1], 2.0, 3.0, 0.25, 0.0, 0.0),
        ([1, 0, 0, 1, 1, 1], 2.0, 2.75, 0.25, 0.25, 0.0),
        ([0, 1, 1, 0, 1, 1], 1.5, 2.75, 0.25, 0.0, 0.25),
        ([1, 1, 0, 0, 0, 1, 1, 1], 2.5, 3.5, 0.25, 0.25, 0.25),
        ([1, 0, 1, 0, 1, 1, 0, 1], 2.0, 4.0, 0.0, 0.25, 0.0),
        ([0, 0, 0, 0], 1.0, 1.5, 0.25, 0.0, 0.25),
    ],
)
@pytest.mark.parametrize("p_spot", [0.3, 0.7])
def test_the_optimum_equals_a_brute_force_search_on_tiny_traces(avail, work, deadline, R, d, prov, p_spot):
    gap_h, step = 0.5, 0.25
    job = JobSpec(work_h=work, restart_overhead_h=R, checkpoint_cost_h=d, provisioning_delay_h=prov, deadline_h=deadline)
    trace = SpotTrace("t", gap_h * 3600, np.array(avail, dtype=np.int64))
    markets = Markets(((compile_spot_trace(trace, 1), p_spot),), 1.0)
    opt = hindsight_optimum(job, markets)
    assert opt.spend == pytest.approx(brute_force(avail, gap_h, job, p_spot, 1.0, step), abs=1e-9)


@pytest.mark.parametrize("path", ["us-west-2a_v100_1.json", "us-east-1f_v100_4node.json", "aws-p3-trace.csv"])
def test_the_optimum_finishes_by_the_deadline_and_adds_up(path):
    trace = load_node_trace(FIXTURES / path) if path.endswith(".csv") else load_spot_trace(FIXTURES / path)
    job = JobSpec(work_h=10, restart_overhead_h=0.1, checkpoint_cost_h=0.05, provisioning_delay_h=0.05, deadline_h=15)
    ladder = Ladder(tiers=(Tier.spot(4, price_per_worker_hour=0.3), Tier.on_demand(4, price_per_worker_hour=1.0)))
    od_only = 4 * (job.restart_overhead_h + job.work_h)
    for o in optimum_for(ladder, job, world_for(ladder, trace), np.arange(0.0, 200.0, 10.0)):
        assert o.feasible and o.finish_h <= 15 + 1e-9
        assert o.spend <= od_only + 1e-9  # on-demand alone is one of its schedules
        assert o.spend == pytest.approx(1.2 * o.spot_h + 4.0 * o.on_demand_h)
        # Billed hours are the work plus R per start and one write per start but the last.
        assert o.spot_h + o.on_demand_h == pytest.approx(10 + o.sessions * 0.1 + (o.sessions - 1) * 0.05)


def test_starts_spread_over_processes_get_the_same_optima(monkeypatch):
    trace = load_spot_trace(FIXTURES / "us-west-2a_v100_1.json")
    job = JobSpec(work_h=10, restart_overhead_h=0.1, checkpoint_cost_h=0.05, provisioning_delay_h=0.05, deadline_h=15)
    ladder = Ladder(tiers=(Tier.spot(1, price_per_worker_hour=0.3), Tier.on_demand(1, price_per_worker_hour=1.0)))
    world = world_for(ladder, trace)
    starts = [30.0, *np.arange(0.0, 200.0, 10.0).tolist(), 50.0]  # repeats are searched once
    alone = optimum_for(ladder, job, world, starts, processes=1)
    used = []

    class Counted(Spread):  # the real Spread, and how it was started
        def __init__(self, fn, shared, items, processes, *, caller_share=True):
            used.append((processes, caller_share))
            super().__init__(fn, shared, items, processes, caller_share=caller_share)

    monkeypatch.setattr(optimum, "Spread", Counted)
    assert optimum_for(ladder, job, world, starts, processes=3) == alone  # a small search stays here
    monkeypatch.setattr(optimum, "_SPREAD_FROM", 1)
    assert optimum_for(ladder, job, world, starts, processes=3) == alone
    # In the background: the other processes take every share while the caller goes on.
    with start_optima(ladder, job, world, starts, processes=2, background=True) as pending:
        assert pending.result() == alone
    assert used == [(3, True), (2, False)]
    with pytest.raises(ValueError, match="processes must be at least 1"):
        optimum_for(ladder, job, world, starts, processes=0)


def test_a_search_past_its_limit_says_how_large_it_is_and_one_within_it_answers_the_same(monkeypatch):
    trace = load_node_trace(FIXTURES / "aws-p3-trace.csv")
    job = JobSpec(work_h=6, restart_overhead_h=0.1, checkpoint_cost_h=0.05, provisioning_delay_h=0.05, deadline_h=9)
    ladder = Ladder(tiers=(Tier.spot(4, price_per_worker_hour=0.3), Tier.on_demand(4, price_per_worker_hour=1.0)))
    world = world_for(ladder, trace)
    starts = np.arange(0.0, 2.0, 0.25)
    free = optimum_for(ladder, job, world, starts, processes=1)
    assert optimum_for(ladder, job, world, starts, processes=1, limit=10**9) == free
    # The estimate for all the starts, from the first few, is past the limit.
    with pytest.raises(OptimumTooLargeError, match=r"about [\d,]+ states for 8 start\(s\), past the limit of 5,000\b"):
        optimum_for(ladder, job, world, starts, processes=1, limit=5_000)
    # One start alone passes its share, in this process or another: here the first start is the
    # smallest search (1,446 states), 9 of them fit the limit, and the second needs twice as much.
    monkeypatch.setattr(optimum, "_SHARE_FLOOR", 0)
    monkeypatch.setattr(optimum, "_PROBES", 1)
    monkeypatch.setattr(optimum, "_SHARE", 1)
    monkeypatch.setattr(optimum, "_SPREAD_FROM", 1)
    for processes in (1, 2):
        with pytest.raises(OptimumTooLargeError, match=r"one start's search \(the states it met, or the cells of its tables\) passed 1,555, its share of the limit"):
            optimum_for(ladder, job, world, [1.75, *starts, 40.0], processes=processes, limit=14_000)
    # Searched in the background, a start past its share is found by another process and raised by ``result``.
    pending = start_optima(ladder, job, world, [1.75, *starts, 40.0], processes=2, limit=14_000, background=True)
    with pending, pytest.raises(OptimumTooLargeError, match=r"passed 1,555, its share of the limit"):
        pending.result()


def test_a_search_whose_tables_alone_would_pass_its_limit_stops_before_building_them(monkeypatch):
    """A deadline of thousands of hours over a repeating trace: a move per point and later gang, more than the
    limit (and than the machine's memory) before any state is met."""
    trace = load_node_trace(FIXTURES / "aws-p3-trace.csv")
    job = JobSpec(work_h=10, restart_overhead_h=0.1, checkpoint_cost_h=0.05, provisioning_delay_h=0.05,
                  deadline_h=20_000)
    ladder = Ladder(tiers=(Tier.spot(1, price_per_worker_hour=0.3), Tier.on_demand(1, price_per_worker_hour=1.0)))

    def built(*_: object) -> None:
        raise AssertionError("the tables were built")

    monkeypatch.setattr(optimum._Search, "_tables", built)
    with pytest.raises(OptimumTooLargeError, match=r"one start's search .* passed 50,000,000, its share"):
        optimum_for(ladder, job, world_for(ladder, trace), [0.0], processes=1, limit=50_000_000)


def test_the_optimum_runs_spot_only_while_there_is_capacity_and_needs_a_deadline():
    job = JobSpec(work_h=2, restart_overhead_h=0.1, deadline_h=3)
    never = SpotTrace("never", 600.0, np.zeros(30, dtype=np.int64))
    always = SpotTrace("always", 600.0, np.ones(30, dtype=np.int64))
    od = 1.0
    for trace, spend in ((never, od * 2.1), (always, 0.3 * 2.1)):
        o = hindsight_optimum(job, Markets(((compile_spot_trace(trace, 1), 0.3),), od))
        assert o.spend == pytest.approx(spend) and o.sessions == 1
    # No time for even on-demand: no schedule.
    assert not hindsight_optimum(job.model_copy(update={"deadline_h": 2.05}), Markets((), od)).feasible
    with pytest.raises(ValueError, match="deadline"):
        hindsight_optimum(job.model_copy(update={"deadline_h": None}), Markets((), od))
    with pytest.raises(ValueError, match="rate model|random interruptions"):
        ladder = Ladder(tiers=(Tier.spot(1), Tier.on_demand(1)))
        optimum_for(ladder, job, [RateModel(preemptions_per_node_hour=0.1), RateModel()], [0.0])
    # A periodic checkpoint interval does not change it: it writes only before it stops.
    tau = job.model_copy(update={"checkpoint_interval_h": 0.3, "checkpoint_cost_h": 0.05})
    assert float(wall_to_finish(2, 0.3, 0.05)) > 2
    o = hindsight_optimum(tau, Markets(((compile_spot_trace(always, 1), 0.3),), od))
    assert o.spend == pytest.approx(0.3 * 2.1)


@pytest.mark.parametrize(
    ("a", "b", "work", "deadline"),
    [
        ([1, 1, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0, 0], 2.0, 3.5),
        ([1, 0, 0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0], 2.5, 4.0),
        ([0, 1, 1, 0, 1, 1, 0, 1], [1, 0, 1, 1, 0, 1, 1, 0], 2.0, 4.0),
    ],
)
@pytest.mark.parametrize(("move_h", "move_cost"), [(0.25, 0.0), (0.25, 0.3), (0.0, 0.5)])
@pytest.mark.parametrize("od_cluster", [0, 1])
def test_the_optimum_prices_moves_between_clusters_as_a_brute_force_search_does(a, b, work, deadline, move_h, move_cost,
                                                                                  od_cluster):
    """Two spot pools on two clusters (and on-demand on one of them): each move pays its restart and egress."""
    gap_h, step = 0.5, 0.25
    job = JobSpec(work_h=work, restart_overhead_h=0.25, checkpoint_cost_h=0.25, provisioning_delay_h=0.0,
                  deadline_h=deadline, move_restart_h=move_h, move_cost=move_cost)
    caps = tuple((compile_spot_trace(SpotTrace(n, gap_h * 3600, np.array(x, dtype=np.int64)), 1), 0.3)
                 for n, x in (("a", a), ("b", b)))
    opt = hindsight_optimum(job, Markets(caps, 1.0, clusters=(0, 1), on_demand_cluster=od_cluster))
    expected = brute_force_across([a, b], [0, 1], od_cluster, gap_h, job, 0.3, 1.0, step)
    assert opt.spend == pytest.approx(expected, abs=1e-9)
    free = hindsight_optimum(job.model_copy(update={"move_restart_h": 0.0, "move_cost": 0.0}),
                             Markets(caps, 1.0, clusters=(0, 1), on_demand_cluster=od_cluster))
    assert free.spend <= opt.spend + 1e-12


@pytest.mark.parametrize(("gated", "on_demand", "message"), [
    ((), None, "give at least one market"),
    ((), -1.0, r"on_demand_price: a price must be a finite number, 0 or more, got -1.0"),
    ((), math.nan, r"on_demand_price: a price must be"),
    (("trace", math.inf), 1.0, r"gated\[0\]: a price must be"),
])
def test_markets_refuse_what_no_market_is(gated, on_demand, message):
    """A negative price gave a negative optimum; a NaN one read as 'no schedule meets the deadline'."""
    if gated:
        trace = compile_spot_trace(SpotTrace("t", 60.0, np.array([1, 0, 1], dtype=np.int64)), 1)
        gated = ((trace, gated[1]),)
    with pytest.raises(ValueError, match=rf"^markets: .*{message}"):
        Markets(gated, on_demand)
