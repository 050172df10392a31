"""Hindsight optimum and backtesting: `.venv/bin/python -m bench.bench_backtest [--repeat N]`.

Targets: `plan` with the optimum on one trace in under 5 s; a backtest of 400 windows in
under 10 s. Beside them, the optimum alone for 300 h and 1000 h jobs (``long_job_rows``). Then
leave one trace out: for each shared trace, the ladder planned on all the
others, replayed unchanged on every 24-hour window of it, against the optimum and on-demand
only, and the share of windows on time. Beside it, what ladders can reach at all on the same
windows, chosen with hindsight from a grid of 2,000 (``ladder_bound_rows``): the best single
ladder for the whole trace, and the best ladder for each window on its own. For the 10 h job
three ways: a checkpoint write longer than the 2-minute notice, one within it, and one within
it answering checkpoint requests. Last, the ladder planned on every shared trace, replayed on
generated families none of them resembles (``bench/trace_families.py``), with the same
hindsight bounds. Apart, minutes each: the optimum of one start of a large gang's 100 h job
on the node trace, its time and peak memory (``large_gangs``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import Figure, Measurement, Stat, Target, best_of, cpu_model, table, values
from bench.trace_families import FAMILIES, Family
from spotfallback.cli.plan import PlanOptimum, plan_optimum
from spotfallback.config import Ladder, Tier
from spotfallback.sim.backtesting import BacktestResult, backtest, window_starts
from spotfallback.sim.optimum import Markets, hindsight_optimum, optimum_for
from spotfallback.sim.planner import RESERVE_SHARES, Plan, PlanRequest, load_process, plan
from spotfallback.sim.simulate import simulate
from spotfallback.sim.traces import NodeTrace, SpotTrace
from spotfallback.sim.world import Process, RateModel, world_for

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
FIXTURES = ROOT / "tests" / "fixtures"
V100 = "spot-traces/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json"

# The job: 1 worker, 10 h of work, 15 h deadline, restart 0.1 h, spot at 0.3x on-demand, JIT on
# with a 2-minute notice. Its 5-minute write cannot fit the notice, so every stop loses the work since
# the last periodic checkpoint, as for a large model's checkpoint.
SMALL = PlanRequest(work_h=10, num_workers=1, checkpoint_cost_h=5 / 60, restart_overhead_h=0.1,
                    provisioning_delay_h=0.05, spot_price=0.3, on_demand_price=1.0, deadline_h=15, runs=400)
# The same job with a 1-minute write, which fits the notice: a stop that comes with one loses nothing.
SMALL_FITS = SMALL.model_copy(update={"checkpoint_cost_h": 1 / 60})
# Leave one trace out and the ladder bound run for each: whether JIT saves the work at a notice
# changes what separates a ladder from the optimum, which writes once, just before each stop.
# The latter, also answering the controller's checkpoint requests: climbs back between checkpoints.
SMALL_ASKED = SMALL_FITS.model_copy(update={"checkpoint_on_request": True})
HELD_OUT_JOBS = {"5 min write, longer than the notice": SMALL, "1 min write, within the notice": SMALL_FITS,
                 "1 min write, checkpoints on request": SMALL_ASKED}
# The README's job: 100 h on 8 workers, 150 h deadline.
LARGE = PlanRequest(work_h=100, num_workers=8, checkpoint_cost_h=5 / 60, restart_overhead_h=0.1,
                    provisioning_delay_h=0.05, spot_price=0.9, on_demand_price=3.06, deadline_h=150, runs=400)
LONG_WORK_H = (300.0, 1000.0)  # hours of work of the long jobs whose optimum is timed alone
# Large gangs on the node trace, (hours of work, workers): a search that a stop every few minutes makes large.
NODE_TRACE = "node-traces/aws-p3-trace.csv"
LARGE_GANGS = ((100.0, 16), (100.0, 8))
ON_TIME_ASKED_PCT = 100 * SMALL.deadline_probability

Row = dict[str, Any]


def traces_base() -> Path:
    """The shared traces where this checkout has them, else the test fixtures' copies."""
    return SHARED if SHARED.is_dir() else FIXTURES / "traces"


