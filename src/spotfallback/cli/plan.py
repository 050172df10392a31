"""`spotfallback plan`: price a job on spot with fallback before running it."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import typer
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.table import Table

from spotfallback.cli.common import (
    check_trace_counts,
    fail,
    one_line,
    output_problem,
    usage_error,
    write_output,
)
from spotfallback.config import (
    DEFAULT_CHECKPOINT_COST_S,
    DEFAULT_NOTICE_S,
    DEFAULT_PROVISIONING_DELAY_S,
    DEFAULT_RESTART_OVERHEAD_S,
    ClusterRef,
    JobConfig,
    Ladder,
    Tier,
    format_validation_error,
    shared_storage_error,
)
from spotfallback.errors import ConfigError, OptimumTooLargeError, TraceError, UsageError
from spotfallback.sim.costmodel import DEFAULT_DISCOUNT, runtime_flexibility_table
from spotfallback.sim.draws import run_offsets
from spotfallback.sim.job import MAX_HOURS
from spotfallback.sim.optimum import PendingOptima, start_optima
from spotfallback.sim.planner import Candidate, Plan, PlanRequest, load_process, plan
from spotfallback.sim.traces import NodeTrace, SpotTrace
from spotfallback.sim.world import Process, RateModel, as_counted, compile_process


def seed_table(discount: float = DEFAULT_DISCOUNT) -> Table:
    """The seed's runtime-flexibility table, recomputed, with its printed figures beside."""
    table = Table(title=f"Runtime flexibility before spot stops saving (discount d = {discount:g})")
    table.add_column("job on spot (alpha)", justify="right")
    table.add_column("break-even T_total/T", justify="right")
    table.add_column("runtime may grow by", justify="right")
    table.add_column("seed printed", justify="right")
    for row in runtime_flexibility_table(discount=discount):
        seed = "" if row.seed_claim_percent is None else f"{row.seed_claim_percent:g}% longer"
        if row.seed_is_right is False:
            seed += f" (wrong: that is the {row.ratio:.2f}x ratio)"
        table.add_row(f"{row.alpha:.0%}", f"{_ratio(row.ratio)}x", f"{row.percent_longer:.2f}% longer", seed)
    return table


def _ratio(r: float) -> str:
    """Three decimals, or four when that is exact (1/0.64 = 1.5625), as the issue lists them."""
    return f"{r:.4f}" if math.isclose(round(r, 4), r, rel_tol=0, abs_tol=1e-12) else f"{r:.3f}"


def _fmt_h(h: float) -> str:
    if not math.isfinite(h):
        return "inf"
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.2f} h"


# States the optimum's search of one `plan` may meet (``optimum_for``): about 10-40 s on one core.
# The 300 h, 8-worker job on us-west-2a_v100_1 needs 9 million; a 30 h job of an 8-node gang
# on the node trace, 650 million.
OPTIMUM_LIMIT = 12_000_000


