"""A run put into words: money, one line per ledger event, the snapshot as a panel.

Shared by `run` (live panel, plain CI lines, JSON lines), `status`, `report` and the demo, so
a run reads the same wherever it is shown. Lines carry rich markup; JSON objects carry none.
Durations and ages come from ``spotfallback.durations``, which the storage shell's messages use too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from spotfallback.accounting import RESTART_TIER
from spotfallback.config import Ladder
from spotfallback.durations import ago, duration
from spotfallback.events import LedgerRecord, PreemptionNotice
from spotfallback.view.intervals import AnnouncedEviction
from spotfallback.view.snapshot import AgentInfo, Snapshot


def money(x: float) -> str:
    """Dollars to the cent, with two more digits below a dollar (short runs cost cents)."""
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4f}"


_FAULTS = {
    "preempted": "[yellow]preemption[/]",
    "node_failed": "[yellow]node lost without notice[/]",
    "capacity_timed_out": "[yellow]no capacity in time[/]",
    "application_failed": "[red]error in the training function[/]",
}


def describe_event(record: LedgerRecord, t0: float, ladder: Ladder) -> str | None:
    """One rich-markup line for a ledger event (None for events not worth a line).

    What the ledger says in words (reasons, messages, details) is escaped: a training error
    prints ``[rank0]:`` or a path in brackets, which rich would read as markup.
    """
    ev = record.event
    tiers = ladder.tiers
    tier = tiers[min(record.tier, len(tiers) - 1)].name
    at = f"[dim]{duration(record.t - t0):>7}[/]"
    decision = record.decision or {}
    match ev.kind:
        case "run_started":
            reset = getattr(ev, "reset", False)
            again = " again with fresh budgets" if reset else ""
            # The record carries the tier the run failed on; a reset starts again from the first.
            return f"{at}  run started{again}; waiting for [bold]{tiers[RESTART_TIER].name if reset else tier}[/] workers"
        case "workers_acquired":
            return f"{at}  {getattr(ev, 'num_workers', 0)} workers up on [bold]{tier}[/]"
        case "checkpoint_committed":
            step = getattr(ev, "step", None)
            return f"{at}  checkpoint committed" + (f" at step {step}" if step is not None else "")
        case "preempted" | "node_failed" | "capacity_timed_out" | "application_failed":
            what = _FAULTS[ev.kind]
            action = decision.get("action")
            if action == "switch_tier":
                to = tiers[int(decision.get("to_tier", record.tier + 1))].name
                then = f"[bold magenta]→ fall back to {to}[/] ({escape(str(decision.get('reason', '')))})"
            elif action == "retry":
                then = f"→ restart on {tier} from the latest checkpoint; waiting for workers"
            elif action == "give_up":
                then = f"[bold red]→ give up[/]: {escape(str(decision.get('reason', '')))}"
            else:
                then = f"→ {escape(str(action))}"
            return f"{at}  {what} on [bold]{tier}[/] {then}"
        case "fatal":
            return f"{at}  [bold red]fatal:[/] {escape(str(getattr(ev, 'message', '')))}"
        case "finished":
            return f"{at}  [green]finished[/] on [bold]{tier}[/]"
        case "capacity_observed" if decision.get("action") == "climb_back":
            to = tiers[int(decision.get("to_tier", record.tier))].name
            return f"{at}  capacity back on {to} [bold green]→ climb back from {tier} to {to}[/] ({escape(str(decision.get('reason', '')))})"
        case "capacity_observed" if decision.get("action") == "resize":
            return f"{at}  capacity changed [bold]→ resize {tier} to {decision.get('num_workers')} workers[/]"
        case "preemption_notice" if isinstance(ev, PreemptionNotice):
            left = f", {duration(ev.deadline_s - record.t)} before the node goes" if ev.deadline_s else ""
            source = escape(ev.source or "notice")
            drained = "; node drained" if ev.drained else ""
            if ev.taken_back:
                return f"{at}  [yellow]notice taken back[/] ({source}: cancelled before its time) on [bold]{tier}[/]"
            maintenance = ev.action == "host-maintenance"
            what = "host maintenance notice" if maintenance else "preemption notice"
            if ev.announced_ahead:
                what = "host maintenance announced" if maintenance else f"{escape(ev.action)} announced"
            return f"{at}  [yellow]{what}[/] ({source}{left}) on [bold]{tier}[/]{drained}"
        case "jit_checkpoint":
            outcome, step = getattr(ev, "outcome", ""), getattr(ev, "step", None)
            at_step = f" of step {step}" if step is not None else ""
            detail = escape(str(getattr(ev, "detail", "")))
            if outcome == "started":
                return f"{at}  just-in-time checkpoint{at_step} started on [bold]{tier}[/] ({detail})"
            if outcome == "reported":
                return f"{at}  [green]just-in-time checkpoint{at_step} reported[/] on [bold]{tier}[/] ({detail})"
            if outcome == "missed":
                return f"{at}  [red]just-in-time checkpoint{at_step} missed[/] on [bold]{tier}[/]: {detail}"
            if outcome == "moved":
                return f"{at}  [green]gang moved off the draining node(s)[/] after the checkpoint{at_step} ({detail})"
    # Kinds added later (notices, observations...): named plainly with their set fields.
    fields = [escape(f"{k}={v}") for k, v in ev.to_json().items() if k not in ("kind", "t") and v not in (None, "", False)]
    what = ev.kind.replace("_", " ") + (f" ({', '.join(fields[:2])})" if fields else "")
    if decision.get("action") == "switch_tier":
        to = tiers[int(decision.get("to_tier", record.tier))].name
        return f"{at}  {what} on [bold]{tier}[/] [bold magenta]→ move to {to}[/] ({escape(str(decision.get('reason', '')))})"
    return f"{at}  {what} on [bold]{tier}[/]"


def event_json(record: LedgerRecord, t0: float, ladder: Ladder) -> dict[str, Any]:
    """A ledger event as one JSON-lines object."""
    tier = ladder[min(record.tier, len(ladder) - 1)]
    return {
        "type": "event",
        "elapsed_s": round(record.t - t0, 3),
        "tier": tier.name,
        **record.event.to_json(),
        "decision": record.decision,
    }


def _budget(left: int | None, limit: int) -> str:
    return "unlimited" if left is None else f"{left} of {limit} left"


def snapshot_renderable(snap: Snapshot) -> RenderableType:
    """The snapshot as a small rich grid (the same for `run` and `status`)."""
    colour = {"running": "green", "waiting": "yellow", "finished": "green", "failed": "red", "stalled": "red"}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    state = f"[{colour.get(snap.status, 'white')}]{snap.status}[/]"
    if snap.status == "stalled":
        state += " (no live driver; `spotfallback run` the same job resumes it)"
    grid.add_row("run", f"{snap.run}  {state}  after {duration(snap.elapsed_s)}")
    nxt = f"then {snap.next_tier}" if snap.next_tier else "last tier"
    grid.add_row(
        "tier",
        f"{snap.tier} ({snap.market}{f' on {snap.where}' if snap.where else ''}, tier {snap.tier_index + 1}, {nxt}); "
        f"preemptions {_budget(snap.preemptions_left, snap.max_preemptions)}, "
        f"node failures {_budget(snap.failures_left, snap.max_failures)}, "
        f"training errors {_budget(snap.app_errors_left, snap.max_failures)}",
    )
    workers = f"{snap.workers_up}/{snap.workers_wanted} up"
    if snap.status == "waiting" and snap.waiting_since is not None:
        workers += f"; waiting {duration(snap.now - snap.waiting_since)}"
        if snap.capacity_left_s is not None:
            workers += f", capacity timeout in {duration(snap.capacity_left_s)}"
    grid.add_row("workers", workers)
    p = snap.progress
    if p is not None:
        shown = f"{p.key} {p.value:g}" + (f"/{p.total:g}" if p.total is not None else "")
        if p.fraction is not None:
            bar = ProgressBar(total=1.0, completed=p.fraction, width=30)
            grid.add_row("progress", Group(Text(f"{shown}  ({p.fraction:.0%})"), bar))
        else:
            grid.add_row("progress", shown)
    if snap.last_checkpoint_t is not None:
        step = f"step {snap.last_checkpoint_step}, " if snap.last_checkpoint_step is not None else ""
        if snap.status in ("running", "waiting"):
            when = ago(snap.now - snap.last_checkpoint_t)
        else:  # an ended run: when in the run, not how long ago
            when = f"at {duration(snap.last_checkpoint_t - (snap.started_at or snap.last_checkpoint_t))} into the run"
        grid.add_row("checkpoint", f"{snap.checkpoints} committed; latest {step}{when}")
    else:
        grid.add_row("checkpoint", "none committed yet")
    saved = 1 - snap.spend / snap.on_demand_spend if snap.on_demand_spend > 0 else None
    cost = f"{money(snap.spend)} so far; all on-demand for the same progress {money(snap.on_demand_spend)}"
    if saved is not None:
        cost += f" ({saved:+.0%} saved)"
    if snap.lost_s > 0:  # redone work, or the hold after a just-in-time checkpoint: billed, not progress
        cost += f"; {duration(snap.lost_s)} lost to interruptions"
    grid.add_row("spend", cost)
    if snap.evictions:
        grid.add_row("evictions", evictions_summary(snap.evictions))
    if snap.driver is not None:
        alive = "live" if snap.driver.live(snap.now) else "gone"
        grid.add_row("driver", f"{snap.driver.host} pid {snap.driver.pid}, {alive}, seen {ago(snap.now - snap.driver.renewed_at)}")
    if snap.give_up_reason:
        grid.add_row("gave up", Text(snap.give_up_reason, style="red"))
    if snap.agents:
        grid.add_row("notice agents", agents_summary(snap))
    return grid


def evictions_summary(evictions: Sequence[AnnouncedEviction]) -> str:
    """Announced evictions: how many moved early, and the mean hold and idle time after the checkpoint."""
    held = sum(e.held_s for e in evictions) / len(evictions)
    idles = [e.idle_s for e in evictions if e.idle_s is not None]
    idle = f", idle {duration(sum(idles) / len(idles))} until the next gang" if idles else ""
    moved = sum(1 for e in evictions if e.moved)
    return f"{len(evictions)} announced, {moved} moved before the node went; per eviction held {duration(held)}{idle}"


_AGENT_STATES = {
    "waiting-for-ray": "[yellow]waiting for the Ray node[/]",
    "watching": "[green]watching[/]",
    "enabling": "[yellow]enabling Scheduled Events[/]",
    "metadata-failing": "[red]failing to reach metadata[/]",
    "drained": "[yellow]drained its node[/]",
    "stopped": "[dim]stopped[/]",
}


def agent_state(agent: AgentInfo, now: float) -> str:
    """What the agent is doing and for how long, e.g. "waiting for the Ray node for 5m12s"."""
    label = _AGENT_STATES.get(agent.state, agent.state)
    if agent.state in ("stopped", "drained"):
        text = f"{label} {ago(now - agent.since)}"
    else:
        text = f"{label} for {duration(agent.last_seen - agent.since)}"
    if agent.state == "drained" and agent.deadline_s is not None:
        left = agent.deadline_s - now
        text += f", deadline in {duration(left)}" if left >= 0 else f", deadline passed {duration(-left)} ago"
    return text


def agent_seen(agent: AgentInfo, now: float) -> str:
    seen = ago(now - agent.last_seen)
    if agent.gone_with_node:
        return seen + " (gone with its node)"
    return seen + " [bold red]STALE[/]" if agent.stale else seen


# The summary's order: what needs a look first.
_SUMMARY_ORDER = ("stale", "metadata-failing", "waiting-for-ray", "enabling", "drained", "gone", "watching", "stopped")
_SUMMARY_LABELS = {**_AGENT_STATES, "stale": "[bold red]stale[/]", "gone": "[dim]gone with their nodes[/]"}


def agents_summary(snap: Snapshot) -> str:
    """One line: how many agents are in each state, those that need a look first."""
    counts: dict[str, int] = {}
    for agent in snap.agents:
        key = "gone" if agent.gone_with_node else "stale" if agent.stale else agent.state
        counts[key] = counts.get(key, 0) + 1
    order = [k for k in _SUMMARY_ORDER if k in counts] + sorted(k for k in counts if k not in _SUMMARY_ORDER)
    more = f" (and {snap.agents_not_shown} older records)" if snap.agents_not_shown else ""
    return f"{len(snap.agents)}{more}: " + ", ".join(f"{counts[k]} {_SUMMARY_LABELS.get(k, k)}" for k in order)


def agents_table(snap: Snapshot) -> Table:
    """Each notice agent: its node, cloud, state, when it was last heard from, and why."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("agent", "node", "cloud", "state", "last seen", "detail"):
        table.add_column(col, no_wrap=col != "detail")
    for agent in snap.agents:
        node = agent.node_id[:12] if agent.node_id else "-"
        table.add_row(
            Text(agent.agent), node, agent.cloud, agent_state(agent, snap.now), agent_seen(agent, snap.now), Text(agent.detail[:160])
        )
    return table


def print_wide(console: Console, table: Table) -> None:
    """Print a table at its natural width: numbers cut to '…' on a narrow or piped console help nobody."""
    from rich.measure import Measurement

    needed = Measurement.get(console, console.options.update_width(1000), table).maximum
    width = console.width
    console.width = max(width, needed)  # print(width=...) cannot exceed the console's own width
    try:
        console.print(table)
    finally:
        console.width = width


def snapshot_line(snap: Snapshot) -> str:
    """The snapshot as one plain line, for CI logs."""
    parts = [f"{snap.status} on {snap.tier}", f"workers {snap.workers_up}/{snap.workers_wanted}"]
    if snap.progress is not None:
        p = snap.progress
        parts.append(f"{p.key} {p.value:g}" + (f"/{p.total:g}" if p.total is not None else ""))
    if snap.last_checkpoint_t is not None:
        parts.append(f"checkpoint {snap.last_checkpoint_step} ({ago(snap.now - snap.last_checkpoint_t)})")
    parts.append(f"spend {money(snap.spend)} vs {money(snap.on_demand_spend)} on-demand")
    return f"[dim]{duration(snap.elapsed_s):>7}[/]  " + " · ".join(parts)
