"""The world a simulated run meets: per tier, a process that says when capacity is there and
when a running gang is interrupted.

Why apart from the engines: every engine (the policy engine, the vectorised one and the
Uniform Progress baseline) must see the same world, so it is built and compiled once here.
A process is a rate model (Poisson per node-hour, with outages that make capacity vanish
and return), a SkyPilot availability trace, a node add/remove trace (both replayed
cyclically from a random start tick) or, for tests, a script. Traces are compiled per gang
size into lookup tables (``TraceCapacity``), so a question about one run or ten thousand
costs a few array lookups.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field

from spotfallback.config import Ladder, NumbersNotBooleans, Tier, make_ladder
from spotfallback.sim.job import EPS
from spotfallback.sim.traces import NodeTrace, SpotTrace


class RateModel(NumbersNotBooleans):
    """Memoryless interruptions and capacity outages; ``RateModel()`` is a reliable on-demand pool.

    Each acquisition attempt finds the capacity gone with ``outage_probability``; the outage
    then lasts an exponential time of mean ``mean_outage_h``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    preemptions_per_node_hour: float = Field(default=0.0, ge=0)
    failures_per_node_hour: float = Field(default=0.0, ge=0, description="Node losses without notice.")
    outage_probability: float = Field(default=0.0, ge=0, le=1)
    mean_outage_h: float = Field(default=0.0, ge=0)


@dataclass(frozen=True)
class ScriptedModel:
    """Deterministic process for tests: the i-th acquisition on the tier lasts ``uptimes_h[i]``.

    After the list runs out the tier is never interrupted. ``waits_h[i]`` delays the i-th
    acquisition (capacity absent). Only the policy engine runs it.
    """

    uptimes_h: tuple[float, ...]
    kind: Literal["preempt", "fail"] = "preempt"
    waits_h: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("preempt", "fail"):
            raise ValueError(f"kind: expected 'preempt' or 'fail', got {self.kind!r}")
        # NaN compares false both ways; an infinite uptime is a gang never interrupted, an infinite wait none.
        for field, values, inf_ok in (("uptimes_h", self.uptimes_h, True), ("waits_h", self.waits_h, False)):
            for i, h in enumerate(values):
                if isinstance(h, bool) or not isinstance(h, int | float) or not 0 <= h <= math.inf or (h == math.inf and not inf_ok):
                    raise ValueError(f"{field}[{i}]: expected hours, 0 or more{'' if inf_ok else ' and finite'}, got {h!r}")


Process = RateModel | SpotTrace | NodeTrace | ScriptedModel


def complement_trace(trace: SpotTrace, capacity: int | None = None) -> SpotTrace:
    """Read a trace whose ticks count *preempted* instances (upstream SkyPilot's 1-node files).

    The pool's size is ``capacity``, else the most preempted at once, and at least one: a
    trace with nothing ever preempted is a pool that was always there."""
    cap = max(trace.capacity, 1) if capacity is None else capacity
    flipped = np.clip(cap - trace.available, 0, None).astype(np.int64)
    flipped.flags.writeable = False
    return SpotTrace(name=f"{trace.name} (complemented)", gap_seconds=trace.gap_seconds, available=flipped)


def as_counted(trace: SpotTrace | NodeTrace, trace_counts: str) -> SpotTrace | NodeTrace:
    """A recorded trace read as ``trace_counts`` says (``--trace-counts``): a SkyPilot trace that counts
    ``"preempted"`` instances complemented; a node trace, which records its own adds and removes, as it is."""
    return complement_trace(trace) if trace_counts == "preempted" and isinstance(trace, SpotTrace) else trace


def world_for(ladder: Ladder | Sequence[Tier], spot: Process, on_demand: Process | None = None,
              pools: Mapping[str, Process] | None = None) -> tuple[Process, ...]:
    """One process per tier: spot-market tiers get ``spot``, the others ``on_demand`` (reliable);
    a tier named in ``pools`` gets its own (another pool's history over the same hours)."""
    ladder = make_ladder(ladder)
    od = on_demand if on_demand is not None else RateModel()
    own = pools or {}
    return tuple(own.get(t.name, spot if t.is_spot else od) for t in ladder.tiers)



# ---------------------------------------------------------------------------------------
# Trace processes compiled to per-tick lookup tables