def trace_paths(base: Path) -> list[Path]:
    return sorted(base.rglob("*.json")) + sorted(base.rglob("*.csv"))


def plan_beside_optimum(req: PlanRequest, spots: list[Process]) -> tuple[Plan, float | None]:
    """What `spotfallback plan` computes, as it computes it: the plan, and the optimum searched in other
    processes beside it (``PlanOptimum``)."""
    with PlanOptimum.start(req, spots) as search:
        p = plan(req, spots)
        return p, search.mean()


def plan_rows(v100: SpotTrace | NodeTrace, repeat: int) -> Iterator[Row]:
    """`plan` with the optimum for the small job (best of ``repeat``) and the large one (once); ``optimum_s``
    times the optimum alone, after the plan."""
    for case, req in (("10 h job, 15 h deadline, 1 worker", SMALL), ("100 h job, 150 h deadline, 8 workers", LARGE)):
        secs, out = best_of(repeat if req is SMALL else 1, lambda req=req: plan_beside_optimum(req, [v100]))
        assert isinstance(out, tuple)
        p, opt = out
        assert isinstance(p, Plan) and opt is not None
        t0 = time.perf_counter()
        assert plan_optimum(p, [v100]) == opt
        opt_s = time.perf_counter() - t0
        yield {"kind": "plan", "case": case, "runs": req.runs, "seconds": secs, "optimum_s": opt_s,
               "optimum": opt, "x_optimum": p.recommended.mean_spend / opt}


def long_job_rows(v100: SpotTrace | NodeTrace, starts_h: tuple[float, ...] = (0.0, 50.0, 100.0)) -> Iterator[Row]:
    """The optimum alone for longer jobs (1 worker, deadline twice the work), seconds per start: its search
    grows with the spot stretches before the deadline and the partial schedules kept at each."""
    for work_h in LONG_WORK_H:
        req = SMALL.model_copy(update={"work_h": work_h, "deadline_h": 2 * work_h})
        ladder = Ladder(tiers=(req.spot_tier(0), req.on_demand_tier()))
        t0 = time.perf_counter()
        opts = optimum_for(ladder, req.job(None), world_for(ladder, v100), starts_h)
        secs = (time.perf_counter() - t0) / len(starts_h)
        yield {"kind": "optimum", "case": f"{work_h:g} h job, {2 * work_h:g} h deadline, 1 worker, per start",
               "seconds": secs, "optimum_s": secs, "optimum": float(np.mean([o.spend for o in opts]))}


def large_gang_rows(base: Path, gangs: tuple[tuple[float, int], ...] = LARGE_GANGS) -> Iterator[Row]:
    """The optimum of one start (hour 0) of each job of ``gangs`` (hours of work, nodes) on the node trace, each
    in a fresh process so that its peak memory is the search's: seconds and peak resident memory.
    Minutes each for ``LARGE_GANGS``; not part of ``main`` or ``python -m bench``."""
    for work_h, workers in gangs:
        code = f"from bench.bench_backtest import large_gang_search; large_gang_search({work_h!r}, {workers!r}, {str(base / NODE_TRACE)!r})"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))})
        yield {"kind": "large_gang", "case": f"{work_h:g} h job, {workers} nodes, deadline {1.5 * work_h:g} h",
               **json.loads(out.stdout.splitlines()[-1])}


def large_gang_search(work_h: float, workers: int, path: str) -> None:
    """One start's search (``large_gang_rows``), printed as one JSON line; spot 0.9, on-demand 3.06 per worker-hour."""
    req = LARGE.model_copy(update={"work_h": work_h, "num_workers": workers, "deadline_h": 1.5 * work_h})
    markets = Markets.of(Ladder(tiers=(req.spot_tier(0), req.on_demand_tier())), [load_process(path), RateModel()])
    t0 = time.perf_counter()
    o = hindsight_optimum(req.job(None), markets, 0.0)
    secs = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"seconds": secs, "peak_mb": peak_mb, "optimum": o.spend, "sessions": o.sessions}))


