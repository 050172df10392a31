"""`spotfallback status`: where a live or finished run stands, from any machine that can read its storage.

It reads only the run's directory (``STORAGE_PATH/NAME``, on any pyarrow filesystem), so it
works from a laptop while the run trains on a cluster, and after it ended. That includes the
notice agents' health records: an agent that waits for its Ray node, cannot reach the metadata
service or stopped writing shows here, not only in a log on the node.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from spotfallback.cli.common import RUN_HELP, fail, load_run, reading_run
from spotfallback.config import Ladder
from spotfallback.view.text import print_wide

if TYPE_CHECKING:
    from spotfallback.accounting import RunSummary
    from spotfallback.store.location import RunLocation
    from spotfallback.view.snapshot import AgentInfo


# Under the tier table: its counts are the whole run's, its budgets what the tier line counts down.
TIER_TABLE_CAPTION = (
    "Whole run: preempted, node failures, training errors, running and spend add up every stay on the tier. "
    "budget: what the tier tolerates; the tier line above counts it down since it was last fresh "
    "(the run's start, --retry-failed, a climb back with climb_budgets: fresh)."
)


def _budget(limit: int, one: str, many: str) -> str:
    return f"unlimited {many}" if limit == -1 else f"{limit} {one if limit == 1 else many}"


def _tier_table(ladder: Ladder, summary: RunSummary) -> Table:
    """Each tier's whole-run counts, hours and spend beside its budget.

    Why apart: the counts add up every stay on a tier (and every --retry-failed), the budget is
    what one stretch of it tolerates; shown as "4/3" a total read as a budget overrun.
    """
    from spotfallback.view.text import money

    table = Table(box=None, pad_edge=False, header_style="bold", caption=TIER_TABLE_CAPTION, caption_justify="left")
    columns = ("tier", "market", "workers", "preempted", "node failures", "training errors", "running", "spend", "budget")
    for col in columns:
        table.add_column(col, justify="left" if col in ("tier", "market", "budget") else "right")
    for i, (u, t) in enumerate(zip(summary.tiers, ladder.tiers, strict=True)):
        mark = "▶ " if i == summary.state.tier and summary.status == "running" else "  "
        # max_failures bounds node failures and training-function errors, each on its own count
        budget = ", ".join((_budget(t.max_preemptions, "preemption", "preemptions"),
                            _budget(t.max_failures, "node failure", "node failures"),
                            _budget(t.max_failures, "training error", "training errors")))
        table.add_row(mark + u.name, u.market, str(t.num_workers), str(u.preemptions), str(u.failures),
                      str(u.app_errors), f"{u.running_s / 3600:.4f} h", money(u.spend), budget)
    return table


def _read_agents(location: RunLocation, now: float) -> tuple[list[AgentInfo], int]:
    """The run's notice agents from their health records; none when they cannot be listed
    (the rest of the status is still worth showing)."""
    from spotfallback.notices.health import read_agents
    from spotfallback.view.snapshot import AgentInfo

    try:
        records, not_shown = read_agents(location)
    except OSError as e:
        logging.getLogger("spotfallback").warning("cannot read the notice agents' health records: %s", e)
        return [], 0
    agents = [
        AgentInfo(
            agent=h.agent, host=h.host, node_id=h.node_id, cloud=h.cloud, state=h.state.value, since=h.since,
            detail=h.detail, last_seen=h.t, deadline_s=h.deadline_s, notices=h.notices,
            stale=h.stale(now), gone_with_node=h.gone_with_node(now),
        )
        for h in records
    ]
    return agents, not_shown


def register(app: typer.Typer) -> None:
    """Add `status` to the spotfallback CLI."""

    @app.command("status")
    def status_cmd(
        run: Annotated[str, typer.Argument(help=RUN_HELP, show_default=False, metavar="STORAGE_PATH/NAME")],
        as_json: Annotated[bool, typer.Option(
            "--json", help="Print the status as one JSON object: the latest events as a list under \"events\", and "
                           "how many the ledger holds as \"event_count\".")] = False,
        events: Annotated[int, typer.Option("--events", help="How many of the latest events to list (0: none).")] = 10,
    ) -> None:
        """Where a live or finished run stands: tier, budget, workers, progress, checkpoint, spend, each
        tier's whole-run counts, hours and spend beside its budget, and each node's notice agent (its
        state, and when it was last heard from; stale ones flagged).

        Reads only the run's directory, so it works from any machine that can read the storage.
        Exit codes: 0 shown, 2 bad input (not STORAGE_PATH/NAME, or no run there), 1 the ledger
        cannot be read.
        """
        from spotfallback.accounting import summarize
        from spotfallback.store.heartbeat import read_heartbeat
        from spotfallback.view.snapshot import build_snapshot, charge_until, read_driver
        from spotfallback.view.text import (
            agents_table,
            describe_event,
            event_json,
            snapshot_renderable,
        )

        if events < 0:
            raise fail(f"--events: must be 0 or more, got {events}")
        # More latest events than the stored snapshot keeps need every record.
        location, ladder, view, meta = load_run(
            run, every_event=lambda v: v.snapshot is not None and events > len(v.snapshot.recent) + len(v.tail))
        base, records, latest = view.snapshot, view.tail, view.latest
        now = time.time()
        with reading_run():
            driver = read_driver(location)
        totals = meta.get("progress_totals") if isinstance(meta.get("progress_totals"), dict) else None
        agents, not_shown = _read_agents(location, now)
        summary = summarize(ladder, records, now=charge_until(latest, driver, now), start=base.carry if base else None)
        snap = build_snapshot(ladder, records, run=location.uri(), now=now, heartbeat=read_heartbeat(location),
                              driver=driver, config=totals, agents=agents, agents_not_shown=not_shown,
                              summary=summary, base=base)
        t0 = summary.started_at if summary.started_at is not None else now
        shown = latest[-events:] if events else []
        if as_json:
            data = snap.to_json()
            data["events"] = [event_json(r, t0, ladder) for r in shown]
            typer.echo(json.dumps(data, default=str))
            return
        console = Console(highlight=False)
        console.print(snapshot_renderable(snap))
        print_wide(console, _tier_table(ladder, summary))
        if snap.agents:
            console.print("[bold]notice agents[/]")
            print_wide(console, agents_table(snap))
        if shown:
            console.print(f"[bold]latest events[/] ({len(shown)} of {view.events})")
            for rec in shown:
                line = describe_event(rec, t0, ladder)
                if line:
                    console.print(line, soft_wrap=True)
