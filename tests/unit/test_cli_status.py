"""`spotfallback status`, `report` and `init` through typer's test runner.

Bad input must give one clear line naming the argument or option, exit code 2, and never a
traceback; good input is checked against the same hand-built ledger as test_status_report.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import stat
from pathlib import Path

import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from spotfallback.cli import init as cli_init
from spotfallback.cli import report as cli_report
from spotfallback.cli import run as cli_run
from spotfallback.cli import status as cli_status
from spotfallback.config import JobConfig
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run, split_run_uri
from spotfallback.view.report import cost_report
from tests.support.ledgers import LADDER, run_events, write_ledger


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    for command in (cli_status, cli_report, cli_init, cli_run):
        command.register(app)
    return app


def invoke(app, *args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.fixture()
def run_uri(tmp_path):
    location, _ = write_ledger(tmp_path / "runs", run_events(), name="digits-1")
    return f"{tmp_path / 'runs'}/digits-1"


def assert_usage_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_status_of_a_finished_run(app, run_uri):
    r = invoke(app, "status", run_uri)
    assert r.exit_code == 0, r.output
    assert "finished" in r.output and "on-demand" in r.output
    assert "$8.01 so far; all on-demand for the same progress $14.28 (+44% saved)" in r.output
    assert "14 committed; latest step 140" in r.output
    assert r.output.count("fall back to on-demand") == 1 and "latest events (10 of 21)" in r.output
    lines = r.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["tier", "market"])
    assert re.split(r"\s{2,}", lines[header].strip())[3:] == [
        "preempted", "node failures", "training errors", "running", "spend", "budget"]
    # The whole run's 2 preemptions on spot beside the budget of 1 that the second one spent: not "2/1".
    spot = re.split(r"\s{2,}", lines[header + 1].strip())
    assert spot[3:6] == ["2", "0", "0"] and spot[-1] == "1 preemption, 3 node failures, 3 training errors"
    assert lines[header + 2].endswith("unlimited preemptions, 3 node failures, 3 training errors")
    caption = " ".join(" ".join(lines[header + 3:header + 6]).split())
    assert caption.startswith("Whole run: preempted, node failures, training errors, running and spend add up")
    assert "the tier line above counts it down" in caption


def test_status_json_matches_the_ledger(app, run_uri):
    r = invoke(app, "status", run_uri, "--json", "--events", "3")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    records = Ledger(resolve_run(*split_run_uri(run_uri))).read()
    report = cost_report(LADDER, records)
    assert data["status"] == "finished" and data["tier"] == "on-demand"
    assert data["spend"] == pytest.approx(report.spend) and data["checkpoints"] == 14
    assert [e["kind"] for e in data["events"]] == ["checkpoint_committed", "checkpoint_committed", "finished"]
    assert data["event_count"] == 21  # every event in the ledger; "events" lists the latest


def test_a_key_means_the_same_in_status_json_and_in_the_status_lines_of_run_json(app, run_uri):
    """A script reading both gets one type per key: ``events`` is a list of event records in
    `status --json` and absent from `run --json`'s status lines, which count them as ``event_count``."""
    from spotfallback.view.watcher import JsonSink, RunWatcher

    data = json.loads(invoke(app, "status", run_uri, "--json").output)
    out = io.StringIO()
    with RunWatcher(LADDER, [JsonSink(LADDER, out)], interval_s=0.05).watch(resolve_run(*split_run_uri(run_uri))):
        pass
    line = [o for o in map(json.loads, out.getvalue().splitlines()) if o["type"] == "status"][-1]
    number = (int, float)
    differ = {k for k in set(data) & set(line) if None not in (data[k], line[k])
              and not (isinstance(data[k], number) and isinstance(line[k], number)) and type(data[k]) is not type(line[k])}
    assert differ == set()
    assert isinstance(data["events"], list) and "events" not in line
    assert data["event_count"] == line["event_count"] == 21


