"""`spotfallback backtest`: a job file's ladder, unchanged, on every window of recorded traces."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from spotfallback.cli.common import (
    check_trace_counts,
    fail,
    one_line,
    output_problem,
    same_file_problem,
    usage_error,
    write_output,
)
from spotfallback.config import (
    DEFAULT_CHECKPOINT_COST_S,
    DEFAULT_NOTICE_S,
    DEFAULT_PROVISIONING_DELAY_S,
    DEFAULT_RESTART_OVERHEAD_S,
    JobConfig,
    Ladder,
    PlannedJob,
    Tier,
)
from spotfallback.errors import (
    ConfigError,
    OptimumTooLargeError,
    PoolError,
    TraceError,
    UsageError,
    WindowError,
)
from spotfallback.sim.backtesting import (
    BacktestResult,
    Spread,
    backtest,
    check_spot_prices,
    on_demand_tier,
)
from spotfallback.sim.job import MAX_HOURS, JobSpec, wall_to_finish
from spotfallback.sim.planner import load_process
from spotfallback.sim.traces import NodeTrace, SpotTrace
from spotfallback.sim.world import as_counted, gating_note, repeat_note

# States the optimum's search of one backtest may meet over all its windows (``optimum_for``):
# about 30-150 s on one core; past it, the optimum is left out with a note. The 27 windows of a
# 1000 h job on us-west-2a_v100_1 need 8 million.
OPTIMUM_LIMIT = 50_000_000


def _table(res: BacktestResult, label: str) -> Table:
    table = Table(title=f"{label}: {res.windows} windows of {res.window_h:g} h, deadline {res.deadline_h:g} h")
    for col in ("", "mean", "median", "p95"):
        table.add_column(col, justify="left" if not col else "right")

    def row(name: str, s: Spread, fmt: str) -> None:
        table.add_row(name, *(format(v, fmt) for v in (s.mean, s.median, s.p95)))

    row("spend", Spread.of(res.spend), ",.2f")
    row("spend / on-demand only", res.vs_on_demand, ".3f")
    if res.vs_optimum is not None and math.isfinite(res.vs_optimum.mean):
        row("spend / hindsight optimum", res.vs_optimum, ".3f")
    return table


# A guard's work this much off the replayed job's is made for another job (a rounding or a changed write time is not).
GUARD_WORK_TOLERANCE = 0.01


def _guard_notes(tiers: Sequence[Tier], spec: JobSpec) -> list[str]:
    """Tiers whose deadline guard was made for another job than the one replayed: the ladder is
    replayed unchanged, so such a guard leaves its tier on the schedule of the job it was made for."""
    assert spec.deadline_h is not None
    wall = float(wall_to_finish(spec.work_h, spec.tau_h, spec.checkpoint_cost_h))
    notes = []
    for tier in tiers:
        guard = tier.deadline_guard
        if guard is None:
            continue
        off = ([f"deadline_h={guard.deadline_h:g} (the replay's deadline: {spec.deadline_h:g} h)"]
               if not math.isclose(guard.deadline_h, spec.deadline_h, rel_tol=1e-9) else [])
        if not math.isclose(guard.work_h, wall, rel_tol=GUARD_WORK_TOLERANCE):
            off.append(f"work_h={guard.work_h:g} (the replayed job takes {wall:.4g} h uninterrupted)")
        if off:
            notes.append(f"tier {tier.name!r}: its deadline_guard has {' and '.join(off)}; it is replayed unchanged, "
                         "so it leaves the tier as it would for the job it was made for. For a ladder made for this job: "
                         f"spotfallback plan --hours {spec.work_h:g} --deadline-h {spec.deadline_h:g} ... --write-yaml")
    return notes


def _jit_words(replayed: Mapping[str, Any], saves: bool) -> str:
    """Whether a preemption's notice saves the work (``saves``: ``JobSpec.jit_saves``): a
    just-in-time checkpoint whose write outlasts the notice saves nothing."""
    if not replayed["jit_checkpoint"]:
        return "no just-in-time checkpoint"
    if saves:
        return "just-in-time checkpoint"
    return "no just-in-time checkpoint (the write outlasts the notice: a preemption loses the work since the last one)"


def _job_line(replayed: Mapping[str, Any], planned: bool, jit_saves: bool) -> str:
    """The job a backtest replays, in one line, so a default that differs from the plan is seen."""
    tau = replayed["checkpoint_interval_h"]
    return (f"Job: {replayed['work_h']:g} h of training, "
            f"{'a checkpoint every ' + format(tau, '.3g') + ' h' if tau is not None else 'no periodic checkpoint'} "
            f"({replayed['checkpoint_cost_s']:g} s to write), {replayed['restart_overhead_s']:g} s restart, "
            f"{replayed['provisioning_delay_s']:g} s provisioning, {replayed['notice_s']:g} s notice, "
            f"{_jit_words(replayed, jit_saves)}"
            f"{', checkpoints on request' if replayed['checkpoint_on_request'] else ''}"
            f"{'; JSON traces read as counting preempted instances' if replayed['trace_counts'] == 'preempted' else ''}. "
            f"{'What the command line does not give is as planned in the job file.' if planned else 'The job file records no planned job: what the command line does not give is the default.'}")


# The job's durations (seconds) by option: the plan's field, its seconds per unit (hours, or the
# notice in seconds) and the default when neither the command line nor the job file's plan gives one.
DURATIONS = {"checkpoint_cost_s": ("checkpoint_cost_h", 3600.0, DEFAULT_CHECKPOINT_COST_S),
             "restart_overhead_s": ("restart_overhead_h", 3600.0, DEFAULT_RESTART_OVERHEAD_S),
             "provisioning_delay_s": ("provisioning_delay_h", 3600.0, DEFAULT_PROVISIONING_DELAY_S),
             "notice_s": ("notice_s", 1.0, DEFAULT_NOTICE_S)}


def _seconds(given: dict[str, float | None], planned: PlannedJob | None) -> dict[str, float]:
    """Each duration in seconds: as given on the command line, else as planned, else the default."""
    out = {}
    for key, v in given.items():
        field, unit_s, default = DURATIONS[key]
        if v is None and planned is not None:
            v = getattr(planned, field) * unit_s
        out[key] = default if v is None else v
    return out


def _optimum_tiers(ladder: Ladder, od: Tier, spot_price: float | None) -> Ladder | None:
    """The tiers the optimum may use: the ladder's own, or for a ladder without spot, spot at ``--spot-price`` too."""
    has_spot = any(t.is_spot for t in ladder.tiers)
    if spot_price is None:
        if not has_spot:
            raise usage_error("--spot-price", "JOB.yaml's ladder has no spot tier, so the traces never apply to it; "
                                              "give the spot price per worker-hour the optimum may use, e.g. "
                                              "--spot-price 0.9")
        return None
    if has_spot:
        raise usage_error("--spot-price", "JOB.yaml's ladder has spot tiers, and the optimum uses their prices; "
                                          "leave --spot-price out")
    if not (spot_price >= 0 and math.isfinite(spot_price)):
        raise usage_error("--spot-price", f"must be a non-negative price per worker-hour, got {spot_price:g}")
    spot = Tier.spot(od.num_workers, price_per_worker_hour=spot_price, cluster=od.cluster)
    return Ladder(tiers=(spot, od))


