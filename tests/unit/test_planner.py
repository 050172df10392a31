"""The planner: feasible, no dearer than any of the four baselines, output the runner reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spotfallback.config import JobConfig, ladder_from_yaml
from spotfallback.sim.backtesting import backtest
from spotfallback.sim.planner import (
    ROBUST_TOLERANCE,
    TAU_MIN_H,
    PlanRequest,
    guarded,
    ladder_yaml,
    load_process,
    observed_mtbf_h,
    plan,
    trace_counts,
)
from spotfallback.sim.simulate import simulate
from spotfallback.sim.traces import SpotTrace
from spotfallback.sim.world import RateModel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRACES = FIXTURES / "traces"  # a copy of ../shared/data/{spot-traces,node-traces}, for CI
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
ALL_TRACES = sorted(str(p.relative_to(TRACES)) for p in TRACES.rglob("*") if p.suffix in (".json", ".csv"))


def request(**kw) -> PlanRequest:
    base = dict(work_h=48, num_workers=8, checkpoint_cost_h=5 / 60, restart_overhead_h=0.1,
                provisioning_delay_h=0.05, spot_price=0.9, on_demand_price=3.06, runs=120)
    base.update(kw)
    return PlanRequest(**base)


def no_dearer_than_any_baseline(p, unguarded_rel: float = 0.0) -> None:
    """``unguarded_rel``: how much more a guarded recommendation may cost than an unguarded ladder
    baseline that met the deadline on the sample without a rule that keeps it (its luck)."""
    rec = p.recommended
    assert rec.meets(p.request.deadline_probability)
    for base in p.baselines:
        if base.meets(p.request.deadline_probability):
            luck = base.ladder is not None and guarded(rec) and not guarded(base)
            assert rec.mean_spend <= base.mean_spend * (1 + (unguarded_rel if luck else 0.0)) + 1e-9, (base.label, rec.label)


def test_fixture_traces_are_every_shared_trace():
    assert len(ALL_TRACES) == 8
    if SHARED.is_dir():  # the copy must not drift from, or leave out, what ../shared holds
        shared = sorted(str(p.relative_to(SHARED)) for p in SHARED.rglob("*") if p.suffix in (".json", ".csv"))
        assert shared == ALL_TRACES
        for rel in ALL_TRACES:
            assert (TRACES / rel).read_bytes() == (SHARED / rel).read_bytes(), rel


@pytest.mark.parametrize("slack", [1.25, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("trace", ALL_TRACES)
def test_plan_is_no_dearer_than_any_baseline_on_every_shared_trace(trace, slack):
    """The four baselines: on-demand only, spot forever, the seed's M = 5 and Uniform Progress, all four.

    Every shared trace, every deadline of docs/planner.md (1.25 to 3 times the work), the
    planner's default grids. Uniform Progress runs the same job (checkpoints every tau on
    every market, as the runner's training function does); a baseline that misses the
    deadline (Uniform Progress on the node trace, whose 10 min tau cannot finish by 1.5 W
    even on on-demand) is no bar to clear.
    """
    p = plan(request(deadline_h=slack * 48, runs=100), load_process(str(TRACES / trace)))
    assert [b.label for b in p.baselines] == ["on-demand only", "spot forever", "seed M=5", "uniform progress"]
    # A guarded ladder is preferred to an unguarded one that met the deadline on the sample: it
    # may pay its lead's few early exits to on-demand (0.2% at most here, on loose deadlines).
    no_dearer_than_any_baseline(p, unguarded_rel=0.005)


def test_a_budget_the_planning_traces_never_spend_is_not_recommended():
    """Among ladders as cheap on the planning traces (here exactly: the budget of M = 8 never ran
    out on them), the plan takes the one that counts fewest of their events. Held out of the
    planning, the node trace, a gang interrupted every few minutes, spends that budget within
    hours: the budgeted twin then pays on-demand for the rest, the recommendation does not."""
    traces = [load_process(str(TRACES / t)) for t in ALL_TRACES if not t.startswith("node-traces")]
    req = PlanRequest(work_h=10, num_workers=1, checkpoint_cost_h=1 / 60, restart_overhead_h=0.3,
                      provisioning_delay_h=0.05, spot_price=0.3, on_demand_price=1.0, deadline_h=15, notice_s=120,
                      checkpoint_on_request=True, runs=100)
    p = plan(req, traces[0], more=traces[1:])
    rec = p.recommended
    assert rec.ladder is not None and guarded(rec)
    assert rec.ladder.tiers[0].max_preemptions == -1
    twins = [c for c in p.candidates if c.ladder is not None and guarded(c) and c.meets(0.95)
             and c.mean_spend <= rec.mean_spend and trace_counts(c) > trace_counts(rec)]
    assert twins, "no cheaper candidate that counts more: the rule had nothing to choose"
    assert rec.mean_spend <= min(c.mean_spend for c in twins) * (1 + ROBUST_TOLERANCE)
    node = load_process(str(TRACES / "node-traces/aws-p3-trace.csv"))
    twin = min(twins, key=lambda c: c.mean_spend)
    held_out = [backtest(c.ladder, [node], req.job(c.tau_h)).spend.mean() for c in (rec, twin)]
    assert held_out[0] < 0.9 * held_out[1]


def test_rate_model_plan_is_feasible_and_cheapest():
    p = plan(request(deadline_h=80), RateModel(preemptions_per_node_hour=0.01, failures_per_node_hour=0.001,
                                               outage_probability=0.3, mean_outage_h=2.0))
    assert p.feasible
    no_dearer_than_any_baseline(p)
    assert p.recommended.mean_spend < p.baselines[0].mean_spend  # spot pays here
    assert p.tau_daly_h is not None and p.tau_young_h is not None
    assert p.recommended.tau_h is not None
    # Every candidate was simulated on the same draws, and the sweeps for the plot exist.
    assert {c.result.runs for c in p.candidates} == {120}
    assert len(p.sweep_over_m()) >= 5 and len(p.sweep_over_tau()) >= 3


def test_recommended_guarded_ladder_is_what_the_policy_engine_does():
    # The planner simulates on the vectorised engine; the recommendation (here a deadline
    # guard that climbs back) gives the same runs when FallbackPolicy decides every event.
    proc = load_process(str(FIXTURES / "us-west-2a_v100_1.json"))
    p = plan(request(deadline_h=60, runs=80), proc)
    rec = p.recommended
    assert rec.ladder is not None and rec.ladder[0].deadline_guard is not None and rec.ladder[0].climb_back
    again = simulate(rec.ladder, p.request.job(rec.tau_h), [proc, RateModel()], runs=80, seed=p.request.seed,
                     engine="policy")
    np.testing.assert_allclose(again.spend, rec.result.spend, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(again.wall_h, rec.result.wall_h, rtol=1e-9, atol=1e-9)
    one_way = plan(request(deadline_h=60, runs=80), proc, climb=False)
    assert not any(c.ladder is not None and (c.ladder[0].climb_back or c.ladder[0].deadline_guard)
                   for c in one_way.candidates)
    assert rec.mean_spend <= one_way.recommended.mean_spend + 1e-9


def test_job_file_round_trips_through_job_config(tmp_path):
    p = plan(request(deadline_h=72, runs=60), load_process(str(FIXTURES / "us-east-1f_v100_4node.json")))
    path = tmp_path / "job.yaml"
    path.write_text(p.job_yaml("nightly-48h", "s3://bucket/runs", "spotfallback.examples.ddp_digits:train_fn", {"lr": 0.01}))
    job = JobConfig.from_yaml(path)
    assert (job.name, job.storage_path, job.entrypoint, job.train_loop_config) == (
        "nightly-48h", "s3://bucket/runs", "spotfallback.examples.ddp_digits:train_fn", {"lr": 0.01})
    assert job.ladder == p.recommended.ladder  # guard, climb back and budgets included
    assert job.plan == p.prediction()
    assert job.plan.spend == pytest.approx(p.recommended.mean_spend)
    assert job.plan.deadline_h == 72 and job.plan.on_time_probability == pytest.approx(p.recommended.p_deadline)
    assert job.plan.checkpoint_interval_h == pytest.approx(p.recommended.tau_h)
    assert "us-east-1f_v100_4node" in job.plan.made_with and "60 runs" in job.plan.made_with
    # The tiers alone still read as a ladder file.
    assert ladder_from_yaml(p.tiers_yaml()) == p.recommended.ladder
    from spotfallback.errors import ConfigError

    with pytest.raises(ConfigError, match="entrypoint"):
        p.job_yaml("ok", "./runs", "no-colon")
    with pytest.raises(ConfigError, match="name"):
        p.job_yaml("../escape", "./runs", "m:f")


def test_spot_no_cheaper_than_on_demand_recommends_on_demand_only():
    p = plan(request(spot_price=3.06, deadline_h=60), RateModel(preemptions_per_node_hour=0.01))
    assert p.recommended.label == "on-demand only"
    assert [t.market for t in p.recommended.ladder.tiers] == ["on-demand"]


def test_infeasible_deadline_is_reported():
    with pytest.raises(ValueError, match="shorter than the work"):
        request(deadline_h=40)
    # Feasible only on on-demand (48 h of work + R + provisioning = 48.15 h, the first start included).
    p = plan(request(deadline_h=48.2, deadline_probability=1.0), RateModel(preemptions_per_node_hour=0.05), climb=False)
    assert p.recommended.label == "on-demand only" and p.feasible
    exact = plan(request(deadline_h=48.15, deadline_probability=1.0), RateModel(preemptions_per_node_hour=0.05),
                 climb=False)
    assert exact.recommended.label == "on-demand only" and exact.feasible


def test_a_deadline_no_run_can_meet_is_refused_naming_the_least_one():
    """Past the work but short of the first start's restart and provisioning: every candidate, on-demand
    only included, had P = 0, and the plan recommended the "most likely" of them (spot, M = 10)."""
    with pytest.raises(ValueError, match=r"deadline_h \(48.01\) is shorter than the least wall time a run can take, "
                                         r"48.6 h: .*give a deadline of at least 48.6 h, or none"):
        request(deadline_h=48.01, provisioning_delay_h=0.5)
    assert request(provisioning_delay_h=0.5).least_deadline_h == pytest.approx(48.6)
    with pytest.raises(ValueError, match="least wall time a run can take, 48.15 h"):
        request(deadline_h=48.149)
    # The least one itself is met, on on-demand only: the simulator bills a start as the check counts it.
    p = plan(request(deadline_h=48.6, provisioning_delay_h=0.5, deadline_probability=1.0),
             RateModel(preemptions_per_node_hour=0.05), climb=False)
    assert p.feasible and p.recommended.p_deadline == 1.0


def test_no_deadline_leaves_out_uniform_progress_and_guards():
    p = plan(request(), RateModel(preemptions_per_node_hour=0.005))
    assert len(p.baselines) == 3 and any("Uniform Progress" in n for n in p.notes)
    assert not any(c.ladder is not None and c.ladder[0].deadline_guard for c in p.candidates)
    no_dearer_than_any_baseline(p)


def test_jit_notice_covering_the_checkpoint_makes_periodic_checkpoints_optional():
    p = plan(request(notice_s=600, deadline_h=100), RateModel(preemptions_per_node_hour=0.02), climb=False)
    assert p.tau_daly_h is None and p.lossy_mtbf_h == float("inf")
    assert any("optional" in n for n in p.notes)


def test_a_climbing_recommendation_without_periodic_checkpoints_says_it_never_climbs():
    """The runner (and the simulator) climb back just after a commit; with none due, the plan must say so."""
    trace = load_process(str(TRACES / "spot-traces/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json"))
    # A 5-minute write that a 10-minute notice holds: periodic ones would cost more than they save.
    p = plan(request(work_h=10, num_workers=1, checkpoint_cost_h=5 / 60, notice_s=600, deadline_h=15, spot_price=0.3,
                     on_demand_price=1.0), trace)
    rec = p.recommended
    assert rec.tau_h is None and rec.ladder is not None and rec.ladder[0].climb_back
    assert any("does not return" in n for n in p.notes)
    periodic = plan(request(work_h=10, num_workers=1, deadline_h=15, spot_price=0.3, on_demand_price=1.0), trace)
    assert periodic.recommended.tau_h is not None and not any("does not return" in n for n in periodic.notes)
    asked = plan(request(work_h=10, num_workers=1, checkpoint_cost_h=1 / 60, deadline_h=15, spot_price=0.3,
                         on_demand_price=1.0, checkpoint_on_request=True), trace)
    assert not any("does not return" in n for n in asked.notes)  # its climbs ask for their own checkpoint
    assert any("must answer checkpoint requests" in n for n in asked.notes)
    assert asked.prediction().checkpoint_on_request
    assert "answers checkpoint requests" in asked.job_yaml("asked", "./runs", "m:f")


def test_observed_mtbf_of_a_trace():
    tr = SpotTrace("t", 3600.0, np.array([1, 1, 0, 1, 1, 1, 0, 0]))
    mtbf, lossy = observed_mtbf_h(tr, 4)
    assert mtbf == pytest.approx(2.5) and lossy == float("inf")  # 5 h up, 2 interruptions
    assert observed_mtbf_h(RateModel(preemptions_per_node_hour=0.1, failures_per_node_hour=0.025), 4) == (
        pytest.approx(2.0), pytest.approx(10.0))


def test_a_trace_flipping_every_second_gets_a_plan_with_intervals_no_shorter_than_a_minute():
    """Daly's interval there is the gang's mean time between interruptions, a second (the shortest
    tick a trace may have; a millisecond one, which the grid's six decimals of an hour once rounded
    to a zero interval that no job accepts, is now refused by the trace itself)."""
    flips = SpotTrace("s", 1.0, np.array([1, 0] * 500))
    p = plan(request(work_h=0.5, num_workers=1, deadline_h=1.0, runs=8), flips)
    assert p.tau_daly_h is not None and p.tau_daly_h == pytest.approx(1 / 3600)
    taus = {c.tau_h for c in p.candidates if c.tau_h is not None}
    assert taus and min(taus) == TAU_MIN_H
    assert p.recommended.label == "on-demand only"  # no gang there ever reaches a checkpoint


def test_several_samples_split_the_runs_and_the_deadline_must_hold_on_the_worst():
    a, b = (load_process(str(TRACES / t)) for t in ALL_TRACES[:2])
    req = request(work_h=10, num_workers=1, deadline_h=15, runs=100, spot_price=0.3, on_demand_price=1.0)
    p = plan(req, a, more=[b])
    rec = p.recommended
    assert [r.runs for r in rec.by_trace] == [50, 50] and rec.result.runs == 100
    assert rec.p_deadline == min(r.deadline_probability(15) for r in rec.by_trace)
    assert rec.meets(req.deadline_probability) and guarded(rec)
    assert a.name in p.made_with and b.name in p.made_with
    with pytest.raises(ValueError, match="one per spot tier"):
        plan(req, [a, a], more=[b])


def test_guard_lead_covers_what_a_new_gang_can_lose_before_its_progress_is_safe():
    req = request(deadline_h=72, notice_s=120)  # a 2 min notice cannot hold a 5 min write
    assert req.guard(0.7, 1.0, 0.4).first_commit_h == pytest.approx(0.1 + 0.7 + 5 / 60)
    held = request(deadline_h=72, notice_s=600)  # it can: a preemption loses only the save's lead
    assert held.guard(0.7, 1.0, 0.4).first_commit_h == pytest.approx(0.1 + (1.5 * 300 + 3) / 3600)
    short = request(deadline_h=72, notice_s=400)  # a notice shorter than the lead: saved at once, all of it lost
    assert short.guard(0.7, 1.0, 0.4).first_commit_h == pytest.approx(0.1 + 400 / 3600)


def reserving_guards(p) -> list:
    """(candidate, guard) of every candidate whose first tier's guard keeps a reserve."""
    return [(c, c.ladder[0].deadline_guard) for c in p.candidates
            if c.ladder is not None and c.ladder[0].deadline_guard is not None and c.ladder[0].deadline_guard.reserve_h]


