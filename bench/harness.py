"""The pure half of the benchmark harness: statistics, figures, the machine, the results page.

Nothing here starts Ray: every figure on ``docs/benchmarks.md`` is computed by a
measurement's ``figures(rows)`` from the raw rows the harness recorded (kept in
``docs/benchmarks.json``), so ``python -m bench --render`` rebuilds the page from the JSON
and no number is ever typed in by hand.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stat:
    """Median and spread (min–max) of repeated measurements."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Stat:
        xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        if not xs:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    def fmt(self, digits: int = 2) -> tuple[str, str]:
        """(median, spread) as text; the spread is empty for one repetition."""
        if self.n == 0:
            return "n/a", ""
        med = f"{self.median:,.{digits}f}"
        return med, ("" if self.n == 1 else f"{self.lo:,.{digits}f}–{self.hi:,.{digits}f}")


@dataclass(frozen=True)
class Target:
    """What the issue asks of a figure: ``value <= max`` or ``|value| <= abs_max`` (None: report only)."""

    text: str
    max: float | None = None
    abs_max: float | None = None
    min: float | None = None

    def met(self, value: float) -> bool | None:
        if not math.isfinite(value):
            return None
        if self.max is not None:
            return value <= self.max + 1e-12
        if self.abs_max is not None:
            return abs(value) <= self.abs_max + 1e-12
        if self.min is not None:
            return value >= self.min - 1e-12
        return None


@dataclass(frozen=True)
class Figure:
    """One line of the results table."""

    item: int  # the figure's number on docs/benchmarks.md (1-13)
    name: str
    unit: str
    target: Target
    stat: Stat
    digits: int = 2
    note: str = ""
    worst: bool = False  # judge the worst value (every case must meet it), not the median

    @property
    def met(self) -> bool | None:
        """Judged on the median (the spread is shown beside it), or on the worst case."""
        if not self.stat.n:
            return None
        if not self.worst:
            return self.target.met(self.stat.median)
        return bool(self.target.met(self.stat.lo)) and bool(self.target.met(self.stat.hi))


@dataclass
class Measurement:
    """A named measurement: ``run`` records raw rows on the cluster, ``figures`` turns rows into figures.

    ``requires``: measurements whose rows ``run`` reads (the predictor calibrates its model
    from them), run first even when not asked for. ``cluster``: whether it needs the local
    Ray cluster (the simulator benchmark does not).
    """

    name: str
    items: tuple[int, ...]
    title: str
    run: Callable[[Any], list[dict[str, Any]]]
    figures: Callable[[list[dict[str, Any]]], list[Figure]]
    describe: Callable[[list[dict[str, Any]]], str]
    requires: tuple[str, ...] = ()
    cluster: bool = True
    explain: Callable[[list[dict[str, Any]]], str] | None = None  # why a missed target is missed, from the rows


def ratio_pairs(rows: Sequence[Mapping[str, Any]], key: str, variant: str, baseline: str, value: str) -> list[float]:
    """Ratios variant/baseline of ``value`` within each repetition ``key`` (runs alternate, so pairs share load)."""
    by_rep: dict[Any, dict[str, float]] = {}
    for r in rows:
        if r.get(value) is not None:
            by_rep.setdefault(r[key], {})[r["variant"]] = float(r[value])
    return [d[variant] / d[baseline] for d in by_rep.values() if variant in d and baseline in d and d[baseline] > 0]


def values(rows: Sequence[Mapping[str, Any]], value: str, **match: Any) -> list[float]:
    return [float(r[value]) for r in rows if r.get(value) is not None and all(r.get(k) == v for k, v in match.items())]