def _pool_paths(given: list[str]) -> dict[str, Path]:
    """``--pool TIER=PATH`` options by tier name; one line naming the option for a malformed one."""
    out: dict[str, Path] = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise usage_error("--pool", f"expected TIER=PATH (a spot tier's name and its trace), e.g. --pool "
                                        f"spot-b=us-west-2b_v100_1.json; got {item!r}")
        if name in out:
            raise usage_error("--pool", f"tier {name!r} is given twice; give each tier one trace")
        out[name] = Path(path)
    return out


def _read_trace(option: str, path: Path, trace_counts: str) -> SpotTrace | NodeTrace:
    """A recorded trace, a JSON one read as ``trace_counts`` says (``plan --trace-counts``)."""
    try:
        proc = load_process(str(path))
    except TraceError as e:
        raise usage_error(option, str(e)) from None
    return as_counted(proc, trace_counts)


def _no_spot_note(path: Path, trace: SpotTrace, counts: str) -> str:
    """A trace with no spot capacity at all (``plan`` refuses one; here it is a measurement): every
    window waits for spot as the ladder allows, then runs on its other tiers."""
    hint = "" if counts == "preempted" else "; if it counts preempted instances, pass --trace-counts preempted"
    return (f"{path}: no spot capacity in any of its {trace.available.size:,} ticks, so in every window spot never "
            f"starts and the run goes on as the ladder's timeouts and guards allow{hint}")