def test_slack_rule_guards_that_climb_back_also_try_keeping_slack_for_the_way_back():
    """On-demand keeps the slack where the guard left it: only a reserve kept on leaving lets the run return."""
    trace = load_process(str(TRACES / "spot-traces/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json"))
    p = plan(request(work_h=10, num_workers=1, checkpoint_cost_h=1 / 60, deadline_h=15, spot_price=0.3,
                     on_demand_price=1.0, checkpoint_on_request=True), trace)
    guards = reserving_guards(p)
    unwritten = sorted({g.reserve_h for c, g in guards if c.tau_h is None})
    assert unwritten == pytest.approx([0.15 * 5, 0.3 * 5])  # shares of the 5 h of slack: these write no periodic checkpoints
    assert all(g.pace == 0 and c.ladder[0].climb_back and f"reserve={g.reserve_h * 60:.0f}m" in c.label for c, g in guards)
    reserving = guards[0][0]
    assert ladder_from_yaml(ladder_yaml(reserving.ladder)) == reserving.ladder  # the reserve reaches the runner's file
    # Only reserves a climb can spend, at least its two changeovers (6 + 3 min each) and the guard's lead: with
    # a write the notice cannot hold, the lead is a whole interval and the shares of the slack fall short.
    for job in (p, plan(request(work_h=10, num_workers=1, deadline_h=15, spot_price=0.3, on_demand_price=1.0), trace)):
        assert all(g.reserve_h >= 2 * 0.15 + g.first_commit_h for _, g in reserving_guards(job))


