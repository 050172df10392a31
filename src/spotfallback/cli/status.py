"""`spotfallback status`: where a live or finished run stands, from any machine that can read its storage.

It reads only the run's directory (``STORAGE_PATH/NAME``, on any pyarrow filesystem), so it
works from a laptop while the run trains on a cluster, and after it ended.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from spotfallback.cli.common import RUN_HELP, fail, load_run
from spotfallback.config import Ladder
from spotfallback.events import LedgerRecord
from spotfallback.view.text import print_wide


def _tier_table(ladder: Ladder, records: list[LedgerRecord], now: float | None) -> Table:
    from spotfallback.accounting import summarize
    from spotfallback.view.text import money

    summary = summarize(ladder, records, now=now)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("tier", "market", "workers", "preempted/max", "failed/max", "running", "spend"):
        table.add_column(col, justify="left" if col in ("tier", "market") else "right")
    for i, (u, t) in enumerate(zip(summary.tiers, ladder.tiers, strict=True)):
        mark = "▶ " if i == summary.state.tier and summary.status == "running" else "  "
        table.add_row(mark + u.name, u.market, str(t.num_workers), f"{u.preemptions}/{t.max_preemptions if t.max_preemptions != -1 else '∞'}",
                      f"{u.failures}/{t.max_failures if t.max_failures != -1 else '∞'}", f"{u.running_s / 3600:.4f} h", money(u.spend))
    return table


def register(app: typer.Typer) -> None:
    """Add `status` to the spotfallback CLI."""

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
        from spotfallback.store.heartbeat import read_heartbeat
        from spotfallback.view.snapshot import build_snapshot, charge_until, read_driver
        from spotfallback.view.text import describe_event, event_json, snapshot_renderable

        if events < 0:
            raise fail(f"--events: must be 0 or more, got {events}")
        location, ladder, records, meta = load_run(run)
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
