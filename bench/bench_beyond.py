"""Each feature beyond one-way fallback (climbing back, elastic tiers, guards) against the one-way ladder on the shared traces.

`.venv/bin/python -m bench.bench_beyond [--runs N] [--seed S] [--markdown]`

For every shared trace the same job runs on the seeds' one-way ladder (spot with a
preemption budget and a capacity timeout, then on-demand) and on that ladder with one
feature switched on, with the same budgets, the same random draws and the same trace
offsets: climbing back to spot, an elastic spot tier (half to all workers; only traces with
more than one node can show it), leaving on a burst of preemptions (the sliding-window rate
rule), and leaving when staying is expected to cost more (the expected-cost exit). A
deadline reaches a ladder only through a tier's ``deadline_guard``, so every ladder here
carries the same one (slack rule: leave when the slack is down to 1 h); the row "one-way,
no guard" shows what the guard itself changes. Three settings: a generous deadline, a tight
one with a large count budget, and spot at 72% of the on-demand price (where leaving a
stormy pool can pay). The numbers are mean spend, its change against the one-way ladder,
the share of runs that met the deadline, mean wall time and mean moves (switches + climbs).
``--markdown`` prints the tables as in docs/beyond.md; without it, aligned plain text.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

from spotfallback.config import Tier
from spotfallback.sim.job import JobSpec, wall_to_finish
from spotfallback.sim.planner import load_process
from spotfallback.sim.results import SimResult
from spotfallback.sim.simulate import simulate
from spotfallback.sim.world import world_for

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
FIXTURES = ROOT / "tests" / "fixtures" / "traces"  # the same files, when ../shared is not there

WORKERS = 4
WORK_H, TAU_H, DELTA_H = 24.0, 0.5, 3 / 60
ON_DEMAND_PRICE = 3.06
SETTINGS: dict[str, dict[str, Any]] = {
    "generous": {"title": "Generous deadline: 60 h for 24 h of work, max_preemptions=3, spot 0.90",
                 "deadline_h": 60.0, "max_preemptions": 3, "spot_price": 0.9},
    "tight": {"title": "Tight deadline: 32 h, max_preemptions=10, spot 0.90",
              "deadline_h": 32.0, "max_preemptions": 10, "spot_price": 0.9},
    "dear": {"title": "Dear spot: 2.20 (72% of on-demand), 60 h, max_preemptions=10",
             "deadline_h": 60.0, "max_preemptions": 10, "spot_price": 2.2},
}
CLIMB = {"climb_back": True, "min_dwell_s": 3600.0}
FEATURES: dict[str, dict[str, Any]] = {
    "one-way": {},
    "one-way, no guard": {"deadline_guard": None},
    "climb back": CLIMB,
    "elastic": {"min_workers": WORKERS // 2, "min_dwell_s": 1800.0},
    "rate rule": {"max_preemption_rate": {"count": 2, "window_s": 1800.0}},
    "expected-cost exit": {"expected_cost_exit": True},
    "climb back + expected-cost exit": {**CLIMB, "expected_cost_exit": True},
}


def job(deadline_h: float) -> JobSpec:
    return JobSpec(work_h=WORK_H, checkpoint_interval_h=TAU_H, checkpoint_cost_h=DELTA_H, restart_overhead_h=0.1,
                   provisioning_delay_h=0.05, notice_s=120, deadline_h=deadline_h)


def ladder(feature: str, setting: dict[str, Any]) -> list[Tier]:
    guard = {"deadline_h": setting["deadline_h"], "work_h": float(wall_to_finish(WORK_H, TAU_H, DELTA_H)),
             "pace": 0.0, "margin_h": 1.0}
    fields: dict[str, Any] = {"max_preemptions": setting["max_preemptions"], "capacity_timeout_s": 1800.0,
                              "price_per_worker_hour": setting["spot_price"], "deadline_guard": guard,
                              **FEATURES[feature]}
    spot = Tier(name="spot", market="spot", num_workers=WORKERS, **fields)
    return [spot, Tier.on_demand(WORKERS, price_per_worker_hour=ON_DEMAND_PRICE)]


def traces() -> tuple[Path, list[Path]]:
    base = SHARED if SHARED.is_dir() else FIXTURES
    return base, sorted((base / "spot-traces").rglob("*.json")) + sorted((base / "node-traces").glob("*.csv"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--markdown", action="store_true", help="Print markdown tables (as in docs/beyond.md).")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"Comma-separated subset of {', '.join(SETTINGS)}.")
    args = ap.parse_args()
    base, paths = traces()
    print(f"job: {WORK_H:g} h of work on {WORKERS} workers, tau {TAU_H:g} h, delta {DELTA_H * 60:g} min, R 0.1 h, "
          f"provisioning 0.05 h, 120 s notice (shorter than a checkpoint write: no just-in-time checkpoint); "
          f"capacity_timeout_s=1800; on-demand {ON_DEMAND_PRICE}/worker-h; {args.runs} runs per cell, seed {args.seed}; "
          f"traces from {base}")
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    for key in args.settings.split(","):
        setting = SETTINGS[key]
        rows: list[list[str]] = []
        for path in paths:
            proc = load_process(str(path))
            name = str(path.relative_to(base)).removeprefix("spot-traces/")
            one_way: SimResult | None = None
            for feature in FEATURES:
                if feature == "elastic" and getattr(proc, "capacity", 2) < 2:
                    continue  # a one-node trace gates the whole pool: nothing to shrink to
                lad = ladder(feature, setting)
                res = simulate(lad, job(setting["deadline_h"]), world_for(lad, proc), runs=args.runs, seed=args.seed)
                one_way = one_way or res
                change = (res.mean_spend / one_way.mean_spend - 1.0) * 100.0
                rows.append([name, feature, f"{res.mean_spend:.1f}", f"{change:+.1f}%", f"{res.deadline_probability():.3f}",
                             f"{res.wall_h.mean():.1f}", f"{res.switches.mean():.2f}"])
        header = ["trace", "ladder", "mean spend", "vs one-way", "met deadline", "mean wall h", "mean moves"]
        print(f"\n### {setting['title']}\n")
        if args.markdown:
            print("| " + " | ".join(header) + " |")
            print("|---|---|---:|---:|---:|---:|---:|")
            for r in rows:
                print("| " + " | ".join(r) + " |")
        else:
            widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
            for r in [header, *rows]:
                print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