def test_a_plan_on_a_trace_recorded_for_fewer_instances_than_the_gang_says_how_it_read_it():
    """Eight workers on a one-instance trace: the plan assumes the whole pool is there whenever the trace shows one."""
    tr = SpotTrace("one-node", 3600.0, np.array([1, 1, 0, 1, 1, 1]))
    req = PlanRequest(work_h=4, num_workers=8, deadline_h=8, runs=20, checkpoint_cost_h=0.02, restart_overhead_h=0.1,
                      provisioning_delay_h=0.05, notice_s=120, spot_price=0.3, on_demand_price=1.0)
    notes = plan(req, tr).notes
    assert sum("'one-node' records at most 1 instance(s), and the gang has 8 workers" in n for n in notes) == 1
    assert not any("records at most" in n for n in plan(req.model_copy(update={"num_workers": 1}), tr).notes)


def test_a_plan_on_a_trace_shorter_than_its_deadline_says_the_trace_recurs():
    """A run outlasting a 6 h trace meets its first hours again: the plan says so, once the deadline passes its end."""
    tr = SpotTrace("six-hours", 3600.0, np.array([1, 1, 0, 1, 1, 1]))
    req = PlanRequest(work_h=4, num_workers=1, deadline_h=8, runs=20, checkpoint_cost_h=0.02, restart_overhead_h=0.1,
                      provisioning_delay_h=0.05, notice_s=120, spot_price=0.3, on_demand_price=1.0)
    (note,) = [n for n in plan(req, tr).notes if "recur" in n]
    assert note.startswith("trace 'six-hours' covers 6 h, less than the 8 h deadline: a run still going at its end "
                           "replays it from its beginning")
    assert not any("recur" in n for n in plan(req.model_copy(update={"deadline_h": 6.0}), tr).notes)
    no_deadline = plan(req.model_copy(update={"deadline_h": None, "work_h": 7.0}), tr).notes
    assert any("less than the 7 h of work" in n for n in no_deadline)