def large_gangs(base: Path) -> None:
    """Print ``large_gang_rows`` as each is done."""
    print("\nthe optimum of one start of a large gang's job on the node trace, each in a fresh process:")
    for r in large_gang_rows(base):
        print(f"  {r['case']}: {r['seconds']:.1f} s, peak memory {r['peak_mb']:,.0f} MB (optimum {r['optimum']:,.1f}, "
              f"{r['sessions']} sessions)", flush=True)


def backtest_row(v100: SpotTrace | NodeTrace, repeat: int) -> Row:
    """The small job's recommended ladder backtested on every 1.6 h window of the trace (best of ``repeat``)."""
    small = plan(SMALL, v100)
    ladder = small.recommended.ladder
    assert ladder is not None
    job = SMALL.job(small.recommended.tau_h)
    secs, res = best_of(repeat, lambda: backtest(ladder, [v100], job, window_h=1.6))
    assert isinstance(res, BacktestResult)
    return {"kind": "backtest", "case": "us-west-2a_v100_1, every 1.6 h", "windows": res.windows, "seconds": secs}


def held_out_rows(paths: list[Path], base: Path, req: PlanRequest = SMALL, window_h: float = 24.0) -> Iterator[Row]:
    """Plan on every trace but one, backtest on that one: what the planner promises on a trace it never saw."""
    procs = [load_process(str(p)) for p in paths]
    markets = Ladder(tiers=(req.spot_tier(0), req.on_demand_tier()))  # the optimum may use spot, whatever is recommended
    for i, path in enumerate(paths):
        others = [p for j, p in enumerate(procs) if j != i]
        t0 = time.perf_counter()
        held = plan(req, others[0], more=others[1:])
        plan_s = time.perf_counter() - t0
        assert held.recommended.ladder is not None
        r = backtest(held.recommended.ladder, [procs[i]], req.job(held.recommended.tau_h), window_h=window_h,
                     optimum_over=markets)
        yield {"kind": "held_out", "case": str(path.relative_to(base)), "windows": r.windows,
               "x_optimum_mean": r.vs_optimum.mean, "x_optimum_p95": r.vs_optimum.p95,
               "costlier_than_on_demand": r.costlier_than_on_demand, "on_time_pct": 100 * r.on_time_share,
               "plan_s": plan_s, "recommended": held.recommended.label}


def ladder_grid(req: PlanRequest) -> Iterator[tuple[Ladder, float | None]]:
    """Spot-then-on-demand ladders of the planner's family, far wider than its search (with tau).

    Checkpoint interval (work_h / 4 ... / 33, or none) x budget (1, 3, 5, 8, unlimited) x
    capacity timeout (10 min ... 2 h, none) x (one-way; climbing back; a deadline guard with
    a margin of one or two changeovers plus a write, climbing back or not, and climbing back
    with the planner's reserves of slack). Built from the request's own job, so it carries
    over to any job and trace.
    """
    change = req.restart_overhead_h + req.provisioning_delay_h
    margins = (change + req.checkpoint_cost_h, 2 * change + req.checkpoint_cost_h)
    taus = [req.work_h / k for k in (4, 6, 8, 12, 17, 24, 33)] + [None]
    climbing = {"climb_back": True, "min_dwell_s": 0.0}
    for tau, m, timeout in itertools.product(taus, (1, 3, 5, 8, -1), (600.0, 1800.0, 3600.0, 7200.0, None)):
        rules: list[dict[str, Any]] = [{}, climbing]
        if req.deadline_h is not None:
            slack = req.slack_h(tau)
            rules += [{"deadline_guard": req.guard(tau, 0.0, margin), **climb}
                      for margin in margins for climb in ({}, climbing)]
            rules += [{"deadline_guard": req.guard(tau, 0.0, margin, share * slack), **climbing}
                      for margin in margins for share in RESERVE_SHARES]
        for extra in rules:
            spot: Tier = req.spot_tier(0, m, timeout, **extra)
            yield Ladder(tiers=(spot, req.on_demand_tier())), tau


