"""A finished (or running) run explained: what it cost, tier by tier, and what the formulas predicted.

The cost table charges every hour to the tier it ran on (``accounting.summarize``) and puts
the seed's closed form (``costmodel.seed_closed_form``) beside it, fed the run's own T, M,
dt and alpha, so the reader sees how far the back-of-the-envelope formula is from the bill;
where the ladder came from ``spotfallback plan``, the plan's prediction (kept in the run's
metadata) is set beside the outcome too. The same report renders as a rich table, plain
lines, JSON, or one HTML page around the timeline picture (``view/timeline.py``).
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from spotfallback.accounting import RunSummary, summarize
from spotfallback.config import SPOT, Ladder, PlanPrediction
from spotfallback.events import LedgerRecord, PreemptionNotice
from spotfallback.sim.costmodel import SeedEstimate, seed_closed_form
from spotfallback.store.ledger_snapshot import LedgerSnapshot, digest_records
from spotfallback.view.intervals import (
    INTERRUPTIONS,
    announced_evictions,
    mean_or_none,
    run_intervals,
)
from spotfallback.view.text import duration, money


@dataclass(frozen=True)
class TierCost:
    """One tier's line of the cost table; ``spend = running_h * price_per_hour`` exactly."""

    name: str
    market: str
    num_workers: int
    price_per_hour: float
    running_h: float
    waiting_h: float
    redone_h: float  # lost time that was work done again after a restart
    worker_h: float  # running hours x workers placed; differs from running_h x num_workers on elastic tiers
    attempts: int
    preemptions: int
    failures: int
    app_errors: int
    capacity_timeouts: int
    spend: float
    held_h: float = 0.0  # lost time spent holding after a just-in-time checkpoint: billed, nothing redone
    where: str | None = None  # the tier's cluster and region, in a ladder across clusters

    @property
    def market_where(self) -> str:
        return self.market if self.where is None else f"{self.market} on {self.where}"


@dataclass(frozen=True)
class SeedCheck:
    """The seed's formula fed this run's measured inputs."""

    work_h: float  # T: useful work, hours
    interruptions: int  # M: restarts (preemptions, node failures, training errors, climbs, resizes)
    overhead_h: float  # dt = (wall - T) / M: hours each interruption added
    alpha: float  # share of the useful work done on spot
    on_demand_price: float  # C_o per hour of the gang
    discount: float  # d = 1 - spot price / on-demand price
    estimate: SeedEstimate

    @property
    def predicted(self) -> float:
        return self.estimate.cost_new


@dataclass(frozen=True)
class PlanCheck:
    """The plan's prediction beside the outcome; ``final`` is False while the run has not finished,
    ``failed`` True once it gave up (its figures are then its outcome, though no work finished)."""

    predicted_spend: float
    predicted_wall_h: float
    p90_wall_h: float | None
    deadline_h: float | None
    on_time_probability: float | None
    made_with: str
    measured_spend: float
    measured_wall_h: float
    final: bool
    failed: bool = False

    @property
    def spend_error(self) -> float | None:
        """(measured - predicted) / predicted spend; None when nothing was predicted."""
        return self.measured_spend / self.predicted_spend - 1 if self.predicted_spend > 0 else None

    @property
    def wall_error(self) -> float:
        return self.measured_wall_h / self.predicted_wall_h - 1

    @property
    def deadline_met(self) -> bool | None:
        """Whether the run met the plan's deadline: None without a deadline or while a running run
        can still meet it; False once its wall time is past it or it failed (it will never finish on time)."""
        if self.deadline_h is None:
            return None
        if self.final:
            return self.measured_wall_h <= self.deadline_h
        if self.failed or self.measured_wall_h > self.deadline_h:
            return False
        return None


