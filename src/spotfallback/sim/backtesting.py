"""Backtesting: a fixed ladder replayed from the start of every window of recorded traces.

Why: a plan's promise is made on random starts of the traces it was given; a user wants to
know how a job file's ladder, unchanged, would have done on capacity it never saw, window by
window, against on-demand alone and against the hindsight optimum (``sim.optimum``). Any
ladder the simulator runs can be backtested, ladders that climb back included; every
window runs the same job from its first moment, on the same engines as ``simulate``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spotfallback.config import Ladder, Tier, make_ladder
from spotfallback.errors import PoolError, WindowError
from spotfallback.policy import FallbackPolicy
from spotfallback.sim.job import JobSpec
from spotfallback.sim.optimum import optimum_for
from spotfallback.sim.simulate import simulate
from spotfallback.sim.traces import NodeTrace, SpotTrace
from spotfallback.sim.world import Process, RateModel, compile_process, world_for


@dataclass(frozen=True)
class Spread:
    """Mean, median and 95th percentile of a per-window ratio."""

    mean: float
    median: float
    p95: float

    @classmethod
    def of(cls, values: np.ndarray) -> Spread:
        v = np.asarray(values, dtype=float)
        v = v[np.isfinite(v)]
        if v.size == 0:
            return cls(math.nan, math.nan, math.nan)
        return cls(float(v.mean()), float(np.median(v)), float(np.percentile(v, 95)))

    def plain(self) -> dict[str, float | None]:
        """As plain data for JSON, which has no nan: None where there was no finite value."""
        return {k: v if math.isfinite(v) else None for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class BacktestResult:
    """Per-window outcomes (arrays, one entry per window) and their summary."""

    trace: np.ndarray  # name of the trace each window comes from
    start_h: np.ndarray  # window start, hours into its trace
    spend: np.ndarray
    wall_h: np.ndarray
    on_time: np.ndarray  # finished by the deadline
    switches: np.ndarray
    finished: np.ndarray  # False: the run never finished; the simulator gave up at its horizon (wall_h)
    on_demand_spend: float  # the same job on the ladder's on-demand tier alone
    optimum: np.ndarray | None  # hindsight optimum of each window (inf: no schedule in time); None: not searched
    deadline_h: float
    window_h: float

    @property
    def windows(self) -> int:
        return len(self.spend)

    @property
    def vs_on_demand(self) -> Spread:
        return Spread.of(self.spend / self.on_demand_spend)

    @property
    def vs_optimum(self) -> Spread | None:
        """Spend over the optimum, window by window; None where the optimum was not searched. Windows
        where no schedule meets the deadline (``unreachable``) have no optimum and are left out (all
        of them: nan)."""
        if self.optimum is None:
            return None
        reach = np.isfinite(self.optimum)
        return Spread.of(np.divide(self.spend, self.optimum, out=np.full(self.windows, np.nan), where=reach))

    @property
    def unreachable(self) -> int:
        """Windows where no schedule, even with hindsight, finishes by the deadline (0 where not searched)."""
        return 0 if self.optimum is None else int((~np.isfinite(self.optimum)).sum())

    @property
    def unfinished(self) -> int:
        """Windows whose run never finished: the simulator gave up on it (``default_horizon_h``), and its
        spend and wall time are those of the hours until then."""
        return int((~self.finished).sum())

    @property
    def costlier_than_on_demand(self) -> int:
        return int((self.spend > self.on_demand_spend * (1 + 1e-9)).sum())

    @property
    def on_time_share(self) -> float:
        return float(self.on_time.mean()) if self.windows else math.nan

    def rows(self) -> list[dict[str, float | str | bool | int | None]]:
        """One dict per window, for CSV and JSON."""
        return [
            {"trace": str(self.trace[i]), "start_h": float(self.start_h[i]), "spend": float(self.spend[i]),
             "wall_h": float(self.wall_h[i]), "finished": bool(self.finished[i]), "on_time": bool(self.on_time[i]),
             "switches": int(self.switches[i]),
             "on_demand_spend": self.on_demand_spend,
             "optimum": None if self.optimum is None or not np.isfinite(self.optimum[i]) else float(self.optimum[i])}
            for i in range(self.windows)
        ]

    def summary(self) -> dict[str, object]:
        """The figures ``spotfallback backtest`` prints, as plain data."""
        return {
            "windows": self.windows,
            "window_h": self.window_h,
            "deadline_h": self.deadline_h,
            "on_demand_spend": self.on_demand_spend,
            "spend": Spread.of(self.spend).plain(),
            "vs_on_demand": self.vs_on_demand.plain(),
            "vs_optimum": None if (vs := self.vs_optimum) is None else vs.plain(),
            "unreachable": self.unreachable,
            "unfinished": self.unfinished,
            "costlier_than_on_demand": self.costlier_than_on_demand,
            "on_time_share": self.on_time_share,
        }


# More windows than any backtest needs (400 replay in well under a second): a window of minutes or
# less over a long trace is a slip, and would take hours and the machine's memory.
MAX_WINDOWS = 100_000


def window_starts(trace: SpotTrace | NodeTrace, window_h: float, num_workers: int = 1) -> np.ndarray:
    """Starts of the whole windows of ``window_h`` in the trace; one at 0 when the trace is shorter.

    A run that outlasts its window goes on into the trace that follows it, and past the end
    of the trace into its beginning again, as the simulator replays every trace.
    """
    if isinstance(window_h, bool) or not isinstance(window_h, int | float) or not (window_h > 0 and math.isfinite(window_h)):
        raise WindowError(f"window_h must be a positive number of hours, got {window_h!r}")
    cap = compile_process(trace, num_workers)
    assert not isinstance(cap, RateModel)
    length_h = cap.period_h  # type: ignore[union-attr]
    n = max(1, math.floor(length_h / window_h + 1e-9))
    if n > MAX_WINDOWS:
        raise WindowError(f"window_h={window_h:g} h cuts the {length_h:g} h of trace {trace.name!r} into {n:,} windows, "
                         f"more than {MAX_WINDOWS:,}; give a longer window")
    return np.arange(n) * window_h


def check_spot_prices(ladder: Ladder) -> None:
    """Refuse a spot tier without a price (the default is 0): a backtest would count its hours
    as free, and the ladder would look cheaper than any schedule that pays for spot."""
    for i, t in enumerate(ladder.tiers):
        if t.is_spot and t.price_per_worker_hour <= 0:
            raise ValueError(f"tiers[{i}].price_per_worker_hour: {t.name!r} has no price, so a backtest would count its "
                             "hours as free; give every tier its price per worker-hour")


def on_demand_tier(ladder: Ladder) -> Tier:
    """The tier a backtest sets the ladder against: its last tier that is not on the spot market.

    A tier off the spot market may be free (capacity already paid for) only if it is not this one.
    """
    for i in reversed(range(len(ladder.tiers))):
        t = ladder.tiers[i]
        if not t.is_spot:
            if t.price_per_worker_hour <= 0:
                raise ValueError(f"tiers[{i}].price_per_worker_hour: {t.name!r} has no price, and a backtest sets spend "
                                 "against it; give every tier its price per worker-hour")
            return t
    raise ValueError("the ladder has no tier off the spot market to compare with; add an on-demand tier")


def _not_a_trace(value: object) -> str | None:
    """Why ``value`` is no trace a backtest replays (None: it is one)."""
    if isinstance(value, SpotTrace | NodeTrace):
        return None
    hint = ("a path: load it first with spotfallback.sim.planner.load_process(path)"
            if isinstance(value, str | os.PathLike) else "give a SpotTrace or a NodeTrace")
    return f"got {type(value).__name__}, {hint}"


def backtest(
    ladder: Ladder | Sequence[Tier] | FallbackPolicy,
    traces: Sequence[SpotTrace | NodeTrace],
    job: JobSpec,
    window_h: float = 24.0,
    on_demand: Process | None = None,
    optimum_over: Ladder | Sequence[Tier] | None = None,
    pools: Mapping[str, SpotTrace | NodeTrace] | None = None,
    optimum_limit: int | None = None,
    optimum: bool = True,
) -> BacktestResult:
    """Replay the ladder, unchanged, from the start of every ``window_h`` window of each trace.

    Every spot tier runs on the trace (``world_for``), the others on ``on_demand`` (default:
    always there); a spot tier named in ``pools`` runs on its own trace instead, over the same
    hours as the window (another zone's or pool's history recorded beside the first), so a
    ladder of two spot pools meets each pool's own capacity. ``job.deadline_h`` is required:
    windows are judged by it, and the optimum is the cheapest schedule that meets it, on the
    tiers of ``optimum_over`` (default: the ladder's own, each on its trace). A ladder without
    a spot tier never touches the trace, so its own optimum is itself: give the spot and
    on-demand tiers it could have used to see what it leaves. ``optimum_limit`` bounds the
    optimum's search over all the windows (``optimum_for``'s ``limit``, shared out between the
    traces): past it, ``OptimumTooLargeError``. ``optimum=False`` leaves it out (``optimum`` and
    ``vs_optimum`` None): the replays alone take well under a second, the optimum of a long job
    on a large gang's node trace can take hours.
    """
    if not isinstance(job, JobSpec):
        raise TypeError(f"job: expected a JobSpec with a deadline_h, got {type(job).__name__} {job!r:.60}")
    if job.deadline_h is None:
        raise ValueError("a backtest needs the job's deadline (JobSpec.deadline_h)")
    if optimum_limit is not None and (isinstance(optimum_limit, bool) or not isinstance(optimum_limit, int)
                                      or optimum_limit < len(traces if isinstance(traces, Sequence) else [traces])):
        raise ValueError(f"optimum_limit must be a whole number of states, at least one per trace (None: no limit), "
                         f"got {optimum_limit!r}")
    if isinstance(traces, SpotTrace | NodeTrace | str | os.PathLike):
        raise ValueError("traces: expected a list of traces; give it as [trace]")
    if not traces:
        raise ValueError("give at least one trace")
    for i, trace in enumerate(traces):
        if problem := _not_a_trace(trace):
            raise ValueError(f"traces[{i}]: {problem}")
    lad = ladder.ladder if isinstance(ladder, FallbackPolicy) else make_ladder(ladder)
    best = lad if optimum_over is None else make_ladder(optimum_over)
    spot = {t.name: t for t in lad.tiers if t.is_spot}
    for name, pool in (pools or {}).items():
        if name not in spot:
            raise PoolError(name, f"{name!r} is not a spot tier of the ladder, so no trace applies to it; its spot tiers "
                                  f"are {', '.join(map(repr, spot)) or 'none'}")
        if problem := _not_a_trace(pool):
            raise PoolError(name, f"{name!r}: {problem}")
        try:
            compile_process(pool, spot[name].num_workers)  # e.g. a node trace too small for the tier's gang
        except ValueError as e:
            raise PoolError(name, f"{name!r}: {e}") from None
    check_spot_prices(lad)
    od_tier = on_demand_tier(lad)
    od_ladder = Ladder(tiers=(od_tier.model_copy(update={"climb_back": False}),))
    od_spend = float(simulate(od_ladder, job, [RateModel()], runs=1, engine="fast").spend[0])
    spot_workers = min((t.num_workers for t in lad.tiers if t.is_spot), default=1)
    windows = [window_starts(trace, window_h, spot_workers) for trace in traces]  # every trace's, before any replay
    names, starts, spend, wall, on_time, switches, finished, opt = [], [], [], [], [], [], [], []
    for trace, ws in zip(traces, windows, strict=True):
        world = world_for(lad, trace, on_demand, pools)
        res = simulate(ladder, job, world, runs=len(ws), start_h=ws, label=trace.name)
        if optimum:
            optima = optimum_for(best, job, world if best is lad else world_for(best, trace, on_demand, pools), ws,
                                 limit=None if optimum_limit is None else optimum_limit // len(traces))
            opt.append(np.array([o.spend for o in optima]))
        names += [trace.name] * len(ws)
        starts.append(ws)
        spend.append(res.spend)
        wall.append(res.wall_h)
        on_time.append(res.met_deadline())
        switches.append(res.switches)
        finished.append(res.finished)
    return BacktestResult(np.array(names), np.concatenate(starts), np.concatenate(spend), np.concatenate(wall),
                          np.concatenate(on_time), np.concatenate(switches), np.concatenate(finished), od_spend,
                          np.concatenate(opt) if optimum else None,
                          float(job.deadline_h), float(window_h))


__all__ = ["BacktestResult", "Spread", "backtest", "check_spot_prices", "on_demand_tier", "window_starts"]
