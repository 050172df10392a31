"""`spotfallback backtest` through typer's test runner, and the backtest API behind it."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import typer
import yaml
from typer.testing import CliRunner

from spotfallback.cli import backtest as cli_backtest
from spotfallback.config import JobConfig, Ladder, Tier
from spotfallback.errors import PoolError, WindowError
from spotfallback.sim import backtest, backtesting
from spotfallback.sim.job import JobSpec
from spotfallback.sim.planner import PlanRequest, load_process, plan
from spotfallback.sim.simulate import simulate
from spotfallback.sim.traces import load_node_trace, load_spot_trace
from spotfallback.sim.world import complement_trace, world_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRACE = str(FIXTURES / "us-west-2a_v100_1.json")
NODES = str(FIXTURES / "aws-p3-trace.csv")
GUARD = {"deadline_h": 15, "work_h": 10, "pace": 1.0, "margin_h": 0.3}
JOB = """name: bt-job
storage_path: ./runs
entrypoint: m:f
tiers:
  - {name: spot, market: spot, num_workers: 1, max_preemptions: -1, capacity_timeout_s: null, price_per_worker_hour: 0.3,
     climb_back: true, min_dwell_s: 0, deadline_guard: {deadline_h: 15, work_h: 10, pace: 1.0, margin_h: 0.3}}
  - {name: on-demand, market: on-demand, num_workers: 1, price_per_worker_hour: 1.0}
