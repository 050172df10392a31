"""The planner's cost cap: off unless asked; asked, on every spot tier, sized for the job it plans."""

from __future__ import annotations

import pytest
import yaml

from spotfallback.config import JobConfig
from spotfallback.sim.job import NEVER_H, wall_to_finish
from spotfallback.sim.planner import PlanRequest, plan
from spotfallback.sim.world import RateModel

REQ = PlanRequest(work_h=6.0, num_workers=2, checkpoint_cost_h=0.05, restart_overhead_h=0.1, spot_price=0.3,
                  on_demand_price=1.0, deadline_h=10.0, runs=40)
SPOT = RateModel(preemptions_per_node_hour=0.2)


def spot_ladders(p):
    return [c.ladder for c in p.candidates if c.ladder is not None and len(c.ladder) > 1]


def test_plans_carry_no_cost_cap_unless_asked():
    p = plan(REQ, SPOT, climb=False)
    assert spot_ladders(p)
    assert all(t.cost_cap is None for lad in spot_ladders(p) for t in lad.tiers)


def test_an_asked_cost_cap_sits_on_every_spot_tier_and_reaches_the_job_file():
    p = plan(REQ.model_copy(update={"cost_cap_factor": 1.1}), [SPOT, SPOT], climb=False)
    for c in p.candidates:
        if c.ladder is None or len(c.ladder) == 1:
            continue
        *spots, od = c.ladder.tiers
        assert od.cost_cap is None and len(spots) == 2
        for t in spots:
            assert t.cost_cap is not None
            assert t.cost_cap.work_h == pytest.approx(float(wall_to_finish(6.0, c.tau_h or NEVER_H, 0.05)))
            risk = c.tau_h + 0.05 if c.tau_h is not None else t.cost_cap.work_h
            assert t.cost_cap.first_commit_h == pytest.approx(0.1 + risk)
            assert (t.cost_cap.restart_h, t.cost_cap.factor) == (0.1, 1.1)
    calm = plan(REQ.model_copy(update={"cost_cap_factor": 1.1, "deadline_h": None}), RateModel(preemptions_per_node_hour=0.01),
                climb=False)  # with a deadline and no guard searched, on-demand only is the one guarded ladder
    assert calm.recommended.ladder is not None and calm.recommended.ladder.tiers[0].cost_cap is not None
    text = calm.job_yaml("capped", "/tmp/store", "train:main")
    assert "cost_cap read" in text
    assert JobConfig.model_validate(yaml.safe_load(text)).tiers == calm.recommended.ladder.tiers
