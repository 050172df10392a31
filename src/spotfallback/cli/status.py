"""`spotfallback status`, `report` and `init`: look at a run from anywhere, explain its cost, start a job file.

`status` and `report` read only the run's directory (``STORAGE_PATH/NAME``, on any pyarrow
filesystem), so they work from a laptop while the run trains on a cluster, and after it ended.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from spotfallback.cli.run import EXIT_BAD_INPUT, EXIT_ERROR, fail
from spotfallback.config import ConfigError, JobConfig, Ladder, PlanPrediction
from spotfallback.store.ledger import Ledger, LedgerError, LedgerRecord
from spotfallback.store.location import STATE_DIR, RunLocation, resolve_run, split_run_uri
from spotfallback.view.progress import print_wide

RUN_HELP = "The run as STORAGE_PATH/NAME, e.g. ./runs/digits-1 or s3://bucket/runs/digits-1."

EXAMPLE_JOB = """\
# A spotfallback job. `spotfallback run job.yaml` runs it; running the same command again
# resumes it (same name + storage_path = same run). In Python: FallbackTrainer.from_yaml("job.yaml").fit()

# Unique run name: the run's directory under storage_path, and a good MLflow / W&B run name.
# A new name starts a new run.
name: my-first-run
# Where checkpoints and the run ledger live: a local or NFS path, or s3://bucket/prefix, gs://...
storage_path: ./runs
# The training function, 'package.module:function' or 'path/to/file.py:function': ordinary
# Ray Train V2 code that calls ray.train.get_checkpoint() and ray.train.report(..., checkpoint=...).
# This one is examples/ddp_digits.py from the spotfallback repository (run from its checkout).
entrypoint: spotfallback.examples.ddp_digits:train_fn
# Handed to the training function. Report a `step` metric (and give `total_steps` here or in the
# metrics) and `spotfallback run` / `status` show a progress bar.
train_loop_config:
  total_steps: 200
  checkpoint_every: 5
  step_delay_s: 0.2           # the example is tiny: slow each step so there is something to watch
  preemption_check_every: 2   # on a preemption notice, checkpoint at once and wait for the node to go
# 'local' starts a small Ray cluster on this machine (one node per worker of each tier, labelled
# spot / on-demand) to try things out; 'auto' joins the cluster this machine belongs to; or an
# address such as ray://head:10001.
ray_address: local
# The ladder: the run starts on the first tier and only ever walks down, resuming from the
# latest checkpoint. `spotfallback plan --write-yaml` recommends budgets and timeouts.
tiers:
  - name: spot
    market: spot               # workers go to nodes labelled ray.io/market-type=spot
    num_workers: 2
    max_preemptions: 3         # preemptions tolerated here; the next one moves the run down
    max_failures: 3            # node losses without notice; also retries of errors in your code
    capacity_timeout_s: 600    # longest wait for workers, at the start and after each failure
    price_per_worker_hour: 0.92
  - name: on-demand
    market: on-demand
    num_workers: 2
    max_failures: 3
    capacity_timeout_s: 1800
    price_per_worker_hour: 3.06
"""


def _open_run(run: str) -> tuple[RunLocation, Ledger, Ladder]:
    """The run's location, ledger and ladder; ConfigError when RUN names no spotfallback run."""
    base, sep, query = run.partition("?")  # s3://b/runs/NAME?endpoint_override=...: options stay with the storage
    storage_path, name = split_run_uri(base)
    location = resolve_run(storage_path + sep + query, name)
    ledger = Ledger(location)
    ladder = ledger.read_ladder()
    if ladder is None:
        raise ConfigError(
            f"run: no spotfallback run at {location.uri()!r} (no {STATE_DIR}/run.json there); "
            "give STORAGE_PATH/NAME with the job file's storage_path and name"
        )
    return location, ledger, ladder