@dataclass(frozen=True)
class CostReport:
    run: str
    status: str
    tiers: list[TierCost]
    spend: float
    on_demand_spend: float
    useful_h: float
    running_h: float
    redone_h: float
    held_h: float
    waiting_h: float
    wall_h: float
    interruptions: int
    tier_switches: int
    checkpoints: int
    alpha: float
    seed: SeedCheck | None
    give_up_reason: str | None = None
    climbs: int = 0
    resizes: int = 0
    notices: int = 0  # preemption notices recorded (spotfallback notice-agent, the local injector)
    jit_checkpoints: int = 0  # just-in-time checkpoints reported before the node went
    jit_missed: int = 0  # ... and those that did not make it (the notice was shorter than the write)
    plan: PlanCheck | None = None
    evictions_moved: int = 0  # announced evictions whose gang left before its node went
    held_per_eviction_s: float | None = None  # mean, checkpoint reported -> attempt ended
    idle_per_eviction_s: float | None = None  # mean, checkpoint reported -> next gang started

    @property
    def savings(self) -> float | None:
        """Fraction saved against all-on-demand for the same useful work (None before any work)."""
        return 1.0 - self.spend / self.on_demand_spend if self.on_demand_spend > 0 else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["savings"] = self.savings
        if self.seed is not None:
            data["seed"]["predicted"] = self.seed.predicted
        if self.plan is not None:
            data["plan"].update(spend_error=self.plan.spend_error, wall_error=self.plan.wall_error,
                                deadline_met=self.plan.deadline_met)
        return data


def _discount(ladder: Ladder, summary: RunSummary) -> float:
    """d = 1 - (spot price / on-demand price), spot price weighted by the useful work on each spot tier."""
    od = summary.baseline_price_per_hour
    spot = [(t.running_s - t.lost_s, t.price_per_hour) for t in summary.tiers if t.market == SPOT]
    weight = sum(max(0.0, w) for w, _ in spot)
    if od <= 0 or not spot:
        return 0.0
    price = sum(max(0.0, w) * p for w, p in spot) / weight if weight > 0 else spot[0][1]
    return min(1.0, max(0.0, 1.0 - price / od))


def _jit(records: Sequence[LedgerRecord], outcome: str) -> int:
    return sum(1 for r in records if r.event.kind == "jit_checkpoint" and getattr(r.event, "outcome", "") == outcome)