@dataclass(frozen=True)
class TraceCapacity:
    """A trace as seen by a gang: when it can start, and when it is interrupted once started.

    The trace repeats with period ``period_h``. ``ok[j]``: a gang can be acquired in tick j.
    ``next_ok[j]``: first tick >= j (possibly in the next period, i.e. >= L) where it can,
    -1 if never. ``hit_h[j]``: time (from the period start, may exceed it) at which a gang
    acquired in tick j is interrupted, inf if never.
    """

    name: str
    gap_h: float
    ok: np.ndarray
    next_ok: np.ndarray
    hit_h: np.ndarray

    @property
    def length(self) -> int:
        return len(self.ok)

    @property
    def period_h(self) -> float:
        return self.length * self.gap_h

    def _tick(self, t_abs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tick = np.floor(t_abs / self.gap_h + EPS).astype(np.int64)
        return tick // self.length, tick % self.length

    def is_ok(self, t_abs: np.ndarray) -> np.ndarray:
        return self.ok[self._tick(t_abs)[1]]

    def next_available(self, t_abs: np.ndarray) -> np.ndarray:
        cyc, j = self._tick(t_abs)
        nxt = self.next_ok[j]
        at = (cyc * self.length + nxt) * self.gap_h
        return np.where(nxt < 0, np.inf, np.where(nxt == j, t_abs, at))

    def hit(self, t_abs: np.ndarray) -> np.ndarray:
        cyc, j = self._tick(t_abs)
        return cyc * self.period_h + self.hit_h[j]


def _next_true(flags: np.ndarray) -> np.ndarray:
    """For each j in [0, L): first index >= j in the doubled array where flags holds, else -1."""
    n = len(flags)
    doubled = np.concatenate([flags, flags])
    idx = np.where(doubled, np.arange(2 * n), 2 * n)
    nxt = np.minimum.accumulate(idx[::-1])[::-1][:n]
    return np.where(nxt >= 2 * n, -1, nxt).astype(np.int64)


def compile_spot_trace(trace: SpotTrace, num_workers: int) -> TraceCapacity:
    """A gang needs ``min(N, trace capacity)`` instances: a 1-instance trace gates the whole pool."""
    need = min(num_workers, trace.capacity)
    ok = trace.available >= need if need > 0 else np.zeros(len(trace.available), dtype=bool)
    gap_h = trace.gap_seconds / 3600.0
    next_ok = _next_true(ok)
    next_bad = _next_true(~ok)
    # A gang acquired in an ok tick j runs until the next bad tick (> j).
    hit_h = np.where(next_bad < 0, np.inf, next_bad * gap_h)
    return TraceCapacity(trace.name, gap_h, ok, next_ok, hit_h)


def gating_note(process: object, num_workers: int) -> str | None:
    """What a SkyPilot trace recorded for fewer instances than the gang means here, or None.

    ``compile_spot_trace`` reads it as gating the whole pool: an assumption worth saying for a
    gang of eight nodes planned on a one-instance trace, whose capacity may well vanish more often.
    """
    if not isinstance(process, SpotTrace) or process.capacity == 0 or process.capacity >= num_workers:
        return None
    return (f"trace {process.name!r} records at most {process.capacity} instance(s), and the gang has {num_workers} "
            f"workers: it is read as gating the whole pool, as if the pool held {num_workers} nodes whenever the "
            f"trace shows {process.capacity}; a pool that runs short of {num_workers} more often is interrupted "
            "more often than simulated")


def repeat_note(process: object, num_workers: int, horizon_h: float, horizon: str) -> str | None:
    """What replaying a trace shorter than a run may last means, or None: every simulator reads
    time past a trace's end as its beginning again, so a short trace's hours recur."""
    if not isinstance(process, SpotTrace | NodeTrace):
        return None
    cap = compile_process(process, num_workers)
    assert isinstance(cap, TraceCapacity)
    if cap.period_h >= horizon_h - EPS:
        return None
    return (f"trace {process.name!r} covers {cap.period_h:g} h, less than the {horizon_h:g} h {horizon}: a run still "
            f"going at its end replays it from its beginning, so those {cap.period_h:g} h recur; a longer trace "
            "shows what they leave out")


def compile_node_trace(trace: NodeTrace, num_workers: int, gap_seconds: float = 60.0) -> TraceCapacity:
    """The gang holds the N longest-running live nodes; removing any of them interrupts it.

    Events are quantised up to ``gap_seconds`` ticks (the shared trace is minute-aligned).
    When the trace repeats, a gang still alive at its end carries on as if started at tick 0.
    """
    peak = trace.peak
    if num_workers > peak:
        raise ValueError(f"node trace {trace.name!r} never has {num_workers} nodes (at most {peak}); use fewer workers")
    gap_h = gap_seconds / 3600.0
    ticks = [math.ceil(ev.t_s / gap_seconds - EPS) for ev in trace.events]
    length = ticks[-1] + 1
    # Removal tick of each incarnation (index of its add event).
    removal: dict[int, int] = {}
    open_add: dict[str, int] = {}
    for i, ev in enumerate(trace.events):
        if ev.action == "add":
            open_add[ev.node] = i
        else:
            removal[open_add.pop(ev.node)] = ticks[i]
    ok = np.zeros(length, dtype=bool)
    hit_tick = np.full(length, np.inf)
    live_nodes: dict[str, int] = {}  # node -> incarnation, insertion (= join) order
    e = 0
    for j in range(length):
        while e < len(trace.events) and ticks[e] <= j:
            ev = trace.events[e]
            if ev.action == "add":
                live_nodes[ev.node] = e
            else:
                live_nodes.pop(ev.node)
            e += 1
        if len(live_nodes) >= num_workers:
            ok[j] = True
            held = list(live_nodes.values())[:num_workers]
            hit_tick[j] = min(removal.get(inc, math.inf) for inc in held)
    hit_h = hit_tick * gap_h
    if np.isinf(hit_h).any():
        carry = hit_h[0] if ok[0] else 0.0
        hit_h = np.where(np.isinf(hit_h), length * gap_h + carry, hit_h)
    return TraceCapacity(trace.name, gap_h, ok, _next_true(ok), hit_h)


def compile_process(process: Process, num_workers: int, where: str = "process") -> RateModel | TraceCapacity | ScriptedModel:
    if isinstance(process, SpotTrace):
        return compile_spot_trace(process, num_workers)
    if isinstance(process, NodeTrace):
        return compile_node_trace(process, num_workers)
    if isinstance(process, RateModel | ScriptedModel):
        return process
    hint = " (a trace file's path: read it with load_process(path) first)" if isinstance(process, str | Path) else ""
    raise TypeError(f"{where}: expected a SpotTrace, NodeTrace, RateModel or ScriptedModel, got "
                    f"{type(process).__name__} {process!r:.60}{hint}")


def check_world(world: object) -> None:
    """Refuse a world that is no list of processes (one trace alone, a path) before anything iterates it."""
    if isinstance(world, str | Path) or not isinstance(world, Sequence):
        raise TypeError(f"world: expected one process per tier (a list), got {type(world).__name__} {world!r:.60}")


def compile_world(ladder: Ladder, world: Sequence[Process]) -> list[RateModel | TraceCapacity | ScriptedModel]:
    """Each tier's process compiled for the tier's gang."""
    check_world(world)
    if len(world) != len(ladder):
        raise ValueError(f"world has {len(world)} processes for {len(ladder)} tiers; give one per tier")
    return [compile_process(p, t.num_workers, f"world[{i}]") for i, (p, t) in enumerate(zip(world, ladder.tiers, strict=True))]


def observed_mtbf_h(process: Process, num_workers: int) -> tuple[float, float]:
    """(mean time between interruptions of a gang, same for failures without notice only)."""
    proc = compile_process(process, num_workers)
    if isinstance(proc, RateModel):
        pre = proc.preemptions_per_node_hour * num_workers
        fail = proc.failures_per_node_hour * num_workers
        total = pre + fail
        return (math.inf if total == 0 else 1.0 / total), (math.inf if fail == 0 else 1.0 / fail)
    if isinstance(proc, TraceCapacity):
        # Run a gang that restarts at once through one period; mean uptime between hits.
        t, run_h, hits = 0.0, 0.0, 0
        end = proc.period_h
        while True:
            start = float(proc.next_available(np.array([t]))[0])
            if not math.isfinite(start) or start >= end:
                break
            hit = float(proc.hit(np.array([start]))[0])
            run_h += min(hit, end) - start
            if hit >= end:
                break
            hits += 1
            t = hit
        return (math.inf if hits == 0 else run_h / hits), math.inf
    raise ValueError(f"cannot plan on {type(process).__name__}")


__all__ = [
    "gating_note",
    "repeat_note",
    "observed_mtbf_h",
    "Process",
    "RateModel",
    "ScriptedModel",
    "TraceCapacity",
    "check_world",
    "compile_node_trace",
    "compile_process",
    "compile_spot_trace",
    "compile_world",
    "complement_trace",
    "world_for",
]