def test_report_writes_png_html_and_a_table_whose_hours_times_price_is_the_spend(app, run_uri, tmp_path):
    png, page = tmp_path / "t.png", tmp_path / "r.html"
    r = invoke(app, "report", run_uri, "--out", str(png), "--html", str(page))
    assert r.exit_code == 0, r.output
    assert "│ spot      │ spot      │ $1.84/h │ 1.5833 h │ $2.91 │" in r.output
    assert "│ on-demand │ on-demand │ $6.12/h │ 0.8333 h │ $5.10 │" in r.output
    assert "predicts $8.42; measured $8.01" in r.output
    Image.open(io.BytesIO(png.read_bytes())).verify()
    assert "data:image/png;base64," in page.read_text()
    r = invoke(app, "report", run_uri, "--json", "--out", str(png))
    data = json.loads(r.output)
    for tier in data["tiers"]:
        assert round(tier["running_h"] * tier["price_per_hour"], 2) == round(tier["spend"], 2)
    assert data["png"] == str(png) and data["seed"]["predicted"] == pytest.approx(8.4214, abs=1e-4)


def test_report_default_picture_name_is_the_run_name(app, run_uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke(app, "report", run_uri)
    assert r.exit_code == 0, r.output
    assert "timeline: digits-1-timeline.png" in r.output
    assert (tmp_path / "digits-1-timeline.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["status", "nonsense"], ["run: expected STORAGE_PATH/NAME", "'nonsense'"]),
        (["status", "{tmp}/runs/missing"], ["run: no spotfallback run at", "missing"]),
        (["status", "{tmp}/runs/bad name"], ["name: run name 'bad name'"]),
        (["status", "{tmp}/runs/x/_spotfallback"], ["is a run's own _spotfallback folder; give the run:", "runs/x'"]),
        (["status", "bare-name"], ["expected STORAGE_PATH/NAME, got 'bare-name' (STORAGE_PATH is the job file's "
                                   "storage_path: ./runs/bare-name for the job file `spotfallback init` writes)"]),
        (["status", "{run}", "--events", "-1"], ["--events: must be 0 or more"]),
        (["report", "{run}", "--out", "{tmp}/t.jpg"], ["--out:", "must end in .png"]),
        (["report", "{run}", "--out", "{tmp}/nowhere/t.png"], ["--out: directory", "does not exist"]),
        (["report", "{run}", "--html", "{tmp}/r.txt"], ["--html:", "must end in .html"]),
        (["report", "s3://bucket"], ["names a bucket, not a run"]),
        (["status", "ftp://host/runs/x"], ["storage_path: 'ftp://' is not storage", "s3://, gs://"]),
        (["report", "S3://bucket/runs/x"], ["storage_path: write the scheme in lower case: 's3://', not 'S3://'"]),
        (["init", "{tmp}/nowhere/job.yaml"], ["PATH: directory", "does not exist"]),
        (["init", "{tmp}"], ["is a directory"]),
        (["init", "{tmp}/job.json"], ["PATH:", "must end in .yaml or .yml"]),
        (["run", "{tmp}/missing.yaml"], ["cannot read the job file"]),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_code_2(app, run_uri, tmp_path, args, needles):
    args = [a.format(tmp=tmp_path, run=run_uri) for a in args]
    assert_usage_error(invoke(app, *args), *needles)


def test_a_run_copied_without_its_ladder_says_so(app, run_uri, tmp_path):
    """The events are there but not run.json: not "no run here", which would send the user to the wrong path."""
    (tmp_path / "runs" / "digits-1" / "_spotfallback" / "run.json").unlink()
    for command in ("status", "report"):
        assert_usage_error(invoke(app, command, run_uri), "has a ledger but no _spotfallback/run.json", "copy the whole")


@pytest.mark.parametrize("where", ["runs/my-run", "my-run"])
def test_a_run_named_alone_is_pointed_to_the_folder_of_that_name_here(app, tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / where).mkdir(parents=True)
    assert_usage_error(invoke(app, "status", "my-run"), f"got 'my-run' (did you mean ./{where}?)")


def test_init_writes_a_valid_commented_job_and_refuses_to_overwrite(app, tmp_path):
    path = tmp_path / "job.yaml"
    r = invoke(app, "init", str(path))
    assert r.exit_code == 0, r.output
    job = JobConfig.from_yaml(path)
    assert job.entrypoint == "spotfallback.examples.ddp_digits:train_fn" and [t.name for t in job.tiers] == ["spot", "on-demand"]
    assert job.tiers[0].price_per_worker_hour < job.tiers[1].price_per_worker_hour
    assert sum(1 for line in path.read_text().splitlines() if line.lstrip().startswith("#")) >= 10
    path.write_text("edited")
    assert_usage_error(invoke(app, "init", str(path)), "already exists", "--force")
    assert path.read_text() == "edited"
    assert invoke(app, "init", str(path), "--force").exit_code == 0
    assert JobConfig.from_yaml(path).name == job.name


def test_init_says_the_next_command_ready_to_paste(app, tmp_path):
    path = tmp_path / "my jobs" / "job.yaml"
    path.parent.mkdir()
    r = invoke(app, "init", str(path))
    assert r.exit_code == 0 and r.output.rstrip().endswith(f"Edit it, then: spotfallback run '{path}'"), r.output


def test_report_of_a_run_with_no_events_yet_says_so(app, tmp_path):
    location = write_ledger(tmp_path / "runs", [], name="empty")[0]
    r = invoke(app, "report", f"{tmp_path / 'runs'}/empty")
    assert r.exit_code == 1 and "no ledger events yet" in r.output and "Traceback" not in r.output
    r = invoke(app, "status", f"{tmp_path / 'runs'}/empty")
    assert r.exit_code == 0 and "not started" in r.output, r.output
    assert location.name == "empty"


@pytest.mark.parametrize(
    ("command", "texts"),
    [
        ("status", ["STORAGE_PATH/NAME", "--json", "--events", "any machine"]),
        ("report", ["--out", "--html", "--json", "seed formula", "hours"]),
        ("init", ["--force", "commented example job"]),
        ("run", ["--json", "--mlflow", "SPOTFALLBACK_RAY_ADDRESS", "Exit codes"]),
    ],
)
def test_help_of_each_command_describes_its_options(app, command, texts):
    r = invoke(app, command, "--help")
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    for text in texts:
        assert text in flat, (text, r.output)


def test_status_shows_the_progress_total_and_bar_from_the_runs_metadata(app, tmp_path):
    location, ledger = write_ledger(tmp_path / "runs", run_events(), name="digits-2")
    run = f"{tmp_path / 'runs'}/digits-2"
    assert "step 140/140" not in invoke(app, "status", run).output  # no total known: no bar
    ledger.write_meta(LADDER, {"name": "digits-2", "progress_totals": {"total_steps": 140}})
    r = invoke(app, "status", run)
    assert r.exit_code == 0, r.output
    assert "step 140/140  (100%)" in r.output and "━━━━━━━━━━" in r.output  # the bar, as in the live view
    assert json.loads(invoke(app, "status", run, "--json").output)["progress"]["total"] == 140


def test_report_sets_the_plan_beside_the_outcome_in_table_html_and_json(app, tmp_path):
    location, ledger = write_ledger(tmp_path / "runs", run_events(), name="digits-3")
    plan = {"spend": 7.5, "wall_h": 2.0, "deadline_h": 3.0, "made_with": "rate model, 200 runs"}
    ledger.write_meta(LADDER, {"name": "digits-3", "plan": plan})
    run, png, page = f"{tmp_path / 'runs'}/digits-3", tmp_path / "t.png", tmp_path / "r.html"
    r = invoke(app, "report", run, "--out", str(png), "--html", str(page))
    assert r.exit_code == 0, r.output
    assert "Plan vs outcome (rate model, 200 runs)" in r.output
    assert re.search(r"│ spend\s+│\s+\$7\.50 │\s+\$8\.01 │\s+\+6\.8% │", r.output), r.output
    assert re.search(r"│ deadline\s+│\s+3h00m │\s+2h30m │\s+met │", r.output), r.output
    assert "Plan vs outcome" in page.read_text()
    data = json.loads(invoke(app, "report", run, "--json", "--out", str(png)).output)
    assert data["plan"]["predicted_spend"] == 7.5 and data["plan"]["measured_spend"] == pytest.approx(data["spend"])
    # A run without a plan has no such table.
    write_ledger(tmp_path / "runs", run_events(), name="digits-4")
    r = invoke(app, "report", f"{tmp_path / 'runs'}/digits-4", "--out", str(png))
    assert r.exit_code == 0 and "Plan vs outcome" not in r.output and "plan:" not in r.output


def test_status_and_report_read_a_run_on_s3(app, tmp_path, monkeypatch):
    """The ledger on an S3 server (moto, on loopback), read with nothing but the s3:// URI."""
    from tests.support.s3server import S3Server

    with S3Server() as s3:
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3.endpoint}")  # how a user points at MinIO/moto
        write_ledger(f"s3://{s3.bucket}/runs", run_events(), name="digits-s3")
        run = f"s3://{s3.bucket}/runs/digits-s3"
        r = invoke(app, "status", run)
        assert r.exit_code == 0, r.output
        assert "$8.01 so far; all on-demand for the same progress $14.28 (+44% saved)" in r.output
        png = tmp_path / "s3.png"
        r = invoke(app, "report", run, "--out", str(png))
        assert r.exit_code == 0, r.output
        assert "│ spot      │ spot      │ $1.84/h │ 1.5833 h │ $2.91 │" in r.output
        Image.open(io.BytesIO(png.read_bytes())).verify()
        # The endpoint may also ride in the URI's query, as pyarrow and Ray accept it.
        r = invoke(app, "status", s3.uri("runs/digits-s3"), "--json")
        assert r.exit_code == 0 and json.loads(r.output)["spend"] == pytest.approx(8.01, abs=0.005), r.output
        assert_usage_error(invoke(app, "status", f"s3://{s3.bucket}/runs/missing"), "run: no spotfallback run at")


@pytest.mark.parametrize("command", ["status", "report"])
def test_storage_that_cannot_be_reached_is_one_line_within_the_read_limit(app, command, monkeypatch):
    """A wrong endpoint (nothing listens there): exit 1 with a line that says nothing was written,
    not the run's advice to resume from a checkpoint, after the read-only wait, not the run's."""
    from tests.support.s3server import free_port

    monkeypatch.setenv("SPOTFALLBACK_STORAGE_RETRY_S", "1")
    r = invoke(app, command, f"s3://bucket/runs/x?endpoint_override=http://127.0.0.1:{free_port()}")
    assert r.exit_code == 1, r.output
    assert "cannot reach the run's storage: storage unavailable for" in r.output and "(limit 1s" in r.output
    assert "Nothing was written" in r.output and "resume" not in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(("error", "code", "needle"), [
    # No network on the way to the bucket (S3 looks up its region when the filesystem opens): waited out, exit 1.
    ("When resolving region for bucket 'b': AWS Error NETWORK_CONNECTION during HeadBucket operation: curlCode: 6, "
     "Could not resolve hostname", 1, "cannot reach the run's storage: storage unavailable for"),
    # A bucket that is not there is the path's fault: bad input, at once.
    ("When resolving region for bucket 'b': AWS Error NO_SUCH_BUCKET during HeadBucket operation", 2,
     "storage_path: cannot open 's3://b/runs': When resolving region for bucket 'b': AWS Error NO_SUCH_BUCKET"),
])
def test_storage_that_fails_as_it_opens_is_told_apart_unreachable_or_wrong(app, monkeypatch, error, code, needle):
    from spotfallback.store import location

    def opening_fails(uri: str, env: object = None) -> object:
        raise OSError(error)

    monkeypatch.setenv("SPOTFALLBACK_STORAGE_RETRY_S", "1")
    monkeypatch.setattr(location, "filesystem_from_uri", opening_fails)
    # The retries' warnings go to this invocation's stderr, not to a handler an earlier command left on a closed one.
    monkeypatch.setattr(logging.getLogger("spotfallback"), "handlers", [])
    r = invoke(app, "status", "s3://b/runs/x")
    assert r.exit_code == code, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_status_lists_the_notice_agents_and_flags_a_stale_one(app, run_uri):
    """An agent that waits for its Ray node, or stopped writing, shows where the user looks."""
    import time
    from pathlib import Path

    from spotfallback.notices.health import AGENTS_DIR, AgentHealth

    location = resolve_run(*split_run_uri(run_uri))
    folder = Path(location.path(AGENTS_DIR))
    folder.mkdir(parents=True)
    now = time.time()
    waiting = AgentHealth.starting("worker-pod-1", "k8s", now - 400, every_s=30).waiting_for_ray(now - 5, "no live Ray node has this machine's address 10.4.0.7")
    silent = AgentHealth.starting("worker-pod-2", "k8s", now - 900, every_s=30).watching(now - 600, "cd" * 28)
    for health in (waiting, silent):
        (folder / f"{health.agent}.json").write_text(json.dumps(health.to_json()))
    r = invoke(app, "status", run_uri)
    assert r.exit_code == 0, r.output
    assert "notice agents  2: 1 stale, 1 waiting for the Ray node" in r.output
    lines = {line.split()[0]: line for line in r.output.splitlines() if line.startswith("worker-pod-")}
    assert "waiting for the Ray node for 6m35s" in lines["worker-pod-1"] and "10.4.0.7" in lines["worker-pod-1"]
    assert "STALE" in lines["worker-pod-2"] and "cdcdcdcdcdcd" in lines["worker-pod-2"]
    data = json.loads(invoke(app, "status", run_uri, "--json").output)
    by_name = {a["agent"]: a for a in data["agents"]}
    assert by_name["worker-pod-1"]["state"] == "waiting-for-ray" and not by_name["worker-pod-1"]["stale"]
    assert by_name["worker-pod-2"]["stale"] and data["agents_not_shown"] == 0


def test_status_without_agents_shows_no_agent_section(app, run_uri):
    r = invoke(app, "status", run_uri)
    assert r.exit_code == 0 and "notice agents" not in r.output


FULL = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a disk that is always full)")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["init", "{tmp}/afile/job.yaml"], ["PATH: '{tmp}/afile' is a file, not a directory"]),
        (["init", "{tmp}/dangling.yaml"], ["PATH: '{tmp}/dangling.yaml' links to '/nonexistent/x.yaml', whose directory"]),
        (["report", "{run}", "--out", "{tmp}/afile/t.png"], ["--out: '{tmp}/afile' is a file"]),
        (["report", "{run}", "--html", "{tmp}/dangling.html"], ["--html: '{tmp}/dangling.html' links to"]),
        pytest.param(["init", "{tmp}/full.yaml", "--force"],
                     ["PATH: cannot write '{tmp}/full.yaml' (a link to '/dev/full'): No space left on device; free some space"],
                     marks=FULL),
        pytest.param(["report", "{run}", "--out", "{tmp}/full.png"], ["--out: cannot write", "No space left"], marks=FULL),
        pytest.param(["report", "{run}", "--out", "{tmp}/t.png", "--html", "{tmp}/full.html"],
                     ["--html: cannot write", "No space left"], marks=FULL),
    ],
)
def test_an_output_that_cannot_be_written_is_one_line_naming_the_option(app, run_uri, tmp_path, args, needles):
    (tmp_path / "afile").write_text("")
    for name in ("dangling.yaml", "dangling.html"):
        (tmp_path / name).symlink_to("/nonexistent/x" + Path(name).suffix)
    for name in ("full.yaml", "full.png", "full.html"):
        (tmp_path / name).symlink_to("/dev/full")
    args = [a.format(tmp=tmp_path, run=run_uri) for a in args]
    assert_usage_error(invoke(app, *args), *(n.format(tmp=tmp_path) for n in needles))
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_default_picture_onto_a_dangling_link_is_one_line(app, run_uri, tmp_path, monkeypatch):
    """Not checked before the ledger is read (no --out given): the write itself fails, and says so."""
    monkeypatch.chdir(tmp_path)
    Path("digits-1-timeline.png").symlink_to("/nonexistent/d.png")
    assert_usage_error(invoke(app, "report", run_uri),
                       "--out: cannot write 'digits-1-timeline.png' (a link to '/nonexistent/d.png'): No such file")


