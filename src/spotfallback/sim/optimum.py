"""The hindsight optimum: the least a job could have spent on a recorded trace and still met its deadline.

Why: a ladder's spend means little until it is set against what was possible on the same
capacity. Knowing the whole trace, the optimum runs on a spot market only while it has the
gang's capacity, falls to on-demand, comes back, and restarts wherever that pays, so every
policy's spend can be read as a multiple of it (``spotfallback plan``, ``backtest``).

The job is the simulator's (``JobSpec``, a tier's ``price_per_hour``, the compiled traces of
``sim.world``): every start waits ``provisioning_delay_h`` (free) for a gang found in the
trace as the engines' ``acquire`` finds one, then pays the restart ``R`` (billed, no
progress); a spot gang runs until the trace's ``hit``; every hour is billed on the market it
ran on. Knowing when each gang will be stopped, the optimum writes one checkpoint (``delta``)
just before it stops and none in between: periodic checkpoints and preemption notices only
protect a run that cannot see ahead. Every run any policy makes is therefore one of its
schedules, or does no better than one (``tests/unit/test_sim_optimum.py`` checks that on
random traces), and its spend is a lower bound a ladder can approach but not beat. Elastic
gangs (fewer workers than the tier's ``num_workers``) are outside this model.

The search is a dynamic programme over the moments a gang is stopped by the trace. At each
such moment it keeps the Pareto set of partial schedules by (spend − p·progress) for every
market price p, and progress plus the on-demand work that earlier on-demand sessions could
still absorb; one on-demand session between two spot sessions runs from the first stop to the
moment the next gang is looked for, and how much of it is used is decided at the end, once
the deadline says how much must be done before the last session. Pure: arrays in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spotfallback.config import Ladder, make_ladder
from spotfallback.sim.job import EPS, JobSpec
from spotfallback.sim.world import Process, RateModel, TraceCapacity, compile_process

_TOL = 1e-9


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


@dataclass(frozen=True)
class Markets:
    """What the optimum may buy: capacity-gated markets (a compiled trace and a gang price each) and on-demand."""

    gated: tuple[tuple[TraceCapacity, float], ...]
    on_demand_price: float | None  # None: no reliable market

    @classmethod
    def of(cls, ladder: Ladder | Sequence[object], world: Sequence[Process]) -> Markets:
        """The ladder's tiers as markets: a tier on a trace is gated, one on a rate model without losses is on-demand."""
        lad = make_ladder(ladder)
        if len(world) != len(lad):
            raise ValueError(f"world has {len(world)} processes for {len(lad)} tiers; give one per tier")
        gated: list[tuple[TraceCapacity, float]] = []
        reliable: list[float] = []
        for tier, process in zip(lad.tiers, world, strict=True):
            proc = compile_process(process, tier.num_workers)
            if isinstance(proc, TraceCapacity):
                gated.append((proc, tier.price_per_hour()))
            elif isinstance(proc, RateModel) and proc == RateModel():
                reliable.append(tier.price_per_hour())
            else:
                raise ValueError(
                    f"tier {tier.name!r}: the hindsight optimum needs a recorded trace or a reliable pool, "
                    f"not {type(process).__name__} with random interruptions"
                )
        return cls(tuple(gated), min(reliable) if reliable else None)


def optimum_for(ladder: Ladder | Sequence[object], job: JobSpec, world: Sequence[Process],
                starts_h: Sequence[float] | np.ndarray) -> list[Optimum]:
    """The optimum of ``job`` on the ladder's markets, starting at each of ``starts_h`` (hours into the traces)."""
    markets = Markets.of(ladder, world)
    starts = np.asarray(starts_h, dtype=float)
    memo: dict[float, Optimum] = {}
    out = []
    for s in starts.tolist():
        if s not in memo:
            memo[s] = hindsight_optimum(job, markets, s)
        out.append(memo[s])
    return out


def hindsight_optimum(job: JobSpec, markets: Markets, start_h: float = 0.0) -> Optimum:
    """The least spend that finishes ``job`` by its deadline, starting ``start_h`` hours into the traces."""
    if job.deadline_h is None:
        raise ValueError("the hindsight optimum needs a deadline (JobSpec.deadline_h)")
    return _Search(job, markets, float(start_h)).run()


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


