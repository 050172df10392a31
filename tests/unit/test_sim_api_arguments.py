"""The simulator's Python API refuses arguments it cannot use, naming them, rather than returning
nonsense (a negative horizon's negative wall times) or failing deep in numpy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from spotfallback.config import PlannedJob, PlanPrediction, Tier
from spotfallback.sim import backtest
from spotfallback.sim.job import JobSpec
from spotfallback.sim.optimum import Markets, hindsight_optimum, optimum_for
from spotfallback.sim.planner import PlanRequest, load_process
from spotfallback.sim.simulate import simulate
from spotfallback.sim.world import RateModel, world_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LADDER = [Tier.spot(1, price_per_worker_hour=0.3), Tier.on_demand(1, price_per_worker_hour=1.0)]
JOB = JobSpec(work_h=2, checkpoint_interval_h=0.5, checkpoint_cost_h=0.01, restart_overhead_h=0.05, deadline_h=4)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"runs": 2.5}, "runs must be a whole number > 0, got 2.5"),
    ({"runs": 0}, "runs must be a whole number > 0, got 0"),
    ({"seed": -1}, "seed must be a whole number >= 0, got -1"),
    ({"engine": "x"}, "engine must be 'auto', 'fast' or 'policy', got 'x'"),
    ({"horizon_h": -1.0}, "horizon_h must be a positive number of hours"),
    ({"horizon_h": math.nan}, "horizon_h must be a positive number of hours"),
])
def test_simulate_refuses_arguments_it_cannot_use_by_name(kwargs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        simulate(LADDER, JOB, [RateModel(preemptions_per_node_hour=0.1)], **{"runs": 10, **kwargs})


@pytest.mark.parametrize("start", [-5.0, math.nan, math.inf])
def test_the_optimum_takes_starts_as_simulate_does(start):
    trace = load_process(FIXTURES / "us-west-2a_v100_1.json")
    world = world_for(LADDER, trace)
    with pytest.raises(ValueError, match="^start_h must be finite and >= 0"):
        optimum_for(LADDER, JOB, world, [0.0, start])
    with pytest.raises(ValueError, match="^start_h must be finite and >= 0"):
        hindsight_optimum(JOB, Markets.of(LADDER, world), start)


def test_a_trace_is_read_from_a_path_object_and_an_unknown_kind_is_named():
    assert load_process(FIXTURES / "aws-p3-trace.csv").name == load_process(str(FIXTURES / "aws-p3-trace.csv")).name
    with pytest.raises(ValueError, match="^kind: expected 'spot' .* or 'node' .*, got 'xyz'"):
        load_process(FIXTURES / "us-west-2a_v100_1.json", kind="xyz")  # type: ignore[arg-type]


@pytest.mark.parametrize(("model", "fields", "field"), [
    (JobSpec, {"work_h": math.inf}, "work_h"),
    (JobSpec, {"work_h": 1, "checkpoint_cost_h": math.inf}, "checkpoint_cost_h"),
    (PlannedJob, {"work_h": 1, "checkpoint_cost_h": 1e300, "restart_overhead_h": 0}, "checkpoint_cost_h"),
    (PlannedJob, {"work_h": 1, "checkpoint_cost_h": 0, "restart_overhead_h": 0, "notice_s": 1e300}, "notice_s"),
    (PlanPrediction, {"spend": math.inf, "wall_h": 1}, "spend"),
    (PlanPrediction, {"spend": 1, "wall_h": 1, "checkpoint_interval_h": 1e300}, "checkpoint_interval_h"),
])
def test_job_and_plan_records_refuse_infinite_or_absurd_durations(model, fields, field):
    with pytest.raises(ValidationError) as err:
        model(**fields)
    assert [e["loc"][0] for e in err.value.errors()] == [field]


@pytest.mark.parametrize(("traces", "message"), [
    ("trace.json", r"^traces: expected a list of traces; give it as \[trace\]"),
    (["trace.json"], r"^traces\[0\]: got str, a path: load it first with spotfallback\.sim\.planner\.load_process"),
    ([Path("trace.json")], r"^traces\[0\]: got PosixPath, a path"),
    ([3], r"^traces\[0\]: got int, give a SpotTrace or a NodeTrace"),
])
def test_backtest_names_a_trace_it_was_given_as_a_path(traces, message):
    with pytest.raises(ValueError, match=message):
        backtest(LADDER, traces, JOB)


def test_a_job_whose_deadline_is_shorter_than_its_work_is_refused():
    with pytest.raises(ValidationError, match=r"deadline_h \(5\) is shorter than work_h \(10\): no run can meet it"):
        JobSpec(work_h=10, deadline_h=5)
    assert JobSpec(work_h=10, deadline_h=10).deadline_h == 10


@pytest.mark.parametrize("field", ["num_workers", "runs", "seed", "seed_max_preemptions"])
def test_a_plan_request_takes_no_boolean_for_a_count(field):
    base = {"work_h": 2, "num_workers": 1, "checkpoint_cost_h": 0.01, "restart_overhead_h": 0.05, "spot_price": 0.3,
            "on_demand_price": 1.0}
    with pytest.raises(ValidationError, match=rf"{field}\n.*expected a whole number, got true"):
        PlanRequest(**{**base, field: True})
