"""The optimum's search: its shortcuts change how long it takes, never what it answers.

The search keeps only Pareto-optimal partial schedules, found by sorting and prefix minima,
and drops those that cannot beat the best schedule so far or, by a margin, a few simple
schedules it tries first. Pinned here: the answers recorded from the plain search it
replaced (spend, finish, hours and sessions, to the last tie: tests/golden/optimum-search.json),
an exhaustive search without any pruning on small random traces, the bound that drops a state
against the least spend the exhaustive search finds from it, the answer with the simple
schedules left out or a narrow search first, and the Pareto helpers against their definition.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spotfallback.sim.optimum as optimum
from spotfallback.sim.job import JobSpec
from spotfallback.sim.optimum import Markets, Optimum, hindsight_optimum
from spotfallback.sim.traces import SpotTrace, load_node_trace, load_spot_trace
from spotfallback.sim.world import compile_process, compile_spot_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
AVAILABILITY = FIXTURES / "traces" / "spot-traces" / "availability" / "1-node" / "aws-10-26-2022"


def _markets(name: str) -> Markets:
    west = load_spot_trace(FIXTURES / "us-west-2a_v100_1.json")
    gated = {
        "100 h job, 8 workers": ([(west, 8, 7.2)], 24.48),
        "10 h job, 1 worker": ([(west, 1, 0.3)], 1.0),
        "no restart cost": ([(west, 8, 0.3)], 1.0),
        "spot only": ([(load_spot_trace(FIXTURES / "us-east-1f_v100_4node.json"), 4, 1.2)], None),
        "two spot markets": ([(west, 1, 0.3), (load_spot_trace(AVAILABILITY / "us-west-2b_k80_1.json"), 1, 0.45)], 1.0),
        "node trace, 8 nodes": ([(load_node_trace(FIXTURES / "aws-p3-trace.csv"), 8, 2.4)], 8.0),
    }[name]
    return Markets(tuple((compile_process(trace, n), price) for trace, n, price in gated[0]), gated[1])


JOBS = {
    "100 h job, 8 workers": JobSpec(work_h=100, deadline_h=150, restart_overhead_h=0.1, checkpoint_cost_h=5 / 60,
                                    provisioning_delay_h=0.05),
    "10 h job, 1 worker": JobSpec(work_h=10, deadline_h=15, restart_overhead_h=0.1, checkpoint_cost_h=5 / 60,
                                  provisioning_delay_h=0.05),
    "no restart cost": JobSpec(work_h=20, deadline_h=40),
    "spot only": JobSpec(work_h=10, deadline_h=40, restart_overhead_h=0.1, checkpoint_cost_h=0.05,
                         provisioning_delay_h=0.05),
    "two spot markets": JobSpec(work_h=30, deadline_h=45, restart_overhead_h=0.25, checkpoint_cost_h=0.05,
                                provisioning_delay_h=0.1),
    "node trace, 8 nodes": JobSpec(work_h=5, deadline_h=8, restart_overhead_h=0.1, checkpoint_cost_h=0.02,
                                   provisioning_delay_h=0.05),
}

# By job: (start_h, (spend, finish_h, spot_h, on_demand_h, sessions)), as the search before this one
# (a Python loop per Pareto level, no early bounds) answered them; no schedule at all is spend Infinity, the rest NaN.
RECORDED: dict[str, list[tuple[float, tuple[float, float, float, float, int]]]] = {
    name: [(start, tuple(want)) for start, want in answers]
    for name, answers in json.loads((GOLDEN / "optimum-search.json").read_text()).items()
}


def _same(o: Optimum, want: tuple[float, float, float, float, int]) -> bool:
    got = (o.spend, o.finish_h, o.spot_h, o.on_demand_h)
    return o.sessions == want[4] and got == pytest.approx(want[:4], rel=1e-9, abs=1e-9, nan_ok=True)


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_search_answers_what_the_plain_search_answered(name):
    """Spend, finish, hours and sessions: among schedules of equal spend it picks the same one."""
    markets = _markets(name)
    for start, want in RECORDED[name]:
        o = hindsight_optimum(JOBS[name], markets, start)
        assert _same(o, want), (name, start, o, want)


@pytest.mark.parametrize("name", list(RECORDED))
def test_a_narrow_search_first_changes_nothing(name, monkeypatch):
    """A large search first finds a schedule with a few states per point, then searches in full below it."""
    monkeypatch.setattr(optimum, "_LARGE", 0)  # every search counts as large
    for beam in (1, 16):
        monkeypatch.setattr(optimum, "_BEAM", beam)
        for start, want in RECORDED[name]:
            assert _same(hindsight_optimum(JOBS[name], _markets(name), start), want), (name, beam, start)


@pytest.mark.parametrize("name", list(RECORDED))
def test_pruning_the_rows_that_wait_at_a_point_before_it_is_reached_changes_nothing(name, monkeypatch):
    """Rows sent to a later point are pruned there as they pile up (memory), to the answers pruned at the point."""
    for waiting in (0, 40):
        monkeypatch.setattr(optimum, "_WAITING", waiting)
        for start, want in RECORDED[name]:
            assert _same(hindsight_optimum(JOBS[name], _markets(name), start), want), (name, waiting, start)


@pytest.mark.parametrize("name", ["100 h job, 8 workers", "no restart cost", "two spot markets"])
def test_the_simple_schedules_tried_first_bound_the_optimum_and_change_nothing(name, monkeypatch):
    markets, job = _markets(name), JOBS[name]
    for start, want in RECORDED[name]:
        search = optimum._Search(job, markets, start)
        o = search.run()
        assert search.upper >= o.spend - 1e-9
        monkeypatch.setattr(optimum, "_UPPER_FROM", 10**9)  # never tried
        assert _same(hindsight_optimum(job, markets, start), want)
        monkeypatch.undo()


# ---------------------------------------------------------------------------------------
# Every schedule, no pruning


def exhaustive(job: JobSpec, markets: Markets, t0: float,
               seen: list[tuple[float, float, float, float, float]] | None = None) -> float:
    """The least spend over every schedule of the optimum's model, found by trying them all.

    From a moment a run is idle: finish on on-demand, or take any gang it can get (straight
    away, or after an on-demand session that fills the wait), and either finish on it or
    let the trace stop it and go on from there. No state is dropped, merged or bounded.
    ``seen`` gets each state it went through (t, P, C, Q) with the least spend from it.
    """
    search = optimum._Search(job, markets, t0)  # for the model's groups and acquisitions only
    gr = search.groups
    W, D, R, d, prov = job.work_h, float(job.deadline_h or 0), job.restart_overhead_h, job.checkpoint_cost_h, job.provisioning_delay_h
    p_od = markets.on_demand_price
    tol = 1e-9

    def explore(t: float, P: float, C: float, Q: float) -> float:
        best = math.inf
        rem = W - P
        need = max(t + prov + R + rem - D, 0.0)
        if p_od is not None and need <= Q - P + tol and need <= rem + tol:
            best = C + p_od * (R + rem)
        if gr.s.size == 0:
            return best
        look, acq = (x[0] for x in search._acquire(np.array([[t]])))
        for g in np.flatnonzero(np.isfinite(acq)).tolist():
            a, hit, price = float(acq[g]), float(gr.hit[g]), float(gr.price[g])
            room = float(look[g]) - (t + prov) - R - d
            for base in [(0.0, 0.0, 0.0)] + ([(0.0, p_od * (R + d), room)] if p_od is not None and room > tol else []):
                P1, C1, Q1 = P + base[0], C + base[1], min(Q + base[2], W)
                end = min(hit, D)
                if a + R < end - tol:  # finish on this gang, on-demand before taking what the deadline needs
                    r = W - P1
                    y = max(a + R + r - end, 0.0)
                    if y <= Q1 - P1 + tol and y < r and r > 0 and (p_od is not None or y <= tol):
                        best = min(best, C1 + (p_od or 0.0) * y + price * (R + r - y))
                L = hit - a
                if math.isfinite(hit) and hit < D and R + d + tol < L and P1 + L - R - d < W - tol:
                    best = min(best, explore(hit, P1 + L - R - d, C1 + price * L, min(Q1 + L - R - d, W)))
        if seen is not None:
            seen.append((t, P, C, Q, best))
        return best

    return explore(0.0, 0.0, 0.0, 0.0)


@st.composite
def tiny_worlds(draw):
    gap_h = draw(st.sampled_from([0.2, 0.25, 0.5]))
    n = draw(st.integers(4, 16))
    traces = [draw(st.lists(st.sampled_from([0, 1, 1, 1]), min_size=n, max_size=n))
              for _ in range(draw(st.integers(1, 2)))]
    prices = draw(st.lists(st.sampled_from([0.2, 0.3, 0.5]), min_size=len(traces), max_size=len(traces)))
    markets = Markets(tuple((compile_spot_trace(SpotTrace(f"t{i}", gap_h * 3600, np.array(a, dtype=np.int64)), 1), p)
                            for i, (a, p) in enumerate(zip(traces, prices, strict=True))),
                      draw(st.sampled_from([1.0, 1.0, None])))
    work = draw(st.sampled_from([1.0, 1.5, 2.0]))
    job = JobSpec(work_h=work, deadline_h=work * draw(st.sampled_from([1.2, 1.6, 2.5])),
                  restart_overhead_h=draw(st.sampled_from([0.0, 0.1])),
                  checkpoint_cost_h=draw(st.sampled_from([0.0, 0.05])),
                  provisioning_delay_h=draw(st.sampled_from([0.0, 0.05])))
    return job, markets, draw(st.sampled_from([0.0, 0.1, gap_h, 2 * gap_h]))


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_worlds())
def test_the_search_finds_what_trying_every_schedule_finds(world):
    job, markets, start = world
    want = exhaustive(job, markets, start)
    got = hindsight_optimum(job, markets, start).spend
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9) if math.isfinite(want) else math.isinf(got)


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_worlds())
def test_the_bound_that_drops_a_state_is_never_above_the_least_spend_from_it(world):
    """The search drops a state whose bound cannot beat the best: the bound must be a lower bound, at every state."""
    job, markets, start = world
    seen: list[tuple[float, float, float, float, float]] = []
    exhaustive(job, markets, start, seen)
    search = optimum._Search(job, markets, start)
    search.run()
    for t, P, C, Q, least in seen:
        if math.isfinite(least):
            point = int(np.searchsorted(search.times, t))  # one cluster: one point per time, the start first
            assert search.times[point] == pytest.approx(t)
            assert search._bound(np.array([[P, C, Q, 0.0, 0.0, 0.0]]), point)[0] <= least + 1e-9, (t, P, C, Q)


# ---------------------------------------------------------------------------------------
# Pareto fronts


def _front(crit: np.ndarray) -> np.ndarray:
    """By definition: the rows no other row is <= in every column (rows distinct)."""
    le = (crit[:, None, :] <= crit[None, :, :]).all(axis=2)
    np.fill_diagonal(le, False)
    return np.flatnonzero(~le.any(axis=0))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(1, 120), st.integers(2, 5), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_the_pareto_helpers_keep_exactly_the_rows_nothing_beats(n, cols, spread, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-spread, spread + 1, size=(n, cols)) * 0.5
    x[rng.random(x.shape) < 0.1] *= -1.0  # with -0.0 beside 0.0
    rows, first = optimum._distinct_rows(x)
    want_rows, want_first = np.unique(x, axis=0, return_index=True)
    assert np.array_equal(rows, want_rows) and np.array_equal(first, want_first)
    want = _front(rows)
    assert np.array_equal(optimum._pareto(rows, block=int(rng.integers(1, 40))), want)
    if cols == 3 and len(rows) > 1:
        assert np.array_equal(optimum._pareto3(rows), want)
        table = optimum._TABLE
        try:
            optimum._TABLE = 0  # the halving path, as for a large table
            assert np.array_equal(optimum._pareto3(rows), want)
        finally:
            optimum._TABLE = table
