"""Backtesting a capped ladder: on spot that keeps failing, no window costs more than on-demand alone."""

from __future__ import annotations

import numpy as np

from spotfallback.config import CostCap, Ladder, Tier
from spotfallback.sim.backtesting import backtest
from spotfallback.sim.job import JobSpec, wall_to_finish
from spotfallback.sim.traces import SpotTrace

# Ten-minute ticks; each day: two calm hours, then spot lost for ten minutes in every hour.
DAY = np.array([1] * 12 + [1, 1, 1, 1, 1, 0] * 22, dtype=np.int64)
FLAKY = SpotTrace("flaky", 600.0, np.tile(DAY, 3))
# A restart eats a quarter hour of each 50-minute attempt: spot at 0.6 costs more per hour of work than on-demand.
JOB = JobSpec(work_h=8.0, checkpoint_interval_h=0.25, checkpoint_cost_h=0.05, restart_overhead_h=0.25,
              jit_checkpoint=False, deadline_h=40.0)


def ladder(cap: CostCap | None) -> Ladder:
    spot = Tier(name="spot", market="spot", num_workers=1, max_preemptions=-1, capacity_timeout_s=None,
                price_per_worker_hour=0.6, cost_cap=cap)
    return Ladder(tiers=(spot, Tier.on_demand(1, price_per_worker_hour=1.0)))


def test_no_window_costs_more_than_on_demand_with_a_cost_cap():
    work = float(wall_to_finish(JOB.work_h, 0.25, 0.05))
    cap = CostCap(work_h=work, restart_h=0.25, first_commit_h=0.25 + 0.25 + 0.05)
    capped = backtest(ladder(cap), [FLAKY], JOB, window_h=24.0)
    free = backtest(ladder(None), [FLAKY], JOB, window_h=24.0)
    assert free.costlier_than_on_demand == free.windows == 3  # the cap has something to prevent ...
    assert capped.costlier_than_on_demand == 0  # ... and prevents it
    assert (capped.switches == 1).all() and capped.spend.max() < free.spend.min()
