"""A run's timeline as a picture: tier lanes, faults, notices, checkpoints and progress over time.

Drawn for `spotfallback report` and the demo from the ledger alone, with matplotlib's Agg
canvas directly (no pyplot state, no display). matplotlib, the heaviest library spotfallback
uses, is loaded only when a picture is drawn.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Literal

from spotfallback.accounting import summarize
from spotfallback.config import ON_DEMAND, SPOT, Ladder
from spotfallback.events import CheckpointCommitted, LedgerRecord, PreemptionNotice
from spotfallback.store.ledger_snapshot import LedgerSnapshot, digest_records
from spotfallback.view.intervals import run_intervals
from spotfallback.view.text import money

_MARKET_COLOURS = {SPOT: ("#2a9d8f", "#52b69a", "#76c893", "#99d98c"), ON_DEMAND: ("#e76f51", "#f4a261"),
                   "reserved": ("#6d597a", "#b56576")}
_OTHER_COLOURS = ("#577590", "#4d908e", "#43aa8b")
_MARKS = {
    "preempted": ("v", "#d62828", "preemption"),
    "node_failed": ("X", "black", "node lost"),
    "application_failed": ("D", "#7b2cbf", "training error"),
    "capacity_timed_out": ("s", "#6c757d", "capacity timeout"),
}
# Informational records: (marker, colour, legend label), drawn above the lane they happened on.
_NOTICE = ("$!$", "#f77f00", "preemption notice")
_JIT = {
    "reported": ("d", "#2b9348", "just-in-time checkpoint"),
    "missed": ("x", "#f77f00", "just-in-time checkpoint missed"),
}
_CLIMB_COLOUR = "#2b9348"
# Past this many faults and notices, the lines across the lanes at each would hide the lanes.
MAX_FAULT_LINES = 200
_RESIZE = ("H", "#3a86ff", "resize (gang size)")


def _tier_colours(ladder: Ladder) -> list[str]:
    used: dict[str, int] = {}
    colours = []
    for t in ladder.tiers:
        palette = _MARKET_COLOURS.get(t.market, _OTHER_COLOURS)
        i = used.get(t.market, 0)
        used[t.market] = i + 1
        colours.append(palette[i % len(palette)])
    return colours


def timeline_png(
    ladder: Ladder,
    records: Sequence[LedgerRecord],
    *,
    title: str = "",
    now: float | None = None,
    dpi: int = 110,
    base: LedgerSnapshot | None = None,
) -> bytes:
    """The run's timeline as PNG bytes: tier bands, faults, checkpoints, progress.

    ``records`` are those after ``base`` (the ledger's stored snapshot) when it is given: bands,
    marks and intervals come from its carry and digest, exactly as from every record; ticks and
    the progress line from its sample of the checkpoints and every checkpoint after it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    summary = summarize(ladder, records, now=now, start=base.carry if base is not None else None)
    # (ordinal, checkpoint) of each one drawn: every one, or the snapshot's sample and every one after it.
    ticks = [(n, r) for n, r in enumerate((r for r in records if isinstance(r.event, CheckpointCommitted)), 1)]
    if base is not None:
        ticks = [*base.sample, *((base.counted + n, r) for n, r in ticks)]
    records = digest_records(base, records)
    if not records:
        raise ValueError("the run has no ledger events yet; nothing to draw")
    t0 = min(records[0].t, summary.started_at if summary.started_at is not None else math.inf)
    end = summary.ended_at if summary.ended_at is not None else records[-1].t
    span = max(end - t0, 1e-6)
    unit, scale = ("s", 1.0) if span < 600 else ("min", 60.0) if span < 3 * 3600 else ("h", 3600.0)

    def x(t: float) -> float:
        return (t - t0) / scale

    colours = _tier_colours(ladder)
    n = len(ladder)
    fig = Figure(figsize=(11, 2.6 + 0.55 * n + 2.2), dpi=dpi)
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(2, 1, height_ratios=[0.9 + 0.55 * n, 2.2], hspace=0.08)
    ax = fig.add_subplot(gs[0])
    axp = fig.add_subplot(gs[1], sharex=ax)

    # Tier lanes: running as solid bands, waiting as faint hatched bands, redone work hatched red,
    # the hold after a just-in-time checkpoint dotted grey (billed, but nothing is redone).
    # Each kind of band, mark and line is one artist per lane or colour, not one per event: matplotlib
    # rescales over every artist as each is added, so a long run's thousands of faults would take minutes.
    waiting, redone, held = run_intervals(records, end)
    bands: dict[tuple[Any, ...], list[tuple[float, float]]] = defaultdict(list)
    for tier, start, stop in summary.segments:
        bands[(tier, 0.32, (("color", colours[tier]), ("zorder", 2)))].append((x(start), max(x(stop) - x(start), 1e-9)))
    style: tuple[tuple[str, Any], ...]
    for tier, start, stop in waiting:
        style = (("facecolor", "none"), ("edgecolor", colours[tier]), ("hatch", "///"), ("linewidth", 0.0), ("alpha", 0.7), ("zorder", 1))
        bands[(tier, 0.18, style)].append((x(start), x(stop) - x(start)))
    for tier, start, stop in redone:
        style = (("facecolor", "none"), ("edgecolor", "#d62828"), ("hatch", "xxx"), ("linewidth", 0.0), ("zorder", 3))
        bands[(tier, 0.32, style)].append((x(start), x(stop) - x(start)))
    for tier, start, stop in held:
        style = (("facecolor", "#e9ecef"), ("edgecolor", "#6c757d"), ("hatch", "..."), ("linewidth", 0.0), ("zorder", 3))
        bands[(tier, 0.32, style)].append((x(start), x(stop) - x(start)))
    for (tier, half, style), ranges in bands.items():
        ax.broken_barh(ranges, (tier - half, 2 * half), **dict(style))
    ck_t = [x(r.t) for _, r in ticks]
    ck_tier = [r.tier for _, r in ticks]
    ax.scatter(ck_t, ck_tier, marker="|", s=260, color="black", linewidths=1.6, zorder=4)
    used_marks: set[str] = set()
    extra: dict[str, tuple[str, str, str]] = {}  # legend entries of the informational marks used
    points: dict[tuple[Any, ...], list[tuple[float, float]]] = defaultdict(list)  # (marker style) -> (x, y)
    lines: dict[tuple[str, Literal[':', '--'], float, float, bool], list[float]] = defaultdict(list)  # (colour, style, width, alpha, both axes) -> x
    for rec in records:
        decision = rec.decision or {}
        action = decision.get("action")
        kind = rec.event.kind
        if isinstance(rec.event, PreemptionNotice) and not rec.event.counts:
            continue
        if kind == "preemption_notice":
            symbol, colour, label = extra.setdefault("notice", _NOTICE)
            points[(symbol, 110, colour, None, 0.0, 5, False)].append((x(rec.t), rec.tier - 0.48))
            lines[(colour, ":", 1.0, 0.9, False)].append(x(rec.t))
        elif kind == "jit_checkpoint" and getattr(rec.event, "outcome", "") in _JIT:
            outcome = rec.event.outcome  # type: ignore[attr-defined]
            symbol, colour, label = extra.setdefault(f"jit-{outcome}", _JIT[outcome])
            points[(symbol, 80, colour, "black", 0.6, 6, True)].append((x(rec.t), rec.tier))
        elif kind == "capacity_observed" and action == "climb_back":
            to = int(decision.get("to_tier", rec.tier - 1))
            extra.setdefault("climb", ("", _CLIMB_COLOUR, "climb back"))
            ax.annotate("", xy=(x(rec.t), to + 0.34), xytext=(x(rec.t), rec.tier - 0.34),
                        arrowprops={"arrowstyle": "->", "color": _CLIMB_COLOUR, "lw": 1.8}, zorder=6)
        elif kind == "capacity_observed" and action == "resize":
            symbol, colour, label = extra.setdefault("resize", _RESIZE)
            points[(symbol, 80, colour, None, 0.0, 5, False)].append((x(rec.t), rec.tier - 0.48))
            ax.annotate(f"{int(decision.get('num_workers', 0))}w", (x(rec.t), rec.tier - 0.48), xytext=(5, -3),
                        textcoords="offset points", fontsize=7, color=colour, zorder=6)
        mark = _MARKS.get(kind)
        if mark is None:
            continue
        used_marks.add(kind)
        symbol, colour, _ = mark
        points[(symbol, 90, colour, None, 0.0, 5, False)].append((x(rec.t), rec.tier - 0.48))
        lines[(colour, "--", 0.9, 0.7, True)].append(x(rec.t))
        if action == "switch_tier":
            to = int(decision.get("to_tier", rec.tier + 1))
            extra.setdefault("switch", ("", "#333333", "fall back"))
            ax.annotate("", xy=(x(rec.t), to - 0.34), xytext=(x(rec.t), rec.tier + 0.34),
                        arrowprops={"arrowstyle": "->", "color": "#333333", "lw": 1.4}, zorder=6)
    for rec in records:
        if rec.event.kind == "finished":
            points[("*", 220, "gold", "black", 1.0, 6, True)].append((x(rec.t), rec.tier))
    for (symbol, size, colour, edge, width, z, clip), xy in points.items():
        px, py = zip(*xy, strict=True)
        ax.scatter(px, py, marker=symbol, s=size, color=colour, edgecolors=edge, linewidths=width, zorder=z, clip_on=clip)
    # A line across the lanes at each fault and notice, while few enough to read; past that they
    # would cover the lanes (the marks above the lanes stay).
    if sum(len(v) for v in lines.values()) <= MAX_FAULT_LINES:
        for (colour, dash, width, alpha, both), at in lines.items():
            for a in (ax, axp) if both else (ax,):
                a.vlines(at, 0, 1, transform=a.get_xaxis_transform(), colors=colour, linestyles=dash,
                         linewidth=width, alpha=alpha, zorder=0)
    ax.set_yticks(range(n), [f"{t.name}\n{t.market}, {money(t.price_per_hour())}/h".replace("$", r"\$")
                             for t in ladder.tiers])
    ax.set_ylim(n - 0.4, -0.75)
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(axis="x", labelbottom=False)

    # Progress: the committed step (or checkpoint count) over time.
    steps = [(x(r.t), r.event.step) for _, r in ticks if isinstance(r.event, CheckpointCommitted) and r.event.step is not None]
    if steps:
        xs, ys = (list(v) for v in zip(*steps, strict=True))
        axp.plot([0.0, *xs], [0, *ys], drawstyle="steps-post", color="#264653", linewidth=1.8, zorder=3)
        axp.plot(xs, ys, "o", color="#264653", markersize=3.5, zorder=4)
        axp.set_ylabel("committed step")
    else:
        xs = [x(r.t) for _, r in ticks]
        axp.plot([0.0, *xs], [0, *(n for n, _ in ticks)], drawstyle="steps-post", color="#264653", linewidth=1.8)
        axp.set_ylabel("checkpoints")
    if redone:
        axp.broken_barh([(x(start), x(stop) - x(start)) for _, start, stop in redone], (0, 1),
                        transform=axp.get_xaxis_transform(), color="#d62828", alpha=0.12, zorder=0)
    axp.set_xlabel(f"time since the run started ({unit})")
    axp.set_xlim(-span / scale * 0.01, span / scale * 1.02)
    axp.set_ylim(bottom=0)
    axp.grid(alpha=0.3)

    handles: list[Any] = [Patch(color=colours[i], label=f"running on {t.name}") for i, t in enumerate(ladder.tiers)]
    handles.append(Patch(facecolor="none", edgecolor="#555555", hatch="///", label="waiting for workers"))
    if redone:
        handles.append(Patch(facecolor="none", edgecolor="#d62828", hatch="xxx", label="work redone"))
    if held:
        handles.append(Patch(facecolor="#e9ecef", edgecolor="#6c757d", hatch="...", label="held after a JIT checkpoint"))
    handles.append(Line2D([], [], marker="|", linestyle="none", color="black", markersize=12, label="checkpoint"))
    for kind in _MARKS:
        if kind in used_marks:
            symbol, colour, label = _MARKS[kind]
            handles.append(Line2D([], [], marker=symbol, linestyle="none", color=colour, markersize=8, label=label))
    for key in ("notice", "jit-reported", "jit-missed", "resize"):
        if key in extra:
            symbol, colour, label = extra[key]
            handles.append(Line2D([], [], marker=symbol, linestyle="none", color=colour, markersize=8, label=label))
    for key in ("switch", "climb"):
        if key in extra:
            _, colour, label = extra[key]
            handles.append(Line2D([], [], marker=r"$\rightarrow$" if key == "switch" else r"$\uparrow$",
                                  linestyle="none", color=colour, markersize=10, label=label))
    handles.append(Line2D([], [], marker="*", linestyle="none", color="gold", markeredgecolor="black", markersize=12, label="finished"))
    ncol = min(len(handles), 6)
    legend_rows = math.ceil(len(handles) / ncol)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    saved = 1 - summary.spend / summary.on_demand_spend if summary.on_demand_spend > 0 else None
    subtitle = f"{summary.status}; spend {money(summary.spend)} vs {money(summary.on_demand_spend)} all on-demand"
    if saved is not None:
        subtitle += f" ({saved:+.0%} saved)"
    text = f"{title}\n{subtitle}" if title else subtitle
    fig.suptitle(text.replace("$", r"\$"), fontsize=10)  # a literal dollar, not mathtext
    fig.subplots_adjust(left=0.15, right=0.98, top=0.9, bottom=0.11 + 0.035 * legend_rows)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