def _pools(paths: Mapping[str, Path], ladder: Ladder, trace_counts: str) -> dict[str, SpotTrace | NodeTrace]:
    """The traces of ``--pool`` (``_pool_paths``), loaded, for tiers of ``ladder``."""
    tiers = {t.name: t for t in ladder.tiers}
    pools: dict[str, SpotTrace | NodeTrace] = {}
    for name, path in paths.items():
        if name not in tiers:
            raise usage_error("--pool", f"JOB.yaml has no tier {name!r}; its tiers are {', '.join(map(repr, tiers))}")
        pools[name] = _read_trace("--pool", path, trace_counts)
        if tiers[name].is_spot:  # another tier is refused by backtest() itself, as no trace applies to it
            _check_gang_fits("--pool", path, pools[name], [(tiers[name].num_workers, f"JOB.yaml's spot tier {name!r}")])
    return pools


def _check_gang_fits(option: str, path: Path, trace: SpotTrace | NodeTrace, gangs: Sequence[tuple[int, str]]) -> None:
    """A node trace replayed on gangs it never holds is refused, naming what sets the gang (``gangs``:
    workers and what sets them, e.g. a spot tier of JOB.yaml)."""
    if not isinstance(trace, NodeTrace) or not gangs:
        return
    need, who = max(gangs, key=lambda g: g[0])
    if need > trace.peak:
        raise usage_error(option, f"{path}: node trace {trace.name!r} never has {need} nodes at once (at most "
                                     f"{trace.peak}), and {who} has num_workers: {need}; give a trace of a larger "
                                     "cluster, or fewer workers there")