def test_init_force_that_fails_mid_write_keeps_the_old_job_file(app, tmp_path, disk_full_on_sync):
    """The new file is made beside the old one and renamed over it only once it is whole on disk."""
    path = tmp_path / "job.yaml"
    path.write_text("edited")
    assert_usage_error(invoke(app, "init", str(path), "--force"), "PATH: cannot write", "No space left on device")
    assert path.read_text() == "edited" and sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


def test_init_force_through_a_link_rewrites_its_target_and_keeps_its_permissions(app, tmp_path):
    real = tmp_path / "configs" / "job.yaml"
    real.parent.mkdir()
    real.write_text("edited")
    real.chmod(0o640)
    link = tmp_path / "job.yaml"
    link.symlink_to(real)
    r = invoke(app, "init", str(link), "--force")
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and JobConfig.from_yaml(real).name == "my-first-run"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_init_through_a_link_to_nothing_needs_force(app, tmp_path):
    """A dangling link would create its target somewhere else: say where, and write there only with --force."""
    target = tmp_path / "elsewhere" / "job.yaml"
    target.parent.mkdir()
    link = tmp_path / "job.yaml"
    link.symlink_to(target)
    assert_usage_error(invoke(app, "init", str(link)), f"'{link}' is a link to '{target}', which does not exist", "--force")
    assert not target.exists()
    assert invoke(app, "init", str(link), "--force").exit_code == 0
    assert link.is_symlink() and JobConfig.from_yaml(target).name == "my-first-run"