def _money(x: float) -> str:
    """A spend for a table cell: cents do not matter beside thousands, and the column must fit."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:,.1f}"


def _cell(x: float, decimals: int) -> str:
    """A number for a table cell in at most ``decimals`` decimals, fewer as it grows (a run that
    never finishes shows 1000 h of wall and thousands of interruptions), so a row of them stays
    within 80 columns."""
    places = decimals if abs(x) < 10 else min(decimals, 2) if abs(x) < 100 else min(decimals, 1) if abs(x) < 1000 else 0
    return f"{x:.{places}f}"


def _fmt_timeout(s: float | None) -> str:
    return "none" if s is None else f"{s:g}"


def plan_optimum(p: Plan, spots: list[Process], more: Sequence[Process] = (), limit: int | None = None) -> float | None:
    """Mean hindsight-optimal spend over the plan's own trace starts; None without a deadline or with a rate model.

    The same start ticks as the simulated runs (``run_offsets``, per sample when ``more``
    traces of a single spot tier were planned on too), so every policy's mean spend divided by
    it says how much that policy leaves on the table on those replays. Its search may meet
    ``limit`` states in all (default ``OPTIMUM_LIMIT``; ``optimum_for``), or ``OptimumTooLargeError``.
    """
    with PlanOptimum.start(p.request, spots, more, limit, background=False) as pending:
        return pending.mean()


class PlanOptimum:
    """``plan_optimum``'s searches, started before the plan (they need only its request): with
    ``background``, in other processes while this one simulates the candidates, so that ``plan``
    with the optimum takes about the longer of the two on two cores, not their sum."""

    def __init__(self, first: PendingOptima | None, later: Sequence[Callable[[], PendingOptima]] = (),
                 error: OptimumTooLargeError | None = None):
        self._first, self._later, self._error = first, later, error

    @classmethod
    def start(cls, req: PlanRequest, spots: list[Process], more: Sequence[Process] = (), limit: int | None = None, *,
              background: bool = True) -> PlanOptimum:
        """Start the searches; one found too large now is raised by ``mean``. Use it as a context
        manager: leaving it stops the searches still running."""
        limit = OPTIMUM_LIMIT if limit is None else limit
        samples = [spots, *([m] for m in more)]
        if req.deadline_h is None or not all(isinstance(s, SpotTrace | NodeTrace) for sample in samples for s in sample):
            return cls(None)
        ladder = Ladder(tiers=(*[req.spot_tier(i) for i in range(len(spots))], req.on_demand_tier()))
        runs = math.ceil(req.runs / len(samples))

        def part(sample: list[Process], background: bool = False) -> Callable[[], PendingOptima]:
            offsets = run_offsets([compile_process(sample[0], req.num_workers)], runs, req.seed)
            return lambda: start_optima(ladder, req.job(None), [*sample, RateModel()], offsets,
                                        limit=limit // len(samples), background=background)

        # The first sample's searches go to other processes now; the others' (the --sample traces)
        # are searched in ``mean``, one sample at a time, rather than crowd the cores at once.
        try:
            first = part(samples[0], background)()
        except OptimumTooLargeError as e:
            return cls(None, error=e)
        return cls(first, [part(sample) for sample in samples[1:]])

    def mean(self) -> float | None:
        """The mean optimum over the starts (None without a deadline or on a rate model), once searched."""
        if self._error is not None:
            raise self._error
        if self._first is None:
            return None
        spends = [o.spend for o in self._first.result()]
        for start in self._later:
            with start() as pending:
                spends += [o.spend for o in pending.result()]
        arr = np.array(spends)
        return float(arr.mean()) if np.isfinite(arr).all() else None

    def close(self) -> None:
        """Stop the searches still running in other processes."""
        if self._first is not None:
            self._first.close()

    def __enter__(self) -> PlanOptimum:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _comparison_table(p: Plan, optimum: float | None = None) -> Table:
    """Every policy on the same draws; narrow enough for an 80-column terminal, nothing cut."""
    d = p.request.deadline_h
    caption = None if d is None else f"P(<=D): share of runs done within the {d:g} h deadline; " \
        f"{p.request.deadline_probability:g} required"
    table = Table(title="Recommended policy (first row) vs baselines, on the same random draws", caption=caption,
                  box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True, show_edge=False)
    table.add_column("policy", overflow="fold", min_width=11)
    cols = ["spend", "x opt", "p90", "wall h", "p90", "P(<=D)", "alpha", "intr", "sw"]
    if optimum is None:
        cols.remove("x opt")
    for col in cols:  # the verdict after P(<=D) may wrap; a number never is cut
        table.add_column(col, justify="right", no_wrap=col != "P(<=D)", min_width=5 if col == "P(<=D)" else None)
    for i, c in enumerate(p.comparison()):
        r = c.result
        ok = c.meets(p.request.deadline_probability)
        x_opt = [] if optimum is None else [_cell(c.mean_spend / optimum, 3)]
        table.add_row(
            "recommended" if i == 0 else c.label,
            _money(c.mean_spend),
            *x_opt,
            _money(float(np.percentile(r.spend, 90))),
            _cell(c.mean_wall_h, 1),
            _cell(float(np.percentile(r.wall_h, 90)), 1),
            f"{c.p_deadline:.3f}" + ("" if ok else " [red]miss[/red]"),
            f"{float(r.alpha.mean()):.2f}",
            _cell(float(r.interruptions.mean()), 1),
            _cell(float(r.switches.mean()), 1),
        )
    return table


def _as_json(p: Plan, optimum: float | None, notes: list[str]) -> dict[str, Any]:
    """What ``--json`` prints: every compared policy with its spend as a multiple of the optimum."""
    rows = []
    for i, c in enumerate(p.comparison()):
        rows.append({
            "policy": "recommended" if i == 0 else c.label,
            "label": c.label,
            "mean_spend": c.mean_spend,
            "p90_spend": float(np.percentile(c.result.spend, 90)),
            "mean_wall_h": c.mean_wall_h,
            "p_deadline": c.p_deadline,
            "unfinished": c.unfinished,  # runs the simulator gave up on: the means above are lower bounds
            "x_optimum": None if optimum is None else c.mean_spend / optimum,
        })
    rec = p.recommended
    return {
        "request": p.request.model_dump(mode="json"),
        "feasible": p.feasible,
        "optimum_mean_spend": optimum,
        "policies": rows,
        "recommended_tiers": [] if rec.ladder is None else [t.model_dump(mode="json") for t in rec.ladder.tiers],
        "checkpoint_interval_h": rec.tau_h,
        "notes": notes,
    }


def _distribution_table(c: Candidate) -> Table:
    table = Table(title=f"Recommended policy over {c.result.runs} simulated runs")
    for col in ("metric", "mean", "p50", "p90", "p99"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, dist in c.result.summary().items():
        table.add_row(name, *(f"{v:,.3f}" for v in (dist.mean, dist.p50, dist.p90, dist.p99)))
    return table


def _ladder_table(p: Plan) -> Table:
    """One column per tier, one row per setting: any ladder fits an 80-column terminal."""
    rec = p.recommended
    tau = "no periodic checkpoint" if rec.tau_h is None else f"checkpoint every {_fmt_h(rec.tau_h)}"
    table = Table(title=f"Recommended ladder ({tau})", box=box.SIMPLE_HEAD)
    assert rec.ladder is not None
    tiers = rec.ladder.tiers
    table.add_column("tier", no_wrap=True)
    for t in tiers:
        table.add_column(t.name, overflow="fold")

    def guard(t: Tier) -> str:
        g = t.deadline_guard
        if g is None:
            return "none"
        reserve = f", reserve {g.reserve_h * 60:.0f} min" if g.reserve_h else ""
        return f"pace {g.pace:g}, margin {g.margin_h * 60:.0f} min{reserve}, by {g.deadline_h:g} h"

    rows: list[tuple[str, Callable[[Tier], str]]] = [
        ("market", lambda t: t.market),
        ("workers", lambda t: str(t.num_workers)),
        ("max_preemptions", lambda t: str(t.max_preemptions)),
        ("max_failures", lambda t: str(t.max_failures)),
        ("capacity_timeout_s", lambda t: _fmt_timeout(t.capacity_timeout_s)),
        ("price", lambda t: f"{t.price_per_worker_hour:g}"),
        ("deadline_guard", guard),
        ("climb_back", lambda t: f"after {t.min_dwell_s:g} s" if t.climb_back else "no"),
    ]
    for name, show in rows:
        table.add_row(name, *(show(t) for t in tiers))
    return table


def _plot(p: Plan) -> bytes:
    """The plan's picture as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    od = next(c for c in p.baselines if c.label == "on-demand only")
    deadline = p.request.deadline_h
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for row, (rows, xlabel) in enumerate(
        (
            (p.sweep_over_m(), "max_preemptions M on the first spot tier"),
            (p.sweep_over_tau(), "checkpoint interval tau (h)"),
        )
    ):
        ax_cost, ax_time = axes[row]
        if not rows:
            ax_cost.text(0.5, 0.5, "no sweep (on-demand recommended)", ha="center", transform=ax_cost.transAxes)
            continue
        xs: list[Any]
        if row == 0:
            labels = ["inf" if c.ladder[0].max_preemptions == -1 else str(c.ladder[0].max_preemptions) for c in rows]  # type: ignore[index]
            xs = list(range(len(rows)))
        else:
            labels = None
            xs = [c.tau_h for c in rows]
        ax_cost.plot(xs, [c.mean_spend for c in rows], "o-", label="mean spend")
        chosen = [x for x, c in zip(xs, rows, strict=True) if c is p.recommended]
        if chosen:
            ax_cost.plot(chosen, [p.recommended.mean_spend], "*", ms=16, color="gold", mec="black", label="recommended")
        ax_cost.axhline(od.mean_spend, color="red", ls="--", label="break-even: on-demand only")
        ax_time.plot(xs, [c.mean_wall_h for c in rows], "o-", label="mean finish time")
        ax_time.plot(xs, [float(np.percentile(c.result.wall_h, 90)) for c in rows], "s--", label="p90 finish time")
        if deadline is not None:
            ax_time.axhline(deadline, color="black", ls=":", label=f"deadline {deadline:g} h")
        for ax, ylabel in ((ax_cost, "spend"), (ax_time, "wall time (h)")):
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            if labels is not None:
                ax.set_xticks(xs, labels)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"spotfallback plan: {p.recommended.label}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _same_nodes(ladder: Ladder) -> list[str]:
    """A note for each pair of spot tiers the plan priced as separate pools but whose selectors, on
    one cluster, pick the same nodes: the file cannot know which nodes each trace recorded."""
    notes = []
    for i, j in ladder.same_nodes():
        a, b = ladder.tiers[i], ladder.tiers[j]
        if a.is_spot:
            notes.append(f"note: tiers {a.name!r} and {b.name!r} were priced as two spot pools, but both select "
                         f"{dict(a.label_selector)} and would run on the same nodes: give each a label_selector "
                         "of its own (e.g. ray.io/availability-zone) in the job file before running it")
    return notes