def test_with_a_provisioning_delay_past_ten_minutes_every_tier_can_still_start():
    """A capacity timeout counts the provisioning: the on-demand tier's default 10 minutes gave up on
    every gang before it was up, so every run that fell to on-demand failed (and cost nothing)."""
    req = PlanRequest(work_h=10, num_workers=2, checkpoint_cost_h=0.05, restart_overhead_h=0.05, provisioning_delay_h=0.25,
                      spot_price=0.3, on_demand_price=1.0, deadline_h=20, runs=40)
    p = plan(req, RateModel(preemptions_per_node_hour=0.05))
    prov_s = req.provisioning_delay_h * 3600
    on_demand = next(b for b in p.baselines if b.label == "on-demand only")
    assert on_demand.result.finished_fraction == 1.0 and on_demand.mean_spend > 0
    assert p.recommended.result.finished_fraction == 1.0
    for tier in p.recommended.ladder.tiers:
        assert tier.capacity_timeout_s is None or tier.capacity_timeout_s > prov_s
    assert req.on_demand_tier().capacity_timeout_s == 600 + prov_s
    assert req.model_copy(update={"provisioning_delay_h": 0.05}).on_demand_tier().capacity_timeout_s == 600  # 3 min: as ever


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"m_grid": []}, "m_grid: give at least one"),
    ({"timeout_grid_s": []}, "timeout_grid_s: give at least one"),
    ({"m_grid": [-5]}, "m_grid: -5 is not a preemption budget"),
    ({"timeout_grid_s": [0]}, "timeout_grid_s: 0 is not a capacity timeout"),
])
def test_a_search_grid_no_tier_could_take_is_refused_naming_it(kwargs, message):
    req = PlanRequest(work_h=10, num_workers=1, checkpoint_cost_h=0.05, restart_overhead_h=0.05, runs=10,
                      spot_price=0.3, on_demand_price=1.0)
    with pytest.raises(ValueError, match=message):
        plan(req, RateModel(preemptions_per_node_hour=0.05), **kwargs)