def ladder_bound_rows(paths: list[Path], base: Path, req: PlanRequest = SMALL, window_h: float = 24.0) -> Iterator[Row]:
    """What any ladder of ``ladder_grid`` reaches on each trace's windows when chosen with hindsight."""
    grid = list(ladder_grid(req))
    for path in paths:
        trace = load_process(str(path))
        yield {"kind": "bound", "case": str(path.relative_to(base)), **ladder_bounds(grid, trace, req, window_h)}


def ladder_bounds(grid: list[tuple[Ladder, float | None]], trace: SpotTrace | NodeTrace, req: PlanRequest,
                  window_h: float) -> Row:
    """The best of ``grid`` on the trace's windows, chosen with hindsight (spend / optimum).

    The best single ladder for the trace (least mean spend / optimum among those on time in
    the requested share of windows) bounds what any planning of this family can do there;
    the best ladder for each window on its own (on time in that window) bounds it further.
    """
    starts = window_starts(trace, window_h, req.num_workers)
    # Every ladder of the grid runs on the same two markets: one world and one optimum per trace.
    world = world_for(grid[0][0], trace)
    optimum = np.array([o.spend for o in optimum_for(grid[0][0], req.job(None), world, starts)])
    ratios, on_time = [], []
    for ladder, tau in grid:
        res = simulate(ladder, req.job(tau), world, runs=len(starts), start_h=starts)
        ratios.append(res.spend / optimum)
        on_time.append(res.met_deadline())
    x, ok = np.array(ratios), np.array(on_time)
    single = [i for i in range(len(grid)) if ok[i].mean() >= req.deadline_probability]
    best = min(single, key=lambda i: float(x[i].mean())) if single else None
    per_window = np.where(ok, x, np.inf).min(axis=0)
    return {"windows": len(starts), "ladders": len(grid),
            "single_mean": float(x[best].mean()) if best is not None else None,
            "single_p95": float(np.percentile(x[best], 95)) if best is not None else None,
            "per_window_mean": float(per_window.mean()), "per_window_p95": float(np.percentile(per_window, 95))}


def family_rows(req: PlanRequest = SMALL, families: tuple[Family, ...] = FAMILIES, seed: int = 0,
                window_h: float = 24.0, bounds: bool = True) -> Iterator[Row]:
    """The ladder planned on every shared trace, replayed on each generated family (``bench/trace_families.py``).

    With ``bounds``, also the best ladders of ``ladder_grid`` chosen with hindsight on each
    family: where they too stay far from the optimum, the family of ladders is the limit, not
    the planning.
    """
    base = traces_base()
    procs = [load_process(str(p)) for p in trace_paths(base)]
    held = plan(req, procs[0], more=procs[1:])
    assert held.recommended.ladder is not None
    markets = Ladder(tiers=(req.spot_tier(0), req.on_demand_tier()))
    grid = list(ladder_grid(req)) if bounds else []
    for family in families:
        trace = family.trace(seed)
        r = backtest(held.recommended.ladder, [trace], req.job(held.recommended.tau_h), window_h=window_h,
                     optimum_over=markets)
        over = r.spend / r.on_demand_spend
        row: Row = {"kind": "family", "case": family.name, "windows": r.windows, "x_optimum_mean": r.vs_optimum.mean,
                    "x_optimum_p95": r.vs_optimum.p95, "x_on_demand_mean": r.vs_on_demand.mean,
                    "costlier_than_on_demand": r.costlier_than_on_demand, "most_over_on_demand_pct": 100 * (over.max() - 1),
                    "on_time_pct": 100 * r.on_time_share, "recommended": held.recommended.label}
        if grid:
            row.update(ladder_bounds(grid, trace, req, window_h))
        yield row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base = traces_base()
    print(f"machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}")
    v100 = load_process(str(base / V100))
    for r in plan_rows(v100, args.repeat):
        print(f"plan with the optimum, us-west-2a_v100_1, {r['case']}, {r['runs']} runs: {r['seconds']:.2f} s "
              f"(the optimum alone {r['optimum_s']:.2f} s; mean optimum {r['optimum']:,.1f}, recommended "
              f"{r['x_optimum']:.3f}x of it; target < 5 s)")
    for r in long_job_rows(v100):
        print(f"the optimum alone, us-west-2a_v100_1, {r['case']}: {r['seconds']:.2f} s (mean optimum {r['optimum']:,.1f})")
    r = backtest_row(v100, args.repeat)
    print(f"\nbacktest, {r['windows']} windows of us-west-2a_v100_1 (every 1.6 h), the 10 h job's recommended "
          f"ladder: {r['seconds']:.2f} s (target < 10 s for 400)")
    for req in HELD_OUT_JOBS.values():
        leave_one_trace_out(base, req)
    for req in HELD_OUT_JOBS.values():
        generated_families(req)