def _write_files(result: Plan, write_yaml: Path | None, job_fields: dict[str, Any] | None,
                 plot: Path | None) -> list[str]:
    """Write the job file and the picture asked for; what was written, a line each. Both are made before
    either is written, so what is left to fail is the writing itself."""
    text: str | None = None
    if write_yaml is not None:
        assert job_fields is not None
        try:
            text = result.job_yaml(**job_fields)
        except ConfigError as e:
            raise fail(str(usage_error("--write-yaml", one_line(str(e)))), e.exit_code) from None
    picture = _plot(result) if plot is not None else None
    done = []
    if write_yaml is not None:
        assert text is not None  # made above
        write_output("--write-yaml", write_yaml, text)
        done.append(f"Wrote the job file (recommended tiers and the plan's prediction) to {write_yaml}")
        assert result.recommended.ladder is not None  # job_yaml made a file of it
        done.extend(_same_nodes(result.recommended.ladder))
    if plot is not None:
        assert picture is not None  # made above
        write_output("--plot", plot, picture)
        done.append(f"Wrote the plot to {plot}")
    return done


def _spot_trace(option: str, path: Path, trace_counts: str, kind: Literal["spot", "node"] | None = None) -> Process:
    """One trace of ``--trace`` / ``--sample`` (by extension, as backtest reads them: a .csv is a
    node trace) or ``--node-trace``; a spot trace in which spot never starts is refused."""
    try:
        proc = load_process(str(path), kind)
    except TraceError as e:
        raise usage_error(option, str(e)) from None
    proc = as_counted(proc, trace_counts)
    if isinstance(proc, SpotTrace) and not proc.available.any():
        hint = "" if trace_counts == "preempted" else "; if it counts preempted instances, pass --trace-counts preempted"
        raise usage_error(option, f"{path}: no spot capacity in any of its {proc.available.size:,} ticks, so spot "
                                  f"never starts{hint}")
    return proc


