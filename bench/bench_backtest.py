"""Hindsight optimum and backtesting: `.venv/bin/python bench/bench_backtest.py [--repeat N]`.

Targets: `plan` with the optimum on one trace in under 5 s; a backtest of 400 windows in
under 10 s. Also prints, for a planned ladder replayed unchanged on every 24-hour window of
every shared trace, its spend against on-demand only and against the optimum.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from bench.harness import cpu_model
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


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


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

    print(f"\nthe 10 h job's recommended ladder ({small.recommended.label}), unchanged, every 24 h window:")
    print(f"  {'trace':62s} {'windows':>7s} {'vs OD mean/med/p95':>20s} {'vs optimum mean/med/p95':>24s} "
          f"{'> OD':>5s} {'on time':>8s}")
    for path in sorted(base.rglob("*.json")) + sorted(base.rglob("*.csv")):
        r = backtest(ladder, [load_process(str(path))], job, window_h=24)
        od, vs_opt = r.vs_on_demand, r.vs_optimum
        print(f"  {str(path.relative_to(base)):62s} {r.windows:7d} {od.mean:6.3f} {od.median:6.3f} {od.p95:6.3f} "
              f"{vs_opt.mean:7.3f} {vs_opt.median:7.3f} {vs_opt.p95:7.3f}  {r.costlier_than_on_demand:4d} {r.on_time_share:8.1%}")


if __name__ == "__main__":
    main()