def leave_one_trace_out(base: Path, req: PlanRequest = SMALL, window_h: float = 24.0) -> None:
    """Print ``held_out_rows`` for every trace under ``base`` as each is done."""
    paths = trace_paths(base)
    asked = ", checkpoints on request" if req.checkpoint_on_request else ""
    print(f"\nleave one trace out: the 10 h job ({60 * req.checkpoint_cost_h:g} min write, {req.notice_s:g} s notice{asked}, "
          f"{req.deadline_probability:g} on time asked), planned on the other "
          f"{len(paths) - 1} traces, replayed unchanged on every {window_h:g} h window of the held-out one:")
    print(f"  {'held-out trace':50s} {'windows':>7s} {'vs optimum mean / p95':>22s} {'> OD':>5s} {'on time':>8s}  "
          f"plan (s)  recommended")
    for r in held_out_rows(paths, base, req, window_h):
        print(f"  {r['case']:50s} {r['windows']:7d} {r['x_optimum_mean']:10.3f} / {r['x_optimum_p95']:6.3f}    "
              f"{r['costlier_than_on_demand']:4d} {r['on_time_pct']:7.1f}%  {r['plan_s']:7.1f}  {r['recommended']}",
              flush=True)
    print("\nwhat ladders reach at all, chosen with hindsight (spend / optimum, mean / p95):")
    print(f"  {'trace':50s} {'ladders':>7s} {'best single ladder':>20s} {'best ladder per window':>24s}")
    for b in ladder_bound_rows(paths, base, req, window_h):
        single = "none on time" if b["single_mean"] is None else f"{b['single_mean']:.3f} / {b['single_p95']:.3f}"
        print(f"  {b['case']:50s} {b['ladders']:7d} {single:>20s} {b['per_window_mean']:11.3f} / {b['per_window_p95']:.3f}",
              flush=True)


def generated_families(req: PlanRequest = SMALL, seed: int = 0, window_h: float = 24.0) -> None:
    """Print ``family_rows`` as each family is done."""
    asked = ", checkpoints on request" if req.checkpoint_on_request else ""
    print(f"\ngenerated families (bench/trace_families.py, seed {seed}): the 10 h job ({60 * req.checkpoint_cost_h:g} min "
          f"write{asked}) planned on every shared trace, replayed on every {window_h:g} h window; beside it the best "
          f"ladders chosen with hindsight (spend / optimum, mean / p95):")
    print(f"  {'family':18s} {'windows':>7s} {'vs optimum':>15s} {'vs OD':>6s} {'> OD':>5s} {'worst':>6s} {'on time':>8s} "
          f"{'best single':>15s} {'best per window':>16s}")
    for r in family_rows(req, seed=seed, window_h=window_h):
        single = "none on time" if r["single_mean"] is None else f"{r['single_mean']:.3f} / {r['single_p95']:.3f}"
        print(f"  {r['case']:18s} {r['windows']:7d} {r['x_optimum_mean']:6.3f} / {r['x_optimum_p95']:6.3f} "
              f"{r['x_on_demand_mean']:6.3f} {r['costlier_than_on_demand']:5d} {r['most_over_on_demand_pct']:+5.1f}% "
              f"{r['on_time_pct']:7.1f}% {single:>15s} {r['per_window_mean']:7.3f} / {r['per_window_p95']:.3f}", flush=True)
    print(f"  recommended: {r['recommended']}")