def _spot_processes(trace: list[Path], node_trace: list[Path], trace_counts: str, rate: float | None,
                    failure_rate: float, outage_prob: float, outage_h: float) -> list[Process]:
    check_trace_counts(trace_counts)
    procs = [_spot_trace("--trace", path, trace_counts) for path in trace]
    procs += [_spot_trace("--node-trace", path, trace_counts, "node") for path in node_trace]
    if rate is None:
        # The rate model's own terms: without --rate they would be silently ignored.
        given = [opt for opt, v in (("--failure-rate", failure_rate), ("--outage-prob", outage_prob), ("--outage-h", outage_h)) if v]
        if given:
            raise usage_error(given[0], "applies to the rate model only; give --rate too (a trace carries its own failures and outages)")
    else:
        for opt, v in (("--rate", rate), ("--failure-rate", failure_rate), ("--outage-h", outage_h)):
            if v < 0 or not math.isfinite(v):
                raise usage_error(opt, f"must be a non-negative number, got {v:g}")
        if not 0 <= outage_prob <= 1:
            raise usage_error("--outage-prob", f"must be between 0 and 1, got {outage_prob:g}")
        procs.append(RateModel(preemptions_per_node_hour=rate, failures_per_node_hour=failure_rate,
                               outage_probability=outage_prob, mean_outage_h=outage_h))
    if not procs:
        raise usage_error("--trace", "give a spot trace (--trace / --node-trace) or a preemption rate (--rate)")
    return procs


def _samples(paths: list[Path], n_spot: int, trace_counts: str) -> list[Process]:
    """``--sample`` traces, each another sample of the one spot tier's market, read as --trace's are."""
    if paths and n_spot != 1:
        raise usage_error("--sample", f"samples are for a ladder with one spot tier, this one has {n_spot}")
    return [_spot_trace("--sample", path, trace_counts) for path in paths]


# The defaults of the options that price a move between clusters: one changed without --cluster is refused.
MOVE_RESTART_S = 120.0
EGRESS_PRICE_PER_GB = 0.02
CHECKPOINT_GB = 0.0


def _unused_options(processes: Sequence[Process], trace_counts: str, cluster: Sequence[str], move_restart_s: float,
                    checkpoint_gb: float, egress_price: float) -> None:
    """Options that would change nothing here: said, rather than silently ignored."""
    if trace_counts == "preempted" and not any(isinstance(p, SpotTrace) for p in processes):
        raise usage_error("--trace-counts", "applies to SkyPilot JSON spot traces only (a node trace's lines say "
                                            "which nodes come and go); leave it out or give a .json --trace")
    if not cluster:
        moved = [opt for opt, v, default in (("--move-restart-s", move_restart_s, MOVE_RESTART_S), ("--checkpoint-gb", checkpoint_gb, CHECKPOINT_GB),
                                             ("--egress-price", egress_price, EGRESS_PRICE_PER_GB)) if v != default]
        if moved:
            raise usage_error(moved[0], "prices a move between Ray clusters; give --cluster too (one per spot pool, "
                                        "then the on-demand tier's)")


