"""The hindsight optimum: the least a job could have spent on a recorded trace and still met its deadline.

Why: a ladder's spend means little until it is set against what was possible on the same
capacity. Knowing the whole trace, the optimum runs on a spot market only while it has the
gang's capacity, falls to on-demand, comes back, and restarts wherever that pays, so every
policy's spend can be read as a multiple of it (``spotfallback plan``, ``backtest``).

The job is the simulator's (``JobSpec``, a tier's ``price_per_hour``, the compiled traces of
``sim.world``): every start waits ``provisioning_delay_h`` (free) for a gang found in the
trace as the engines' ``acquire`` finds one, then pays the restart ``R`` (billed, no
progress); a spot gang runs until the trace's ``hit``; every hour is billed on the market it
ran on; a start on another Ray cluster than the session before it (a ladder across clusters)
pays the job's move, ``move_restart_h`` more restart and ``move_cost``, as in the engines.
Knowing when each gang will be stopped, the optimum writes one checkpoint (``delta``)
just before it stops and none in between: periodic checkpoints and preemption notices only
protect a run that cannot see ahead. Every run any policy makes is therefore one of its
schedules, or does no better than one (``tests/unit/test_sim_optimum.py`` checks that on
random traces), and its spend is a lower bound a ladder can approach but not beat. Elastic
gangs (fewer workers than the tier's ``num_workers``) are outside this model.

The search is a dynamic programme over the moments a gang is stopped by the trace (and, for
a ladder across clusters, the cluster it ran on, which prices the next start). At each
such moment it keeps the Pareto set of partial schedules by (spend − p·progress) for every
market price p, and progress plus the on-demand work that earlier on-demand sessions could
still absorb; one on-demand session between two spot sessions runs from the first stop to the
moment the next gang is looked for, and how much of it is used is decided at the end, once
the deadline says how much must be done before the last session. Pure: arrays in, numbers out.

What makes it fast (a 100-hour job's optimum in a few milliseconds per start) changes how
much it looks at, never what it answers (``tests/unit/test_optimum_search.py`` holds it to
the answers of the plain search it replaced, ties included): the moves of every point are
worked out once for all points; the Pareto sets come from sorting and prefix minima, not a
loop per level; a partial schedule whose lower bound (the rest of the work at the cheapest
price, the restarts of the fewest spot sessions that could hold it in the stretches of spot
capacity left, or on-demand's premium on what fewer could not) cannot beat the best schedule
so far is dropped as soon as it is made; a large search first keeps only a few states per
point, for a schedule near the optimum below which the full search looks; and a few simple
schedules tried first (the first gang that runs some hours, with or without an on-demand
session before it) set that best early, with a margin that keeps every schedule that could
tie with the answer. The rows sent on to a later point are pruned there as they pile up,
not only when the search reaches it, which holds a large search's memory to a few Pareto
sets per point (docs/planner.md, section 9). ``optimum_for`` spreads the searches of many
starts over processes where they would take more than about a second (``start_optima``
starts them there and lets the caller go on), and, given a
``limit``, stops a search that would take hours (``OptimumTooLargeError``) rather than
answer after them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotfallback.config import Ladder, make_ladder
from spotfallback.errors import OptimumTooLargeError
from spotfallback.sim.job import EPS, JobSpec
from spotfallback.sim.spread import Spread, available_cpus
from spotfallback.sim.world import Process, RateModel, TraceCapacity, compile_process

_TOL = 1e-9
_NO_BASE = np.zeros((1, 6))
# Simple schedules for a first upper bound: spot on the first gang that runs this many hours,
# with an on-demand session before it where that has this much room (inf: never).
_WALK_HOURS, _WALK_ROOM = (0.0, 1.0, 3.0, 8.0), (math.inf, 1.0, 4.0)
_UPPER_FROM = 8  # points; a smaller search is over before the bound would pay
_LARGE = 50_000  # states met by a search past which a narrow search first would pay
_BEAM = 16  # states kept at each point by that narrow search
# How long a search takes, counted in states met: each point it looks at costs about as much as
# this many states (its tables and bounds). The work the other starts' searches would do (the
# mean of _PROBES starts from across the list, times their number) from which spreading them
# over processes pays: about a second on one core, against about 0.5 s to start a process.
_POINT_WORK = 100
_PROBES = 4
_SHARE = 4  # under a limit, one start's search may use this many times its share of it
_SHARE_FLOOR = 50_000  # and at least this much
_SPREAD_FROM = 300_000
_SMALL = 96  # up to this many states, each pair is compared at once
_WAITING = 16_384  # rows waiting at a later point past which they are pruned there and then,
_WAITING_GROWTH = 8  # and this many times as many as were left the last time (fewer prunings of the same rows)
_TABLE = 1 << 15  # the largest levels x column-1 table ``_pareto3`` fills
_STRONG = 24  # kept rows each block of ``_pareto`` meets first


@dataclass(frozen=True)
class Optimum:
    """The cheapest schedule that finishes by the deadline: its spend and how it was made up.

    ``spend`` is inf (and the rest nan) when no schedule finishes by the deadline.
    """

    spend: float
    finish_h: float
    spot_h: float  # billed hours on spot markets
    on_demand_h: float  # billed hours on on-demand
    sessions: int  # gangs started

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.spend)


ANY_CLUSTER = -2  # on-demand on several clusters: no start there is counted as a move (a bound)
_NO_CLUSTER = -1  # before the first start: it is no move


@dataclass(frozen=True)
class Markets:
    """What the optimum may buy: capacity-gated markets (a compiled trace and a gang price each) and on-demand.

    ``clusters``: each gated market's Ray cluster, numbered (empty: all on one), and
    ``on_demand_cluster`` on-demand's, for a ladder across clusters: a start on another
    cluster than the last one's pays the job's move (``JobSpec.move_restart_h``, ``move_cost``).
    """

    gated: tuple[tuple[TraceCapacity, float], ...]
    on_demand_price: float | None  # None: no reliable market
    clusters: tuple[int, ...] = ()
    on_demand_cluster: int = 0

    def __post_init__(self) -> None:
        if not self.gated and self.on_demand_price is None:
            raise ValueError("markets: give at least one market (a gated one, or an on-demand price)")
        for i, price in enumerate([p for _, p in self.gated] + [self.on_demand_price]):
            if price is not None and (isinstance(price, bool) or not isinstance(price, int | float)
                                      or not 0 <= price < math.inf):
                where = f"gated[{i}]" if i < len(self.gated) else "on_demand_price"
                raise ValueError(f"markets: {where}: a price must be a finite number, 0 or more, got {price!r}")
        if self.clusters and len(self.clusters) != len(self.gated):
            raise ValueError(f"clusters gives {len(self.clusters)} cluster(s) for {len(self.gated)} gated market(s)")

    def as_data(self) -> dict[str, Any]:
        """Plain data that ``from_data`` reads back to equal markets: for another process."""
        gated = [{"name": c.name, "gap_h": c.gap_h, "ok": c.ok.tolist(), "next_ok": c.next_ok.tolist(),
                  "hit_h": c.hit_h.tolist(), "price": price} for c, price in self.gated]
        return {"gated": gated, "on_demand_price": self.on_demand_price, "clusters": list(self.clusters),
                "on_demand_cluster": self.on_demand_cluster}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Markets:
        """The markets ``as_data`` wrote."""
        gated = tuple((TraceCapacity(g["name"], g["gap_h"], np.array(g["ok"], dtype=bool),
                                     np.array(g["next_ok"], dtype=np.int64), np.array(g["hit_h"], dtype=float)),
                       g["price"]) for g in data["gated"])
        return cls(gated, data["on_demand_price"], tuple(data["clusters"]), data["on_demand_cluster"])

    @classmethod
    def of(cls, ladder: Ladder | Sequence[object], world: Sequence[Process]) -> Markets:
        """The ladder's tiers as markets: a tier on a trace is gated, one on a rate model without losses is on-demand.

        On-demand is the cheapest reliable tier; when reliable tiers lie on several clusters,
        a start on on-demand is never counted as a move, so the optimum stays a lower bound.
        """
        lad = make_ladder(ladder)
        if len(world) != len(lad):
            raise ValueError(f"world has {len(world)} processes for {len(lad)} tiers; give one per tier")
        number = {key: n for n, key in enumerate(lad.cluster_keys)}
        gated: list[tuple[TraceCapacity, float]] = []
        clusters: list[int] = []
        reliable: list[tuple[float, int]] = []
        for i, (tier, process) in enumerate(zip(lad.tiers, world, strict=True)):
            proc = compile_process(process, tier.num_workers)
            if isinstance(proc, TraceCapacity):
                gated.append((proc, tier.price_per_hour()))
                clusters.append(number[lad.cluster_key(i)])
            elif isinstance(proc, RateModel) and proc == RateModel():
                reliable.append((tier.price_per_hour(), number[lad.cluster_key(i)]))
            else:
                raise ValueError(
                    f"tier {tier.name!r}: the hindsight optimum needs a recorded trace or a reliable pool, "
                    f"not {type(process).__name__} with random interruptions"
                )
        od_clusters = {c for _, c in reliable}
        return cls(tuple(gated), min(p for p, _ in reliable) if reliable else None, tuple(clusters),
                   od_clusters.pop() if len(od_clusters) == 1 else ANY_CLUSTER)


def optimum_for(ladder: Ladder | Sequence[object], job: JobSpec, world: Sequence[Process],
                starts_h: Sequence[float] | np.ndarray, *, processes: int | None = None,
                limit: int | None = None) -> list[Optimum]:
    """The optimum of ``job`` on the ladder's markets, starting at each of ``starts_h`` (hours into the traces).

    Each distinct start is searched once. Where a few searches first show that the rest would
    take more than about a second on one core (``_SPREAD_FROM``), they are spread over
    ``processes`` processes (``sim.spread``; default: the CPUs this process may use; 1
    searches them all here). The answers are the same either way.

    ``limit`` bounds the search, in states met (each point looked at counting as
    ``_POINT_WORK``): all the starts together may use about that much, each at most
    ``_SHARE`` times its share (and at least ``_SHARE_FLOOR``), or ``OptimumTooLargeError``
    says how large it is. The search grows with the gang's interruptions before the
    deadline (long jobs on a node trace's large gangs, above all), and no answer is better
    than one after hours.
    """
    with start_optima(ladder, job, world, starts_h, processes=processes, limit=limit) as pending:
        return pending.result()


class PendingOptima:
    """Optima whose searches are under way (``start_optima``): ``result`` answers them, ``close`` stops them."""

    def __init__(self, starts: list[float], found: dict[float, Optimum], rest: list[float],
                 work: Spread[float, list[float] | None] | None, searches: Callable[[], list[Optimum | None]],
                 too_large: OptimumTooLargeError):
        self._starts, self._found, self._rest, self._work = starts, found, rest, work
        self._searches, self._too_large = searches, too_large

    def result(self) -> list[Optimum]:
        """The optimum at each start, in their order; ``OptimumTooLargeError`` where a search passed its share."""
        answers: list[Optimum | None]
        if self._work is None:
            answers = self._searches()
        else:
            answers = [None if a is None else Optimum(a[0], a[1], a[2], a[3], int(a[4])) for a in self._work.result()]
        for s, a in zip(self._rest, answers, strict=True):
            if a is None:
                raise self._too_large
            self._found[s] = a
        return [self._found[s] for s in self._starts]

    def close(self) -> None:
        """Stop the searches still running in other processes."""
        if self._work is not None:
            self._work.close()

    def __enter__(self) -> PendingOptima:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_optima(ladder: Ladder | Sequence[object], job: JobSpec, world: Sequence[Process],
                 starts_h: Sequence[float] | np.ndarray, *, processes: int | None = None, limit: int | None = None,
                 background: bool = False) -> PendingOptima:
    """``optimum_for``'s searches, started; its ``result`` answers them.

    With ``background``, searches spread over other processes start at once and this process
    takes no share, so that it can do other work beside them: ``plan`` simulates its
    candidates while its optimum is searched. A few searches run here first, so a search too
    large for ``limit`` raises ``OptimumTooLargeError`` now, or from ``result``.
    """
    if processes is not None and processes < 1:
        raise ValueError(f"processes must be at least 1, not {processes}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a whole number of states of at least 1 (None: no limit), got {limit!r}")
    job, markets = _with_deadline(job), Markets.of(ladder, world)
    starts = _checked_starts(starts_h)
    distinct = list(dict.fromkeys(starts))
    each = None if limit is None or not distinct else min(limit, max(_SHARE * limit // len(distinct), _SHARE_FLOOR))
    too_large = OptimumTooLargeError(
        f"the hindsight optimum's search is too large: one start's search (the states it met, or the cells of its "
        f"tables) passed {each or 0:,}, its share of the limit of {limit or 0:,} for {len(distinct)} start(s). "
        f"{_IN_REACH}")
    # A few starts from across the list first: how long they took says what spreading the rest would save.
    probe = np.unique(np.linspace(0, len(distinct) - 1, min(_PROBES, len(distinct))).round().astype(int)).tolist()
    searches = [_Search(job, markets, distinct[i], each) for i in probe]
    found: dict[float, Optimum] = {}
    for se in searches:
        o = se.run()
        if o is None:
            raise too_large
        found[se.t0] = o
    rest = [s for s in distinct if s not in found]
    done = sum(se.work for se in searches)
    work = done / max(len(searches), 1) * len(rest)
    if limit is not None and done + work > limit:
        raise OptimumTooLargeError(f"the hindsight optimum's search is too large: about {done + work:,.0f} states for "
                                   f"{len(distinct)} start(s), past the limit of {limit:,}. {_IN_REACH}")
    # No more processes than the CPUs, nor than would each get about a second of the work.
    n = min(available_cpus() if processes is None else processes, 1 + int(work // _SPREAD_FROM))
    spreading = None
    if n > 1:
        shared = {"job": job.model_dump(), "markets": markets.as_data(), "each": each}
        spreading = Spread(_optima_at, shared, rest, n, caller_share=not background)

    def here() -> list[Optimum | None]:
        return [_Search(job, markets, s, each).run() for s in rest]

    return PendingOptima(starts, found, rest, spreading, here, too_large)


_IN_REACH = ("It grows with the gang's interruptions before the deadline: a shorter job or deadline, a smaller gang "
             "or fewer starts keep it in reach")


def _optima_at(shared: dict[str, Any], starts_h: list[float]) -> list[list[float] | None]:
    """The optimum's fields at each start, job and markets as plain data (``spread``'s terms); None where
    the search passed its limit."""
    job, markets = JobSpec.model_validate(shared["job"]), Markets.from_data(shared["markets"])
    found = (_Search(job, markets, s, shared["each"]).run() for s in starts_h)
    return [None if o is None else list(dataclasses.astuple(o)) for o in found]


def hindsight_optimum(job: JobSpec, markets: Markets, start_h: float = 0.0) -> Optimum:
    """The least spend that finishes ``job`` by its deadline, starting ``start_h`` hours into the traces.

    ``markets``: ``Markets.of(ladder, world)``, the ladder's tiers on their processes (``world_for``);
    ``optimum_for`` takes the ladder and world themselves, and many starts.
    """
    if not isinstance(markets, Markets):
        raise TypeError(f"markets: expected Markets.of(ladder, world), got {type(markets).__name__} {markets!r:.60}; "
                        "or call optimum_for(ladder, job, world, [start_h])")
    o = _Search(_with_deadline(job), markets, _checked_starts([start_h])[0]).run()
    assert o is not None  # only a limit stops a search short
    return o


def _checked_starts(starts_h: Sequence[float] | np.ndarray) -> list[float]:
    """Starts as ``simulate`` takes them: hours into the traces, finite and not negative."""
    starts = np.asarray(starts_h, dtype=float).ravel()
    if not np.isfinite(starts).all() or (starts < 0).any():
        raise ValueError("start_h must be finite and >= 0")
    return starts.tolist()


def _with_deadline(job: JobSpec) -> JobSpec:
    if job.deadline_h is None:
        raise ValueError("the hindsight optimum needs a deadline (JobSpec.deadline_h)")
    return job


# ---------------------------------------------------------------------------------------


@dataclass
class _Groups:
    """Stretches where a gang can be acquired and is then stopped at the same time, relative to the start."""

    market: np.ndarray  # index into Markets.gated
    s: np.ndarray  # first moment of the stretch
    end: np.ndarray  # an acquisition must fall before this
    first_tick: np.ndarray  # absolute ticks of the stretch, to check an acquisition lands in it
    last_tick: np.ndarray
    hit: np.ndarray  # when a gang acquired in the stretch is stopped (inf: never)
    price: np.ndarray


def _groups(markets: Markets, t0: float, horizon: float) -> _Groups:
    parts: list[tuple[np.ndarray, ...]] = []
    for m, (cap, price) in enumerate(markets.gated):
        g = cap.gap_h
        j0 = int(math.floor(t0 / g + EPS))
        j1 = int(math.floor((t0 + horizon) / g + EPS))
        ticks = np.arange(j0, j1 + 1)
        ok = cap.ok[ticks % cap.length]
        hit = (ticks // cap.length) * cap.period_h + cap.hit_h[ticks % cap.length]
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            continue
        # A new group wherever the ok run breaks or the stop time changes.
        brk = np.ones(idx.size, dtype=bool)
        brk[1:] = (np.diff(idx) != 1) | (hit[idx[1:]] != hit[idx[:-1]])
        first = np.flatnonzero(brk)
        last = np.append(first[1:] - 1, idx.size - 1)
        ft, lt = ticks[idx[first]], ticks[idx[last]]
        parts.append((np.full(first.size, m), np.maximum(ft * g - t0, 0.0), (lt + 1) * g - t0, ft, lt,
                      hit[idx[first]] - t0, np.full(first.size, price, dtype=float)))
    if not parts:
        e = np.empty(0)
        return _Groups(e.astype(np.int64), e, e, e.astype(np.int64), e.astype(np.int64), e, e)
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    order = np.argsort(cols[1], kind="stable")
    return _Groups(*(c[order] for c in cols))


@dataclass
class _Moves:
    """Every gang a run idle at a point can get next, for all points at once (``_Search._moves``).

    Rows by point, then block (the gang straight away; after an on-demand session), then
    group: point i's rows are ``lo[i]:hi[i]``, its second block from ``mid[i]``.
    """

    base: np.ndarray  # what the move adds to a state before the gang: an on-demand session's and moves' costs, or zeros
    extra: np.ndarray  # the gang's restart beyond R: a move's (JobSpec.move_restart_h), or 0
    a: np.ndarray  # when the gang is acquired
    hit: np.ndarray  # when the trace stops it
    price: np.ndarray
    group: np.ndarray
    lo: list[int]
    mid: list[int]
    hi: list[int]


@dataclass
class _Tables:
    """Everything the search does per point that does not depend on the states, worked out once."""

    times: np.ndarray
    clusters: np.ndarray  # per point: the cluster of the session that ended there
    moves: _Moves
    # Finishing: the moves whose gang starts work before its stop and the deadline, point i's
    # rows f_lo[i]:f_hi[i] (straight away up to f_mid[i]).
    f_base: np.ndarray
    f_a: np.ndarray
    f_end: np.ndarray
    f_price: np.ndarray
    f_extra: np.ndarray
    f_lo: list[int]
    f_mid: list[int]
    f_hi: list[int]
    # Going on: the moves whose gang the trace stops before the deadline, sorted by point, then
    # target point (each in move order): what each adds to a state, its target; point i's rows
    # o_lo[i]:o_lo[i + 1], and each run of one target o_cut[r]:o_cut[r + 1].
    o_add: np.ndarray
    o_row: np.ndarray  # per row: its target point, as a column
    o_lo: list[int]
    o_cut: list[int]
    o_target: list[int]  # per run
    on: np.ndarray  # per move: whether it goes on
    add: np.ndarray  # per move
    target: np.ndarray  # per move


class _Search:
    """The dynamic programme for one start; see the module docstring."""

    def __init__(self, job: JobSpec, markets: Markets, t0: float, limit: int | None = None):
        self.W, self.D = job.work_h, float(job.deadline_h or 0.0)
        self.R, self.delta, self.prov = job.restart_overhead_h, job.checkpoint_cost_h, job.provisioning_delay_h
        self.markets, self.t0 = markets, t0
        # Moves between clusters: without a price, every market counts as one cluster (the same points).
        self.move_h, self.move_cost = job.move_restart_h, job.move_cost
        priced = (self.move_h > 0 or self.move_cost > 0) and bool(markets.clusters)
        self.market_cluster = np.array(markets.clusters if priced else [0] * len(markets.gated), dtype=np.int64)
        self.od_cluster = markets.on_demand_cluster if priced else 0
        self.p_od = math.inf if markets.on_demand_price is None else markets.on_demand_price
        self.has_od = markets.on_demand_price is not None
        self.groups = _groups(markets, t0, self.D)
        self.prices = sorted({float(p) for _, p in markets.gated} | ({self.p_od} if self.has_od else set()))
        self.best = Optimum(math.inf, math.nan, math.nan, math.nan, 0)
        # The spend of a schedule known to exist (``_upper``): states that cannot come within a
        # margin of it are dropped (``_limit``). Only ``best`` is ever reported, and the margin
        # keeps every schedule that could still become it, so the answer is the same without.
        self.upper = math.inf
        # States met by every search so far, and _POINT_WORK per point: how long it took (or, for tables
        # too large to build, their cells).
        self.work = 0
        self.limit = limit  # past this much work, the search stops and answers None

    @property
    def over(self) -> bool:
        """Whether the search has passed its ``limit`` (and so answers None)."""
        return self.limit is not None and self.work > self.limit

    # -- where a gang can be had ------------------------------------------------------------

    def _acquire(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(look time, acquisition time) per time in the column ``t`` and group; nan where it cannot get that group.

        As ``draws.acquire``: look from a moment with capacity, get the gang ``prov`` later if
        there is capacity then; the earliest look that lands in the group.
        """
        gr = self.groups
        look = np.full((t.shape[0], gr.s.size), np.nan)
        for m, (cap, _) in enumerate(self.markets.gated):
            sel = gr.market == m
            if sel.any():
                x = np.maximum(t, gr.s[sel] - self.prov)
                look[:, sel] = cap.next_available(self.t0 + x) - self.t0
        acq = look + self.prov
        with np.errstate(invalid="ignore"):
            tick = np.floor((self.t0 + np.where(np.isfinite(acq), acq, 0.0)) / self._gap() + EPS)
            ok = np.isfinite(acq) & (tick >= self.groups.first_tick) & (tick <= self.groups.last_tick)
        return np.where(ok, look, np.nan), np.where(ok, acq, np.nan)

    def _moved(self, before: np.ndarray | int, after: np.ndarray | int) -> np.ndarray:
        """Whether a start on cluster ``after`` after a session on ``before`` is a move (0 or 1, broadcast)."""
        b, a = np.asarray(before), np.asarray(after)
        return ((b >= 0) & (a >= 0) & (b != a)).astype(float)

    def _gap(self) -> np.ndarray:
        gaps = np.array([cap.gap_h for cap, _ in self.markets.gated])
        return gaps[self.groups.market]

    def _moves(self, times: np.ndarray, clusters: np.ndarray) -> _Moves:
        """For each point, the gangs a run idle since then can get, straight away and after an on-demand session.

        The on-demand session runs from the point to the moment the gang is looked for; it is
        a move only where that leaves it room for work. A start on another cluster than the
        session before it (``clusters``: the point's) pays the move's restart and cost.
        """
        R, d, prov, gr = self.R, self.delta, self.prov, self.groups
        look, acq = self._acquire(times[:, None])
        usable = np.isfinite(acq)
        blocks = [usable]
        room = np.zeros_like(acq)
        gang_cluster = self.market_cluster[gr.market]
        into_od = self._moved(clusters, self.od_cluster)  # per point
        if self.has_od:
            with np.errstate(invalid="ignore"):
                # The on-demand session's room for work.
                room = look - (times[:, None] + prov) - R - d - (self.move_h * into_od)[:, None]
            blocks.append(usable & (room > _TOL))
        point, block, g = np.nonzero(np.stack(blocks, axis=1))
        base = np.zeros((point.size, 6))
        od = block == 1
        out_of_od = self._moved(self.od_cluster, gang_cluster[g])
        moves = np.where(od, into_od[point] + out_of_od, self._moved(clusters[point], gang_cluster[g]))
        base[:, 1] = self.move_cost * moves
        base[od, 1] += self.p_od * (R + d + self.move_h * into_od[point[od]])
        base[od, 2] = room[point[od], g[od]]
        base[od, 4] = R + d + self.move_h * into_od[point[od]]
        base[od, 5] = 1.0
        extra = self.move_h * np.where(od, out_of_od, moves)
        each = np.arange(times.size)
        lo = np.searchsorted(point, each)
        mid = lo + np.bincount(point[~od], minlength=times.size)
        hi = np.searchsorted(point, each, side="right")
        return _Moves(base, extra, acq[point, g], gr.hit[g], gr.price[g], g, lo.tolist(), mid.tolist(), hi.tolist())

    def _tables(self, times: np.ndarray, clusters: np.ndarray) -> _Tables:
        """The moves of every point, split into those that can finish the job and those that go on to a point.

        Points are (time, cluster) pairs, sorted by time then cluster, each once.
        """
        D, R, d = self.D, self.R, self.delta
        mv = self._moves(times, clusters)
        end = np.minimum(mv.hit, D)
        fits = mv.a + R + mv.extra < end - _TOL  # the gang starts work before its stop and the deadline
        f = np.flatnonzero(fits)
        f_at = np.concatenate([[0], np.cumsum(fits)]).tolist()  # move -> first finishing row at or after it
        # Gangs stopped by the trace before the deadline, after more than their restart and write.
        span = mv.hit - mv.a
        on = np.isfinite(mv.hit) & (mv.hit < D) & (R + mv.extra + d + _TOL < span)
        gain = span - R - mv.extra - d
        add = mv.base.copy()
        add[:, 0] += gain
        add[:, 1] += np.multiply(mv.price, span, out=np.zeros_like(span), where=mv.price != 0)  # free spot: 0, not 0 x inf
        add[:, 2] += gain
        add[:, 3] += span
        add[:, 5] += 1
        point = np.repeat(np.arange(times.size), np.subtract(mv.hi, mv.lo))
        target = _point_index(times, clusters, mv.hit, self.market_cluster[self.groups.market[mv.group]])
        order = np.lexsort((target, point))  # by point, then target, each in move order
        o = order[on[order]]
        o_point, o_target = point[o], target[o]
        run = np.flatnonzero((np.diff(o_point) != 0) | (np.diff(o_target) != 0)) + 1
        o_cut = np.concatenate([[0], run, [o.size]]).astype(np.int64) if o.size else np.zeros(1, dtype=np.int64)
        return _Tables(
            times, clusters, mv, mv.base[f], mv.a[f], end[f], mv.price[f], mv.extra[f],
            [f_at[j] for j in mv.lo], [f_at[j] for j in mv.mid], [f_at[j] for j in mv.hi],
            add[o], o_target[:, None], np.searchsorted(o_point, np.arange(times.size + 1)).tolist(),
            o_cut.tolist(), o_target[o_cut[:-1]].tolist(), on, add, target,
        )

    # -- the programme ------------------------------------------------------------------------

    def run(self) -> Optimum | None:
        """The optimum; None once the search has passed ``limit``."""
        D, gr = self.D, self.groups
        stops = np.isfinite(gr.hit) & (gr.hit < D)
        points = np.unique(np.stack([np.concatenate([[0.0], gr.hit[stops]]),
                                     np.concatenate([[_NO_CLUSTER], self.market_cluster[gr.market[stops]]])], axis=1), axis=0)
        times, clusters = points[:, 0].copy(), points[:, 1].astype(np.int64)
        # The tables hold a move per point and gang that could be had after it: past the limit alone
        # (a deadline of thousands of hours over a repeating trace), they would not fit in memory.
        if self.limit is not None and times.size * gr.s.size > self.limit:
            self.work = max(self.work, times.size * gr.s.size)
            return None
        self.times = times  # the points' times, by which caps (and so _bound's rows) are indexed
        self.caps = self._spot_caps(times)
        self.terms = self._bound_terms(self.caps)
        self.cap_keys = (self.caps + np.arange(times.size)[:, None] * (self.W + 2.0)).ravel()
        tb = self._tables(times, clusters)
        self._greedy(tb)  # a good schedule first, so that states that cannot beat it are dropped at once
        if times.size < _UPPER_FROM:
            return self._search(tb)
        self.upper = upper = min(self.upper, self._upper(tb))
        first = self.best
        found = self._search(tb, give_up=_LARGE)
        if found is not None or self.over:
            return found
        # A large search: a narrow one (the few states at each point that look best) finds a
        # schedule near the optimum, and the full search, again, drops every state that cannot
        # come near it. Each starts from the greedy schedule, so that the full one answers
        # what it would have answered alone, ties included.
        self.best = first
        narrow = self._search(tb, beam=_BEAM)
        if narrow is None:
            return None
        upper = min(upper, narrow.spend)
        self.best, self.upper = first, upper
        return self._search(tb)

    def _search(self, tb: _Tables, *, beam: int | None = None, give_up: int | None = None) -> Optimum | None:
        """The programme from the start, dropping states that cannot come within a margin of ``upper``;
        with ``beam``, keeping at most that many states at each point, those of least bound; None once it
        has met more than ``give_up`` states, or once ``work`` has passed ``limit`` (``over``)."""
        W, times, clusters = self.W, tb.times, tb.clusters
        # Candidates per point: P, C, Q (progress plus what earlier on-demand could still absorb,
        # at most W), and the tallies spot_h, od_h, sessions.
        pending: list[list[np.ndarray]] = [[] for _ in times]
        pending[0].append(np.zeros((1, 6)))
        # Rows waiting at each point, and how many were left the last time they were pruned there.
        waiting, kept = [0] * times.size, [0] * times.size
        run_at = 0  # the first run of moves of one target not yet done (tb.o_cut)
        met = 0
        for i, t in enumerate(times.tolist()):
            if not pending[i]:
                continue
            st = np.concatenate(pending[i]) if len(pending[i]) > 1 else pending[i][0]
            pending[i] = []
            met += len(st)
            self.work += len(st) + _POINT_WORK
            if self.over:
                return None
            if give_up is not None and met > give_up:
                return None
            st = self._pruned_at(st, i)
            if len(st) == 0:
                continue
            if beam is not None and len(st) > beam:
                st = st[np.sort(np.argsort(self._bound(st, i), kind="stable")[:beam])]
            self._final_on_demand(t, int(clusters[i]), st)
            lo, mid, hi = tb.f_lo[i], tb.f_mid[i], tb.f_hi[i]
            if hi > lo:
                self._finals(st, tb.f_base[lo:hi], tb.f_a[lo:hi], tb.f_end[lo:hi], tb.f_price[lo:hi], tb.f_extra[lo:hi],
                             (0, mid - lo, hi - lo))
            lo, hi = tb.o_lo[i], tb.o_lo[i + 1]
            if hi == lo:
                continue
            new = tb.o_add[lo:hi, None, :] + st[None, :, :]  # moves x states
            new[..., 2] = np.minimum(new[..., 2], W)
            # Finishing inside the group is a final; a state the bound already rules out is
            # dropped here, as it would be at its point (the limit only falls).
            live = new[..., 0] < W - _TOL
            live &= self._bound(new, tb.o_row[lo:hi]) < self._limit() - _TOL
            rows = new[live]  # by move, then state: the order they join their points in
            if len(rows) == 0:
                continue
            ends = np.cumsum(np.count_nonzero(live, axis=1)).tolist()
            while tb.o_cut[run_at] < lo:
                run_at += 1
            start = 0
            while tb.o_cut[run_at] < hi:
                stop = ends[tb.o_cut[run_at + 1] - lo - 1]
                if stop > start:
                    j = tb.o_target[run_at]
                    pending[j].append(rows[start:stop])
                    waiting[j] += stop - start
                    if waiting[j] > max(_WAITING, _WAITING_GROWTH * kept[j]):
                        # Prune the rows waiting at a later point now, as it would: their Pareto set is what
                        # its own pruning keeps of them, and it holds the memory to a few sets per point.
                        met += waiting[j]
                        self.work += waiting[j]
                        w = self._pruned_at(np.concatenate(pending[j]), j)
                        pending[j] = [w] if len(w) else []
                        waiting[j] = kept[j] = len(w)
                start = stop
                run_at += 1
        return self.best

    def _pruned_at(self, st: np.ndarray, point: int) -> np.ndarray:
        """What the search keeps of the states at a point: those the bound does not rule out, pruned."""
        return self._prune(st[self._bound(st, point) < self._limit() - _TOL])

    def _limit(self) -> float:
        """States whose bound is not below this (less _TOL) cannot lead to the reported optimum."""
        return min(self.best.spend, self.upper + 1e-6 * (1.0 + abs(self.upper)))

    def _upper(self, tb: _Tables) -> float:
        """The least spend of a few simple schedules: each time the first gang that runs some hours, with or without
        an on-demand session before it, finishing wherever that is cheapest.

        Each is one of the search's schedules, so the search cannot end above it; it only
        lets the search drop states early (``_limit``).
        """
        W, mv, times = self.W, tb.moves, tb.times
        n, T = mv.a.size, times.size
        if n == 0:
            return math.inf
        point = np.repeat(np.arange(T), np.subtract(mv.hi, mv.lo))
        second = np.arange(n) >= np.repeat(mv.mid, np.subtract(mv.hi, mv.lo))
        # Per move without on-demand: the same gang after an on-demand session (-1: none), and its room.
        key = point * (int(mv.group.max()) + 1) + mv.group
        od = np.flatnonzero(second & tb.on)
        at = np.minimum(np.searchsorted(key[od], key), od.size - 1)
        with_od = np.where(key[od[at]] == key, od[at], -1) if od.size else np.full(n, -1)
        room = np.where(with_od >= 0, mv.base[with_od, 2], -np.inf)
        span = mv.hit - mv.a
        target = tb.target.tolist()
        walks: list[np.ndarray] = [np.zeros((1, 6))]
        ends: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        for least in _WALK_HOURS:
            cand = np.flatnonzero(~second & tb.on & (span >= least))
            first = np.full(T, -1)
            pts, pos = np.unique(point[cand], return_index=True)
            first[pts] = cand[pos]
            for min_room in _WALK_ROOM:
                pick = np.where((first >= 0) & (room[first] >= min_room), with_od[first], first).tolist()
                path, i = [], 0
                while pick[i] >= 0:
                    path.append(pick[i])
                    i = target[pick[i]]
                walks.append(np.cumsum(tb.add[path], axis=0))  # the state after each move
                ends.append(tb.target[path])
        sts = np.concatenate(walks)
        pts = np.concatenate(ends)
        sts[:, 2] = np.minimum(sts[:, 2], W)
        # Up to the first move that would finish inside its gang (such a move is a final instead).
        over = sts[:, 0] >= W - _TOL
        sizes = [len(w) for w in walks]
        before = np.repeat(np.concatenate([[0], np.cumsum(over)])[np.cumsum([0, *sizes[:-1]])], sizes)
        keep = np.cumsum(over) - before == 0
        sts, pts = sts[keep], pts[keep]
        best = math.inf
        if self.has_od:  # on-demand from the point
            rem = W - sts[:, 0]
            moved = self._moved(tb.clusters[pts], self.od_cluster)
            restart = self.R + self.move_h * moved
            need = np.maximum(times[pts] + self.prov + restart + rem - self.D, 0.0)
            ok = (need <= sts[:, 2] - sts[:, 0] + _TOL) & (need <= rem + _TOL)
            if ok.any():
                best = float((sts[ok, 1] + self.move_cost * moved[ok] + self.p_od * (restart[ok] + rem[ok])).min())
        lo = np.asarray(tb.f_lo)[pts]
        k = np.asarray(tb.f_hi)[pts] - lo
        if k.sum():  # a gang from the point
            which = np.repeat(np.arange(pts.size), k)
            rows = np.repeat(lo - np.cumsum(k) + k, k) + np.arange(int(k.sum()))
            cost = self._final_cost(sts[which], tb.f_base[rows], tb.f_a[rows], tb.f_end[rows], tb.f_price[rows],
                                    tb.f_extra[rows])[0]
            best = min(best, float(cost.min()))
        return best

    def _spot_caps(self, times: np.ndarray) -> np.ndarray:
        """Per point, at most how much work k spot sessions can still do after it before the deadline, for
        k = 0, 1, ...: a row rising with k (up to ``W``: all the work), then ``W + 1`` from the first k that
        would add none.

        Sessions fall in the stretches with spot capacity, each paying a restart and all but
        one a checkpoint write, so the k longest stretches, less k restarts and k − 1 writes,
        hold the most (several sessions in one stretch hold less).
        """
        gr = self.groups
        if gr.s.size == 0:
            return np.zeros((times.size, 1))
        lo, hi = gr.s, np.minimum(gr.hit, self.D)
        merged: list[list[float]] = []
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):  # sorted by start
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        m = np.array(merged)
        span = np.maximum(m[None, :, 1] - np.maximum(m[None, :, 0], times[:, None]), 0.0)
        span = -np.sort(-span, axis=1)  # longest first
        gain = span - self.R - self.delta
        gain[:, 0] += self.delta
        caps = np.concatenate([np.zeros((times.size, 1)), np.cumsum(gain, axis=1)], axis=1)
        adds = np.concatenate([np.ones((times.size, 1), dtype=bool), gain > _TOL], axis=1)
        return np.where(np.logical_and.accumulate(adds, axis=1), np.minimum(caps, self.W), self.W + 1.0)

    def _bound_terms(self, caps: np.ndarray) -> np.ndarray:
        """Per point and k (as ``caps``), the least of a spend that is independent of the work left, over
        the ways to finish with fewer than k + 1 spot sessions and the rest on on-demand (``_bound``)."""
        if not self.has_od:
            return np.full(caps.shape, np.inf)
        p_min = min(self.prices)
        k = np.arange(caps.shape[1])
        # k spot sessions (their restarts and writes) and on-demand's premium over what they cannot hold.
        a = p_min * (k * self.R + np.maximum(k - 1, 0) * self.delta) - (self.p_od - p_min) * caps
        a[:, 0] = self.p_od * self.R  # no spot session: the last start is on on-demand
        a[caps > self.W] = np.inf
        return np.minimum.accumulate(a, axis=1)

    def _bound(self, st: np.ndarray, rows: int | np.ndarray) -> np.ndarray:
        """The least any schedule from these states (at points ``rows``, broadcast) can spend.

        Every finish starts at least one more session. With k spot sessions, the work they
        cannot hold (``_spot_caps``) is done on on-demand, so the spend is at least the work
        left at the cheapest price, k restarts and k − 1 writes at that price, and on-demand's
        premium on the rest; the least over k. With no spot session the last start is on
        on-demand and pays its restart there (work absorbed by an earlier on-demand session
        needs none).
        """
        W, width = self.W, self.caps.shape[1]
        rem = W - st[..., 0]
        row = np.broadcast_to(np.asarray(rows), rem.shape)
        # The fewest spot sessions that could hold the work left: the caps below it, counted with
        # room for rounding so that the count is never too high.
        if np.ndim(rows) == 0:
            k = np.searchsorted(self.caps[int(rows)], rem - 1e-7)
        else:  # one search over every row's caps, each row's shifted past the one before
            key = (row * (W + 2.0) + rem - 1e-7).ravel()
            k = (np.searchsorted(self.cap_keys, key) - row.ravel() * width).reshape(rem.shape)
        k = np.maximum(k, 1)
        held = (k < width) & (self.caps[row, np.minimum(k, width - 1)] <= W)
        p_min = min(self.prices)
        on_spot = np.where(held, p_min * (rem + k * self.R + (k - 1) * self.delta), np.inf)
        if not self.has_od:
            return st[..., 1] + on_spot
        return st[..., 1] + np.minimum(on_spot, self.terms[row, k - 1] + self.p_od * rem)

    def _greedy(self, tb: _Tables) -> None:
        """Spot whenever a gang can be had, finishing on spot or on-demand wherever that is cheapest: an upper bound."""
        W, mv = self.W, tb.moves
        i, st = 0, np.zeros((1, 6))
        while True:
            self._final_on_demand(float(tb.times[i]), int(tb.clusters[i]), st)
            if mv.lo[i] == mv.mid[i]:
                return
            lo, mid = tb.f_lo[i], tb.f_mid[i]
            if mid > lo:
                self._finals(st, tb.f_base[lo:mid], tb.f_a[lo:mid], tb.f_end[lo:mid], tb.f_price[lo:mid], tb.f_extra[lo:mid],
                             (0, mid - lo))
            k = mv.lo[i]
            if not tb.on[k]:  # the trace stops the gang before the deadline, after its restart and write
                return
            if st[0, 0] + tb.add[k, 0] >= W - _TOL:
                return
            st = st + tb.add[k]
            i = int(tb.target[k])

    def _prune(self, st: np.ndarray) -> np.ndarray:
        """The states no other state beats on every future: spend − p·progress for each price, and Q.

        Rows equal to 9 decimals count once (the first); the rest come back in the order of
        their criteria, lowest first.
        """
        if len(st) <= 1:
            return st
        crit = np.stack([st[:, 1] - p * st[:, 0] for p in self.prices] + [-st[:, 2]], axis=1)
        crit, first = _distinct_rows(np.round(crit, 9))
        small = len(crit) <= _SMALL
        return st[first[_pareto3(crit) if crit.shape[1] == 3 and not small else _pareto(crit)]]

    def _consider(self, cost: np.ndarray, row: int, col: int, rows: np.ndarray, base: np.ndarray,
                  finish: float, extra_od: float, last_spot: float, last_od: float) -> None:
        """Take the schedule that ends at ``cost[row, col]``, the least (the first of equals) of ``cost``, if it is the best yet.

        ``cost`` holds inf where a schedule does not finish in time; the tallies are those of
        ``rows[row] + base[col]`` and the last session's hours.
        """
        if cost[row, col] < self.best.spend - _TOL:
            r = rows[row] + base[col]
            self.best = Optimum(float(cost[row, col]), float(finish), float(r[3] + last_spot),
                                float(r[4] + extra_od + last_od), int(r[5]) + 1)

    def _final_on_demand(self, t: float, cluster: int, st: np.ndarray) -> None:
        """Finish on on-demand from ``t`` (after a session on ``cluster``); earlier on-demand sessions take
        what the deadline needs."""
        if not self.has_od:
            return
        W, D, prov = self.W, self.D, self.prov
        moved = float(self._moved(cluster, self.od_cluster))
        R = self.R + self.move_h * moved
        rem = W - st[:, 0]
        need = np.maximum(t + prov + R + rem - D, 0.0)
        ok = (need <= st[:, 2] - st[:, 0] + _TOL) & (need <= rem + _TOL)
        cost = np.where(ok, st[:, 1] + self.move_cost * moved + self.p_od * (R + rem), np.inf)
        i = int(np.argmin(cost))
        if ok[i]:
            self._consider(cost[:, None], i, 0, st, _NO_BASE, t + prov + R + rem[i] - need[i], need[i], 0.0,
                           R + rem[i] - need[i])

    def _final_cost(self, st: np.ndarray, b: np.ndarray, a: np.ndarray, end: np.ndarray, price: np.ndarray,
                    extra: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Finish on a gang acquired at ``a`` (it starts work before ``end``: its stop or the deadline), on-demand
        sessions before it taking what the deadline needs; ``b`` is what the move adds before the gang, ``extra``
        the gang's restart beyond R (a move's).

        The arguments broadcast together. Per schedule: its spend (inf where it cannot finish
        in time), the work left at the move (``rem``) and the part on-demand does (``y``).
        """
        W, R = self.W, self.R + extra
        P = st[..., 0] + b[..., 0]
        rem = W - P
        y = np.maximum(a + R + rem - end, 0.0)
        ok = (y <= np.minimum(st[..., 2] + b[..., 2], W) - P + _TOL) & (y < rem) & (rem > 0)
        if not self.has_od:
            ok &= y <= _TOL
        p_od = self.p_od if self.has_od else 0.0
        return np.where(ok, st[..., 1] + b[..., 1] + p_od * y + price * (R + rem - y), np.inf), rem, y

    def _finals(self, st: np.ndarray, b: np.ndarray, a: np.ndarray, end: np.ndarray, price: np.ndarray,
                extra: np.ndarray, blocks: tuple[int, ...]) -> None:
        """Every state finishing on every gang (``_final_cost``); the best of each block of gangs in turn."""
        cost, rem, y = self._final_cost(st[:, None, :], b[None, :, :], a[None, :], end[None, :], price[None, :],
                                        extra[None, :])
        for c0, c1 in itertools.pairwise(blocks):
            if c1 <= c0:
                continue
            r, c = divmod(int(np.argmin(cost[:, c0:c1])), c1 - c0)  # the first least, row by row
            c += c0
            if cost[r, c] < math.inf:
                restart = self.R + extra[c]
                self._consider(cost, r, c, st, b, a[c] + restart + rem[r, c] - y[r, c], y[r, c],
                               restart + rem[r, c] - y[r, c], 0.0)


def _point_index(times: np.ndarray, clusters: np.ndarray, t: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The index of point (``t``, ``c``) among points sorted by time, then cluster; past the end where a
    time is not a point's (a gang the trace never stops before the deadline)."""
    ranks = np.unique(times)
    width = int(max(clusters.max(initial=0), c.max(initial=0))) + 3  # clusters from -2 up
    key = np.searchsorted(ranks, times) * width + clusters + 2
    rank = np.searchsorted(ranks, t)
    found = (rank < ranks.size) & (ranks[np.minimum(rank, ranks.size - 1)] == t)
    return np.where(found, np.searchsorted(key, rank * width + c + 2), times.size)