# Other users' jobs: the job answering checkpoint requests, one thing changed in each.
OTHER_JOBS: dict[str, dict[str, float]] = {
    "as is": {}, "restart 18 min": {"restart_overhead_h": 0.3}, "provisioning 15 min": {"provisioning_delay_h": 0.25},
    "4 workers": {"num_workers": 4}, "deadline 12 h": {"deadline_h": 12.0}, "deadline 20 h": {"deadline_h": 20.0},
    "spot at 0.15": {"spot_price": 0.15}, "spot at 0.5": {"spot_price": 0.5},
    "30 h of work, 45 h deadline": {"work_h": 30.0, "deadline_h": 45.0},
}


def other_jobs(window_h: float = 24.0) -> None:
    """Leave one trace out, then the generated families, for each job of ``OTHER_JOBS``: the
    average and the worst of the held-out means, the windows costlier than on-demand, the least
    share on time."""
    base = traces_base()
    paths = trace_paths(base)
    print(f"\nother jobs (the 10 h job with checkpoint requests, one thing changed), each {window_h:g} h window:")
    print(f"  {'job':28s} {'held out: mean of means':>24s} {'worst':>6s} {'> OD':>5s} {'on time':>8s}   "
          f"{'families: mean of means':>24s} {'> OD':>5s}")
    for name, change in OTHER_JOBS.items():
        req = PlanRequest(**{**SMALL_ASKED.model_dump(), **change})
        held = list(held_out_rows(paths, base, req, window_h))
        fams = list(family_rows(req, window_h=window_h, bounds=False))
        means = [r["x_optimum_mean"] for r in held]
        print(f"  {name:28s} {np.mean(means):24.3f} {max(means):6.3f} {sum(r['costlier_than_on_demand'] for r in held):5d} "
              f"{min(r['on_time_pct'] for r in held + fams):7.1f}%   {np.mean([r['x_optimum_mean'] for r in fams]):24.3f} "
              f"{sum(r['costlier_than_on_demand'] for r in fams):5d}", flush=True)


# Choppier than any generated family: capacity that comes and goes every 10 minutes on average,
# sampled every minute. A trace like this is where the plan's search costs the most.
CHOPPY = Family("1-minute ticks", up_h=1 / 6, down_h=1 / 6, gap_s=60.0)


def family_plan_speed(seed: int = 0, repeat: int = 2) -> None:
    """`plan` with the optimum (seconds, best of ``repeat``) for each held-out job on each generated
    family and on ``CHOPPY``: the speed target on traces like none of the shared ones."""
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, load average {os.getloadavg()[0]:.2f}")
    print(f"  {'family':18s} " + " ".join(f"{name[:30]:>32s}" for name in HELD_OUT_JOBS)
          + "   (plan + optimum after it = s; as `plan` runs them, side by side: s)")
    for family in (*FAMILIES, CHOPPY):
        trace = family.trace(seed)
        cells = []
        for req in HELD_OUT_JOBS.values():
            plan_s, p = best_of(repeat, lambda req=req, trace=trace: plan(req, trace))
            assert isinstance(p, Plan)
            opt_s, _ = best_of(repeat, lambda p=p, trace=trace: plan_optimum(p, [trace]))
            both_s, _ = best_of(repeat, lambda req=req, trace=trace: plan_beside_optimum(req, [trace]))
            cells.append(f"{plan_s:5.2f} + {opt_s:5.2f} = {plan_s + opt_s:5.2f}; {both_s:5.2f}")
        print(f"  {family.name:18s} " + " ".join(f"{c:>32s}" for c in cells), flush=True)