_OPTION_OF = {
    "work_h": "--hours", "num_workers": "--workers", "checkpoint_cost_h": "--checkpoint-cost-s",
    "restart_overhead_h": "--restart-overhead-s", "provisioning_delay_h": "--provisioning-delay-s",
    "notice_s": "--notice-s", "spot_price": "--spot-price", "pool_prices": "--spot-price", "on_demand_price": "--on-demand-price",
    "deadline_h": "--deadline-h", "deadline_probability": "--deadline-prob", "seed_max_preemptions": "--seed-m",
    "runs": "--runs", "seed": "--seed", "clusters": "--cluster", "move_restart_h": "--move-restart-s",
    "move_cost": "--checkpoint-gb",
}


def _request(**kw: object) -> PlanRequest:
    try:
        return PlanRequest(**kw)  # type: ignore[arg-type]
    except ValidationError as e:
        first = e.errors()[0]
        loc = first["loc"][0] if first["loc"] else ""
        option = _OPTION_OF.get(str(loc), "--deadline-h" if not loc else str(loc))
        message = format_validation_error(e).splitlines()[0].split(": ", 1)[-1]
        if loc and str(loc) not in _CONVERTED:
            message += f" (got {first['input']!r})"
        raise usage_error(option, message) from None


# Fields the options give in other units (seconds to hours, gigabytes to egress spend): the value
# the request saw would not be the one typed.
_CONVERTED = {"checkpoint_cost_h", "restart_overhead_h", "provisioning_delay_h", "move_restart_h", "move_cost"}

_JOB_OPTION_OF = {"name": "--name", "storage_path": "--storage-path", "entrypoint": "--entrypoint",
                  "train_loop_config": "--train-loop-config"}


