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


@pytest.mark.parametrize(("model", "base", "field"), [
    (PlanRequest, {"work_h": 2, "num_workers": 1, "checkpoint_cost_h": 0.01, "restart_overhead_h": 0.05,
                   "spot_price": 0.3, "on_demand_price": 1.0}, "spot_price"),
    (JobSpec, {"work_h": 2}, "notice_s"),
    (JobSpec, {"work_h": 2}, "checkpoint_interval_h"),
    (RateModel, {}, "preemptions_per_node_hour"),
])
def test_the_simulations_models_take_no_boolean_for_a_number(model, base, field):
    """A job or a world read from YAML: ``notice_s: yes`` is not 1 second."""
    with pytest.raises(ValidationError, match=rf"{field}\n.*expected a number, got true \(YAML reads yes/no"):
        model(**{**base, field: True})
    assert model(**{**base, field: 1}).model_dump()[field] == 1


def test_a_trace_or_a_path_where_a_list_of_processes_belongs_is_named_whole():
    """One trace alone, or a path, is the usual slip: say so, naming the path whole, not a
    character of it, nor Python's "object is not iterable"."""
    from spotfallback.sim.planner import plan

    trace = load_process(FIXTURES / "us-west-2a_v100_1.json")
    with pytest.raises(TypeError, match=r"^world: expected one process per tier \(a list\), got SpotTrace"):
        simulate(LADDER, JOB, trace, runs=10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^job: expected a JobSpec .*got dict \{'work_h': 10\}"):
        simulate(LADDER, {"work_h": 10}, [trace, RateModel()], runs=10)  # type: ignore[arg-type]
    req = PlanRequest(work_h=2, num_workers=1, checkpoint_cost_h=0.01, restart_overhead_h=0.05, spot_price=0.3,
                      on_demand_price=1.0, deadline_h=4, runs=20)
    path = str(FIXTURES / "us-west-2a_v100_1.json")
    with pytest.raises(TypeError, match=r"got str '/.*us-west-2a_v100_1\.json' \(a trace file's path: read it with "
                                        r"load_process\(path\) first\)"):
        plan(req, path)
    with pytest.raises(TypeError, match=r"got str 'x\.json'"):
        plan(req, trace, more=["x.json"])
    assert plan(req, trace, more=trace).recommended  # one further sample, given alone


@pytest.mark.parametrize("limit", [0, -1, 2.5, True])
def test_a_limit_on_the_optimum_that_is_no_count_of_states_is_refused_as_such(limit):
    """Not reported as a search too large for it."""
    trace = load_process(FIXTURES / "us-west-2a_v100_1.json")
    with pytest.raises(ValueError, match=r"^limit must be a whole number of states of at least 1"):
        optimum_for(LADDER, JOB, world_for(LADDER, trace), [0.0], limit=limit)
    with pytest.raises(ValueError, match=r"^optimum_limit must be a whole number of states, at least one per trace"):
        backtest(LADDER, [trace], JOB, optimum_limit=limit)


def test_backtest_names_a_job_or_window_it_cannot_use():
    trace = load_process(FIXTURES / "us-west-2a_v100_1.json")
    with pytest.raises(TypeError, match=r"^job: expected a JobSpec with a deadline_h, got NoneType"):
        backtest(LADDER, [trace], None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^window_h must be a positive number of hours, got '24'"):
        backtest(LADDER, [trace], JOB, window_h="24")  # type: ignore[arg-type]


def test_a_rate_model_takes_no_infinite_rate():
    with pytest.raises(ValidationError, match="preemptions_per_node_hour"):
        RateModel(preemptions_per_node_hour=math.inf)
    with pytest.raises(ValidationError, match="mean_outage_h"):
        RateModel(outage_probability=0.5, mean_outage_h=math.inf)


def test_tier_helpers_keep_their_market():
    from spotfallback.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^market: Tier\.spot makes a spot tier; build Tier\(market='on-demand', \.\.\.\)"):
        Tier.spot(2, market="on-demand")
    with pytest.raises(ConfigError, match=r"^market: Tier\.on_demand makes an on-demand tier"):
        Tier.on_demand(2, market="spot")


def test_the_optimum_of_one_start_takes_markets_as_the_package_exports_them():
    from spotfallback.sim import Markets as Exported

    trace = load_process(FIXTURES / "us-west-2a_v100_1.json")
    world = world_for(LADDER, trace)
    assert hindsight_optimum(JOB, Exported.of(LADDER, world), 0.0).spend == optimum_for(LADDER, JOB, world, [0.0])[0].spend
    with pytest.raises(TypeError, match=r"^markets: expected Markets\.of\(ladder, world\), got list"):
        hindsight_optimum(JOB, LADDER, 0.0)  # type: ignore[arg-type]