def plan_side_by_side(works_h: tuple[float, ...] = (100.0, 200.0), repeat: int = 2) -> None:
    """The README's 8-worker job (deadline 1.5 times the work) on us-west-2a_v100_1: the plan then its
    optimum, against both side by side as `spotfallback plan` runs them (seconds, each of ``repeat``)."""
    v100 = load_process(str(traces_base() / V100))
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, load average {os.getloadavg()[0]:.2f}")
    for work_h in works_h:
        req = LARGE.model_copy(update={"work_h": work_h, "deadline_h": 1.5 * work_h})
        for _ in range(repeat):
            t0 = time.perf_counter()
            p = plan(req, v100)
            t1 = time.perf_counter()
            opt = plan_optimum(p, [v100])
            t2 = time.perf_counter()
            beside = plan_beside_optimum(req, [v100])
            t3 = time.perf_counter()
            assert beside[1] == opt
            print(f"  {work_h:g} h: plan {t1 - t0:.2f} + optimum {t2 - t1:.2f} = {t2 - t0:.2f} s; side by side "
                  f"{t3 - t2:.2f} s", flush=True)


# ----------------------------------------------------------------------------- `python -m bench`


def run(ctx: Any) -> list[Row]:
    """What ``main`` prints, as rows: the two plans with the optimum, the backtest, each held-out trace."""
    base = traces_base()
    v100 = load_process(str(base / V100))
    repeat = ctx.reps(3, 1)
    paths = trace_paths(base)
    rows = [*plan_rows(v100, repeat), *long_job_rows(v100), backtest_row(v100, repeat)]
    for name, req in HELD_OUT_JOBS.items():
        rows += [{**r, "job": name} for r in [*held_out_rows(paths, base, req), *ladder_bound_rows(paths, base, req)]]
    for name, req in HELD_OUT_JOBS.items():
        rows += [{**r, "job": name} for r in family_rows(req)]
    return rows


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    plans = [r for r in rows if r["kind"] == "plan"]
    out = [Figure(9, f"`plan` with the optimum, us-west-2a_v100_1, {r['case']}, {r['runs']} runs", "s",
                  Target("< 5 s", max=5.0), Stat.of([r["seconds"]])) for r in plans]
    out += [Figure(9, f"`backtest`, {r['windows']} windows of {r['case']}", "s", Target("< 10 s for 400 windows", max=10.0),
                   Stat.of([r["seconds"]])) for r in rows if r["kind"] == "backtest"]
    for job in _jobs(rows):
        named = f", {job}" if job else ""
        held = f"Leave one trace out (the 10 h job{named}, planned on the other traces; spread across held-out traces)"
        out += [
            Figure(9, f"{held}: windows on time", "%", Target(f"≥ {ON_TIME_ASKED_PCT:g}% on every trace", min=ON_TIME_ASKED_PCT),
                   Stat.of(values(rows, "on_time_pct", kind="held_out", job=job)), 1, worst=True),
            Figure(9, f"{held}: spend / optimum, mean", "×", Target("≤ 1.10× on every trace", max=1.10),
                   Stat.of(values(rows, "x_optimum_mean", kind="held_out", job=job)), worst=True),
            Figure(9, f"{held}: spend / optimum, p95", "×", Target("≤ 1.30× on every trace", max=1.30),
                   Stat.of(values(rows, "x_optimum_p95", kind="held_out", job=job)), worst=True),
        ]
    return out


def _jobs(rows: list[dict[str, Any]]) -> list[str | None]:
    """The jobs held out, in row order (None: rows that name none)."""
    return list(dict.fromkeys(r.get("job") for r in rows if r["kind"] == "held_out"))


