"""Throughput of the simulator: `.venv/bin/python -m bench.bench_simulator [--repeat N]`.

Targets: 10,000 runs of a 100-hour, 8-worker job on a rate model in under 1 s;
1,000 replays of a shared trace in under 2 s. Prints the best of ``--repeat`` timings, the
machine, and the reference (policy-driven) engine's speed for comparison.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

from bench.harness import best_of, cpu_model
from spotfallback.config import Ladder, Tier
from spotfallback.sim.job import JobSpec, wall_to_finish
from spotfallback.sim.planner import PlanRequest, load_process, plan
from spotfallback.sim.results import SimResult
from spotfallback.sim.simulate import simulate
from spotfallback.sim.world import RateModel, world_for

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
FIXTURES = ROOT / "tests" / "fixtures"

JOB = JobSpec(
    work_h=100,
    checkpoint_interval_h=0.75,
    checkpoint_cost_h=5 / 60,
    restart_overhead_h=0.1,
    provisioning_delay_h=0.05,
    notice_s=120,
)
RATE = RateModel(preemptions_per_node_hour=0.02, failures_per_node_hour=0.002, outage_probability=0.2, mean_outage_h=0.5)


def ladder(max_preemptions: int, timeout_s: float | None) -> Ladder:
    return Ladder(
        tiers=(
            Tier.spot(8, max_preemptions=max_preemptions, capacity_timeout_s=timeout_s, price_per_worker_hour=0.9),
            Tier.on_demand(8, price_per_worker_hour=3.06),
        )
    )



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}")
    print("job: 100 h of work, 8-worker gang, tau 45 min, delta 5 min, R 6 min, provisioning 3 min, notice 120 s\n")

    simulate(ladder(3, 3600), JOB, world_for(ladder(3, 3600), RATE), runs=100)  # warm-up
    print("rate model (0.02 preemptions + 0.002 failures per node-hour, 20% outages of 0.5 h):")
    for m, to, name in ((3, 3600.0, "M=3, timeout 1 h"), (-1, None, "spot forever")):
        lad = ladder(m, to)
        secs, res = best_of(args.repeat, lambda lad=lad: simulate(lad, JOB, world_for(lad, RATE), runs=10_000, seed=1))
        assert isinstance(res, SimResult)
        print(f"  10,000 runs, {name:17s}: {secs:.3f} s  ({10_000 / secs:,.0f} runs/s; "
              f"mean {res.interruptions.mean():.1f} interruptions/run; target < 1 s)")

    base = SHARED if SHARED.is_dir() else FIXTURES
    traces = sorted(base.rglob("*.json")) + sorted(base.rglob("*.csv"))
    print(f"\ntrace replay ({'../shared/data' if base == SHARED else 'tests/fixtures'}), spot forever, 1,000 replays each:")
    lad = ladder(-1, None)
    for path in traces:
        proc = load_process(str(path))
        secs, res = best_of(args.repeat, lambda proc=proc: simulate(lad, JOB, world_for(lad, proc), runs=1000, seed=1))
        assert isinstance(res, SimResult)
        rel = path.relative_to(base)
        print(f"  {str(rel):62s} {secs:.3f} s  (mean {res.interruptions.mean():5.1f} interruptions/run; target < 2 s)")

    lad = ladder(3, 3600)
    secs, _ = best_of(1, lambda: simulate(lad, JOB, world_for(lad, RATE), runs=1000, seed=1, engine="policy"))
    print(f"\nreference engine (FallbackPolicy.decide per event), 1,000 rate-model runs, M=3: {secs:.3f} s")

    # The planner's two-way ladders: a deadline guard (Uniform Progress's line) that climbs back.
    job = JOB.model_copy(update={"deadline_h": 150.0})
    guard = {"deadline_h": 150.0, "work_h": float(wall_to_finish(100, 0.75, 5 / 60)), "pace": 1.0, "margin_h": 0.5}
    two_way = Ladder(tiers=(
        Tier.spot(8, max_preemptions=-1, capacity_timeout_s=None, price_per_worker_hour=0.9, climb_back=True,
                  min_dwell_s=0, deadline_guard=guard),
        Tier.on_demand(8, price_per_worker_hour=3.06),
    ))
    trace = load_process(str(FIXTURES / "us-west-2a_v100_1.json"))
    for name, proc, runs in (("rate model", RATE, 10_000), ("us-west-2a_v100_1 trace", trace, 1000)):
        world = world_for(two_way, proc)
        secs, res = best_of(args.repeat, lambda world=world, runs=runs: simulate(two_way, job, world, runs=runs, seed=1))
        ref, _ = best_of(1, lambda world=world: simulate(two_way, job, world, runs=1000, seed=1, engine="policy"))
        assert isinstance(res, SimResult)
        print(f"guarded ladder climbing back, {name}: {runs:,} runs {secs:.3f} s (vectorised; mean "
              f"{res.switches.mean():.1f} moves/run); policy engine, 1,000 runs: {ref:.2f} s")

    trace = load_process(str(FIXTURES / "us-west-2a_v100_1.json"))
    req = PlanRequest(work_h=100, num_workers=8, checkpoint_cost_h=5 / 60, restart_overhead_h=0.1,
                      provisioning_delay_h=0.05, spot_price=0.9, on_demand_price=3.06, deadline_h=300, runs=400)
    secs, result = best_of(1, lambda: plan(req, trace))
    print(f"planner (deadline 300 h), us-west-2a_v100_1, 400 runs per candidate, {len(result.candidates)} candidates "
          f"+ 4 baselines: {secs:.2f} s")


if __name__ == "__main__":
    main()
