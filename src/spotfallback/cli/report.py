"""`spotfallback report`: a run's cost table and timeline picture, and its plan beside the outcome.

Like `status`, it reads only the run's directory, so it works from any machine that can read
the storage, while the run trains and after it ended.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from spotfallback.cli.common import (
    RUN_HELP,
    check_output,
    fail,
    load_run,
    reading_run,
    write_output,
)
from spotfallback.config import PlanPrediction
from spotfallback.errors import EXIT_ERROR
from spotfallback.view.text import print_wide


def _plan(meta: dict[str, Any]) -> PlanPrediction | None:
    """The plan the run was started with (``spotfallback plan --write-yaml``), if any and readable."""
    from pydantic import ValidationError

    try:
        return PlanPrediction.model_validate(meta["plan"]) if meta.get("plan") is not None else None
    except ValidationError:
        return None


def register(app: typer.Typer) -> None:
    """Add `report` to the spotfallback CLI."""

    @app.command("report")
    def report_cmd(
        run: Annotated[str, typer.Argument(help=RUN_HELP, show_default=False, metavar="STORAGE_PATH/NAME")],
        out: Annotated[Path | None, typer.Option("--out", help="Timeline picture to write (PNG; replaced if it exists). Default: NAME-timeline.png here.")] = None,
        html_file: Annotated[Path | None, typer.Option("--html", help="Also write one self-contained HTML page (picture embedded; replaced if it exists).")] = None,
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
        from spotfallback.view.report import (
            cost_report,
            cost_table,
            html_report,
            plan_table,
            summary_lines,
        )
        from spotfallback.view.snapshot import charge_until, read_driver
        from spotfallback.view.text import describe_event
        from spotfallback.view.timeline import timeline_png

        if out is not None:
            check_output("--out", out, ".png")
        if html_file is not None:
            check_output("--html", html_file, ".html")
        location, ladder, view, meta = load_run(run, every_event=html_file is not None)  # the page lists every event
        base, records, latest = view.snapshot, view.tail, view.latest
        if not latest:
            raise fail(f"run {location.uri()!r} has no ledger events yet; nothing to report", EXIT_ERROR)
        out = out or Path(f"{location.name}-timeline.png")
        with reading_run():
            driver = read_driver(location)
        now = time.time()
        until = charge_until(latest, driver, now)
        report = cost_report(ladder, records, run=location.uri(), now=until, plan=_plan(meta), base=base,
                             driver_live=driver is not None and driver.live(now))
        try:
            png = timeline_png(ladder, records, title=run.rstrip("/"), now=until, base=base)  # as the user named it
        except ImportError:
            raise fail("the timeline needs matplotlib: pip install matplotlib", EXIT_ERROR) from None
        write_output("--out", out, png)
        if html_file is not None:
            t0 = records[0].t
            lines = [describe_event(r, t0, ladder) for r in records]
            from rich.text import Text

            plain = [Text.from_markup(line).plain for line in lines if line]
            write_output("--html", html_file, html_report(report, png, plain))
        if as_json:
            data = report.to_json()
            data.update(png=str(out), html=str(html_file) if html_file else None)
            typer.echo(json.dumps(data, default=str))
            return
        console = Console(highlight=False)
        print_wide(console, cost_table(report))
        for line in summary_lines(report):  # plain text: a reason from the ledger may hold brackets
            console.print(line, soft_wrap=True, markup=False)
        if (planned := plan_table(report)) is not None:
            print_wide(console, planned)
        console.print(f"timeline: {out}" + (f"; page: {html_file}" if html_file else ""))