def _load(run: str) -> tuple[RunLocation, Ladder, list[LedgerRecord], dict[str, Any]]:
    """The run's location, ladder, ledger records and metadata (plan, progress totals)."""
    try:
        location, ledger, ladder = _open_run(run)
        return location, ladder, ledger.read(), ledger.read_meta() or {}
    except ConfigError as e:
        raise fail(str(e), EXIT_BAD_INPUT) from None
    except LedgerError as e:
        raise fail(f"cannot read the run's ledger: {e}", EXIT_ERROR) from None


def _plan(meta: dict[str, Any]) -> PlanPrediction | None:
    """The plan the run was started with (``spotfallback plan --write-yaml``), if any and readable."""
    from pydantic import ValidationError

    try:
        return PlanPrediction.model_validate(meta["plan"]) if meta.get("plan") is not None else None
    except ValidationError:
        return None


def _tier_table(ladder: Ladder, records: list[LedgerRecord], now: float | None) -> Table:
    from spotfallback.accounting import summarize
    from spotfallback.view.progress import money

    summary = summarize(ladder, records, now=now)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("tier", "market", "workers", "preempted/max", "failed/max", "running", "spend"):
        table.add_column(col, justify="left" if col in ("tier", "market") else "right")
    for i, (u, t) in enumerate(zip(summary.tiers, ladder.tiers, strict=True)):
        mark = "▶ " if i == summary.state.tier and summary.status == "running" else "  "
        table.add_row(mark + u.name, u.market, str(t.num_workers), f"{u.preemptions}/{t.max_preemptions if t.max_preemptions != -1 else '∞'}",
                      f"{u.failures}/{t.max_failures if t.max_failures != -1 else '∞'}", f"{u.running_s / 3600:.4f} h", money(u.spend))
    return table


def _check_output(option: str, path: Path, suffix: str) -> None:
    if path.suffix.lower() != suffix:
        raise fail(f"{option}: {str(path)!r} must end in {suffix}", EXIT_BAD_INPUT)
    if not path.parent.is_dir():
        raise fail(f"{option}: directory {str(path.parent)!r} does not exist", EXIT_BAD_INPUT)