def describe(rows: list[dict[str, Any]]) -> str:
    timings = table(["case", "time (s)", "of which the optimum (s)", "recommended / optimum"],
                    [(f"{r['kind']}: {r['case']}", r["seconds"], r.get("optimum_s", "–"), r.get("x_optimum", "–"))
                     for r in rows if r["kind"] in ("plan", "optimum", "backtest")])
    held = table(["job", "held-out trace", "windows", "spend / optimum, mean", "p95", "costlier than on-demand",
                  "on time (%)", "plan (s)", "recommended"],
                 [(r.get("job", "–"), r["case"], r["windows"], r["x_optimum_mean"], r["x_optimum_p95"],
                   r["costlier_than_on_demand"], r["on_time_pct"], r["plan_s"], r["recommended"])
                  for r in rows if r["kind"] == "held_out"])
    bounds = [r for r in rows if r["kind"] == "bound"]
    text = (__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n" + timings + "\n\n" + held
    if bounds:
        text += "\n\nWhat ladders reach at all, chosen with hindsight (spend / optimum):\n\n" + table(
            ["job", "trace", "windows", "ladders", "best single ladder, mean", "p95", "best ladder per window, mean", "p95"],
            [(r.get("job", "–"), r["case"], r["windows"], r["ladders"], _or_dash(r["single_mean"]),
              _or_dash(r["single_p95"]), r["per_window_mean"], r["per_window_p95"]) for r in bounds])
    families = [r for r in rows if r["kind"] == "family"]
    if families:
        text += ("\n\nGenerated families (`bench/trace_families.py`, seed 0), planned on every shared trace; beside "
                 "it the best ladders chosen with hindsight (spend / optimum):\n\n" + table(
                     ["job", "family", "windows", "spend / optimum, mean", "p95", "spend / on-demand, mean",
                      "costlier than on-demand", "most over on-demand (%)", "on time (%)", "best single ladder, mean",
                      "best ladder per window, mean"],
                     [(r.get("job", "–"), r["case"], r["windows"], r["x_optimum_mean"], r["x_optimum_p95"],
                       r["x_on_demand_mean"], r["costlier_than_on_demand"], r["most_over_on_demand_pct"],
                       r["on_time_pct"], _or_dash(r.get("single_mean")), r.get("per_window_mean", "–"))
                      for r in families]))
    return text


def _or_dash(value: float | None) -> float | str:
    return "–" if value is None else value


def explain(rows: list[dict[str, Any]]) -> str:
    slow = [r for r in rows if r["kind"] == "plan" and r["seconds"] >= 5.0]
    parts = [f"the plan of the {r['case']} takes {r['seconds']:.1f} s with the hindsight optimum, which alone takes "
             f"{r['optimum_s']:.1f} s (`plan_optimum`) and grows with the job's length" for r in slow]
    for job in _jobs(rows):
        held = values(rows, "x_optimum_mean", kind="held_out", job=job)
        if not held or max(held) <= 1.10:
            continue
        parts.append(f"{f'with the {job}, ' if job else ''}the ladder's mean spend is {min(held):.2f}–{max(held):.2f}× "
                     "the optimum's on the held-out traces: the optimum knows when each spot session ends, the ladder "
                     "only waits for spot or pays on-demand (docs/planner.md, leave one trace out)")
        bounds = [r for r in rows if r["kind"] == "bound" and r.get("job") == job]
        bound = [r["per_window_mean"] for r in bounds]
        if bound and max(bound) > 1.10:
            parts.append(f"even the best of {bounds[0]['ladders']:,} ladders, chosen with hindsight for each window on "
                         f"its own, averages {min(bound):.2f}–{max(bound):.2f}× per trace (the bound rows below)")
    return ("Why: " + "; ".join(parts) + ".") if parts else ""


MEASUREMENT = Measurement(
    name="backtest", items=(9,), title="Hindsight optimum and backtesting", run=run, figures=figures,
    describe=describe, cluster=False, explain=explain,
)


if __name__ == "__main__":
    main()