class _Search:
    """The dynamic programme for one start; see the module docstring."""

    def __init__(self, job: JobSpec, markets: Markets, t0: float):
        self.W, self.D = job.work_h, float(job.deadline_h or 0.0)
        self.R, self.delta, self.prov = job.restart_overhead_h, job.checkpoint_cost_h, job.provisioning_delay_h
        self.markets, self.t0 = markets, t0
        self.p_od = math.inf if markets.on_demand_price is None else markets.on_demand_price
        self.has_od = markets.on_demand_price is not None
        self.groups = _groups(markets, t0, self.D)
        self.prices = sorted({float(p) for _, p in markets.gated} | ({self.p_od} if self.has_od else set()))
        self.best = Optimum(math.inf, math.nan, math.nan, math.nan, 0)

    # -- where a gang can be had ------------------------------------------------------------

    def _acquire(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(look time, acquisition time) per group for a run idle since ``t``; nan where it cannot get that group.

        As ``draws.acquire``: look from a moment with capacity, get the gang ``prov`` later if
        there is capacity then; the earliest look that lands in the group.
        """
        gr = self.groups
        look = np.full(gr.s.size, np.nan)
        for m, (cap, _) in enumerate(self.markets.gated):
            sel = gr.market == m
            if sel.any():
                x = np.maximum(t, gr.s[sel] - self.prov)
                look[sel] = cap.next_available(self.t0 + x) - self.t0
        acq = look + self.prov
        with np.errstate(invalid="ignore"):
            tick = np.floor((self.t0 + np.where(np.isfinite(acq), acq, 0.0)) / self._gap() + EPS)
            ok = np.isfinite(acq) & (tick >= self.groups.first_tick) & (tick <= self.groups.last_tick)
        return np.where(ok, look, np.nan), np.where(ok, acq, np.nan)

    def _gap(self) -> np.ndarray:
        gaps = np.array([cap.gap_h for cap, _ in self.markets.gated])
        return gaps[self.groups.market]

    # -- the programme ------------------------------------------------------------------------

    def run(self) -> Optimum:
        W, D, R, d, prov = self.W, self.D, self.R, self.delta, self.prov
        gr = self.groups
        stops = gr.hit[np.isfinite(gr.hit) & (gr.hit < D)]
        times = np.unique(np.concatenate([[0.0], stops]))
        # Candidates per point: P, C, Q (progress plus what earlier on-demand could still absorb,
        # at most W), and the tallies spot_h, od_h, sessions.
        pending: list[list[np.ndarray]] = [[] for _ in times]
        pending[0].append(np.zeros((1, 6)))
        self._greedy()  # a good schedule first, so that states that cannot beat it are dropped at once
        spot_left = self._spot_left(times)
        for i, t in enumerate(times.tolist()):
            if not pending[i]:
                continue
            st = np.concatenate(pending[i])
            pending[i] = []
            st = self._prune(st[self._bound(st, spot_left[i]) < self.best.spend - _TOL])
            if len(st) == 0:
                continue
            self._final_on_demand(t, st)
            if gr.s.size == 0:
                continue
            look, acq = self._acquire(t)
            usable = np.isfinite(acq)
            if not usable.any():
                continue
            g = np.flatnonzero(usable)
            a, lk = acq[g], look[g]
            hit, price = gr.hit[g], gr.price[g]
            cap = lk - (t + prov) - R - d  # an on-demand session before the gang: its room for work
            for with_od in (False, True) if self.has_od else (False,):
                if with_od:
                    keep = cap > _TOL
                    if not keep.any():
                        continue
                    gg, aa, hh, pp, room = g[keep], a[keep], hit[keep], price[keep], cap[keep]
                    base = np.stack([np.zeros(room.size), np.full(room.size, self.p_od * (R + d)), room,
                                     np.zeros(room.size), np.full(room.size, R + d), np.ones(room.size)], axis=1)
                else:
                    gg, aa, hh, pp = g, a, hit, price
                    base = np.zeros((gg.size, 6))
                self._final_spot(st, base, aa, hh, pp)
                # Gangs stopped by the trace before the deadline: a new point at the stop.
                L = hh - aa
                nf = np.isfinite(hh) & (hh < D) & (R + d + _TOL < L)
                if not nf.any():
                    continue
                gain = (L - R - d)[nf]
                add = base[nf].copy()
                add[:, 0] += gain
                add[:, 1] += pp[nf] * L[nf]
                add[:, 2] += gain
                add[:, 3] += L[nf]
                add[:, 5] += 1
                new = st[:, None, :] + add[None, :, :]  # states x groups
                new[..., 2] = np.minimum(new[..., 2], W)
                alive = new[..., 0] < W - _TOL  # finishing inside the group is a final
                targets = np.searchsorted(times, hh[nf])
                for col, k in enumerate(targets.tolist()):
                    rows = new[alive[:, col], col]
                    if rows.size:
                        pending[k].append(rows)
        return self.best

    def _spot_left(self, times: np.ndarray) -> np.ndarray:
        """Hours of spot capacity a gang could still run on after each of ``times``, up to the deadline."""
        gr = self.groups
        if gr.s.size == 0:
            return np.zeros(times.size)
        lo, hi = gr.s, np.minimum(gr.hit, self.D)
        merged: list[list[float]] = []
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):  # sorted by start
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        m = np.array(merged)
        return np.maximum(m[None, :, 1] - np.maximum(m[None, :, 0], times[:, None]), 0.0).sum(1)

    def _bound(self, st: np.ndarray, spot_left: float) -> np.ndarray:
        """The least any schedule from these states can spend: the rest of the work and one start at the
        cheapest price, and on-demand's premium on the work that spot capacity left cannot hold."""
        rem = self.W - st[:, 0]
        p_min = min(self.prices)
        short = np.maximum(rem - spot_left, 0.0)
        if not self.has_od:
            return np.where(short > _TOL, np.inf, st[:, 1] + p_min * (self.R + rem))
        return st[:, 1] + p_min * (self.R + rem) + (self.p_od - p_min) * short

    def _greedy(self) -> None:
        """Spot whenever a gang can be had, finishing on spot or on-demand wherever that is cheapest: an upper bound."""
        W, D, R, d = self.W, self.D, self.R, self.delta
        gr = self.groups
        t, st = 0.0, np.zeros((1, 6))
        while True:
            self._final_on_demand(t, st)
            if gr.s.size == 0:
                return
            _, acq = self._acquire(t)
            g = np.flatnonzero(np.isfinite(acq))
            if g.size == 0:
                return
            self._final_spot(st, np.zeros((g.size, 6)), acq[g], gr.hit[g], gr.price[g])
            k = g[0]
            L = gr.hit[k] - acq[k]
            if not (np.isfinite(gr.hit[k]) and gr.hit[k] < D and R + d + _TOL < L):
                return
            gain = L - R - d
            if st[0, 0] + gain >= W - _TOL:
                return
            st = st + np.array([[gain, gr.price[k] * L, gain, L, 0.0, 1.0]])
            t = float(gr.hit[k])

    def _prune(self, st: np.ndarray) -> np.ndarray:
        """The states no other state beats on every future: spend − p·progress for each price, and Q."""
        if len(st) <= 1:
            return st
        crit = np.stack([st[:, 1] - p * st[:, 0] for p in self.prices] + [-st[:, 2]], axis=1)
        crit, first = np.unique(np.round(crit, 9), axis=0, return_index=True)  # sorted by column 0, then 1, ...
        st = st[first]
        if crit.shape[1] == 3:
            return st[_pareto3(crit)]
        kept = np.empty_like(crit)
        n = 0
        for i in range(len(crit)):  # sorted: only earlier rows can beat a row
            if n == 0 or not (kept[:n] <= crit[i]).all(1).any():
                kept[n] = crit[i]
                first[n] = i
                n += 1
        return st[first[:n]]

    def _consider(self, cost: np.ndarray, finish: np.ndarray, rows: np.ndarray, extra_od: np.ndarray,
                  last_spot: np.ndarray, last_od: np.ndarray) -> None:
        if cost.size == 0:
            return
        i = int(np.argmin(cost))
        if cost[i] < self.best.spend - _TOL:
            self.best = Optimum(float(cost[i]), float(finish[i]), float(rows[i, 3] + last_spot[i]),
                                float(rows[i, 4] + extra_od[i] + last_od[i]), int(rows[i, 5]) + 1)

    def _final_on_demand(self, t: float, st: np.ndarray) -> None:
        """Finish on on-demand from ``t``; earlier on-demand sessions take what the deadline needs."""
        if not self.has_od:
            return
        W, D, R, prov = self.W, self.D, self.R, self.prov
        rem = W - st[:, 0]
        need = np.maximum(t + prov + R + rem - D, 0.0)
        ok = (need <= st[:, 2] - st[:, 0] + _TOL) & (need <= rem + _TOL)
        if not ok.any():
            return
        s, rem, need = st[ok], rem[ok], need[ok]
        cost = s[:, 1] + self.p_od * (R + rem)
        self._consider(cost, t + prov + R + rem - need, s, need, np.zeros(len(s)), R + rem - need)

    def _final_spot(self, st: np.ndarray, base: np.ndarray, a: np.ndarray, hit: np.ndarray, price: np.ndarray) -> None:
        """Finish on a gang acquired at ``a`` (before its stop and the deadline), on-demand taking the rest in time."""
        W, D, R = self.W, self.D, self.R
        end = np.minimum(hit, D)
        fits = a + R < end - _TOL
        if not fits.any():
            return
        b, a, end, price = base[fits], a[fits], end[fits], price[fits]
        P = st[:, 0][:, None] + b[None, :, 0]
        C = st[:, 1][:, None] + b[None, :, 1]
        Q = np.minimum(st[:, 2][:, None] + b[None, :, 2], W)
        rem = W - P
        y = np.maximum(a[None, :] + R + rem - end[None, :], 0.0)  # work on-demand must do before
        ok = (y <= Q - P + _TOL) & (y < rem) & (rem > 0)
        if not self.has_od:
            ok &= y <= _TOL
        if not ok.any():
            return
        p_od = self.p_od if self.has_od else 0.0
        cost = C + p_od * y + price[None, :] * (R + rem - y)
        r, c = np.nonzero(ok)
        rows = st[r] + b[c]
        self._consider(cost[r, c], a[c] + R + rem[r, c] - y[r, c], rows, y[r, c], R + rem[r, c] - y[r, c],
                       np.zeros(r.size))


def _pareto3(crit: np.ndarray) -> np.ndarray:
    """Rows of ``crit`` (distinct, sorted lexicographically) that no other row is <= in all three columns.

    Level by level of column 0 (one spot price: it only counts sessions, so there are few
    levels), each row is checked against the staircase of (column 1, column 2) of the rows
    kept so far and of the rows before it in its level.
    """
    keep = np.zeros(len(crit), dtype=bool)
    front_a = np.empty(0)
    front_c = np.empty(0)
    bounds = np.flatnonzero(np.diff(crit[:, 0])) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(crit)]]), strict=True):
        a, c = crit[lo:hi, 1], crit[lo:hi, 2]
        ok = np.ones(hi - lo, dtype=bool)
        if front_a.size:
            j = np.searchsorted(front_a, a, side="right") - 1
            ok &= ~((j >= 0) & (front_c[np.maximum(j, 0)] <= c))
        prev = np.minimum.accumulate(np.concatenate([[np.inf], c[:-1]]))  # rows sorted by a, then c
        ok &= ~(prev <= c)
        keep[lo:hi] = ok
        if ok.any():
            fa, fc = np.concatenate([front_a, a[ok]]), np.concatenate([front_c, c[ok]])
            order = np.lexsort((fc, fa))
            fa, fc = fa[order], fc[order]
            stair = fc < np.minimum.accumulate(np.concatenate([[np.inf], fc[:-1]]))
            front_a, front_c = fa[stair], fc[stair]
    return np.flatnonzero(keep)


__all__ = ["Markets", "Optimum", "hindsight_optimum", "optimum_for"]