def register(app: typer.Typer) -> None:
    """Add the ``backtest`` command to the spotfallback CLI."""

    @app.command("backtest")
    def backtest_command(
        job_file: Path = typer.Argument(..., metavar="JOB.yaml", help="Job file whose ladder is replayed unchanged."),
        trace: list[Path] = typer.Option([], "--trace", metavar="<path>", help="Recorded trace: SkyPilot JSON, or a node add/remove CSV (.csv); repeat for more windows (each trace is replayed on every spot tier that --pool gives no trace of its own)."),
        pool: list[str] = typer.Option(
            [], "--pool", metavar="TIER=PATH",
            help="A spot tier that replays its own trace (another zone or pool, recorded over the same hours) instead "
                 "of each --trace, which still sets the windows; repeat for more tiers."),
        window_h: float = typer.Option(24.0, "--window-h", help="Hours between window starts; every window starts the job afresh."),
        hours: float | None = typer.Option(
            None, "--hours", help="Training hours of the job on an uninterrupted gang. Default: the job file's plan."),
        deadline_h: float | None = typer.Option(None, "--deadline-h", help="Deadline in hours from each window's start. Default: the job file's plan."),
        checkpoint_interval_h: float | None = typer.Option(
            None, "--checkpoint-interval-h", help="Work between periodic checkpoints, hours. Default: the job file's plan, else none."),
        checkpoint_cost_s: float | None = typer.Option(
            None, "--checkpoint-cost-s", help=f"Seconds to write one checkpoint. Default: the job file's plan, else {DURATIONS['checkpoint_cost_s'][2]:g}."),
        restart_overhead_s: float | None = typer.Option(
            None, "--restart-overhead-s",
            help=f"Billed seconds of every start before training moves. Default: the job file's plan, else {DURATIONS['restart_overhead_s'][2]:g}."),
        provisioning_delay_s: float | None = typer.Option(
            None, "--provisioning-delay-s",
            help=f"Seconds to get workers once capacity exists. Default: the job file's plan, else {DURATIONS['provisioning_delay_s'][2]:g}."),
        notice_s: float | None = typer.Option(
            None, "--notice-s",
            help=f"Preemption notice in seconds (AWS 120, GCP/Azure 30). Default: the job file's plan, else {DURATIONS['notice_s'][2]:g}."),
        jit: bool | None = typer.Option(
            None, "--jit/--no-jit", help="Checkpoint on a preemption notice. Default: the job file's plan, else yes."),
        on_request: bool | None = typer.Option(
            None, "--checkpoint-on-request/--no-checkpoint-on-request",
            help="The training function answers the controller's checkpoint requests (PreemptionWatch("
            "answer_requests=True)): climbs back come between periodic checkpoints, at the cost of one write. "
            "Default: the job file's plan, else no.",
        ),
        trace_counts: str | None = typer.Option(
            None, "--trace-counts",
            help="What the ticks of a SkyPilot JSON trace (--trace, --pool) count: 'available' or 'preempted' "
                 "instances. Default: as the job file's plan read its traces, else 'available'."),
        spot_price: float | None = typer.Option(
            None, "--spot-price",
            help="Spot price per worker-hour the optimum may use when JOB.yaml's ladder has no spot tier (the "
                 "traces' capacity at this price, beside its on-demand tier); a ladder with spot tiers uses theirs."),
        csv_path: Path | None = typer.Option(None, "--csv", help="Write one row per window to this CSV file (replaced if it exists)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary and every window as JSON instead of tables."),
    ) -> None:
        """Replay JOB.yaml's ladder from the start of every window of the traces; set it against on-demand and the optimum.

        Prints the mean, median and 95th percentile of the spend relative to on-demand only
        (the ladder's last non-spot tier) and to the hindsight optimum (the cheapest schedule
        that knew the trace and met the deadline), the windows that cost more than on-demand
        only, and the share that finished by the deadline. Where the optimum's search would be
        too large (a long job on a large gang's node trace), a note says so and the rest is shown.
        """
        console = Console()
        try:
            try:
                job = JobConfig.from_yaml(job_file)
            except (ConfigError, OSError) as e:
                raise usage_error("JOB.yaml", one_line(str(e))) from None
            if not trace:
                raise usage_error("--trace", "give at least one recorded trace (SkyPilot .json or node .csv)")
            if not (window_h > 0 and math.isfinite(window_h)):
                raise usage_error("--window-h", f"must be a positive number of hours, e.g. --window-h 24; got {window_h:g}")
            plan = job.plan
            planned = plan.job if plan is not None else None
            if hours is None:
                if planned is None:
                    raise usage_error("--hours", "required: training hours of the job on an uninterrupted gang (the "
                                                 "job file's plan: does not record them; `spotfallback plan --write-yaml` does)")
                hours = planned.work_h
            if not (hours > 0 and math.isfinite(hours)):  # before the deadline's hint, which scales it
                raise usage_error("--hours", f"must be a positive number of hours, got {hours:g}")
            given = {"checkpoint_cost_s": checkpoint_cost_s, "restart_overhead_s": restart_overhead_s,
                     "provisioning_delay_s": provisioning_delay_s, "notice_s": notice_s}
            secs = _seconds(given, planned)
            guards = [t.deadline_guard for t in job.tiers if t.deadline_guard is not None]
            deadline = deadline_h if deadline_h is not None else (plan.deadline_h if plan and plan.deadline_h else
                                                                 guards[0].deadline_h if guards else None)
            if deadline is None:
                raise usage_error("--deadline-h", "required: the job file gives no deadline (no plan: deadline_h, no tier's "
                                                  "deadline_guard); give the hours from each window's start, e.g. "
                                                  f"--deadline-h {1.5 * hours:g}")
            tau = checkpoint_interval_h if checkpoint_interval_h is not None else (plan.checkpoint_interval_h if plan else None)
            for key, v in secs.items():
                if v < 0 or not math.isfinite(v) or v > MAX_HOURS * 3600:
                    raise usage_error("--" + key.replace("_", "-"), f"must be a number of seconds from 0 to "
                                                                    f"{MAX_HOURS * 3600:g} ({MAX_HOURS:g} h), got {v:g}")
            for opt, v2 in (("--hours", hours), ("--deadline-h", deadline), ("--checkpoint-interval-h", tau)):
                if v2 is not None and not (0 < v2 <= MAX_HOURS):
                    raise usage_error(opt, f"must be a number of hours above 0 and at most {MAX_HOURS:g}, got {v2:g}")
            if deadline < hours:
                if deadline_h is not None:
                    raise usage_error("--deadline-h", f"{deadline:g} h is shorter than the work itself ({hours:g} h)")
                source = "plan: deadline_h" if plan and plan.deadline_h else "its first deadline_guard"
                raise usage_error("--hours", f"{hours:g} h of work cannot finish by the job file's deadline "
                                             f"({deadline:g} h, from {source}); give --deadline-h too")
            if csv_path is not None and (problem := output_problem(csv_path, ".csv")) is not None:
                raise usage_error("--csv", problem)
            try:
                check_spot_prices(job.ladder)
                od = on_demand_tier(job.ladder)
            except ValueError as e:
                raise usage_error("JOB.yaml", str(e)) from None
            delay = secs["provisioning_delay_s"]
            if od.capacity_timeout_s is not None and od.capacity_timeout_s <= delay:
                raise usage_error("--provisioning-delay-s", f"{delay:g} s is no shorter than the capacity_timeout_s of tier "
                                                            f"{od.name!r} ({od.capacity_timeout_s:g} s): no start there could be up "
                                                            "before its timeout, so every window would fail; give a shorter "
                                                            f"delay, or raise the tier's capacity_timeout_s above {delay:g} s")
            optimum_over = _optimum_tiers(job.ladder, od, spot_price)
            spec = JobSpec(work_h=hours, checkpoint_interval_h=tau, checkpoint_cost_h=secs["checkpoint_cost_s"] / 3600.0,
                           restart_overhead_h=secs["restart_overhead_s"] / 3600.0,
                           provisioning_delay_h=secs["provisioning_delay_s"] / 3600.0, notice_s=secs["notice_s"],
                           jit_checkpoint=jit if jit is not None else (planned.jit_checkpoint if planned else True),
                           deadline_h=deadline,
                           checkpoint_on_request=on_request if on_request is not None else bool(plan and plan.checkpoint_on_request),
                           move_restart_h=planned.move_restart_h if planned else 0.0,
                           move_cost=planned.move_cost if planned else 0.0)
            pool_paths = _pool_paths(pool)
            for i, t in enumerate(trace):  # the same windows twice would count twice in every figure
                for earlier in trace[:i]:
                    with contextlib.suppress(OSError):  # a missing file is the loader's to name
                        if os.path.samefile(t, earlier):
                            raise usage_error("--trace", f"{str(t)!r} is given twice (as {str(earlier)!r} too); its "
                                                         "windows would count twice: give each trace once")
            inputs = [("--trace", t) for t in trace] + [("--pool", p) for p in pool_paths.values()]
            if csv_path is not None and (problem := same_file_problem(csv_path, inputs)) is not None:
                raise usage_error("--csv", problem)
            # The gangs each --trace is replayed on: spot tiers without a --pool, and for a ladder without spot, the
            # optimum's spot gang at --spot-price (the size of the on-demand tier's).
            gangs = [(t.num_workers, f"JOB.yaml's spot tier {t.name!r}") for t in job.tiers
                     if t.is_spot and t.name not in pool_paths]
            if optimum_over is not None:
                gangs.append((od.num_workers, f"the optimum's spot gang at --spot-price (JOB.yaml's tier {od.name!r})"))
            counts = trace_counts if trace_counts is not None else (plan.trace_counts if plan else "available")
            check_trace_counts(counts)
            traces: list[SpotTrace | NodeTrace] = []
            for path in trace:
                traces.append(_read_trace("--trace", path, counts))
                _check_gang_fits("--trace", path, traces[-1], gangs)
            pools = _pools(pool_paths, job.ladder, counts)
            if trace_counts == "preempted" and not any(isinstance(t, SpotTrace) for t in [*traces, *pools.values()]):
                raise usage_error("--trace-counts", "applies to SkyPilot JSON traces, and every trace given is a node "
                                                    "trace (.csv), which records its own adds and removes")
            left_out: list[str] = []
            try:
                try:
                    res = backtest(job.ladder, traces, spec, window_h=window_h, optimum_over=optimum_over, pools=pools,
                                   optimum_limit=OPTIMUM_LIMIT)
                except OptimumTooLargeError as e:
                    res = backtest(job.ladder, traces, spec, window_h=window_h, pools=pools, optimum=False)
                    left_out.append(f"spend / hindsight optimum is left out: {e} (fewer starts: a larger --window-h; a "
                                    "shorter deadline: --deadline-h).")
            except PoolError as e:  # e.g. a gang larger than the pool's node trace
                raise usage_error("--pool", e.problem) from None
            except WindowError as e:  # e.g. a window of seconds over a long trace
                raise usage_error("--window-h", str(e)) from None
            except ValueError as e:  # e.g. a gang larger than a node trace's cluster
                raise usage_error("--trace", str(e)) from None
        except UsageError as e:
            raise fail(str(e), e.exit_code) from None

        if csv_path is not None:
            rows = res.rows()
            table = io.StringIO(newline="")
            writer = csv.DictWriter(table, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
            write_output("--csv", csv_path, table.getvalue())
        replayed = {"work_h": spec.work_h, "checkpoint_interval_h": spec.checkpoint_interval_h, **secs,
                    "jit_checkpoint": spec.jit_checkpoint, "checkpoint_on_request": spec.checkpoint_on_request,
                    "trace_counts": counts}
        spot_tiers = [t for t in job.tiers if t.is_spot]
        if res.unreachable:
            left_out.append(f"in {res.unreachable} of {res.windows} windows no schedule, even with hindsight, finishes "
                            f"by the deadline of {spec.deadline_h:g} h; spend / hindsight optimum leaves them out "
                            "(a later deadline: --deadline-h)")
        if res.unfinished:
            left_out.append(f"in {res.unfinished} of {res.windows} windows the run never finished: the simulator gave up "
                            f"after {float(res.wall_h[~res.finished].max()):,.0f} h, and their spend is that of the hours "
                            "until then (a spot tier that never gets far enough on this trace and never gives up: set "
                            "its max_preemptions or capacity_timeout_s, or checkpoint more often)")
        longest_h = max(t.duration_s for t in traces) / 3600.0
        short_pools = [f"tier {name!r} replays {pool_paths[name]} ({p.duration_s / 3600.0:,.1f} h), shorter than the "
                       f"windows' traces (up to {longest_h:,.1f} h): past its end it repeats from its start, so later "
                       "windows pair it with hours other than those it recorded beside them"
                       for name, p in pools.items() if p.duration_s / 3600.0 < longest_h - 1e-9]
        empty = [_no_spot_note(path, t, counts) for path, t in [*zip(trace, traces, strict=True),
                                                                  *((pool_paths[n], t) for n, t in pools.items())]
                 if isinstance(t, SpotTrace) and not t.available.any()]
        notes = left_out + empty + short_pools + _guard_notes(job.tiers, spec) + list(dict.fromkeys(
            n for t in spot_tiers for p in ([pools[t.name]] if t.name in pools else traces)
            for n in (gating_note(p, t.num_workers), repeat_note(p, t.num_workers, deadline, "deadline")) if n))
        if as_json:
            typer.echo(json.dumps({"job": str(job_file), "traces": [str(p) for p in trace],
                                   "pools": {name: str(path) for name, path in pool_paths.items()}, "replayed": replayed,
                                   "notes": notes, **res.summary(),
                                   "windows_detail": res.rows()}, indent=2))
            return
        console.print(_job_line(replayed, planned is not None, spec.jit_saves))
        for note in notes:
            console.print(f"[yellow]note:[/yellow] {note}")
        for name, path in pool_paths.items():
            console.print(f"Tier {name!r} replays {path} over each window's hours; the other spot tiers replay the window's trace.")
        console.print(_table(res, job.name))
        console.print(
            f"On-demand only: {res.on_demand_spend:,.2f} per window. Costlier than on-demand only: "
            f"{res.costlier_than_on_demand} of {res.windows} windows. Finished by the deadline: {res.on_time_share:.1%}."
        )
        if csv_path is not None:
            console.print(f"Wrote {res.windows} windows to {csv_path}")