def cost_report(
    ladder: Ladder,
    records: Sequence[LedgerRecord],
    *,
    run: str = "",
    now: float | None = None,
    plan: PlanPrediction | None = None,
    base: LedgerSnapshot | None = None,
    driver_live: bool = True,
) -> CostReport:
    """The run's cost table, the seed formula's prediction for the same inputs and, given the
    plan the run was started with, that plan's prediction beside the outcome.

    ``records`` are those after ``base`` (the ledger's stored snapshot) when it is given: the
    accounting starts from its carry and the intervals replay its digest, the same figures as
    from every record.

    ``driver_live`` False (no live driver lease) makes a run that is neither finished nor failed
    ``stalled``, as ``status`` calls it: its driver, and with it its workers, are gone.
    """
    summary = summarize(ladder, records, now=now, start=base.carry if base is not None else None)
    records = digest_records(base, records)
    held_s = [0.0] * len(ladder)
    if records:
        for tier, start, stop in run_intervals(records, summary.ended_at or records[-1].t)[2]:
            held_s[tier] += stop - start
    tiers = [
        TierCost(
            name=u.name, market=u.market, num_workers=t.num_workers, price_per_hour=u.price_per_hour,
            running_h=u.running_s / 3600, waiting_h=u.waiting_s / 3600, redone_h=max(0.0, u.lost_s - h) / 3600,
            held_h=h / 3600, worker_h=u.worker_s / 3600, attempts=u.attempts, preemptions=u.preemptions, failures=u.failures, app_errors=u.app_errors,
            capacity_timeouts=u.capacity_timeouts, spend=u.spend, where=t.where,
        )
        for u, t, h in zip(summary.tiers, ladder.tiers, held_s, strict=True)
    ]
    interruptions = sum(1 for r in records if r.event.kind in INTERRUPTIONS)
    evictions = announced_evictions(records)
    switches = sum(1 for r in records if r.decision and r.decision.get("action") == "switch_tier")
    climbs, resizes = len(summary.climbs), len(summary.resizes)
    restarts = interruptions + climbs + resizes  # each one stops the gang and restarts it from a checkpoint
    useful_h = summary.useful_s / 3600
    wall_h = summary.wall_s / 3600
    seed = None
    if useful_h > 0:
        overhead_h = max(0.0, wall_h - useful_h) / restarts if restarts else 0.0
        discount = _discount(ladder, summary)
        od_price = summary.baseline_price_per_hour
        seed = SeedCheck(
            work_h=useful_h, interruptions=restarts, overhead_h=overhead_h, alpha=summary.spot_fraction,
            on_demand_price=od_price, discount=discount,
            estimate=seed_closed_form(useful_h, summary.spot_fraction, restarts, overhead_h, od_price, discount),
        )
    plan_check = None
    if plan is not None:
        plan_check = PlanCheck(
            predicted_spend=plan.spend, predicted_wall_h=plan.wall_h, p90_wall_h=plan.p90_wall_h,
            deadline_h=plan.deadline_h, on_time_probability=plan.on_time_probability, made_with=plan.made_with,
            measured_spend=summary.spend, measured_wall_h=wall_h, final=summary.status == "finished",
            failed=summary.status == "failed",
        )
    status = summary.status
    if status == "running" and not driver_live:
        status = "stalled"
    return CostReport(
        run=run, status=status, tiers=tiers, spend=summary.spend, on_demand_spend=summary.on_demand_spend,
        useful_h=useful_h, running_h=summary.running_s / 3600, redone_h=sum(t.redone_h for t in tiers),
        held_h=sum(t.held_h for t in tiers),
        waiting_h=sum(t.waiting_h for t in tiers), wall_h=wall_h, interruptions=interruptions,
        tier_switches=switches, checkpoints=summary.checkpoint_count, alpha=summary.spot_fraction, seed=seed,
        give_up_reason=summary.give_up_reason, climbs=climbs, resizes=resizes,
        notices=sum(1 for r in records if isinstance(r.event, PreemptionNotice) and r.event.counts),
        jit_checkpoints=_jit(records, "reported"), jit_missed=_jit(records, "missed"), plan=plan_check,
        evictions_moved=sum(1 for e in evictions if e.moved),
        held_per_eviction_s=mean_or_none([e.held_s for e in evictions]),
        idle_per_eviction_s=mean_or_none([e.idle_s for e in evictions if e.idle_s is not None]),
    )


def hours(h: float) -> str:
    """Hours with enough digits that hours x price reproduces the spend to the cent."""
    return f"{h:.4f} h" if h < 100 else f"{h:,.2f} h"


def cost_table(report: CostReport) -> Table:
    """Per-tier hours and spend, with totals; every spend is its running hours times its price."""
    table = Table(title=f"Cost of {report.run or 'the run'} ({report.status})", title_justify="left")
    for col in ("tier", "market", "price", "running", "spend", "waiting", "redone", "attempts", "preempted",
                "failed", "errors", "timeouts"):
        table.add_column(col, justify="left" if col in ("tier", "market") else "right", no_wrap=True)
    for t in report.tiers:
        table.add_row(
            t.name, t.market_where, f"{money(t.price_per_hour)}/h", hours(t.running_h), money(t.spend),
            hours(t.waiting_h), hours(t.redone_h), str(t.attempts), str(t.preemptions), str(t.failures),
            str(t.app_errors), str(t.capacity_timeouts),
        )
    table.add_section()
    table.add_row("total", "", "", hours(report.running_h), money(report.spend), hours(report.waiting_h),
                  hours(report.redone_h), str(sum(t.attempts for t in report.tiers)),
                  str(sum(t.preemptions for t in report.tiers)), str(sum(t.failures for t in report.tiers)),
                  str(sum(t.app_errors for t in report.tiers)), str(sum(t.capacity_timeouts for t in report.tiers)))
    return table