def _distinct_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, axis=0, return_index=True)`` of a float matrix, without its slow row sort.

    The rows sorted lexicographically (column 0 first), each once, and the index of its first
    occurrence in ``x``.
    """
    order = np.lexsort(x.T[::-1])  # stable: equal rows keep their order, the first comes first
    xs = x[order]
    new = np.empty(len(xs), dtype=bool)
    new[0] = True
    new[1:] = (xs[1:] != xs[:-1]).any(axis=1)
    return xs[new], order[new]


def _pareto3(crit: np.ndarray) -> np.ndarray:
    """Rows of ``crit`` (distinct, sorted lexicographically) that no other row is <= in all three columns.

    Only an earlier row can be <= a row. Level by level of column 0 (one spot price: it only
    counts sessions, so there are few levels), a row is beaten inside its level when an
    earlier row of the level has a column 2 no higher (the level is sorted by column 1), and
    across levels when a row of a lower level has columns 1 and 2 no higher. Both are prefix
    minima of column 2's rank, the first along the sorted rows, the second over a table of
    levels x column 1's rank, so no loop runs per level.
    """
    n = len(crit)
    level = np.zeros(n, dtype=np.int64)
    np.cumsum(crit[1:, 0] != crit[:-1, 0], out=level[1:])
    levels = int(level[-1]) + 1
    rank2 = np.unique(crit[:, 2], return_inverse=True)[1].reshape(-1)
    # Inside a level: a key that falls level by level, so a prefix minimum never reaches back.
    key = rank2 - level * (int(rank2.max()) + 2)
    keep = np.ones(n, dtype=bool)
    keep[1:] = np.minimum.accumulate(key)[:-1] > key[1:]
    rows = np.flatnonzero(keep)
    if levels == 1:
        return rows
    # Across levels: each level's rows now have distinct column 1s (a tie has been beaten).
    lv, r2 = level[rows], rank2[rows]
    rank1 = np.unique(crit[rows, 1], return_inverse=True)[1].reshape(-1)
    return rows[~_beaten_by_lower_levels(lv, rank1, r2, levels)]


def _beaten_by_lower_levels(lv: np.ndarray, rank1: np.ndarray, rank2: np.ndarray, levels: int) -> np.ndarray:
    """Whether a row of a lower level has both ranks no higher, for each row (levels ``lv`` in 0..levels-1)."""
    width = int(rank1.max()) + 1
    if levels * width <= _TABLE:
        # low[l, r]: the least rank2 at level <= l and rank1 <= r.
        low = np.full((levels, width), np.iinfo(np.int32).max, dtype=np.int32)
        low[lv, rank1] = rank2
        np.minimum.accumulate(low, axis=1, out=low)
        np.minimum.accumulate(low, axis=0, out=low)
        up = lv > 0
        beaten = np.zeros(lv.size, dtype=bool)
        beaten[up] = low[lv[up] - 1, rank1[up]] <= rank2[up]
        return beaten
    # Too large a table: halve the levels over and over. At each step a row in the upper half
    # of its block of levels is checked against the rows of the lower half, by a prefix minimum
    # of rank2 along the rows sorted by block, rank1, lower half first.
    top = int(rank2.max()) + 2
    beaten = np.zeros(lv.size, dtype=bool)
    step = 0
    while (1 << step) < levels:
        block = lv >> (step + 1)
        upper = ((lv >> step) & 1).astype(bool)
        order = np.lexsort((upper, rank1, block))
        shift = block[order] * top  # a key that falls block by block, so no minimum reaches back
        q = upper[order]
        low = np.minimum.accumulate(np.where(q, top - 1, rank2[order]) - shift)
        beaten[order[q]] |= low[q] <= rank2[order][q] - shift[q]
        step += 1
    return beaten


def _pareto(crit: np.ndarray, block: int = 512) -> np.ndarray:
    """As ``_pareto3`` for any number of columns: block by block of rows, against the rows kept before.

    Only an earlier row can be <= a row, and a row beaten by any row is beaten by a kept one
    (the chain of rows beating it ends at one). So each block is checked against a few of the
    rows kept so far (those lowest on all columns together, which beat many), then the rows
    that survive against all of them, and last against each other, earlier against later.
    """
    n = len(crit)
    keep = np.zeros(n, dtype=bool)
    kept = crit[:0]
    for lo in range(0, n, block):
        rows = np.arange(lo, min(lo + block, n))
        for beat in (kept[_lowest(kept, _STRONG)], kept) if len(kept) else ():
            if len(rows):
                rows = rows[~_le(beat, crit[rows]).any(axis=0)]
        if len(rows):
            rows = rows[~np.triu(_le(crit[rows], crit[rows]), 1).any(axis=0)]
            keep[rows] = True
            kept = np.concatenate([kept, crit[rows]])
    return np.flatnonzero(keep)


def _le(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[i, j]``: row i of ``a`` is <= row j of ``b`` in every column (column by column: no 3-d temporary)."""
    out = a[:, None, 0] <= b[None, :, 0]
    for c in range(1, a.shape[1]):
        out &= a[:, None, c] <= b[None, :, c]
    return out


def _lowest(x: np.ndarray, m: int) -> np.ndarray:
    """Indices of up to ``m`` rows of ``x`` with the least sum of their ranks in each column."""
    if len(x) <= m:
        return np.arange(len(x))
    rank_sum = np.argsort(np.argsort(x, axis=0), axis=0).sum(axis=1)
    return np.argpartition(rank_sum, m)[:m]


__all__ = ["ANY_CLUSTER", "Markets", "Optimum", "PendingOptima", "hindsight_optimum", "optimum_for", "start_optima"]
