"""`spotfallback plan` through typer's test runner, on a fresh app with only this command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from spotfallback.cli import plan as cli_plan
from spotfallback.config import JobConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRACE = str(FIXTURES / "us-west-2a_v100_1.json")


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    cli_plan.register(app)

    @app.command()
    def other() -> None:  # a second command keeps `plan` a subcommand, as in the real CLI
        pass

    return app


def invoke(app, *args: str, columns: int = 160):
    return CliRunner().invoke(app, ["plan", *args], env={"COLUMNS": str(columns)})


def test_seed_table_prints_the_corrected_rows(app):
    r = invoke(app, "--seed-table")
    assert r.exit_code == 0, r.output
    for figure in ("36.99% longer", "56.25% longer", "81.82% longer", "117.39% longer",
                   "1.370x", "1.5625x", "1.818x", "2.174x"):  # the ratios as the issue lists them
        assert figure in r.output
    assert "217% longer" in r.output and "117% longer" in r.output
    r = invoke(app, "--seed-table", "--discount", "0.7")
    assert r.exit_code == 0 and "d = 0.7" in r.output


def test_the_job_file_records_how_the_plan_read_its_traces(app, tmp_path):
    yaml_path = tmp_path / "job.yaml"
    r = invoke(app, "--hours", "10", "--workers", "1", "--trace", TRACE, "--trace-counts", "preempted", "--deadline-h", "15",
               "--runs", "20", "--write-yaml", str(yaml_path), "--entrypoint", "m:f")
    assert r.exit_code == 0, r.output
    plan = JobConfig.from_yaml(yaml_path).plan
    assert plan is not None and plan.trace_counts == "preempted" and "(complemented)" in plan.made_with


def test_plan_on_a_trace_writes_a_job_file_and_a_plot(app, tmp_path):
    yaml_path, png = tmp_path / "job.yaml", tmp_path / "plan.png"
    r = invoke(app, "--hours", "24", "--workers", "4", "--trace", TRACE, "--deadline-h", "40",
               "--runs", "60", "--write-yaml", str(yaml_path), "--plot", str(png),
               "--entrypoint", "examples/ddp_digits.py:train_fn", "--train-loop-config", '{"total_steps": 50}')
    assert r.exit_code == 0, r.output
    for text in ("Recommended ladder", "recommended", "on-demand only", "spot forever", "seed M=5",
                 "uniform progress", "P(<=D)", "Daly", "wall_h", "p99", "deadline_guard"):
        assert text in r.output
    job = JobConfig.from_yaml(yaml_path)  # what `spotfallback run` and `manifest` read
    assert (job.name, job.storage_path, job.entrypoint) == ("job-24h-4w", "./runs", "examples/ddp_digits.py:train_fn")
    assert job.train_loop_config == {"total_steps": 50}
    assert job.tiers[-1].market == "on-demand" and all(t.num_workers == 4 for t in job.tiers)
    assert job.plan is not None and job.plan.deadline_h == 40 and job.plan.on_time_probability >= 0.95
    assert "us-west-2a_v100_1" in job.plan.made_with and job.plan.trace_counts == "available"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = ("--hours", "24", "--workers", "4", "--rate", "0.01", "--runs", "20", "--write-yaml", str(yaml_path),
             "--entrypoint", "train.py:main", "--name", "nightly", "--storage-path", "s3://bucket/runs")
    written = yaml_path.read_text()
    r = invoke(app, *again)  # a job file there already (maybe edited, maybe a running run's) is kept
    assert r.exit_code == 2 and f"--write-yaml: '{yaml_path}' already exists; pass --force to overwrite it" in r.output
    assert yaml_path.read_text() == written
    r = invoke(app, *again, "--force")
    assert r.exit_code == 0, r.output
    job = JobConfig.from_yaml(yaml_path)
    assert (job.name, job.storage_path) == ("nightly", "s3://bucket/runs") and job.plan.deadline_h is None


def test_trace_takes_a_node_trace_csv_by_its_extension_as_backtest_does(app):
    nodes = str(FIXTURES / "aws-p3-trace.csv")
    args = ["--hours", "10", "--workers", "4", "--runs", "20", "--deadline-h", "15", "--json"]
    by_trace = invoke(app, *args, "--trace", nodes)
    assert by_trace.exit_code == 0, by_trace.output
    by_option = invoke(app, *args, "--node-trace", nodes)
    assert json.loads(by_trace.output) == json.loads(by_option.output)


def test_plan_on_a_rate_model_and_a_node_trace(app):
    r = invoke(app, "--hours", "10", "--rate", "0.02", "--outage-prob", "0.2", "--outage-h", "1", "--runs", "50")
    assert r.exit_code == 0, r.output
    assert "no deadline given" in r.output
    r = invoke(app, "--hours", "10", "--workers", "4", "--node-trace", str(FIXTURES / "aws-p3-trace.csv"),
               "--deadline-h", "20", "--runs", "40")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rate", "0.01"], "--hours: required"),
        (["--hours", "-1", "--rate", "0.01"], "--hours: Input should be greater than 0 (got -1.0)"),
        (["--hours", "10", "--rate", "0.01", "--runs", "0"], "--runs:"),
        (["--hours", "10", "--rate", "-0.5"], "--rate: must be a non-negative number"),
        (["--hours", "10", "--rate", "0.1", "--outage-prob", "2"], "--outage-prob:"),
        (["--hours", "10", "--rate", "0.1", "--deadline-h", "5"], "--deadline-h: deadline_h (5) is shorter"),
        # Past the work, short of it on on-demand from the start (360 s restart + 180 s provisioning).
        (["--hours", "10", "--rate", "0.1", "--deadline-h", "10.05"], "--deadline-h: deadline_h (10.05) is shorter than "
         "the least wall time a run can take, 10.15 h: the work (10 h), the first start's restart (360 s) and "
         "provisioning delay (180 s), on on-demand from the start; give a deadline of at least 10.15 h, or none"),
        (["--hours", "10", "--rate", "0.1", "--deadline-prob", "1.5"], "--deadline-prob:"),
        (["--hours", "10", "--rate", "0.1", "--checkpoint-cost-s", "-3"], "--checkpoint-cost-s:"),
        # Past the bounds, each names its own option, not a tier or guard the planner built from it.
        (["--hours", "10", "--rate", "0.1", "--deadline-h", "15", "--checkpoint-cost-s", "1e12"],
         "--checkpoint-cost-s: must be at most 360,000,000 s (100,000 h), got 1e+12"),
        (["--hours", "10", "--rate", "0.1", "--notice-s", "1e12"], "--notice-s: must be at most 360,000,000 s"),
        (["--hours", "10", "--rate", "0.1", "--workers", "99999999999"], "--workers: Input should be less than or equal to 2147483647"),
        (["--hours", "10", "--rate", "0.1", "--runs", "3000000"], "--runs: Input should be less than or equal to 100000"),
        (["--hours", "10"], "give a spot trace"),
        (["--hours", "10", "--trace", "/no/such/trace.json"], "--trace: /no/such/trace.json: no such file"),
        (["--hours", "10", "--trace", TRACE, "--trace-counts", "some"], "--trace-counts:"),
        (["--hours", "10", "--node-trace", str(FIXTURES / "aws-p3-trace.csv"), "--workers", "40"], "--workers:"),
        (["--hours", "10", "--rate", "0.1", "--plot", "/no/such/dir/p.png"], "--plot: directory"),
        (["--hours", "10", "--rate", "0.1", "--plot", "p.txt"], "--plot: 'p.txt' must end in .png"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", ".", "--entrypoint", "m:f"], "--write-yaml: '.' is a directory; give a file name"),
        (["--seed-table", "--discount", "3"], "--discount:"),
        (["--hours", "10", "--rate", "0.1", "--worker-resources", '{"GPU": 8}'], "--worker-resources: applies to the job file; give --write-yaml too"),
        (["--hours", "10", "--rate", "0.1", "--entrypoint", "m:f"], "--entrypoint: applies to the job file; give --write-yaml too"),
        (["--hours", "10", "--rate", "0.1", "--name", "x"], "--name: applies to the job file; give --write-yaml too"),
        (["--hours", "10", "--rate", "0.1", "--storage-path", "s3://b/r"], "--storage-path: applies to the job file"),
        (["--hours", "10", "--rate", "0.1", "--train-loop-config", "{}"], "--train-loop-config: applies to the job file"),
        (["--hours", "10", "--rate", "0.1", "--force"], "--force: applies to the job file; give --write-yaml too"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml", "--entrypoint", "m:f", "--worker-resources", "{x"],
         "--worker-resources: not valid JSON"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml", "--entrypoint", "m:f", "--worker-resources", '{"gpu": 8}'],
         "--worker-resources: resource 'gpu': Ray's name is 'GPU'"),
        (["--hours", "10", "--trace", TRACE, "--failure-rate", "0.5"], "--failure-rate: applies to the rate model only; give --rate too"),
        (["--hours", "10", "--trace", TRACE, "--outage-h", "5"], "--outage-h: applies to the rate model only"),
        (["--seed-table", "--hours", "5"], "--seed-table: prints the seed's table only, with no job"),
        (["--seed-table", "--json"], "--seed-table: prints the seed's table only, with no job; leave --json out"),
        (["--seed-table", "--trace", TRACE], "leave --trace out to have it"),
        (["--hours", "10", "--rate", "0.1", "--discount", "0.5"], "--discount: applies to --seed-table only"),
        (["--hours", "10", "--node-trace", str(FIXTURES / "aws-p3-trace.csv"), "--workers", "1", "--trace-counts", "preempted"],
         "--trace-counts: applies to SkyPilot JSON spot traces only"),
        (["--hours", "10", "--rate", "0.1", "--checkpoint-gb", "5"], "--checkpoint-gb: prices a move between Ray clusters; "
         "give --cluster too"),
        (["--hours", "10", "--rate", "0.1", "--egress-price", "0.09"], "--egress-price: prices a move between Ray clusters"),
        (["--hours", "10", "--rate", "0.1", "--move-restart-s", "600"], "--move-restart-s: prices a move between Ray clusters"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml"], "--entrypoint: required with --write-yaml"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml", "--entrypoint", "nocolon"], "--entrypoint: entrypoint 'nocolon'"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml", "--entrypoint", "m:f", "--name", "a/b"], "--name: run name 'a/b'"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml", "--entrypoint", "m:f", "--train-loop-config", "{x"],
         "--train-loop-config: not valid JSON"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml", "--entrypoint", "m:f", "--train-loop-config", "[1]"],
         "--train-loop-config: must be a JSON object"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml", "--entrypoint", "m:f", "--storage-path", ""],
         "--storage-path: empty; give the durable storage root"),
        (["--hours", "10", "--rate", "0.1", "--write-yaml", "JOB.yaml", "--entrypoint", "m:f", "--name", ""], "--name: run name ''"),
        (["--hours", "10", "--rate", "0.1", "--seed", "-1"], "--seed: Input should be greater than or equal to 0 (got -1)"),
        (["--hours", "10", "--rate", "0.1", "--deadline-h", "1e308"], "--deadline-h: Input should be less than or equal "
         "to 100000"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(app, args, needle, tmp_path):
    r = invoke(app, *[str(tmp_path / a) if a == "JOB.yaml" else a for a in args])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: ") and needle in lines[0], r.output


@pytest.mark.parametrize(("option", "message"), [("--move-restart-s", "must be a non-negative number of seconds, got -1"),
                                                 ("--checkpoint-gb", "Input should be greater than or equal to 0")])
def test_an_option_given_in_other_units_than_the_plan_keeps_is_not_quoted_converted(app, option, message):
    """-1 s of move restart is -0.00028 h to the planner: quoting that would puzzle whoever typed -1."""
    r = invoke(app, "--hours", "10", "--rate", "0.1", option, "-1")
    assert r.exit_code == 2 and r.output.strip() == f"error: {option}: {message}"


def test_the_written_job_carries_the_workers_shape(app, tmp_path):
    """A 64-GPU job: 8 workers of 8 GPUs. The plan prices workers; the job file must say what one is,
    or the runtime and the deployment files would start CPU workers."""
    path = tmp_path / "gpu.yaml"
    r = invoke(app, "--hours", "10", "--deadline-h", "15", "--workers", "8", "--rate", "0.01", "--runs", "20",
               "--write-yaml", str(path), "--entrypoint", "m:f", "--worker-resources", '{"CPU": 90, "GPU": 8}')
    assert r.exit_code == 0, r.output
    job = JobConfig.from_yaml(path)
    assert all(t.use_gpu and t.worker_resources() == {"CPU": 90.0, "GPU": 8.0} and t.num_workers == 8 for t in job.tiers)


def test_a_trace_with_no_capacity_at_all_is_refused_with_the_likely_cause(app, tmp_path):
    zeros = tmp_path / "zeros.json"
    zeros.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0] * 50}))
    r = invoke(app, "--hours", "10", "--deadline-h", "15", "--trace", str(zeros))
    assert r.exit_code == 2 and r.output.strip() == (
        f"error: --trace: {zeros}: no spot capacity in any of its 50 ticks, so spot never starts; if it counts "
        "preempted instances, pass --trace-counts preempted")
    # Another sample of the same market is read as --trace's are: all zeros would be 1000 h of 'spot forever'.
    r = invoke(app, "--hours", "10", "--deadline-h", "15", "--trace", TRACE, "--sample", str(zeros))
    assert r.exit_code == 2 and r.output.strip() == (
        f"error: --sample: {zeros}: no spot capacity in any of its 50 ticks, so spot never starts; if it counts "
        "preempted instances, pass --trace-counts preempted"), r.output


def test_interruptions_too_frequent_for_any_checkpoint_recommend_on_demand_only(app):
    """A gang lost every microsecond: Daly's interval is that, and the plan tries a minute at least."""
    r = invoke(app, "--hours", "0.5", "--rate", "1e9", "--runs", "8", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [t["market"] for t in out["recommended_tiers"]] == ["on-demand"]
    assert out["feasible"]


def test_malformed_trace_names_the_file_and_field(app, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": {"gap_seconds": 60}, "data": [1, "x"]}')
    r = invoke(app, "--hours", "10", "--trace", str(bad))
    assert r.exit_code == 2
    assert f"--trace: {bad}: field 'data[1]'" in r.output


def test_type_errors_name_the_option(app):
    r = invoke(app, "--hours", "ten", "--rate", "0.1")
    assert r.exit_code == 2 and "'--hours'" in r.output and "Traceback" not in r.output


def test_preempted_counting_traces_are_complemented(app):
    a = invoke(app, "--hours", "12", "--trace", TRACE, "--runs", "30")
    b = invoke(app, "--hours", "12", "--trace", TRACE, "--trace-counts", "preempted", "--runs", "30")
    assert a.exit_code == b.exit_code == 0

    def mtbf_line(out: str) -> str:
        return next(ln for ln in out.splitlines() if "Gang MTBF" in ln)

    assert mtbf_line(a.output) != mtbf_line(b.output)


def test_a_trace_that_never_counts_a_preemption_is_a_pool_always_there(app, tmp_path):
    """All zeros: no capacity read as available instances, and as preempted ones, nothing ever lost, as the
    error's hint says."""
    zeros = tmp_path / "zeros.json"
    zeros.write_text('{"metadata": {"gap_seconds": 600}, "data": [0, 0, 0, 0]}')
    args = ["--hours", "2", "--deadline-h", "4", "--runs", "20", "--trace", str(zeros)]
    r = invoke(app, *args)
    assert r.exit_code == 2 and "if it counts preempted instances, pass --trace-counts preempted" in r.output
    r = invoke(app, *args, "--trace-counts", "preempted")
    assert r.exit_code == 0, r.output
    assert "Gang MTBF on spot: inf" in r.output


def test_plan_shows_every_policy_as_a_multiple_of_the_hindsight_optimum(app):
    import json

    args = ["--hours", "10", "--workers", "1", "--deadline-h", "15", "--spot-price", "0.3", "--on-demand-price", "1",
            "--trace", TRACE, "--runs", "40"]
    r = invoke(app, *args)
    assert r.exit_code == 0, r.output
    assert "x opt" in r.output and "Hindsight optimum" in r.output
    r = invoke(app, *args, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    opt = doc["optimum_mean_spend"]
    assert opt > 0
    rows = {row["policy"]: row for row in doc["policies"]}
    assert set(rows) >= {"recommended", "on-demand only", "spot forever", "seed M=5", "uniform progress"}
    for row in rows.values():
        assert row["x_optimum"] == pytest.approx(row["mean_spend"] / opt)
        if row["p_deadline"] == 1.0:  # every run on time: none can beat the optimum
            assert row["x_optimum"] >= 1 - 1e-9
    # A rate model has no hindsight: no column.
    r = invoke(app, "--hours", "10", "--rate", "0.02", "--deadline-h", "15", "--runs", "20")
    assert r.exit_code == 0 and "x opt" not in r.output


def test_plan_searches_its_optimum_in_other_processes_beside_the_plan_with_the_same_answer(app, monkeypatch):
    import json

    from spotfallback.sim import optimum

    args = ["--hours", "10", "--workers", "1", "--deadline-h", "15", "--trace", TRACE, "--runs", "40", "--json"]
    here = json.loads(invoke(app, *args).output)  # a small search: all of it in this process
    started = []

    class Counted(optimum.Spread):  # the real Spread, and whether the caller kept a share
        def __init__(self, fn, shared, items, processes, *, caller_share=True):
            started.append(caller_share)
            super().__init__(fn, shared, items, processes, caller_share=caller_share)

    monkeypatch.setattr(optimum, "_SPREAD_FROM", 1)
    monkeypatch.setattr(optimum, "Spread", Counted)
    beside = json.loads(invoke(app, *args).output)
    assert started == [False]
    assert beside["optimum_mean_spend"] == here["optimum_mean_spend"] and beside["policies"] == here["policies"]


def test_plan_leaves_out_an_optimum_whose_search_is_too_large_and_says_why(app, monkeypatch):
    import json

    from spotfallback.cli import plan as plan_cli

    monkeypatch.setattr(plan_cli, "OPTIMUM_LIMIT", 1_000)
    args = ["--hours", "10", "--workers", "1", "--deadline-h", "15", "--trace", TRACE, "--runs", "40"]
    r = invoke(app, *args)
    assert r.exit_code == 0, r.output
    assert "x opt" not in r.output.split("note:")[0] and "Hindsight optimum" not in r.output
    assert "x opt is left out: the hindsight optimum's search is too large" in " ".join(r.output.split())
    doc = json.loads(invoke(app, *args, "--json").output)
    assert doc["optimum_mean_spend"] is None and all(row["x_optimum"] is None for row in doc["policies"])
    assert "limit of 1,000" in doc["notes"][-1] and "--runs" in doc["notes"][-1]


def test_plan_on_free_spot_leaves_out_an_optimum_of_nothing(app, tmp_path):
    """Spot at price 0 on a trace that always has it: the optimum spends 0, and no policy is a multiple of it."""
    import json

    trace = tmp_path / "single.json"
    trace.write_text('{"metadata": {"gap_seconds": 600}, "data": [1]}')
    args = ["--hours", "2", "--workers", "1", "--deadline-h", "4", "--runs", "20", "--trace", str(trace), "--spot-price", "0"]
    r = invoke(app, *args)
    assert r.exit_code == 0 and "Traceback" not in r.output and "RuntimeWarning" not in r.output, r.output
    assert "x opt is left out: the optimum spends nothing here" in " ".join(r.output.split())
    doc = json.loads(invoke(app, *args, "--json").output)
    assert doc["optimum_mean_spend"] is None and all(row["x_optimum"] is None for row in doc["policies"])


def test_plan_tables_fit_an_80_column_terminal_with_every_figure_whole(app):
    """A big job's spends (thousands) and a missed deadline still fit: no cell cut, no column dropped."""
    import json

    args = ["--hours", "100", "--workers", "64", "--deadline-h", "150", "--trace", TRACE, "--runs", "30"]
    r = invoke(app, *args, columns=80)
    assert r.exit_code == 0, r.output
    assert "…" not in r.output and max(len(line) for line in r.output.splitlines()) <= 80
    doc = json.loads(invoke(app, *args, "--json").output)
    table = r.output.split("vs baselines")[1].split("Hindsight optimum")[0]
    for row in doc["policies"]:
        spend = row["mean_spend"]
        assert (f"{spend:,.0f}" if spend >= 1000 else f"{spend:,.1f}") in table, row["policy"]
        assert f"{row['x_optimum']:.3f}" in table and f"{row['p_deadline']:.3f}" in table
    assert "miss" in table  # spot forever misses the deadline; its verdict is shown
    header = next(line for line in table.splitlines() if line.startswith("policy"))
    assert header.split() == ["policy", "spend", "x", "opt", "p90", "wall", "h", "p90", "P(<=D)", "alpha", "intr", "sw"]
    ladder = r.output.split("Recommended ladder")[1].split("vs baselines")[0]
    for setting in ("market", "max_preemptions", "capacity_timeout_s", "deadline_guard", "climb_back"):
        assert setting in ladder


def test_a_policy_that_never_finishes_keeps_every_column_within_80(app, tmp_path):
    """Spot forever on a trace that is up one tick of three ends at the simulator's 1,000 h limit with
    thousands of interruptions: its figures lose decimals rather than push the last column out."""
    import json

    trace = tmp_path / "short.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0, 1]}))
    r = invoke(app, "--hours", "10", "--workers", "1", "--deadline-h", "15", "--trace", str(trace), "--runs", "40", columns=80)
    assert r.exit_code == 0, r.output
    table = r.output.split("vs baselines")[1].split("Hindsight optimum")[0]
    assert max(len(line) for line in table.splitlines()) <= 80 and "…" not in table
    header = next(line for line in table.splitlines() if line.startswith("policy"))
    assert header.split()[-3:] == ["alpha", "intr", "sw"]
    forever = next(line for line in table.splitlines() if line.startswith("spot forever"))
    assert " 1000 " in forever and forever.split()[-1] == "0.0"  # the wall hours whole, the switches in place


def test_plan_on_several_samples_of_one_market_holds_on_each(app):
    other = str(FIXTURES / "us-east-1f_v100_4node.json")
    r = invoke(app, "--hours", "10", "--workers", "1", "--trace", TRACE, "--sample", other, "--deadline-h", "15",
               "--runs", "40", "--spot-price", "0.3", "--on-demand-price", "1")
    assert r.exit_code == 0, r.output
    assert "x opt" in r.output
    r = invoke(app, "--hours", "10", "--workers", "1", "--trace", TRACE, "--trace", TRACE, "--sample", other)
    assert r.exit_code == 2 and "--sample" in r.output and "one spot tier" in r.output


def test_each_spot_pool_is_priced_on_its_own(app, tmp_path):
    """Two spot pools (say A100 spot, then L4 spot): one --spot-price each, in --trace order."""
    yaml_path = tmp_path / "job.yaml"
    r = invoke(app, "--hours", "10", "--workers", "1", "--trace", TRACE, "--trace", TRACE, "--deadline-h", "30",
               "--runs", "40", "--spot-price", "1.2", "--spot-price", "0.4", "--on-demand-price", "3.0",
               "--write-yaml", str(yaml_path), "--entrypoint", "m:f")
    assert r.exit_code == 0, r.output
    assert "spot 1.2/0.4 vs on-demand 3" in r.output
    tiers = JobConfig.from_yaml(yaml_path).tiers
    assert {t.name: t.price_per_worker_hour for t in tiers} == {"spot": 1.2, "spot-2": 0.4, "on-demand": 3.0}
    r = invoke(app, "--hours", "10", "--trace", TRACE, "--spot-price", "1.2", "--spot-price", "0.4")
    assert r.exit_code == 2 and "--spot-price: 2 prices for 1 spot pools" in r.output and "Traceback" not in r.output


def test_a_ladder_across_clusters_is_planned_with_its_moves_priced(app, tmp_path):
    yaml_path = tmp_path / "job.yaml"
    r = invoke(app, "--hours", "10", "--workers", "1", "--trace", TRACE, "--deadline-h", "15", "--runs", "60",
               "--cluster", "http://east:8265", "--cluster", "http://west:8265", "--checkpoint-gb", "20",
               "--write-yaml", str(yaml_path), "--entrypoint", "m:f", "--storage-path", "s3://ml-runs/runs")
    assert r.exit_code == 0, r.output
    assert "Across 2 clusters: each move to another cluster costs 120 s more restart (billed) and 0.4 of egress" in r.output
    job = JobConfig.from_yaml(yaml_path)
    assert [t.cluster.address for t in job.tiers] == ["http://east:8265", "http://west:8265"]
    for args, needle in (
        (["--cluster", "http://e:1", "--cluster", "http://w:1", "--cluster", "http://x:1"],
         "--cluster: 3 clusters for 1 spot pools and on-demand"),
        (["--cluster", "east", "--cluster", "http://w:1"], "--cluster: address 'east' must be the Ray Jobs API's"),
        (["--cluster", "http://e:1", "--cluster", "http://e:1"], "--cluster: all tiers on one cluster"),
        (["--cluster", "http://e:1", "--cluster", "http://w:1", "--checkpoint-gb", "-1"], "--checkpoint-gb"),
        # The job file's default ./runs is another directory on each machine: refused before any simulation.
        (["--cluster", "http://e:1", "--cluster", "http://w:1", "--write-yaml", str(tmp_path / "j.yaml"), "--entrypoint", "m:f"],
         "--storage-path: './runs' is a path on each machine"),
    ):
        bad = invoke(app, "--hours", "10", "--trace", TRACE, *args)
        assert bad.exit_code == 2 and needle in bad.output, bad.output


def test_both_outputs_are_checked_before_the_simulation_and_before_either_is_written(app, tmp_path, monkeypatch):
    """A bad --plot must not leave a new --write-yaml file behind, nor cost minutes of simulation first."""
    yaml_path, afile, dangling, blocked = tmp_path / "job.yaml", tmp_path / "afile", tmp_path / "d.png", tmp_path / "ro"
    afile.write_text("")
    dangling.symlink_to("/nonexistent/d.png")
    blocked.mkdir()
    access = os.access  # as root every directory is writable: make one say no
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != blocked and access(p, mode, **kw))
    monkeypatch.setattr(cli_plan, "plan", lambda *a, **k: pytest.fail("simulated before the outputs were checked"))
    for plot, needle in ((afile / "p.png", f"--plot: '{afile}' is a file, not a directory"),
                         (dangling, f"--plot: '{dangling}' links to '/nonexistent/d.png', whose directory does not exist"),
                         (blocked / "p.png", f"--plot: '{blocked}' is not writable; give another path")):
        r = invoke(app, "--hours", "10", "--rate", "0.1", "--write-yaml", str(yaml_path), "--entrypoint", "m:f",
                   "--plot", str(plot))
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and lines[0] == f"error: {needle}", r.output
        assert not yaml_path.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a disk that is always full)")
def test_a_job_file_or_plot_that_fails_as_it_is_written_is_one_line_and_keeps_the_old_file(app, tmp_path):
    full = tmp_path / "full.yaml"
    full.symlink_to("/dev/full")
    args = ("--hours", "10", "--rate", "0.1", "--runs", "20")
    r = invoke(app, *args, "--write-yaml", str(full), "--force", "--entrypoint", "m:f")
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert lines == [f"error: --write-yaml: cannot write '{full}' (a link to '/dev/full'): No space left on device; "
                     "free some space or give another path"]
    (tmp_path / "full.png").symlink_to("/dev/full")
    r = invoke(app, *args, "--plot", str(tmp_path / "full.png"))
    assert r.exit_code == 2 and "error: --plot: cannot write" in r.output and "Traceback" not in r.output, r.output


def test_a_forced_job_file_whose_write_fails_keeps_the_old_one(app, tmp_path, disk_full_on_sync):
    yaml_path = tmp_path / "job.yaml"
    yaml_path.write_text("edited")
    r = invoke(app, "--hours", "10", "--rate", "0.1", "--runs", "20", "--entrypoint", "m:f", "--write-yaml", str(yaml_path),
               "--force")
    assert r.exit_code == 2 and f"error: --write-yaml: cannot write '{yaml_path}': No space left" in r.output, r.output
    assert yaml_path.read_text() == "edited" and sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


def test_json_output_still_writes_the_job_file_and_says_so_beside_the_json(app, tmp_path):
    path = tmp_path / "job.yaml"
    r = invoke(app, "--hours", "10", "--rate", "0.1", "--runs", "20", "--deadline-h", "15", "--json",
               "--write-yaml", str(path), "--entrypoint", "m:f")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["policies"][0]["policy"] == "recommended"
    assert f"Wrote the job file (recommended tiers and the plan's prediction) to {path}" in r.stderr
    assert JobConfig.from_yaml(path).plan is not None


def test_spot_pools_written_with_one_selector_on_one_cluster_get_a_note():
    """The plan priced two pools; a file whose tiers select the same nodes would run them as one."""
    from spotfallback.config import Ladder, Tier

    def ladder(second: dict[str, object]) -> Ladder:
        return Ladder(tiers=(Tier.spot(1, name="spot"), Tier.spot(1, name="spot-2", **second), Tier.on_demand(1)))

    notes = cli_plan._same_nodes(ladder({}))
    assert len(notes) == 1 and "tiers 'spot' and 'spot-2' were priced as two spot pools" in notes[0]
    assert "give each a label_selector of its own" in notes[0]
    assert cli_plan._same_nodes(ladder({"label_selector": {"ray.io/availability-zone": "us-east-1c"}})) == []
    apart = {"cluster": {"address": "http://b:8265"}}
    two = Ladder(tiers=(Tier.spot(1, name="spot", cluster={"address": "http://a:8265"}), Tier.spot(1, name="spot-2", **apart),
                        Tier.on_demand(1, **apart)))
    assert cli_plan._same_nodes(two) == []