def plan_rows(plan: PlanCheck) -> list[tuple[str, str, str, str]]:
    """(quantity, planned, measured, difference) rows: spend and wall time, then the deadline."""
    so_far = "" if plan.final or plan.failed else " so far"
    spend_diff = f"{plan.spend_error:+.1%}" if plan.spend_error is not None else "-"
    rows = [
        ("spend", money(plan.predicted_spend), money(plan.measured_spend) + so_far, spend_diff),
        ("wall time", duration(plan.predicted_wall_h * 3600), duration(plan.measured_wall_h * 3600) + so_far,
         f"{plan.wall_error:+.1%}"),
    ]
    if plan.p90_wall_h is not None:
        within = plan.measured_wall_h <= plan.p90_wall_h
        rows.append(("wall time, p90", duration(plan.p90_wall_h * 3600), duration(plan.measured_wall_h * 3600) + so_far,
                     "within" if within else "beyond"))
    if plan.deadline_h is not None:
        met = plan.deadline_met
        chance = f" (planned on time: {plan.on_time_probability:.0%})" if plan.on_time_probability is not None else ""
        rows.append(("deadline", duration(plan.deadline_h * 3600) + chance, duration(plan.measured_wall_h * 3600) + so_far,
                     "-" if met is None else "met" if met else "missed"))
    return rows


def plan_table(report: CostReport) -> Table | None:
    """The plan's prediction beside the outcome, or None when the run was not planned."""
    if report.plan is None:
        return None
    made_with = f" ({report.plan.made_with})" if report.plan.made_with else ""
    table = Table(title=f"Plan vs outcome{made_with}", title_justify="left")
    for col in ("", "planned", "measured", "difference"):
        table.add_column(col, justify="left" if not col else "right", no_wrap=True)
    for row in plan_rows(report.plan):
        table.add_row(*row)
    return table


def summary_lines(report: CostReport) -> list[str]:
    """The comparison lines under the table: savings, overhead, alpha, the seed's prediction."""
    moves = ""
    if report.climbs or report.resizes:
        moves = f", {report.climbs} climbs back, {report.resizes} resizes"
    lines = [
        f"wall time {duration(report.wall_h * 3600)}; billed {hours(report.running_h)}, of which useful work "
        f"{hours(report.useful_h)}, redone work {hours(report.redone_h)}"
        + (f" and held after just-in-time checkpoints {hours(report.held_h)}" if report.held_h > 0 else "")
        + f"; waiting for capacity (not billed) "
        f"{hours(report.waiting_h)}; {report.interruptions} interruptions, {report.tier_switches} tier switches"
        f"{moves}, {report.checkpoints} checkpoints",
    ]
    for t in report.tiers:
        if abs(t.worker_h - t.running_h * t.num_workers) > 1e-9 and t.num_workers:
            per_worker = t.price_per_hour / t.num_workers
            lines.append(f"{t.name} ran with a varying gang: {hours(t.worker_h).replace(' h', ' worker-h')} x "
                         f"{money(per_worker)}/worker-h = {money(t.spend)}")
    if report.notices or report.jit_checkpoints or report.jit_missed:
        lines.append(f"{report.notices} preemption notices; {report.jit_checkpoints} just-in-time checkpoints "
                     f"reported before the node went, {report.jit_missed} missed")
    if report.held_per_eviction_s is not None:
        idle = report.idle_per_eviction_s
        lines.append(f"per announced eviction: held {report.held_per_eviction_s:.1f} s after the checkpoint, "
                     f"idle {'-' if idle is None else f'{idle:.1f} s'} until the next gang started; "
                     f"{report.evictions_moved} of {report.jit_checkpoints} moved before the node went")
    if report.savings is not None:
        lines.append(
            f"spend {money(report.spend)} vs all on-demand {money(report.on_demand_spend)} for the same useful work: "
            f"{report.savings:+.1%} saved ({money(report.on_demand_spend - report.spend)})"
        )
    lines.append(f"alpha (share of the useful work done on spot) {report.alpha:.3f}")
    if report.seed is not None:
        s = report.seed
        # As the plan's line: the outcome against the prediction.
        diff = report.spend / s.predicted - 1 if s.predicted > 0 else math.nan
        lines.append(
            f"seed formula C_new = (T + M*dt) * C_o * (1 - d*alpha) with T = {hours(s.work_h)}, M = {s.interruptions}, "
            f"dt = {hours(s.overhead_h)}, alpha = {s.alpha:.3f}, C_o = {money(s.on_demand_price)}/h, d = {s.discount:.3f}: "
            f"predicts {money(s.predicted)}; measured {money(report.spend)}"
            + (f" ({diff:+.1%} against the prediction)" if math.isfinite(diff) else "")
        )
    if report.plan is not None:
        p = report.plan
        lines.append(
            f"plan: {money(p.predicted_spend)} in {duration(p.predicted_wall_h * 3600)}; "
            f"{'outcome' if p.final else 'so far'}: {money(p.measured_spend)} in {duration(p.measured_wall_h * 3600)}"
            + (f" ({p.spend_error:+.1%} spend)" if p.spend_error is not None and p.final else "")
            + ("" if p.deadline_met is None else f"; deadline {'met' if p.deadline_met else 'missed'}")
        )
    if report.give_up_reason:
        lines.append(f"gave up: {report.give_up_reason}")
    return lines


