"""Uniform Progress as the paper has it: progress is what was committed, so it checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spotfallback.config import Tier
from spotfallback.sim.baselines import simulate_uniform_progress, uniform_progress_interval
from spotfallback.sim.costmodel import daly_interval
from spotfallback.sim.job import JobSpec
from spotfallback.sim.traces import SpotTrace, load_spot_trace
from spotfallback.sim.world import observed_mtbf_h

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPOT = load_spot_trace(FIXTURES / "us-west-2a_v100_1.json")
LOSSY = JobSpec(work_h=10, checkpoint_cost_h=5 / 60, restart_overhead_h=0.1, provisioning_delay_h=0.05,
                notice_s=120, jit_checkpoint=True, deadline_h=15)  # a 2 min notice cannot hold a 5 min write


def test_a_job_without_an_interval_gets_dalys_for_the_spot_gang():
    mtbf, _ = observed_mtbf_h(SPOT, 1)
    assert uniform_progress_interval(LOSSY, SPOT, 1) == daly_interval(5 / 60, mtbf)
    # The job's own interval wins; a notice that holds the write loses nothing, so none is added.
    assert uniform_progress_interval(LOSSY.with_interval(0.5), SPOT, 1) == 0.5
    saved = LOSSY.model_copy(update={"notice_s": 600})
    assert uniform_progress_interval(saved, SPOT, 1) is None


def test_uniform_progress_without_an_interval_runs_as_with_dalys():
    spot, od = Tier.spot(1, price_per_worker_hour=0.3), Tier.on_demand(1, price_per_worker_hour=1.0)
    tau = uniform_progress_interval(LOSSY, SPOT, 1)
    bare = simulate_uniform_progress(LOSSY, spot, od, SPOT, runs=200, seed=1)
    daly = simulate_uniform_progress(LOSSY.with_interval(tau), spot, od, SPOT, runs=200, seed=1)
    assert np.array_equal(bare.spend, daly.spend) and np.array_equal(bare.wall_h, daly.wall_h)
    # Committed progress keeps the safety net from sending every run to on-demand for good.
    assert (bare.final_tier == 0).mean() > 0.3


def test_uniform_progress_keeps_spot_that_never_fails():
    # A trace without interruptions has no MTBF; Daly's interval for one of the deadline still
    # commits progress, so the safety net does not send the run to on-demand for good.
    calm = SpotTrace(name="calm", gap_seconds=600, available=np.ones(2000, dtype=np.int64))
    tau = uniform_progress_interval(LOSSY, calm, 1)
    assert tau == daly_interval(5 / 60, LOSSY.deadline_h)
    spot, od = Tier.spot(1, price_per_worker_hour=0.9), Tier.on_demand(1, price_per_worker_hour=3.06)
    res = simulate_uniform_progress(LOSSY, spot, od, calm, runs=50, seed=0, checkpoint_on_demand=True)
    assert (res.final_tier == 0).all() and (res.spot_h == res.billed_h).all()
    assert res.deadline_probability() == 1.0
    # Spot throughout, plus the periodic writes: well under on-demand only (30.9 for this job).
    assert res.mean_spend < 10.0


def test_uniform_progress_interval_is_unchanged_where_the_trace_interrupts_within_the_deadline():
    mtbf, _ = observed_mtbf_h(SPOT, 1)
    assert mtbf < LOSSY.deadline_h
    assert uniform_progress_interval(LOSSY, SPOT, 1) == daly_interval(5 / 60, mtbf)