def _json_option(option: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise usage_error(option, f"not valid JSON: {e.msg} at character {e.pos}") from None
    except RecursionError:
        raise usage_error(option, "its values nest deeper than the JSON reader can follow; flatten them") from None


def _first_problem(e: ValidationError) -> str:
    """The first problem pydantic found, without the field path the option already names."""
    return format_validation_error(e).splitlines()[0].split(": ", 1)[-1]


def _worker_resources(text: str) -> dict[str, float] | None:
    """``--worker-resources``: one worker's Ray resources, checked as a tier would check them."""
    if not text:
        return None
    resources = _json_option("--worker-resources", text)
    try:
        gpu = isinstance(resources, dict) and bool(resources.get("GPU"))  # as the written tiers get it
        tier = Tier(name="probe", market="on-demand", num_workers=1, resources_per_worker=resources, use_gpu=gpu)
    except ValidationError as e:
        raise usage_error("--worker-resources", _first_problem(e)) from None
    return tier.resources_per_worker


def _job_fields(write_yaml: Path | None, name: str | None, hours: float, workers: int, storage_path: str | None,
                entrypoint: str | None, train_loop_config: str | None, worker_resources: str = "",
                force: bool = False) -> dict[str, Any] | None:
    """The job file's own fields, checked before minutes of simulation are spent."""
    if write_yaml is None:
        given = [opt for opt, v in (("--entrypoint", entrypoint), ("--name", name), ("--storage-path", storage_path),
                                    ("--train-loop-config", train_loop_config), ("--worker-resources", worker_resources),
                                    ("--force", force)) if v]
        if given:
            raise usage_error(given[0], "applies to the job file; give --write-yaml too")
        return None
    if not entrypoint:
        raise usage_error("--entrypoint", "required with --write-yaml: the training function as "
                                    "'package.module:function' or 'path/file.py:function'")
    loop_config = _json_option("--train-loop-config", "{}" if train_loop_config is None else train_loop_config)
    if not isinstance(loop_config, dict):
        raise usage_error("--train-loop-config", f"must be a JSON object, got {type(loop_config).__name__}")
    fields: dict[str, Any] = {
        "name": f"job-{hours:g}h-{workers}w" if name is None else name,
        "storage_path": "./runs" if storage_path is None else storage_path,
        "entrypoint": entrypoint,
        "train_loop_config": loop_config,
    }
    probe = {**fields, "tiers": [{"name": "probe", "market": "on-demand", "num_workers": 1}]}
    resources = _worker_resources(worker_resources)
    try:
        JobConfig.model_validate(probe)
    except ValidationError as e:
        first = e.errors()[0]
        option = _JOB_OPTION_OF.get(str(first["loc"][0]) if first["loc"] else "", "--write-yaml")
        raise usage_error(option, _first_problem(e)) from None
    return {**fields, "resources_per_worker": resources}


def register(app: typer.Typer) -> None:
    """Add the ``plan`` command to the spotfallback CLI."""

    @app.command("plan")
    def plan_command(
        ctx: typer.Context,
        seed_table_only: bool = typer.Option(False, "--seed-table", help="Print the seed's corrected runtime-flexibility table and exit."),
        discount: float = typer.Option(DEFAULT_DISCOUNT, "--discount", help="Spot discount d for --seed-table."),
        hours: float | None = typer.Option(None, "--hours", help="Training hours on an uninterrupted gang."),
        workers: int = typer.Option(8, "--workers", help="Workers in the gang."),
        checkpoint_cost_s: float = typer.Option(DEFAULT_CHECKPOINT_COST_S, "--checkpoint-cost-s", help="Seconds to write one checkpoint."),
        restart_overhead_s: float = typer.Option(DEFAULT_RESTART_OVERHEAD_S, "--restart-overhead-s", help="Billed seconds of every start before training moves, the first included."),
        provisioning_delay_s: float = typer.Option(DEFAULT_PROVISIONING_DELAY_S, "--provisioning-delay-s", help="Seconds to get workers once capacity exists."),
        notice_s: float = typer.Option(DEFAULT_NOTICE_S, "--notice-s", help="Preemption notice in seconds (AWS 120, GCP/Azure 30)."),
        no_jit: bool = typer.Option(False, "--no-jit", help="Do not checkpoint on a preemption notice."),
        on_request: bool = typer.Option(
            False, "--checkpoint-on-request",
            help="The training function answers the controller's checkpoint requests (PreemptionWatch("
            "answer_requests=True)): climbs back come between periodic checkpoints, at the cost of one write.",
        ),
        spot_price: list[float] = typer.Option(
            [0.9], "--spot-price", metavar="<float>",
            help="Spot price per worker-hour; repeat to price each spot pool (--trace / --node-trace, in order) on its own.",
        ),
        on_demand_price: float = typer.Option(3.06, "--on-demand-price", help="On-demand price per worker-hour."),
        deadline_h: float | None = typer.Option(None, "--deadline-h", help="Deadline in hours from the start."),
        deadline_prob: float = typer.Option(0.95, "--deadline-prob", help="Required probability of meeting the deadline."),
        trace: list[Path] = typer.Option([], "--trace", metavar="<path>", help="Spot trace: SkyPilot JSON, or a node add/remove CSV (.csv); repeat for more spot pools, tried in order."),
        trace_counts: str = typer.Option("available", "--trace-counts", help="What the ticks of a SkyPilot JSON trace (--trace, --sample) count: 'available' or 'preempted' instances."),
        node_trace: list[Path] = typer.Option([], "--node-trace", metavar="<path>", help="Node add/remove CSV trace (time_ms,add|remove,node)."),
        sample: list[Path] = typer.Option(
            [], "--sample", metavar="<path>",
            help="Another recorded trace of the same spot market (.json spot, .csv node trace), one spot tier only: "
            "the runs are split between the traces and the deadline must hold on the worst of them.",
        ),
        cluster: list[str] = typer.Option(
            [], "--cluster", metavar="<str>",
            help="A ladder across Ray clusters: the Jobs API address (http://head:8265) of each spot pool's cluster, "
            "in --trace / --node-trace order, then the on-demand tier's. Moves between clusters are priced.",
        ),
        move_restart_s: float = typer.Option(MOVE_RESTART_S, "--move-restart-s", help="With --cluster: extra billed seconds of a start on another cluster (the checkpoint pulled across regions, the job submitted)."),
        checkpoint_gb: float = typer.Option(CHECKPOINT_GB, "--checkpoint-gb", help="With --cluster: checkpoint size in GB, moved on every move between clusters."),
        egress_price: float = typer.Option(EGRESS_PRICE_PER_GB, "--egress-price", help="With --cluster: price per GB moved between clusters (AWS between regions: 0.02)."),
        rate: float | None = typer.Option(None, "--rate", help="Spot preemptions per node-hour (rate model)."),
        failure_rate: float = typer.Option(0.0, "--failure-rate", help="With --rate: node failures without notice per node-hour."),
        outage_prob: float = typer.Option(0.0, "--outage-prob", help="With --rate: chance an acquisition finds spot capacity gone."),
        outage_h: float = typer.Option(0.0, "--outage-h", help="With --rate: mean length of such an outage in hours."),
        seed_m: int = typer.Option(5, "--seed-m", help="M of the seed's fixed-M baseline."),
        runs: int = typer.Option(400, "--runs", help="Simulated runs per candidate."),
        seed: int = typer.Option(0, "--seed", help="Random seed (same draws for every candidate)."),
        plot: Path | None = typer.Option(None, "--plot", help="Write spend and finish time against M and tau to this PNG (replaced if it exists)."),
        write_yaml: Path | None = typer.Option(
            None, "--write-yaml",
            help="Write a complete job file for `spotfallback run` / `manifest`: the recommended tiers, the plan's "
            "prediction (plan:), and --name, --storage-path, --entrypoint, --train-loop-config, --worker-resources.",
        ),
        name: str | None = typer.Option(
            None, "--name", help="With --write-yaml: the run's name. Default: job-<hours>h-<workers>w, e.g. job-100h-8w."
        ),
        storage_path: str | None = typer.Option(
            None, "--storage-path", help="With --write-yaml: where the run's checkpoints and ledger go. Default: ./runs."
        ),
        entrypoint: str | None = typer.Option(
            None, "--entrypoint",
            help="Training function, 'package.module:function' or 'file.py:function'; required with --write-yaml.",
        ),
        train_loop_config: str | None = typer.Option(
            None, "--train-loop-config", help="With --write-yaml: JSON object handed to the training function. Default: {}."
        ),
        worker_resources: str = typer.Option(
            "", "--worker-resources",
            help="With --write-yaml: JSON resources of one worker on every tier, e.g. '{\"CPU\": 8, \"GPU\": 1}' (a GPU count sets use_gpu).",
        ),
        force: bool = typer.Option(False, "--force", help="Overwrite the --write-yaml file if it exists."),
        as_json: bool = typer.Option(False, "--json", help="Print the comparison, the recommended ladder and the optimum as JSON."),
    ) -> None:
        """Recommend max_preemptions, capacity_timeout_s, a deadline guard, climb back and the checkpoint interval.

        Simulates every candidate ladder on the same random draws of the given trace or rate
        model and recommends the cheapest that meets --deadline-h with --deadline-prob (of
        those within 1% of it, the one with the fewest preemption budgets and capacity
        timeouts, which fit the given trace's counts and may not fit the next), next to four
        baselines: on-demand only, spot forever, the seed's fixed M (--seed-m), and
        Uniform Progress (Can't Be Late, NSDI '24). On traces with a deadline, "x opt" is each
        policy's spend as a multiple of the hindsight optimum (the cheapest schedule that knew
        the trace, on the same starts), left out with a note where its search would be too
        large (long jobs of large gangs on a node trace). --no-jit: no just-in-time
        checkpoint on a preemption notice (every preemption then loses the work since the last
        checkpoint).
        """
        console = Console()
        try:
            if seed_table_only:
                given = [p for p in ctx.command.params if p.name not in ("seed_table_only", "discount") and p.name
                         and getattr(ctx.get_parameter_source(p.name), "name", None) == "COMMANDLINE"]
                if given:
                    flag = max(given[0].opts, key=len)
                    raise usage_error("--seed-table", f"prints the seed's table only, with no job; leave {flag} out to "
                                                      "have it, or --seed-table out to plan the job")
                if not 0 <= discount <= 1:
                    raise usage_error("--discount", f"must be between 0 and 1, got {discount:g}")
                console.print(seed_table(discount))
                console.print(
                    "The break-even runtime ratio is 1/(1 - d*alpha). The seed's last row says "
                    "'217% longer', but the formula gives a 2.17x runtime, i.e. 117% longer."
                )
                return
            if hours is None:
                raise usage_error("--hours", "required: training hours of the job (or use --seed-table)")
            if discount != DEFAULT_DISCOUNT:
                raise usage_error("--discount", "applies to --seed-table only; a plan's discount is --spot-price "
                                                "against --on-demand-price")
            for opt, v in (("--checkpoint-cost-s", checkpoint_cost_s), ("--restart-overhead-s", restart_overhead_s),
                           ("--provisioning-delay-s", provisioning_delay_s), ("--notice-s", notice_s),
                           ("--move-restart-s", move_restart_s)):
                if v < 0 or not math.isfinite(v):
                    raise usage_error(opt, f"must be a non-negative number of seconds, got {v:g}")
                if v > MAX_HOURS * 3600.0:
                    raise usage_error(opt, f"must be at most {MAX_HOURS * 3600.0:,.0f} s ({MAX_HOURS:,.0f} h), got {v:g}")
            # Before the simulation: a bad path fails at once, and a job file there already (perhaps
            # edited, perhaps a running run's) is kept unless --force says otherwise.
            outputs: list[tuple[str, Path | None, tuple[str, ...], bool]] = [
                ("--plot", plot, (".png",), False), ("--write-yaml", write_yaml, (".yaml", ".yml"), not force)]
            for opt, path, suffix, keep in outputs:
                if path is not None and (problem := output_problem(path, suffix, keep_existing=keep)) is not None:
                    raise usage_error(opt, problem)
            job_fields = _job_fields(write_yaml, name, hours, workers, storage_path, entrypoint, train_loop_config,
                                     worker_resources, force)
            req = _request(
                work_h=hours, num_workers=workers, checkpoint_cost_h=checkpoint_cost_s / 3600.0,
                restart_overhead_h=restart_overhead_s / 3600.0, provisioning_delay_h=provisioning_delay_s / 3600.0,
                notice_s=notice_s, jit_checkpoint=not no_jit, checkpoint_on_request=on_request, spot_price=spot_price[0],
                pool_prices=tuple(spot_price) if len(spot_price) > 1 else (), on_demand_price=on_demand_price,
                deadline_h=deadline_h, deadline_probability=deadline_prob, seed_max_preemptions=seed_m,
                runs=runs, seed=seed, clusters=tuple(cluster), move_restart_h=move_restart_s / 3600.0,
                move_cost=checkpoint_gb * egress_price,
            )
            clusters = [ClusterRef(address=address) for address in req.clusters]
            if job_fields is not None and (problem := shared_storage_error(job_fields["storage_path"], clusters)):
                raise usage_error("--storage-path", problem)
            spots = _spot_processes(trace, node_trace, trace_counts, rate, failure_rate, outage_prob, outage_h)
            if job_fields is not None:  # backtest reads the traces as the plan did
                job_fields["trace_counts"] = trace_counts
            if cluster and len(cluster) != len(spots) + 1:
                raise usage_error("--cluster", f"{len(cluster)} clusters for {len(spots)} spot pools and on-demand; give "
                                  "one per --trace / --node-trace in order, then the on-demand tier's")
            if req.pool_prices and len(req.pool_prices) != len(spots):
                raise usage_error("--spot-price", f"{len(req.pool_prices)} prices for {len(spots)} spot pools; give one "
                                  "for all, or one per --trace / --node-trace in order")
            more = _samples(sample, len(spots), trace_counts)
            _unused_options([*spots, *more], trace_counts, cluster, move_restart_s, checkpoint_gb, egress_price)
            try:
                # The optimum needs only the request: its searches run in other processes beside the plan.
                optimum_search = PlanOptimum.start(req, spots, more)
                try:
                    result = plan(req, spots, more=more)
                except BaseException:
                    optimum_search.close()
                    raise
            except ValidationError as e:  # a tier or job the planner built from this capacity that the config refuses
                source = "--trace" if trace else "--node-trace" if node_trace else "--rate"
                raise usage_error(source, "no plan can be made for this spot capacity: "
                                  + " ".join(format_validation_error(e).split())) from None
            except ValueError as e:  # e.g. a gang larger than a node trace's cluster
                raise usage_error("--workers", str(e)) from None
        except UsageError as e:
            raise fail(str(e), e.exit_code) from None

        notes = list(result.notes)
        with optimum_search:
            try:
                optimum = optimum_search.mean()
            except OptimumTooLargeError as e:
                optimum = None
                notes.append(f"x opt is left out: {e} (fewer starts: --runs).")
        if optimum is not None and optimum <= 0:
            optimum = None  # spot at no price: every policy is infinitely many times nothing
            notes.append("x opt is left out: the optimum spends nothing here (spot at price 0).")
        if as_json:
            for line in _write_files(result, write_yaml, job_fields, plot):  # beside the JSON, not in it
                typer.echo(line, err=True)
            typer.echo(json.dumps(_as_json(result, optimum, notes), indent=2))
            return
        mtbf = "inf" if not math.isfinite(result.gang_mtbf_h) else f"{result.gang_mtbf_h:.2f} h"
        young = "n/a" if result.tau_young_h is None else _fmt_h(result.tau_young_h)
        daly = "n/a" if result.tau_daly_h is None else _fmt_h(result.tau_daly_h)
        console.print(
            f"Job: {req.work_h:g} h on {req.num_workers} workers; spot {'/'.join(f'{p:g}' for p in req.pool_prices) or f'{req.spot_price:g}'} vs on-demand "
            f"{req.on_demand_price:g} per worker-hour; {req.runs} runs per candidate, seed {req.seed}.\n"
            f"Gang MTBF on spot: {mtbf}; checkpoint interval Young {young}, Daly {daly} "
            f"(for interruptions that lose work, MTBF {_fmt_h(result.lossy_mtbf_h)})."
        )
        if req.clusters:
            console.print(f"Across {len(set(req.clusters))} clusters: each move to another cluster costs "
                          f"{req.move_restart_h * 3600:g} s more restart (billed) and {req.move_cost:g} of egress.")
        if result.recommended.ladder is not None:
            console.print(_ladder_table(result))
        console.print(_comparison_table(result, optimum))
        if optimum is not None:
            console.print(f"Hindsight optimum (knew the trace, met the deadline) on the same starts: {optimum:,.1f} mean spend.")
        console.print(_distribution_table(result.recommended))
        if result.seed_check is not None:
            sc = result.seed_check
            console.print(
                "Closed forms fed the recommendation's simulated alpha and interruptions: "
                f"seed formula {sc.seed_formula.cost_new:,.2f}, exact accounting {sc.exact.cost:,.2f}, "
                f"simulated {result.recommended.mean_spend:,.2f}."
            )
        for note in notes:
            console.print(f"[yellow]note:[/yellow] {note}")
        if not result.feasible:
            console.print("[red]No candidate meets the deadline requirement; shown is the most likely to.[/red]")
        for line in _write_files(result, write_yaml, job_fields, plot):
            console.print(line)