"""


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    cli_backtest.register(app)

    @app.command()
    def other() -> None:  # a second command keeps `backtest` a subcommand, as in the real CLI
        pass

    return app


@pytest.fixture
def job_file(tmp_path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    return path


def invoke(app, *args: str):
    return CliRunner().invoke(app, ["backtest", *args], env={"COLUMNS": "160"})


def test_backtest_prints_spend_against_on_demand_and_the_optimum_and_writes_csv(app, job_file, tmp_path):
    out = tmp_path / "windows.csv"
    r = invoke(app, str(job_file), "--trace", TRACE, "--trace", NODES, "--hours", "10", "--restart-overhead-s", "360",
               "--csv", str(out))
    assert r.exit_code == 0, r.output
    for text in ("28 windows of 24 h", "spend / on-demand only", "p95",
                 "Costlier than on-demand only", "Finished by the deadline", "spend / hindsight optimum │"):
        assert text in r.output
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 28 and rows[-1]["trace"] == "aws-p3-trace"  # 27 windows of the 649 h trace, 1 of the 11 h one
    assert all(float(row["optimum"]) <= float(row["spend"]) + 1e-9 for row in rows if row["on_time"] == "True")
    r = invoke(app, str(job_file), "--trace", TRACE, "--hours", "10", "--window-h", "100", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["windows"] == 6 and doc["deadline_h"] == 15 and len(doc["windows_detail"]) == 6
    assert doc["vs_optimum"]["mean"] >= 1.0 and 0 <= doc["on_time_share"] <= 1


def test_backtest_whose_optimum_is_too_large_to_search_leaves_it_out_with_the_fix(app, job_file, monkeypatch, tmp_path):
    """The replays take well under a second however long the optimum's search would: they are still shown."""
    whole = json.loads(invoke(app, str(job_file), "--trace", TRACE, "--hours", "10", "--json").output)
    monkeypatch.setattr(cli_backtest, "OPTIMUM_LIMIT", 1_000)
    out = tmp_path / "windows.csv"
    r = invoke(app, str(job_file), "--trace", TRACE, "--hours", "10", "--csv", str(out))
    assert r.exit_code == 0, r.output
    assert "note: spend / hindsight optimum is left out: the hindsight optimum's search is too large" in r.output
    assert "--window-h" in r.output and "Traceback" not in r.output
    assert "spend / on-demand only" in r.output and "spend / hindsight optimum │" not in r.output
    assert "27 windows of 24 h" in r.output and "Finished by the deadline" in r.output
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 27 and all(row["optimum"] == "" for row in rows)
    doc = json.loads(invoke(app, str(job_file), "--trace", TRACE, "--hours", "10", "--json").output)
    assert doc["vs_optimum"] is None and all(w["optimum"] is None for w in doc["windows_detail"])
    assert any("is left out" in n for n in doc["notes"])
    # Everything else is what the whole backtest reports.
    assert doc["vs_on_demand"] == whole["vs_on_demand"] and doc["on_time_share"] == whole["on_time_share"]
    assert [w["spend"] for w in doc["windows_detail"]] == [w["spend"] for w in whole["windows_detail"]]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--trace", TRACE], "--hours: required"),
        (["--hours", "10"], "--trace: give at least one"),
        (["--hours", "10", "--trace", "/no/such/trace.json"], "--trace: /no/such/trace.json: no such file"),
        (["--hours", "10", "--trace", TRACE, "--window-h", "0"], "--window-h: must be a positive number"),
        (["--hours", "10", "--trace", TRACE, "--window-h", "-3"], "--window-h: must be a positive number"),
        # The deadline came from the file: the option that made it too short is the one given.
        (["--hours", "20", "--trace", TRACE], "--hours: 20 h of work cannot finish by the job file's deadline (15 h, "
                                              "from its first deadline_guard); give --deadline-h too"),
        (["--hours", "20", "--deadline-h", "15", "--trace", TRACE], "--deadline-h: 15 h is shorter than the work"),
        (["--hours", "10", "--trace", TRACE, "--csv", "/no/such/dir/out.csv"], "--csv: directory"),
        (["--hours", "10", "--trace", TRACE, "--csv", "out.txt"], "--csv: 'out.txt' must end in .csv"),
        (["--hours", "10", "--trace", NODES, "--deadline-h", "12", "--restart-overhead-s", "-1"], "--restart-overhead-s:"),
        (["--hours", "10", "--trace", TRACE, "--window-h", "1e-9"], "--window-h: window_h=1e-09 h cuts the"),
        (["--hours", "10", "--trace", TRACE, "--deadline-h", "100001"], "--deadline-h: must be a number of hours above 0 "
                                                                       "and at most 100000, got 100001"),
        (["--hours", "10", "--trace", TRACE, "--notice-s", "1e300"], "--notice-s: must be a number of seconds from 0 to"),
        (["--hours", "10", "--trace", TRACE, "--trace", TRACE], "is given twice"),
        # Every start on on-demand would time out before its nodes were up: every window a failure, priced at 0.
        (["--hours", "10", "--trace", TRACE, "--provisioning-delay-s", "900"],
         "--provisioning-delay-s: 900 s is no shorter than the capacity_timeout_s of tier 'on-demand' (600 s)"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(app, job_file, args, needle):
    r = invoke(app, str(job_file), *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output
    assert "Traceback" not in r.output


def test_windows_where_no_schedule_meets_the_deadline_have_no_optimum_and_are_noted(app, job_file):
    """A deadline no schedule meets, even knowing the trace: the optimum is inf there, so spend over it is not a
    ratio (0 would read as a perfect score); the windows are counted and named, and the JSON stays strict."""
    r = invoke(app, str(job_file), "--trace", TRACE, "--hours", "10", "--deadline-h", "10")
    assert r.exit_code == 0, r.output
    assert "no schedule, even with hindsight, finishes by the deadline of 10 h" in r.output
    assert "spend / hindsight optimum │" not in r.output
    r = invoke(app, str(job_file), "--trace", TRACE, "--hours", "10", "--deadline-h", "10", "--json")
    doc = json.loads(r.output, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert doc["unreachable"] == doc["windows"] > 0
    assert doc["vs_optimum"] == {"mean": None, "median": None, "p95": None}
    assert {w["optimum"] for w in doc["windows_detail"]} == {None}


def test_a_job_file_that_cannot_be_read_or_has_no_deadline_is_named(app, tmp_path):
    r = invoke(app, str(tmp_path / "missing.yaml"), "--trace", TRACE, "--hours", "10")
    assert r.exit_code == 2 and "error: JOB.yaml:" in r.output
    plain = tmp_path / "plain.yaml"
    plain.write_text(JOB.replace(", deadline_guard: {deadline_h: 15, work_h: 10, pace: 1.0, margin_h: 0.3}", ""))
    r = invoke(app, str(plain), "--trace", TRACE, "--hours", "10")
    assert r.exit_code == 2 and r.output.strip() == (
        "error: --deadline-h: required: the job file gives no deadline (no plan: deadline_h, no tier's deadline_guard); "
        "give the hours from each window's start, e.g. --deadline-h 15"), r.output
    # Bad training hours are named before the missing deadline, whose hint would scale them.
    for hours in ("-1", "0", "nan", "inf"):
        r = invoke(app, str(plain), "--trace", TRACE, "--hours", hours)
        assert r.exit_code == 2 and r.output.startswith("error: --hours: must be a positive number of hours, got "), r.output


@pytest.mark.parametrize(
    ("price", "error"),
    [
        # Spend against on-demand would be 0 / 0.
        (", price_per_worker_hour: 1.0", "tiers[1].price_per_worker_hour: 'on-demand' has no price, and a backtest sets "
                                         "spend against it; give every tier its price per worker-hour"),
        # Spot hours would count as free: the ladder would look cheaper than any schedule.
        (", price_per_worker_hour: 0.3", "tiers[0].price_per_worker_hour: 'spot' has no price, so a backtest would count "
                                         "its hours as free; give every tier its price per worker-hour"),
    ],
)
def test_an_unpriced_tier_is_refused_by_name(app, tmp_path, price, error):
    """The default price is 0: a tier left unpriced is named, not measured as free."""
    unpriced = tmp_path / "unpriced.yaml"
    unpriced.write_text(JOB.replace(price, ""))
    r = invoke(app, str(unpriced), "--trace", TRACE, "--hours", "10")
    assert r.exit_code == 2 and r.output.strip() == f"error: JOB.yaml: {error}", r.output


def test_an_on_demand_ladder_is_measured_against_the_spot_it_could_have_used(app, tmp_path, job_file):
    """Without a spot tier the trace never applies: the optimum needs a spot price, else it would be the ladder itself."""
    od_only = tmp_path / "od.yaml"
    od_only.write_text(JOB.split("  - {name: spot")[0]
                       + "  - {name: on-demand, market: on-demand, num_workers: 1, price_per_worker_hour: 1.0}\n")
    args = ["--trace", TRACE, "--hours", "10", "--deadline-h", "15", "--json"]
    r = invoke(app, str(od_only), *args)
    assert r.exit_code == 2 and r.output.startswith("error: --spot-price: JOB.yaml's ladder has no spot tier"), r.output
    r = invoke(app, str(od_only), *args, "--spot-price", "0.3")
    assert r.exit_code == 0, r.output
    od = json.loads(r.output)
    spot = json.loads(invoke(app, str(job_file), *args).output)  # the same prices, with a spot tier
    assert [w["optimum"] for w in od["windows_detail"]] == [w["optimum"] for w in spot["windows_detail"]]
    assert od["vs_optimum"]["mean"] > 2.0 and od["vs_on_demand"]["mean"] == pytest.approx(1.0)
    r = invoke(app, str(job_file), *args, "--spot-price", "0.3")
    assert r.exit_code == 2 and "error: --spot-price: JOB.yaml's ladder has spot tiers" in r.output
    r = invoke(app, str(od_only), *args, "--spot-price", "-1")
    assert r.exit_code == 2 and "error: --spot-price: must be a non-negative price" in r.output


def test_backtest_replays_climbing_ladders_window_by_window_as_simulate_does():
    trace = load_spot_trace(TRACE)
    job = JobSpec(work_h=10, restart_overhead_h=0.1, provisioning_delay_h=0.05, notice_s=120, deadline_h=15,
                  checkpoint_interval_h=0.5, checkpoint_cost_h=0.02)  # checkpoints: the moments it may climb back
    ladder = Ladder(tiers=(Tier.spot(1, max_preemptions=-1, capacity_timeout_s=None, price_per_worker_hour=0.3,
                                     deadline_guard=GUARD, climb_back=True, min_dwell_s=0),
                           Tier.on_demand(1, price_per_worker_hour=1.0)))
    res = backtest(ladder, [trace, load_node_trace(NODES)], job, window_h=48)
    assert res.windows == 13 + 1
    starts = np.arange(13) * 48.0
    # Both engines take per-run starts for a ladder that climbs back, and agree.
    ref = simulate(ladder, job, world_for(ladder, trace), runs=13, start_h=starts, engine="policy")
    np.testing.assert_allclose(res.spend[:13], ref.spend, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(res.start_h[:13], starts)
    assert res.switches.max() > 1  # it came back from on-demand
    assert res.on_demand_spend == pytest.approx(0.1 + 10 + 19 * 0.02)  # the first start pays R too
    assert (res.optimum <= res.spend + 1e-9)[res.on_time].all()
    assert res.vs_optimum.mean >= 1.0 and res.vs_optimum.median <= res.vs_optimum.p95
    assert res.costlier_than_on_demand == int((res.spend > res.on_demand_spend * (1 + 1e-9)).sum())
    alone = backtest(ladder, [trace, load_node_trace(NODES)], job, window_h=48, optimum=False)
    assert alone.optimum is None and alone.vs_optimum is None and alone.summary()["vs_optimum"] is None
    np.testing.assert_array_equal(alone.spend, res.spend)
    with pytest.raises(WindowError, match="window_h"):
        backtest(ladder, [trace], job, window_h=0)
    with pytest.raises(ValueError, match="deadline"):
        backtest(ladder, [trace], job.model_copy(update={"deadline_h": None}))
    with pytest.raises(ValueError, match="on-demand tier"):
        backtest(Ladder(tiers=(Tier.spot(1, price_per_worker_hour=0.3),)), [trace], job)


OTHER_POOL = str(FIXTURES / "us-east-1f_v100_4node.json")
TWO_POOLS = JOB.replace("  - {name: on-demand,", """  - {name: spot-b, market: spot, num_workers: 1, max_preemptions: 2, capacity_timeout_s: 1800, price_per_worker_hour: 0.35}
  - {name: on-demand,""")


def test_each_spot_pool_can_replay_its_own_trace_over_the_same_hours():
    """A ladder of two spot pools meets each pool's history, not the first pool's twice."""
    job = JobSpec(work_h=10, restart_overhead_h=0.1, provisioning_delay_h=0.05, notice_s=120, deadline_h=15,
                  checkpoint_interval_h=0.5, checkpoint_cost_h=0.02)
    ladder = JobConfig.model_validate(yaml.safe_load(TWO_POOLS)).ladder
    first, other = load_spot_trace(TRACE), load_spot_trace(OTHER_POOL)
    res = backtest(ladder, [first], job, window_h=48, pools={"spot-b": other})
    starts = np.arange(res.windows) * 48.0
    ref = simulate(ladder, job, (first, other, world_for(ladder, first)[2]), runs=res.windows, start_h=starts, engine="policy")
    np.testing.assert_allclose(res.spend, ref.spend, rtol=1e-9, atol=1e-9)
    same = backtest(ladder, [first], job, window_h=48)
    assert not np.allclose(res.spend, same.spend)  # the second pool's own outages change some windows
    assert (res.optimum <= res.spend + 1e-9)[res.on_time].all()
    with pytest.raises(PoolError, match=r"pools: 'on-demand' is not a spot tier of the ladder.*'spot', 'spot-b'") as e:
        backtest(ladder, [first], job, pools={"on-demand": other})
    assert e.value.tier == "on-demand"
    with pytest.raises(PoolError, match=r"pools: 'spot-b': got str, a path: load it first"):
        backtest(ladder, [first], job, pools={"spot-b": OTHER_POOL})  # type: ignore[dict-item]


def test_backtest_pool_option_names_the_tier_that_replays_its_own_trace(app, tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(TWO_POOLS)
    r = invoke(app, str(path), "--trace", TRACE, "--pool", f"spot-b={OTHER_POOL}", "--hours", "10")
    assert r.exit_code == 0, r.output
    assert f"Tier 'spot-b' replays {OTHER_POOL} over each window's hours" in r.output.replace("\n", "")
    r = invoke(app, str(path), "--trace", TRACE, "--pool", f"spot-b={OTHER_POOL}", "--hours", "10", "--json")
    doc = json.loads(r.output)
    assert doc["pools"] == {"spot-b": OTHER_POOL}
    # The pool's 305 h trace under the windows' 649 h one repeats: that pairs hours never recorded together.
    assert [n for n in doc["notes"] if n.startswith("tier 'spot-b' replays")] == [
        f"tier 'spot-b' replays {OTHER_POOL} (305.3 h), shorter than the windows' traces (up to 649.2 h): past its end "
        "it repeats from its start, so later windows pair it with hours other than those it recorded beside them"]
    r = invoke(app, str(path), "--trace", OTHER_POOL, "--pool", f"spot-b={TRACE}", "--hours", "10", "--json")
    assert not [n for n in json.loads(r.output)["notes"] if n.startswith("tier 'spot-b' replays")]
    for args, needle in (
        (["--pool", "spot-b"], "--pool: expected TIER=PATH"),
        (["--pool", f"nope={OTHER_POOL}"], "--pool: JOB.yaml has no tier 'nope'; its tiers are 'spot', 'spot-b', 'on-demand'"),
        (["--pool", f"on-demand={OTHER_POOL}"], "--pool: 'on-demand' is not a spot tier"),
        (["--pool", "spot-b=/no/such.json"], "--pool: /no/such.json: no such file"),
        (["--pool", f"spot-b={OTHER_POOL}", "--pool", f"spot-b={TRACE}"], "--pool: tier 'spot-b' is given twice"),
    ):
        r = invoke(app, str(path), "--trace", TRACE, "--hours", "10", *args)
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output
    # A pool's node trace too small for its tier's gang is the --pool's fault, not the windows' trace.
    path.write_text(TWO_POOLS.replace("{name: spot-b, market: spot, num_workers: 1,", "{name: spot-b, market: spot, num_workers: 64,"))
    r = invoke(app, str(path), "--trace", TRACE, "--hours", "10", "--pool", f"spot-b={NODES}")
    assert r.exit_code == 2 and r.output.strip() == (
        f"error: --pool: {NODES}: node trace 'aws-p3-trace' never has 64 nodes at once (at most 32), and JOB.yaml's "
        "spot tier 'spot-b' has num_workers: 64; give a trace of a larger cluster, or fewer workers there"), r.output


def test_a_node_trace_too_small_for_the_gang_names_the_file_and_the_tier_to_change(app, tmp_path):
    """The job file has no --workers to lower: the error names the trace and the tier whose num_workers sets the gang."""
    big = tmp_path / "big.yaml"
    big.write_text(JOB.replace("{name: spot, market: spot, num_workers: 1,", "{name: spot, market: spot, num_workers: 64,"))
    r = invoke(app, str(big), "--trace", NODES, "--hours", "10")
    assert r.exit_code == 2 and r.output.strip() == (
        f"error: --trace: {NODES}: node trace 'aws-p3-trace' never has 64 nodes at once (at most 32), and JOB.yaml's "
        "spot tier 'spot' has num_workers: 64; give a trace of a larger cluster, or fewer workers there"), r.output
    # Without a spot tier, the optimum's spot gang is the on-demand tier's size.
    od_only = tmp_path / "od.yaml"
    od_only.write_text(JOB.split("  - {name: spot")[0]
                       + "  - {name: on-demand, market: on-demand, num_workers: 40, price_per_worker_hour: 1.0}\n")
    r = invoke(app, str(od_only), "--trace", NODES, "--hours", "10", "--deadline-h", "15", "--spot-price", "0.3")
    assert r.exit_code == 2 and "never has 40 nodes at once (at most 32), and the optimum's spot gang at --spot-price " \
        "(JOB.yaml's tier 'on-demand') has num_workers: 40" in r.output.replace("\n", ""), r.output


def test_a_plan_made_for_checkpoint_requests_is_backtested_with_them_unless_told_otherwise(app, tmp_path):
    job = tmp_path / "job.yaml"
    plan = "plan: {spend: 4.0, wall_h: 11.0, deadline_h: 15, checkpoint_on_request: true}\n"
    job.write_text(JOB + plan)

    def spends(*flags: str) -> list[float]:
        r = invoke(app, str(job), "--trace", TRACE, "--hours", "10", "--checkpoint-cost-s", "60", "--json", *flags)
        assert r.exit_code == 0, r.output
        return [w["spend"] for w in json.loads(r.output)["windows_detail"]]

    asked = spends()
    assert asked == spends("--checkpoint-on-request")
    assert asked != spends("--no-checkpoint-on-request")  # without requests no climb comes between checkpoints


def _planned_job_file(tmp_path: Path, notice_s: float) -> Path:
    """The job file `plan --write-yaml` writes for the 10 h job (1-minute write, checkpoint requests) on TRACE."""
    req = PlanRequest(work_h=10, num_workers=1, checkpoint_cost_h=1 / 60, restart_overhead_h=0.1,
                      provisioning_delay_h=0.05, notice_s=notice_s, spot_price=0.3, on_demand_price=1.0, deadline_h=15,
                      checkpoint_on_request=True, runs=40)
    planned = tmp_path / "planned.yaml"
    planned.write_text(plan(req, load_process(TRACE)).job_yaml("planned", "./runs", "m:f"))
    return planned


def test_a_job_file_from_plan_is_replayed_as_planned_unless_the_command_line_says_otherwise(app, tmp_path):
    """`plan --write-yaml` records the job (work, write, restart, notice): `backtest JOB.yaml --trace` needs no more."""
    planned = _planned_job_file(tmp_path, notice_s=30)
    r = invoke(app, str(planned), "--trace", TRACE, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["replayed"] == {"work_h": 10, "checkpoint_interval_h": JobConfig.from_yaml(planned).plan.checkpoint_interval_h,
                               "checkpoint_cost_s": pytest.approx(60), "restart_overhead_s": pytest.approx(360),
                               "provisioning_delay_s": pytest.approx(180), "notice_s": 30, "jit_checkpoint": True,
                               "checkpoint_on_request": True, "trace_counts": "available"}
    flags = ["--hours", "10", "--checkpoint-cost-s", "60", "--restart-overhead-s", "360", "--provisioning-delay-s", "180",
             "--notice-s", "30", "--jit", "--checkpoint-on-request"]
    stated = json.loads(invoke(app, str(planned), "--trace", TRACE, "--json", *flags).output)
    assert stated["windows_detail"] == doc["windows_detail"]
    # A flag wins over the plan: a 5-minute write is longer than the 30 s notice, so the notice saves nothing.
    slower = json.loads(invoke(app, str(planned), "--trace", TRACE, "--json", "--checkpoint-cost-s", "300").output)
    assert slower["replayed"]["checkpoint_cost_s"] == 300 and slower["replayed"]["notice_s"] == 30
    assert slower["spend"]["mean"] > doc["spend"]["mean"]
    r = invoke(app, str(planned), "--trace", TRACE)
    assert r.exit_code == 0 and "Job: 10 h of training" in r.output and "as planned in the job file" in r.output
    # The header says what the notice saves: the 60 s write outlasts the 30 s notice, not a 120 s one.
    assert "no just-in-time checkpoint (the write outlasts the notice" in " ".join(r.output.split())
    longer = " ".join(invoke(app, str(planned), "--trace", TRACE, "--notice-s", "120").output.split())
    assert "s notice, just-in-time checkpoint, checkpoints on request" in longer


def test_a_hand_written_planned_job_without_durations_replays_the_defaults_backtest_names(app, tmp_path):
    """A ``plan.job`` that gives only the work and the write: the rest is backtest's defaults (180 s to
    provision, a 120 s notice), as for a job file with no plan, not a free instant start."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB + "plan: {spend: 4.0, wall_h: 11.0, deadline_h: 15, job: {work_h: 10, checkpoint_cost_h: 0.05, "
                         "restart_overhead_h: 0.1}}\n")
    r = invoke(app, str(job), "--trace", TRACE, "--json")
    assert r.exit_code == 0, r.output
    replayed = json.loads(r.output)["replayed"]
    assert replayed["provisioning_delay_s"] == pytest.approx(180) and replayed["notice_s"] == 120
    assert replayed["checkpoint_cost_s"] == pytest.approx(180) and replayed["restart_overhead_s"] == pytest.approx(360)


def test_a_planned_job_duration_given_in_seconds_is_refused_naming_the_field(app, tmp_path):
    """``checkpoint_cost_h: 300`` (a 5-minute write, in seconds) would replay 300-hour writes."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB + "plan: {spend: 4.0, wall_h: 11.0, deadline_h: 15, job: {work_h: 10, checkpoint_cost_h: 300, "
                         "restart_overhead_h: 0.1}}\n")
    r = invoke(app, str(job), "--trace", TRACE)
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "plan.job: checkpoint_cost_h is 300 hours, longer than the job's work_h (10 h)" in text, text
    assert "300 s would be 0.08333 h" in text and "Traceback" not in text, text


def test_traces_are_read_as_the_plan_read_them_unless_trace_counts_says_otherwise(app, tmp_path):
    """A plan made on traces that count preempted instances replays its windows on the same reading."""
    req = PlanRequest(work_h=10, num_workers=1, checkpoint_cost_h=1 / 60, restart_overhead_h=0.1, spot_price=0.3,
                      on_demand_price=1.0, deadline_h=15, runs=40)
    planned = tmp_path / "planned.yaml"
    made = plan(req, complement_trace(load_process(TRACE)))
    planned.write_text(made.job_yaml("planned", "./runs", "m:f", trace_counts="preempted"))
    assert JobConfig.from_yaml(planned).plan.trace_counts == "preempted"

    def windows(*args: str) -> dict:
        r = invoke(app, str(planned), "--trace", TRACE, "--json", *args)
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    as_planned, preempted, available = windows(), windows("--trace-counts", "preempted"), windows("--trace-counts", "available")
    assert as_planned["replayed"]["trace_counts"] == "preempted" and available["replayed"]["trace_counts"] == "available"
    assert as_planned["windows_detail"] == preempted["windows_detail"] != available["windows_detail"]
    r = invoke(app, str(planned), "--trace", TRACE)
    assert "JSON traces read as counting preempted instances" in " ".join(r.output.split())
    bad = invoke(app, str(planned), "--trace", TRACE, "--trace-counts", "free")
    assert bad.exit_code == 2 and "--trace-counts: must be 'available' or 'preempted', got 'free'" in bad.output
    nodes = invoke(app, str(planned), "--trace", NODES, "--trace-counts", "preempted")
    assert nodes.exit_code == 2 and "--trace-counts: applies to SkyPilot JSON traces" in nodes.output


ELASTIC_NO_LIMITS = """name: el
storage_path: ./runs
entrypoint: a.b:c
tiers:
  - {name: spot, market: spot, num_workers: [1, 4], price_per_worker_hour: 0.9}
  - {name: on-demand, market: on-demand, num_workers: 4, price_per_worker_hour: 3.06}
"""


def test_a_window_whose_run_never_finishes_is_counted_not_passed_off_as_a_result(app, tmp_path, job_file):
    """No budget, no timeout and no periodic checkpoint on a trace that preempts the gang every few minutes:
    the run never finishes, and the spend shown is that of the hours until the simulator gave up."""
    job = tmp_path / "el.yaml"
    job.write_text(ELASTIC_NO_LIMITS)
    r = invoke(app, str(job), "--trace", NODES, "--hours", "10", "--deadline-h", "15", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["unfinished"] == doc["windows"] == 1 and doc["windows_detail"][0]["finished"] is False
    assert doc["windows_detail"][0]["wall_h"] == 1000  # 100 x the work
    (note,) = [n for n in doc["notes"] if "never finished" in n]
    assert note.startswith("in 1 of 1 windows the run never finished: the simulator gave up after 1,000 h") and (
        "max_preemptions or capacity_timeout_s" in note)
    fine = json.loads(invoke(app, str(job_file), "--trace", TRACE, "--hours", "10", "--json").output)
    assert fine["unfinished"] == 0 and all(w["finished"] for w in fine["windows_detail"])
    assert not any("never finished" in n for n in fine["notes"])


def test_a_trace_without_spot_capacity_replays_without_a_numpy_warning(app, tmp_path, recwarn):
    """Spot never comes: the run leaves it for on-demand, where the search for a climb back finds no look at all."""
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0] * 500}))
    r = invoke(app, str(_planned_job_file(tmp_path, notice_s=120)), "--trace", str(zero), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["vs_on_demand"]["mean"] == pytest.approx(1.0, abs=0.05)
    assert [str(w.message) for w in recwarn.list if issubclass(w.category, RuntimeWarning)] == []
    # `plan` refuses such a trace; here it is a measurement, and a note says what it measured.
    assert [n for n in doc["notes"] if "no spot capacity" in n] == [
        f"{zero}: no spot capacity in any of its 500 ticks, so in every window spot never starts and the run goes on as "
        "the ladder's timeouts and guards allow; if it counts preempted instances, pass --trace-counts preempted"]


def test_a_deadline_guard_made_for_another_job_than_the_replayed_one_is_pointed_out(app, tmp_path):
    """Overriding --hours or --deadline-h replays the ladder unchanged: its guard still leaves on the planned job's schedule."""
    planned = _planned_job_file(tmp_path, notice_s=120)
    assert any(t.deadline_guard for t in JobConfig.from_yaml(planned).tiers)
    as_planned = json.loads(invoke(app, str(planned), "--trace", TRACE, "--json").output)
    assert as_planned["notes"] == []
    assert json.loads(invoke(app, str(planned), "--trace", TRACE, "--json", "--checkpoint-cost-s", "61").output)["notes"] == []
    longer = json.loads(invoke(app, str(planned), "--trace", TRACE, "--json", "--hours", "100", "--deadline-h", "150").output)
    (note,) = longer["notes"]
    assert note.startswith("tier 'spot': its deadline_guard has deadline_h=15 (the replay's deadline: 150 h) and work_h=10 "
                           "(the replayed job takes 100 h uninterrupted)")
    assert note.endswith("spotfallback plan --hours 100 --deadline-h 150 ... --write-yaml")
    r = invoke(app, str(planned), "--trace", TRACE, "--deadline-h", "20")
    assert r.exit_code == 0 and "note: tier 'spot': its deadline_guard has deadline_h=15 (the replay's deadline: 20 h);" in " ".join(r.output.split())


def test_a_trace_recorded_for_fewer_instances_than_a_tiers_gang_is_noted(app, tmp_path):
    """Four workers on a one-instance trace read it as the whole pool's; a pool's own 4-node trace needs no note."""
    path = tmp_path / "four.yaml"
    path.write_text(JOB.replace("num_workers: 1", "num_workers: 4"))
    doc = json.loads(invoke(app, str(path), "--trace", TRACE, "--hours", "10", "--json").output)
    (note,) = doc["notes"]
    assert note.startswith("trace 'us-west-2a_v100_1' records at most 1 instance(s), and the gang has 4 workers")
    own = json.loads(invoke(app, str(path), "--trace", TRACE, "--pool", f"spot={OTHER_POOL}", "--hours", "10", "--json").output)
    assert not [n for n in own["notes"] if n.startswith("trace ")]  # (only that the 305 h pool repeats under 649 h)


def test_a_trace_shorter_than_the_deadline_is_noted_as_recurring(app, tmp_path, job_file):
    """One window of a 4 h trace under a 15 h deadline: the run meets the same 4 h again, and the note says so."""
    short = tmp_path / "four-hours.json"
    short.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [1] * 200 + [0] * 40}))
    doc = json.loads(invoke(app, str(job_file), "--trace", str(short), "--hours", "10", "--json").output)
    assert doc["windows"] == 1
    assert doc["notes"] == ["trace 'four-hours' covers 4 h, less than the 15 h deadline: a run still going at its end "
                            "replays it from its beginning, so those 4 h recur; a longer trace shows what they leave out"]


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("afile/out.csv", "--csv: '{tmp}/afile' is a file, not a directory"),
        ("dangling.csv", "--csv: '{tmp}/dangling.csv' links to '/nonexistent/x.csv', whose directory does not exist"),
        pytest.param("full.csv", "--csv: cannot write '{tmp}/full.csv' (a link to '/dev/full'): No space left on device; "
                     "free some space or give another path",
                     marks=pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")),
    ],
)
def test_a_csv_that_cannot_be_written_is_one_line_naming_the_option(app, job_file, tmp_path, target, needle):
    (tmp_path / "afile").write_text("")
    (tmp_path / "dangling.csv").symlink_to("/nonexistent/x.csv")
    (tmp_path / "full.csv").symlink_to("/dev/full")
    r = invoke(app, str(job_file), "--trace", TRACE, "--hours", "10", "--csv", str(tmp_path / target))
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert [ln for ln in r.output.splitlines() if ln.startswith("error:")] == ["error: " + needle.format(tmp=tmp_path)]
    assert not list(tmp_path.glob(".*.tmp"))


def test_every_traces_windows_are_counted_before_any_replay(monkeypatch):
    """A window that cuts the second trace into too many windows stops the backtest before the first trace's
    replay and optimum, which could take minutes; the CLI blames --window-h for it."""
    trace, nodes = load_spot_trace(TRACE), load_node_trace(NODES)
    job = JobSpec(work_h=0.001, deadline_h=0.002)
    ladder = Ladder(tiers=(Tier.spot(1, price_per_worker_hour=0.3), Tier.on_demand(1, price_per_worker_hour=1.0)))
    replays = []
    monkeypatch.setattr(backtesting, "simulate", lambda *a, **k: replays.append(a) or simulate(*a, **k))
    # 0.001 h windows: about 11,000 of the node trace's 11 h, 649,000 of the spot trace's 649 h.
    with pytest.raises(WindowError, match=rf"{trace.name}.*more than 100,000; give a longer window"):
        backtest(ladder, [nodes, trace], job, window_h=0.001)
    assert len(replays) == 1  # on-demand alone, the yardstick: no window of either trace was replayed


def test_a_csv_that_is_one_of_the_inputs_is_refused_and_the_trace_kept(app, job_file, tmp_path):
    """--csv over the node trace it reads replaced the recorded trace with the table."""
    trace = tmp_path / "nodes.csv"
    trace.write_bytes(Path(NODES).read_bytes())
    link = tmp_path / "table.csv"
    link.symlink_to(trace)
    for target, option in ((trace, "--trace"), (link, "--trace")):
        r = invoke(app, str(job_file), "--trace", str(trace), "--hours", "10", "--csv", str(target))
        assert r.exit_code == 2 and f"--csv: '{target}' is the {option} file; write to another path" in r.output, r.output
    assert trace.read_bytes() == Path(NODES).read_bytes()