def html_report(report: CostReport, png: bytes, events: Sequence[str] = ()) -> str:
    """One self-contained HTML page: the picture inline (base64), the cost table, the lines, the events."""
    e = html.escape
    head = ("tier", "market", "price/h", "running", "spend", "waiting", "redone", "attempts", "preempted",
            "failed", "errors", "timeouts")
    rows = []
    for t in report.tiers:
        cells = (t.name, t.market_where, money(t.price_per_hour), hours(t.running_h), money(t.spend), hours(t.waiting_h),
                 hours(t.redone_h), t.attempts, t.preemptions, t.failures, t.app_errors, t.capacity_timeouts)
        rows.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
    total = ("total", "", "", hours(report.running_h), money(report.spend), hours(report.waiting_h),
             hours(report.redone_h), "", "", "", "", "")
    rows.append("<tr class='total'>" + "".join(f"<td>{e(str(c))}</td>" for c in total) + "</tr>")
    lines = "".join(f"<li>{e(line)}</li>" for line in summary_lines(report))
    plan = ""
    if report.plan is not None:
        made_with = f" ({e(report.plan.made_with)})" if report.plan.made_with else ""
        plan_cells = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in plan_rows(report.plan))
        plan = (f"<h2>Plan vs outcome{made_with}</h2><table class='plan'><thead><tr><th></th><th>planned</th>"
                f"<th>measured</th><th>difference</th></tr></thead><tbody>{plan_cells}</tbody></table>")
    event_items = "".join(f"<li>{e(line)}</li>" for line in events)
    img = base64.b64encode(png).decode()
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>spotfallback report: {e(report.run)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }}
th:nth-child(-n+2), td:nth-child(-n+2) {{ text-align: left; }}
table.plan td:nth-child(2), table.plan th:nth-child(2) {{ text-align: right; }}
tr.total td {{ font-weight: bold; border-top: 2px solid #999; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{e(report.run)}: {e(report.status)}</h1>
<img alt="timeline of the run: tiers, faults, checkpoints, progress" src="data:image/png;base64,{img}">
<h2>Cost</h2>
<table><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead><tbody>{"".join(rows)}</tbody></table>
<ul>{lines}</ul>
{plan}
{f"<h2>Events</h2><ol>{event_items}</ol>" if events else ""}
</body></html>
"""
