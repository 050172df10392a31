"""Hindsight optimum and backtesting: `.venv/bin/python bench/bench_backtest.py [--repeat N]`.

Targets: `plan` with the optimum on one trace in under 5 s; a backtest of 400 windows in
under 10 s. Then leave one trace out: for each shared trace, the ladder planned on all the
others, replayed unchanged on every 24-hour window of it, against the optimum and on-demand
only, and the share of windows on time.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from bench.harness import best_of, cpu_model
from spotfallback.cli.plan import plan_optimum
from spotfallback.sim.backtesting import BacktestResult, backtest
from spotfallback.sim.planner import Plan, PlanRequest, load_process, plan

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
FIXTURES = ROOT / "tests" / "fixtures"
V100 = "spot-traces/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json"

# The job: 1 worker, 10 h of work, 15 h deadline, restart 0.1 h, spot at 0.3x on-demand, JIT on.
SMALL = PlanRequest(work_h=10, num_workers=1, checkpoint_cost_h=5 / 60, restart_overhead_h=0.1,
                    provisioning_delay_h=0.05, spot_price=0.3, on_demand_price=1.0, deadline_h=15, runs=400)
# The README's job: 100 h on 8 workers, 150 h deadline.
LARGE = PlanRequest(work_h=100, num_workers=8, checkpoint_cost_h=5 / 60, restart_overhead_h=0.1,
                    provisioning_delay_h=0.05, spot_price=0.9, on_demand_price=3.06, deadline_h=150, runs=400)



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base = SHARED if SHARED.is_dir() else FIXTURES / "traces"
    print(f"machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}")
    v100 = load_process(str(base / V100))

    for name, req in (("10 h job, 15 h deadline, 1 worker", SMALL), ("100 h job, 150 h deadline, 8 workers", LARGE)):
        def run_plan(req: PlanRequest = req) -> Plan:
            return plan(req, v100)

        secs, p = best_of(args.repeat if req is SMALL else 1, run_plan)
        assert isinstance(p, Plan)
        t0 = time.perf_counter()
        opt = plan_optimum(p, [v100])
        opt_s = time.perf_counter() - t0
        assert opt is not None
        print(f"plan with the optimum, us-west-2a_v100_1, {name}, 400 runs: {secs + opt_s:.2f} s "
              f"(optimum {opt_s:.2f} s; mean optimum {opt:,.1f}, recommended "
              f"{p.recommended.mean_spend / opt:.3f}x of it; target < 5 s)")

    small = plan(SMALL, v100)
    ladder = small.recommended.ladder
    assert ladder is not None
    job = SMALL.job(small.recommended.tau_h)
    secs, res = best_of(args.repeat, lambda: backtest(ladder, [v100], job, window_h=1.6))
    assert isinstance(res, BacktestResult)
    print(f"\nbacktest, {res.windows} windows of us-west-2a_v100_1 (every 1.6 h), the 10 h job's recommended "
          f"ladder: {secs:.2f} s (target < 10 s for 400)")

    leave_one_trace_out(base)


def leave_one_trace_out(base: Path, req: PlanRequest = SMALL, window_h: float = 24.0) -> None:
    """Plan on every shared trace but one, backtest on that one: what the planner promises on a trace it never saw."""
    paths = sorted(base.rglob("*.json")) + sorted(base.rglob("*.csv"))
    procs = [load_process(str(p)) for p in paths]
    print(f"\nleave one trace out: the 10 h job ({req.deadline_probability:g} on time asked), planned on the other "
          f"{len(paths) - 1} traces, replayed unchanged on every {window_h:g} h window of the held-out one:")
    print(f"  {'held-out trace':50s} {'windows':>7s} {'vs optimum mean / p95':>22s} {'> OD':>5s} {'on time':>8s}  "
          f"plan (s)  recommended")
    for i, path in enumerate(paths):
        others = [p for j, p in enumerate(procs) if j != i]
        t0 = time.perf_counter()
        p = plan(req, others[0], more=others[1:])
        secs = time.perf_counter() - t0
        assert p.recommended.ladder is not None
        r = backtest(p.recommended.ladder, [procs[i]], req.job(p.recommended.tau_h), window_h=window_h)
        vs = r.vs_optimum
        print(f"  {str(path.relative_to(base)):50s} {r.windows:7d} {vs.mean:10.3f} / {vs.p95:6.3f}    "
              f"{r.costlier_than_on_demand:4d} {r.on_time_share:8.1%}  {secs:7.1f}  {p.recommended.label}", flush=True)

if __name__ == "__main__":
    main()
