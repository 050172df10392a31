"""Runs that never finish: the simulator gives up on them, so their spend and wall time are lower bounds.

The plan says so for every compared policy that has them, and never recommends such a ladder
while one whose runs all finish exists (on-demand only always does).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from spotfallback.cli import plan as cli_plan
from spotfallback.sim.planner import Candidate, PlanRequest, _better, plan
from spotfallback.sim.results import FINISHED, STUCK, SimResult
from spotfallback.sim.traces import SpotTrace

# 4,000 h of spot, then a 150 h outage: a run that starts in its first 50 h and waits for spot without a
# capacity timeout is still waiting at the simulator's limit (100 times the 1 h of work).
OUTAGE = [1] * 4000 + [0] * 150


def request(**kw) -> PlanRequest:
    base = dict(work_h=1, num_workers=1, checkpoint_cost_h=1 / 60, restart_overhead_h=0.1, provisioning_delay_h=0.05,
                spot_price=0.9, on_demand_price=3.06, runs=400)
    base.update(kw)
    return PlanRequest(**base)


def never_finished(c: Candidate) -> int:
    return int((c.result.status != FINISHED).sum())


@pytest.mark.parametrize("deadline_h", [None, 3.0])
def test_a_ladder_whose_runs_never_finish_is_not_recommended_and_the_baseline_says_so(deadline_h):
    """Spot forever waits out the outage for ever in 6 of 400 runs, yet meets the 0.95 required. Without a
    deadline its lower-bound spend, the least, was recommended, with nothing said; with one, it was the bar."""
    p = plan(request(deadline_h=deadline_h), SpotTrace("outage", 3600.0, np.array(OUTAGE)))
    assert never_finished(p.recommended) == 0
    forever = next(b for b in p.baselines if b.label == "spot forever")
    assert never_finished(forever) == 6 and forever.mean_spend < p.recommended.mean_spend
    assert forever.meets(0.95)  # 394 of 400 finished (in time): it counts as one that keeps the deadline
    (note,) = [n for n in p.notes if "never finished" in n]
    assert note.startswith("baseline 'spot forever': 6 of 400 runs never finished (a spot tier that never gets far "
                           "enough on the trace and never gives up); the simulator gave up on them after 100 h, so its "
                           "spend and wall time are those of the hours until then and its means are lower bounds")
    assert all(never_finished(c) == 0 for c in p.comparison() if c is not forever)


def test_a_plan_whose_runs_all_finish_has_no_such_note():
    p = plan(request(deadline_h=3.0, runs=100), SpotTrace("up", 3600.0, np.array([1] * 200)))
    assert not any("never finished" in n for n in p.notes)


def candidate(label: str, spend: float, stuck: int, runs: int = 20) -> Candidate:
    res = SimResult.empty(label, runs, None)
    res.status[:] = FINISHED
    res.status[:stuck] = STUCK
    res.spend[:] = spend
    return Candidate(label, None, None, res, None)


def test_a_ladder_with_runs_that_never_finish_loses_to_one_without_whatever_it_spends():
    """Both feasible (19 of 20 finished is 0.95): the cheap one's spend counts only the hours until the give-up."""
    cheap, dear = candidate("cheap", 1.0, stuck=1), candidate("dear", 5.0, stuck=0)
    assert cheap.meets(0.95) and cheap.unfinished == 1 and dear.unfinished == 0
    assert _better(dear, cheap, 0.95) and not _better(cheap, dear, 0.95)
    assert _better(cheap, candidate("cheaper still, more stuck", 0.5, stuck=2), 0.5) is False  # then by spend
    assert not _better(candidate("infeasible", 1.0, stuck=5), dear, 0.95)  # feasibility comes first


def test_plan_json_and_output_name_the_policy_whose_runs_never_finished(tmp_path):
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    cli_plan.register(app)
    app.command()(lambda: None)  # a second command keeps `plan` a subcommand
    trace = tmp_path / "outage.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": OUTAGE}))
    args = ["plan", "--hours", "1", "--workers", "1", "--checkpoint-cost-s", "60", "--restart-overhead-s", "360",
            "--provisioning-delay-s", "180", "--trace", str(trace)]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    rows = {row["policy"]: row for row in out["policies"]}
    assert rows["spot forever"]["unfinished"] == 6 and rows["recommended"]["unfinished"] == 0
    assert any(n.startswith("baseline 'spot forever': 6 of 400 runs never finished") for n in out["notes"])
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "note: baseline 'spot forever': 6 of 400 runs never finished" in " ".join(r.output.split())
