"""Each feature of issue 10 against the one-way ladder on the shared traces.

`.venv/bin/python bench/bench_beyond.py [--runs N] [--markdown]`

For every shared trace the same job runs on the seeds' one-way ladder (spot with a
preemption budget and a capacity timeout, then on-demand) and on that ladder with one
feature switched on, with the same budgets, the same random draws and the same trace
offsets: climbing back to spot, an elastic spot tier (half to all workers; only traces with
more than one node can show it), and leaving spot on a burst of preemptions. The numbers
are mean spend, the share of runs that met the deadline, and mean wall time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from spotfallback.config import Tier
from spotfallback.planner import load_process
from spotfallback.simulator import JobSpec, SimResult, simulate, world_for

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"

WORKERS = 4
JOB = JobSpec(
    work_h=24,
    checkpoint_interval_h=0.5,
    checkpoint_cost_h=3 / 60,
    restart_overhead_h=0.1,
    provisioning_delay_h=0.05,
    notice_s=120,
    deadline_h=60,
)
BUDGET = {"max_preemptions": 3, "capacity_timeout_s": 1800.0, "price_per_worker_hour": 0.9}
FEATURES: dict[str, dict[str, object]] = {
    "one-way": {},
    "climb back": {"climb_back": True, "min_dwell_s": 3600.0},
    "elastic": {"min_workers": WORKERS // 2, "min_dwell_s": 1800.0},
    "rate rule": {"max_preemption_rate": {"count": 2, "window_s": 1800.0}},
    "climb back + rate rule": {"climb_back": True, "min_dwell_s": 3600.0, "max_preemption_rate": {"count": 2, "window_s": 1800.0}},
}


def ladder(feature: str, budget: dict[str, float]) -> list[Tier]:
    spot = Tier(name="spot", market="spot", num_workers=WORKERS, **budget, **FEATURES[feature])  # type: ignore[arg-type]
    return [spot, Tier.on_demand(WORKERS, price_per_worker_hour=3.06)]


def traces() -> list[Path]:
    return sorted((SHARED / "spot-traces").rglob("*.json")) + sorted((SHARED / "node-traces").glob("*.csv"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-preemptions", type=int, default=3)
    ap.add_argument("--deadline-h", type=float, default=60.0)
    args = ap.parse_args()
    budget = {**BUDGET, "max_preemptions": args.max_preemptions}
    job = JOB.model_copy(update={"deadline_h": args.deadline_h})
    print(f"job: {job.work_h:g} h of work on {WORKERS} workers, deadline {job.deadline_h:g} h, tau {job.checkpoint_interval_h:g} h, "
          f"R {job.restart_overhead_h:g} h; spot 0.90/worker-h (max_preemptions={args.max_preemptions}, capacity_timeout_s=1800), "
          "on-demand 3.06; "
          f"{args.runs} runs per cell, seed {args.seed}\n")
    print("| trace | ladder | mean spend | vs one-way | met deadline | mean wall h | mean moves |")
    print("|---|---|---:|---:|---:|---:|---:|")
    t0 = time.perf_counter()
    for path in traces():
        proc = load_process(str(path))
        name = str(path.relative_to(SHARED)).removeprefix("spot-traces/")
        base: SimResult | None = None
        for feature in FEATURES:
            if feature == "elastic" and getattr(proc, "capacity", 2) < 2:
                continue  # a one-node trace gates the whole pool: nothing to shrink to
            lad = ladder(feature, budget)
            res = simulate(lad, job, world_for(lad, proc), runs=args.runs, seed=args.seed, engine="policy")
            base = base or res
            delta = (res.mean_spend / base.mean_spend - 1.0) * 100.0
            print(f"| {name} | {feature} | {res.mean_spend:.1f} | {delta:+.1f}% | {res.deadline_probability():.3f} | "
                  f"{res.wall_h.mean():.1f} | {res.switches.mean():.2f} |")
    print(f"\n({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