# ----------------------------------------------------------------------------- machine


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, object]:
    """The fastest of ``repeat`` timed calls and the last result: the least disturbed by other load."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, Any]:
    """Where the figures were measured: they mean little without it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 0
    versions = {}
    for pkg in ("ray", "torch", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {
        "cpu": cpu_model(),
        "cores": cores,
        "python": platform.python_version(),
        **versions,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": round(os.getloadavg()[0], 2),
    }


# ----------------------------------------------------------------------------- the page


@dataclass
class Results:
    """Everything one harness run recorded; ``docs/benchmarks.json`` is this, as JSON."""

    command: str
    machine: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each measurement
    profiles: dict[str, str] = field(default_factory=dict)  # measurement -> summarised profile
    notes: dict[str, str] = field(default_factory=dict)  # measurement -> why a target is missed
    errors: dict[str, str] = field(default_factory=dict)  # measurement -> what went wrong
    total_s: float = 0.0
    quick: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Results:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def figure_rows(registry: Mapping[str, Measurement], results: Results) -> list[tuple[Measurement, Figure]]:
    out = []
    for name, m in registry.items():
        rows = results.rows.get(name)
        if rows:
            out.extend((m, f) for f in m.figures(rows))
    return sorted(out, key=lambda mf: mf[1].item)


def _harness_cluster(machine: Mapping[str, Any]) -> str:
    return ("on one local cluster (a head without CPUs, three one-CPU spot nodes and two one-CPU on-demand nodes): "
            + ("its nodes started ahead of time (`spotfallback.local.LocalSpotCluster`)." if machine.get("cluster", "prestarted") == "prestarted"
               else "its nodes run by Ray's autoscaler v2, each node type kept at its count as a node pool is "
                    "(`spotfallback.local.autoscaling`; a preempted node is replaced by the autoscaler)."))


def render(registry: Mapping[str, Measurement], results: Results) -> str:
    """The results page: one table of every figure, then each measurement's method and raw runs."""
    mc = results.machine
    load_after = mc.get("load_after")
    lines = [
        "# Benchmarks: what spotfallback costs and saves, next to plain Ray Train",
        "",
        "Written by `python -m bench` from the raw runs in [benchmarks.json](benchmarks.json); do not edit by "
        "hand (`python -m bench --render` rebuilds this page from the JSON). Every ratio compares runs made "
        "in the same harness run, alternating the compared variants, "
        + (_harness_cluster(mc) if any(registry[n].cluster for n in results.rows if n in registry)
           else "each measurement on the set-up its section describes (none uses the harness's own cluster)."),
        "",
        f"- command: `{results.command}`" + (" (quick: fewer repetitions)" if results.quick else ""),
        f"- machine: {mc.get('cores')} cores, {mc.get('cpu')}; Python {mc.get('python')}, Ray {mc.get('ray')}, "
        f"torch {mc.get('torch')}, numpy {mc.get('numpy')}",
        f"- date: {mc.get('date')}; load average (1 min) before/after: {mc.get('load_before')}/"
        f"{load_after if load_after is not None else '?'}; harness wall time {results.total_s / 60:.1f} min",
        "- Ray settings: " + (", ".join(f"`{k}={v}`" for k, v in mc.get("ray_env", {}).items()) or "defaults")
        + " (the controller's poll paces each `ray.train.report`; Ray's default poll is 2 s)",
        "- the machine is shared with other work: compare ratios measured within one run, not absolute "
        "seconds across runs",
        "",
        "| # | figure | target | median | spread (min–max) | reps | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, f in figure_rows(registry, results):
        med, spread = f.stat.fmt(f.digits)
        unit = f" {f.unit}" if f.unit and med != "n/a" else ""
        met = {True: "yes", False: "**no**", None: "–"}[f.met]
        name = f.name + (f" ({f.note})" if f.note else "")
        lines.append(
            f"| {f.item} | {_cell(name)} | {_cell(f.target.text)} | {med}{unit} | {spread} | {f.stat.n} | {met} |"
        )
    missing = [n for n in registry if n not in results.rows]
    if missing:
        lines += ["", f"Not measured in this run: {', '.join(missing)}."]
    for name, err in results.errors.items():
        lines += ["", f"**{name} failed:** `{_cell(err)}`"]
    for name, m in registry.items():
        rows = results.rows.get(name)
        if not rows:
            continue
        secs = results.seconds.get(name)
        lines += ["", f"## {', '.join(map(str, m.items))}. {m.title}", ""]
        if secs is not None:
            lines += [f"_{len(rows)} rows in {secs:.0f} s._", ""]
        lines.append(m.describe(rows).rstrip())
        missed = [f for f in m.figures(rows) if f.met is False]
        if missed:
            lines += ["", "**Target missed:** " + "; ".join(f"{f.name} ({f.stat.median:.{f.digits}f} {f.unit}, target {f.target.text})" for f in missed) + "."]
            if m.explain is not None:
                lines += ["", m.explain(rows).rstrip()]
            if name in results.notes:
                lines += ["", results.notes[name].rstrip()]
        if name in results.profiles:
            lines += ["", "Profile:", "", "```", results.profiles[name].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def table(header: Sequence[str], body: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; floats get three significant decimals."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "n/a" if not math.isfinite(v) else f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return _cell(str(v))

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in body]
    return "\n".join(lines)