def test_an_unwritable_directory_is_refused_before_any_work(app, run_uri, tmp_path, monkeypatch):
    """As root every directory is writable, so the permission is made to say no."""
    blocked = tmp_path / "ro"
    blocked.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != blocked and access(p, mode, **kw))
    assert_usage_error(invoke(app, "init", str(blocked / "job.yaml")), f"PATH: '{blocked}' is not writable; give another path")
    assert_usage_error(invoke(app, "report", run_uri, "--out", str(tmp_path / "t.png"), "--html", str(blocked / "r.html")),
                       "--html: ", "is not writable")
    assert not (tmp_path / "t.png").exists()


def test_a_file_name_past_the_systems_limit_is_one_line_not_a_traceback(app, tmp_path):
    """Path.is_dir() raises on such a name, where the output's checks began."""
    assert_usage_error(invoke(app, "init", str(tmp_path / ("a" * 300 + ".yaml"))), "File name too long", "give a shorter path")


def test_a_message_with_brackets_is_shown_as_written_not_read_as_markup(app, tmp_path):
    """torch prefixes errors with '[rank0]:'; a path in brackets closed rich markup that was never opened."""
    from spotfallback.events import Fatal, RunStarted, WorkersAcquired

    message = "RuntimeError: [rank0]: NCCL error in [red] zone, see [/mnt/runs/x]"
    write_ledger(tmp_path / "runs", [RunStarted(1000.0), WorkersAcquired(1030.0, num_workers=2), Fatal(1100.0, message=message)],
                 name="fatal")
    run = f"{tmp_path / 'runs'}/fatal"
    r = invoke(app, "status", run)
    assert r.exit_code == 0 and f"fatal: {message}" in r.output, r.output
    page = tmp_path / "fatal.html"
    r = invoke(app, "report", run, "--out", str(tmp_path / "fatal.png"), "--html", str(page))
    assert r.exit_code == 0 and f"gave up: {message}" in r.output.replace("\n", ""), r.output
    assert "RuntimeError: [rank0]: NCCL error in [red] zone" in page.read_text()


def test_a_driver_lease_that_cannot_be_read_is_one_line_not_a_traceback(app, run_uri, monkeypatch):
    """A lease file the reader may not open (its permissions, say): as for the ledger, one line, exit 1."""
    import spotfallback.view.snapshot as snapshot
    from spotfallback.errors import LedgerError

    def denied(location: object) -> None:
        raise LedgerError("storage error while trying to read the driver lease: PermissionError: [Errno 13] Permission denied")

    monkeypatch.setattr(snapshot, "read_lease", denied)
    for command in ("status", "report"):
        r = invoke(app, command, run_uri)
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        lines = [line for line in r.output.splitlines() if line.strip()]
        assert lines == ["error: cannot read the run's ledger: storage error while trying to read the driver lease: "
                         "PermissionError: [Errno 13] Permission denied"], r.output