def register(app: typer.Typer) -> None:
    """Add `status`, `report` and `init` to the spotfallback CLI."""

    @app.command("status")
    def status_cmd(
        run: Annotated[str, typer.Argument(help=RUN_HELP, show_default=False, metavar="STORAGE_PATH/NAME")],
        as_json: Annotated[bool, typer.Option("--json", help="Print the status as one JSON object.")] = False,
        events: Annotated[int, typer.Option("--events", help="How many of the latest events to list (0: none).")] = 10,
    ) -> None:
        """Where a live or finished run stands: tier, budget, workers, progress, checkpoint, spend.

        Reads only the run's directory, so it works from any machine that can read the storage.
        Exit codes: 0 shown, 2 bad input (not STORAGE_PATH/NAME, or no run there), 1 the ledger
        cannot be read.
        """
        from spotfallback.view.progress import (
            build_snapshot,
            charge_until,
            describe_event,
            event_json,
            read_driver,
            read_heartbeat,
            snapshot_renderable,
        )

        if events < 0:
            raise fail(f"--events: must be 0 or more, got {events}", EXIT_BAD_INPUT)
        location, ladder, records, meta = _load(run)
        now = time.time()
        driver = read_driver(location)
        totals = meta.get("progress_totals") if isinstance(meta.get("progress_totals"), dict) else None
        snap = build_snapshot(ladder, records, run=location.uri(), now=now, heartbeat=read_heartbeat(location),
                              driver=driver, config=totals)
        t0 = records[0].t if records else now
        shown = records[-events:] if events else []
        if as_json:
            data = snap.to_json()
            data["events"] = [event_json(r, t0, ladder) for r in shown]
            typer.echo(json.dumps(data, default=str))
            return
        console = Console(highlight=False)
        console.print(snapshot_renderable(snap))
        print_wide(console, _tier_table(ladder, records, charge_until(records, driver, now)))
        if shown:
            console.print(f"[bold]latest events[/] ({len(shown)} of {len(records)})")
            for rec in shown:
                line = describe_event(rec, t0, ladder)
                if line:
                    console.print(line, soft_wrap=True)

    @app.command("report")
    def report_cmd(
        run: Annotated[str, typer.Argument(help=RUN_HELP, show_default=False, metavar="STORAGE_PATH/NAME")],
        out: Annotated[Path | None, typer.Option("--out", help="Timeline picture to write (PNG). Default: NAME-timeline.png here.")] = None,
        html_file: Annotated[Path | None, typer.Option("--html", help="Also write one self-contained HTML page (picture embedded).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the cost report as one JSON object instead of tables.")] = False,
    ) -> None:
        """The run's cost table and timeline picture.

        Hours and spend per tier (spend = running hours x the tier's price), waiting and redone
        work, savings against all-on-demand for the same useful work, alpha (the share of the
        work done on spot), and the seed formula's prediction for the run's own T, M, dt and
        alpha beside the measured spend; where the job file came from `spotfallback plan
        --write-yaml`, the plan's spend and wall time beside the outcome. The picture shows
        tiers as coloured bands, faults, preemption notices and just-in-time checkpoints as
        marks, fall-backs and climbs back as arrows, checkpoints as ticks and the committed
        step as a line.
        Exit codes: 0 written, 2 bad input, 1 the ledger cannot be read or holds no events yet.
        """
        from spotfallback.view.progress import charge_until, describe_event, read_driver
        from spotfallback.view.report import (
            cost_report,
            cost_table,
            html_report,
            plan_table,
            summary_lines,
            timeline_png,
        )

        if out is not None:
            _check_output("--out", out, ".png")
        if html_file is not None:
            _check_output("--html", html_file, ".html")
        location, ladder, records, meta = _load(run)
        if not records:
            raise fail(f"run {location.uri()!r} has no ledger events yet; nothing to report", EXIT_ERROR)
        out = out or Path(f"{location.name}-timeline.png")
        until = charge_until(records, read_driver(location), time.time())
        report = cost_report(ladder, records, run=location.uri(), now=until, plan=_plan(meta))
        try:
            png = timeline_png(ladder, records, title=run.rstrip("/"), now=until)  # as the user named it
        except ImportError:
            raise fail("the timeline needs matplotlib: pip install matplotlib", EXIT_ERROR) from None
        out.write_bytes(png)
        if html_file is not None:
            t0 = records[0].t
            lines = [describe_event(r, t0, ladder) for r in records]
            from rich.text import Text

            plain = [Text.from_markup(line).plain for line in lines if line]
            html_file.write_text(html_report(report, png, plain), encoding="utf-8")
        if as_json:
            data = report.to_json()
            data.update(png=str(out), html=str(html_file) if html_file else None)
            typer.echo(json.dumps(data, default=str))
            return
        console = Console(highlight=False)
        print_wide(console, cost_table(report))
        for line in summary_lines(report):
            console.print(line, soft_wrap=True)
        if (planned := plan_table(report)) is not None:
            print_wide(console, planned)
        console.print(f"timeline: {out}" + (f"; page: {html_file}" if html_file else ""))

    @app.command("init")
    def init_cmd(
        path: Annotated[Path, typer.Argument(help="Job file to write.", metavar="PATH")] = Path("job.yaml"),
        force: Annotated[bool, typer.Option("--force", help="Overwrite the file if it exists.")] = False,
    ) -> None:
        """Write a commented example job file (ladder, storage, entrypoint) that `spotfallback run` accepts."""
        if path.is_dir():
            raise fail(f"PATH: {str(path)!r} is a directory; give a file name such as {str(path / 'job.yaml')!r}", EXIT_BAD_INPUT)
        if path.exists() and not force:
            raise fail(f"PATH: {str(path)!r} already exists; pass --force to overwrite it", EXIT_BAD_INPUT)
        if not path.parent.is_dir():
            raise fail(f"PATH: directory {str(path.parent)!r} does not exist", EXIT_BAD_INPUT)
        path.write_text(EXAMPLE_JOB)
        job = JobConfig.from_yaml(path)  # the example must always be a valid job
        typer.echo(f"wrote {path}: run {job.name!r} on {' -> '.join(t.name for t in job.tiers)}. "
                   f"Edit it, then: spotfallback run {path}")
