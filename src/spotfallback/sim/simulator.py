"""Discrete-event Monte Carlo of one gang-scheduled training job on a ladder of capacity tiers.

Why it exists: a plan is only worth something if it predicts what the runner will do, so the
reference engine feeds typed events to the very ``FallbackPolicy`` object the live runner uses
and follows its decisions (``simulator_beyond`` does the same for ladders that move while the
run runs). A vectorised numpy engine gives the same outcomes for the budgets, capacity
timeouts, deadline guards and climbing back (tests check them run by run on the same random
draws) and is what the planner and the benchmark use.

The world, per run (hours internally, seconds in the events handed to the policy):

* a gang of N workers: losing any node stops all; work ``W`` hours; after every ``tau`` hours
  of work a checkpoint that takes ``delta``; a restart after an interruption or a tier switch
  costs ``R`` (billed, no progress) and every acquisition waits ``provisioning_delay_h``
  (not billed, matching the run ledger: waiting for capacity costs nothing);
* a preemption comes with ``notice_s`` of warning: when the notice covers a checkpoint write,
  the workers checkpoint just in time and hold, so no work is lost; a node failure (no notice)
  loses the work since the last committed checkpoint;
* per tier a capacity/preemption process: a rate model (Poisson per node-hour, with outages
  that make capacity vanish and return), a SkyPilot availability trace, or a node add/remove
  trace, replayed from a random start tick (cyclically);
* the ladder policy decides after every preemption, node failure and capacity timeout.

``simulate_uniform_progress`` runs the deadline-aware baseline of *Can't Be Late* (NSDI '24)
in the same world, on a tick grid as in the paper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from spotfallback.config import Ladder, Tier, make_ladder
from spotfallback.events import (
    CapacityTimedOut,
    CheckpointCommitted,
    Complete,
    Finished,
    GiveUp,
    NodeFailed,
    Preempted,
    RunStarted,
    SwitchTier,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy, leave_rule_for
from spotfallback.sim.traces import NodeTrace, SpotTrace

NEVER_H = 1e12  # "no periodic checkpoint": an interval no job reaches
_EPS = 1e-9

FINISHED, FAILED, STUCK = 1, 2, 3
STATUS_NAMES = {FINISHED: "finished", FAILED: "failed", STUCK: "stuck"}


# ---------------------------------------------------------------------------------------
# Inputs


class JobSpec(BaseModel):
    """What is being trained and what each interruption costs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    work_h: float = Field(gt=0, description="Hours of training on an uninterrupted gang.")
    checkpoint_interval_h: float | None = Field(
        default=None, gt=0, description="Work between periodic checkpoints (tau); None = never."
    )
    checkpoint_cost_h: float = Field(default=0.0, ge=0, description="Wall time of one checkpoint write (delta).")
    restart_overhead_h: float = Field(default=0.0, ge=0, description="Billed time to resume after a restart (R).")
    provisioning_delay_h: float = Field(default=0.0, ge=0, description="Unbilled time to get workers once capacity exists.")
    notice_s: float = Field(default=0.0, ge=0, description="Preemption notice (AWS: 120 s, GCP/Azure: 30 s).")
    jit_checkpoint: bool = Field(default=True, description="Checkpoint on a preemption notice (no lost work if it fits).")
    deadline_h: float | None = Field(default=None, gt=0, description="Wall-clock deadline, if any.")

    @property
    def tau_h(self) -> float:
        return NEVER_H if self.checkpoint_interval_h is None else self.checkpoint_interval_h

    def with_interval(self, tau_h: float | None) -> JobSpec:
        return self.model_copy(update={"checkpoint_interval_h": tau_h})


class RateModel(BaseModel):
    """Memoryless interruptions and capacity outages; ``RateModel()`` is a reliable on-demand pool.

    Each acquisition attempt finds the capacity gone with ``outage_probability``; the outage
    then lasts an exponential time of mean ``mean_outage_h``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

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


Process = RateModel | SpotTrace | NodeTrace | ScriptedModel


def complement_trace(trace: SpotTrace, capacity: int | None = None) -> SpotTrace:
    """Read a trace whose ticks count *preempted* instances (upstream SkyPilot's 1-node files)."""
    cap = trace.capacity if capacity is None else capacity
    flipped = np.clip(cap - trace.available, 0, None).astype(np.int64)
    flipped.flags.writeable = False
    return SpotTrace(name=f"{trace.name} (complemented)", gap_seconds=trace.gap_seconds, available=flipped)


def world_for(ladder: Ladder | Sequence[Tier], spot: Process, on_demand: Process | None = None) -> tuple[Process, ...]:
    """One process per tier: spot-market tiers get ``spot``, the others ``on_demand`` (reliable)."""
    ladder = make_ladder(ladder)
    od = on_demand if on_demand is not None else RateModel()
    return tuple(spot if t.is_spot else od for t in ladder.tiers)


# ---------------------------------------------------------------------------------------
# Progress arithmetic shared by every engine (numpy, works on scalars too)


def cycle_progress(x: np.ndarray | float, tau: np.ndarray | float, delta: np.ndarray | float):
    """Work done and work committed after ``x`` hours of compute phase (checkpoint every tau)."""
    cyc = np.add(tau, delta)
    k = np.floor(np.divide(x, cyc))
    r = np.subtract(x, np.multiply(k, cyc))
    committed = np.multiply(k, tau)
    done = np.add(committed, np.minimum(r, tau))
    return done, committed


def wall_to_finish(w: np.ndarray | float, tau: np.ndarray | float, delta: np.ndarray | float):
    """Compute-phase hours to do ``w`` more work from a fresh start (no checkpoint at the end)."""
    n = np.maximum(np.ceil(np.divide(w, tau) - _EPS) - 1.0, 0.0)
    return np.add(w, np.multiply(n, delta))


def remaining_s(work_h: float, committed_h: float, tau: float, delta: float) -> float:
    """The ``remaining_work_s`` a training function reports with a checkpoint: wall seconds to finish."""
    return float(wall_to_finish(max(work_h - committed_h, 0.0), tau, delta)) * 3600.0


def commits_of_attempt(work_h: float, committed_h: float, start: float, x: float, gain: float, t_end: float,
                       tau: float, delta: float) -> list[CheckpointCommitted]:
    """The commits a shell reports for an attempt cut at ``t_end`` (hours; ``x`` hours computed from ``start``).

    The first periodic one and the last two (what the policy measures the restore time and
    the interval between commits from) and, when the just-in-time checkpoint saved more,
    that one at the kill; the commits between change nothing the policy reads. Nothing
    without progress.
    """
    if gain <= 0:
        return []
    cyc = tau + delta
    periodic = int(math.floor(x / cyc + _EPS)) if math.isfinite(cyc) and x > 0 else 0
    out = []
    for k in sorted({1, periodic - 1, periodic}):
        if k >= 1 and k * tau <= gain + _EPS:
            out.append(CheckpointCommitted(t=(start + k * cyc) * 3600.0,
                                           remaining_work_s=remaining_s(work_h, committed_h + k * tau, tau, delta)))
    if not out or gain > periodic * tau + _EPS:
        out.append(CheckpointCommitted(t=t_end * 3600.0, remaining_work_s=remaining_s(work_h, committed_h + gain, tau, delta)))
    return out


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
        tick = np.floor(t_abs / self.gap_h + _EPS).astype(np.int64)
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


def compile_node_trace(trace: NodeTrace, num_workers: int, gap_seconds: float = 60.0) -> TraceCapacity:
    """The gang holds the N longest-running live nodes; removing any of them interrupts it.

    Events are quantised up to ``gap_seconds`` ticks (the shared trace is minute-aligned).
    When the trace repeats, a gang still alive at its end carries on as if started at tick 0.
    """
    peak = live = 0
    for ev in trace.events:
        live += 1 if ev.action == "add" else -1
        peak = max(peak, live)
    if num_workers > peak:
        raise ValueError(f"node trace {trace.name!r} never has {num_workers} nodes (at most {peak}); use fewer workers")
    gap_h = gap_seconds / 3600.0
    ticks = [math.ceil(ev.t_s / gap_seconds - _EPS) for ev in trace.events]
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


def compile_process(process: Process, num_workers: int) -> RateModel | TraceCapacity | ScriptedModel:
    if isinstance(process, SpotTrace):
        return compile_spot_trace(process, num_workers)
    if isinstance(process, NodeTrace):
        return compile_node_trace(process, num_workers)
    return process


# ---------------------------------------------------------------------------------------
# Random draws shared by the engines: one column per wait+run cycle of a run


class _Draws:
    """Unit exponentials and uniforms per (run, cycle), extended in deterministic blocks."""

    BLOCK = 16

    def __init__(self, runs: int, seed: int):
        self.runs = runs
        self.seed = seed
        self.cols = 0
        self.e_pre = np.empty((runs, 0))
        self.e_fail = np.empty((runs, 0))
        self.u_out = np.empty((runs, 0))
        self.e_out = np.empty((runs, 0))

    def ensure(self, col: int) -> None:
        while col >= self.cols:
            rng = np.random.default_rng([self.seed, 1 + self.cols // self.BLOCK])
            shape = (self.runs, self.BLOCK)
            self.e_pre = np.hstack([self.e_pre, rng.standard_exponential(shape)])
            self.e_fail = np.hstack([self.e_fail, rng.standard_exponential(shape)])
            self.u_out = np.hstack([self.u_out, rng.random(shape)])
            self.e_out = np.hstack([self.e_out, rng.standard_exponential(shape)])
            self.cols += self.BLOCK


def _offsets(world: Sequence[object], runs: int, seed: int) -> np.ndarray:
    """Start of each replay in trace time: a uniformly random tick of the first trace."""
    caps = [p for p in world if isinstance(p, TraceCapacity)]
    if not caps:
        return np.zeros(runs)
    rng = np.random.default_rng([seed, 0])
    return rng.integers(0, caps[0].length, size=runs) * caps[0].gap_h


def _acquire(proc, draws: _Draws, rows: np.ndarray, cols: np.ndarray, t_abs: np.ndarray, prov: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """When workers are up (trace time), looking from ``t_abs``; > limit means not in time."""
    if isinstance(proc, RateModel):
        outage = np.where(draws.u_out[rows, cols] < proc.outage_probability, draws.e_out[rows, cols] * proc.mean_outage_h, 0.0)
        return t_abs + outage + prov
    found = proc.next_available(t_abs)
    acq = found + prov
    todo = np.isfinite(acq) & (acq <= limit) & ~proc.is_ok(np.where(np.isfinite(acq), acq, 0.0))
    while todo.any():  # capacity vanished while provisioning: look again from then
        found2 = proc.next_available(acq[todo])
        acq[todo] = found2 + prov[todo]
        sub = np.isfinite(acq) & (acq <= limit)
        todo = sub & ~proc.is_ok(np.where(np.isfinite(acq), acq, 0.0))
    return acq


def _interrupt(proc, draws: _Draws, rows: np.ndarray, cols: np.ndarray, t_abs: np.ndarray, workers: np.ndarray):
    """(time of the next interruption, True if it is a preemption rather than a node failure)."""
    if isinstance(proc, RateModel):
        with np.errstate(divide="ignore"):
            lp = proc.preemptions_per_node_hour * workers
            lf = proc.failures_per_node_hour * workers
            tp = np.where(lp > 0, draws.e_pre[rows, cols] / np.where(lp > 0, lp, 1.0), np.inf)
            tf = np.where(lf > 0, draws.e_fail[rows, cols] / np.where(lf > 0, lf, 1.0), np.inf)
        return t_abs + np.minimum(tp, tf), tp <= tf
    return proc.hit(t_abs), np.ones(len(t_abs), dtype=bool)


# ---------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Distribution:
    """Mean and tail percentiles of one outcome over the simulated runs."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        v = np.asarray(values, dtype=float)
        if v.size == 0:
            return cls(math.nan, math.nan, math.nan, math.nan)
        p50, p90, p99 = np.percentile(v, [50, 90, 99])
        return cls(float(v.mean()), float(p50), float(p90), float(p99))


METRICS = ("wall_h", "spend", "lost_work_h", "alpha", "interruptions", "preemptions", "failures", "switches")


@dataclass
class SimResult:
    """Per-run outcomes of one policy; arrays of length ``runs``."""

    label: str
    status: np.ndarray
    wall_h: np.ndarray
    spend: np.ndarray
    lost_work_h: np.ndarray
    billed_h: np.ndarray
    spot_h: np.ndarray
    work_on_spot_h: np.ndarray
    preemptions: np.ndarray
    failures: np.ndarray
    switches: np.ndarray
    capacity_timeouts: np.ndarray
    final_tier: np.ndarray
    deadline_h: float | None = None

    @property
    def runs(self) -> int:
        return len(self.status)

    @property
    def alpha(self) -> np.ndarray:
        """Spot share of billed hours: the alpha that makes the seed's formula exact."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.billed_h > 0, self.spot_h / np.where(self.billed_h > 0, self.billed_h, 1.0), 0.0)

    @property
    def interruptions(self) -> np.ndarray:
        return self.preemptions + self.failures

    @property
    def finished(self) -> np.ndarray:
        return self.status == FINISHED

    @property
    def finished_fraction(self) -> float:
        return float(self.finished.mean())

    def met_deadline(self, deadline_h: float | None = None) -> np.ndarray:
        d = self.deadline_h if deadline_h is None else deadline_h
        return self.finished if d is None else self.finished & (self.wall_h <= d + _EPS)

    def deadline_probability(self, deadline_h: float | None = None) -> float:
        return float(self.met_deadline(deadline_h).mean())

    @property
    def mean_spend(self) -> float:
        return float(self.spend.mean())

    def summary(self) -> dict[str, Distribution]:
        return {m: Distribution.of(getattr(self, m)) for m in METRICS}

    def outcome(self, i: int) -> dict[str, float | int | str]:
        """One run's outcome, for comparisons and debugging."""
        return {
            "status": STATUS_NAMES[int(self.status[i])],
            "wall_h": float(self.wall_h[i]),
            "spend": float(self.spend[i]),
            "lost_work_h": float(self.lost_work_h[i]),
            "billed_h": float(self.billed_h[i]),
            "spot_h": float(self.spot_h[i]),
            "work_on_spot_h": float(self.work_on_spot_h[i]),
            "preemptions": int(self.preemptions[i]),
            "failures": int(self.failures[i]),
            "switches": int(self.switches[i]),
            "capacity_timeouts": int(self.capacity_timeouts[i]),
            "final_tier": int(self.final_tier[i]),
        }


def _empty_result(label: str, runs: int, deadline: float | None) -> SimResult:
    z = np.zeros(runs)
    zi = np.zeros(runs, dtype=np.int64)
    return SimResult(label, zi.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy(),
                     zi.copy(), zi.copy(), zi.copy(), zi.copy(), zi.copy(), deadline)


# ---------------------------------------------------------------------------------------
# Engine 1: the reference, driving FallbackPolicy event by event


def _scripted_next(proc: ScriptedModel, n: int) -> tuple[float, float]:
    wait = proc.waits_h[n] if n < len(proc.waits_h) else 0.0
    up = proc.uptimes_h[n] if n < len(proc.uptimes_h) else math.inf
    return wait, up


def _policy_run(policy: FallbackPolicy, job: JobSpec, procs, draws: _Draws | None, r: int, offset: float,
                horizon_h: float, out: SimResult) -> None:
    W, tau, delta = job.work_h, job.tau_h, job.checkpoint_cost_h
    R, prov = job.restart_overhead_h, job.provisioning_delay_h
    notice_h = job.notice_s / 3600.0
    jit = job.jit_checkpoint and notice_h >= delta
    state = policy.decide(policy.initial_state(), RunStarted(t=0.0)).state
    t = committed = 0.0
    col, started = 0, False
    acquisitions = [0] * len(policy.tiers)
    spend = lost = billed = spot_h = work_spot = 0.0
    pre = fail = switches = timeouts = 0
    status = 0
    one = np.ones(1)
    while status == 0:
        k = state.tier
        tier, proc = policy.tiers[k], procs[k]
        deadline_s = policy.capacity_deadline(state)
        cap_deadline = math.inf if deadline_s is None else deadline_s / 3600.0
        wait_from = t
        if draws is not None:
            draws.ensure(col)
        row, c = np.array([r]), np.array([col])
        if isinstance(proc, ScriptedModel):
            wait, up = _scripted_next(proc, acquisitions[k])
            acq = t + wait + prov
        else:
            acq = float(_acquire(proc, draws, row, c, np.array([t + offset]), prov * one, np.array([cap_deadline + offset]))[0]) - offset
        if acq > cap_deadline:
            if cap_deadline > horizon_h:
                t, status = horizon_h, STUCK
                break
            t = cap_deadline
            timeouts += 1
            step = policy.decide(state, CapacityTimedOut(t=t * 3600.0, waited_s=(t - wait_from) * 3600.0))
        elif acq > horizon_h:
            t, status = horizon_h, STUCK
            break
        else:
            t = acq
            acquisitions[k] += 1
            state = policy.decide(state, WorkersAcquired(t=t * 3600.0, num_workers=tier.num_workers)).state
            if isinstance(proc, ScriptedModel):
                t_int, is_pre = t + up, proc.kind == "preempt"
            else:
                ti, ip = _interrupt(proc, draws, row, c, np.array([t + offset]), np.array([float(tier.num_workers)]))
                t_int, is_pre = float(ti[0]) - offset, bool(ip[0])
            overhead = R if started else 0.0
            started = True
            rem = W - committed
            t_fin = t + overhead + float(wall_to_finish(rem, tau, delta))
            rate = tier.num_workers * tier.price_per_worker_hour
            end = t_fin if t_fin <= t_int else t_int
            spend += (end - t) * rate
            billed += end - t
            if tier.is_spot:
                spot_h += end - t
            if t_fin <= t_int:
                if tier.is_spot:
                    work_spot += rem
                committed, t = W, t_fin
                step = policy.decide(state, Finished(t=t * 3600.0))
            else:
                x = t_int - t - overhead
                if x > 0:
                    if is_pre and jit:
                        done, _ = cycle_progress(max(x - notice_h, 0.0), tau, delta)
                        gain, lost_here = float(done), 0.0
                    else:
                        done, comm = cycle_progress(x, tau, delta)
                        gain, lost_here = float(comm), float(done) - float(comm)
                    for commit in commits_of_attempt(W, committed, t + overhead, x, gain, t_int, tau, delta):
                        state = policy.decide(state, commit).state
                    committed += gain
                    lost += lost_here
                    if tier.is_spot:
                        work_spot += gain
                t = t_int
                if is_pre:
                    pre += 1
                    step = policy.decide(state, Preempted(t=t * 3600.0))
                else:
                    fail += 1
                    step = policy.decide(state, NodeFailed(t=t * 3600.0))
        state, decision = step.state, step.decision
        if isinstance(decision, SwitchTier):
            switches += 1
        elif isinstance(decision, GiveUp):
            status = FAILED
        elif isinstance(decision, Complete):
            status = FINISHED
        if status == 0 and t > horizon_h:
            t, status = horizon_h, STUCK
        col += 1
    out.status[r], out.wall_h[r], out.spend[r], out.lost_work_h[r] = status, t, spend, lost
    out.billed_h[r], out.spot_h[r], out.work_on_spot_h[r] = billed, spot_h, work_spot
    out.preemptions[r], out.failures[r], out.switches[r] = pre, fail, switches
    out.capacity_timeouts[r], out.final_tier[r] = timeouts, state.tier


# ---------------------------------------------------------------------------------------
# Engine 2: vectorised over runs (and over candidate ladders), default leave rules only


def uses_beyond(ladder: Ladder) -> bool:
    """Whether the run can move while running: a tier climbs back or is elastic (``simulator_beyond``)."""
    return any(t.climb_back or t.is_elastic for t in ladder.tiers)


def fast_supports(ladder: Ladder) -> bool:
    """Whether the vectorised engine implements every rule of the ladder.

    It does the budgets, capacity timeouts, deadline guards and climbing back; elastic tiers,
    the preemption-rate rule and the expected-cost exit need the policy engines.
    """
    return not any(t.is_elastic or t.max_preemption_rate is not None or t.expected_cost_exit for t in ladder.tiers)


def _uses_default_rules(policy: FallbackPolicy) -> bool:
    return all(rule == leave_rule_for(t) for rule, t in zip(policy.rules, policy.tiers, strict=True))


def _fast_many(configs: Sequence[tuple[Ladder, JobSpec]], procs, runs: int, seed: int, horizon_h: float,
               labels: Sequence[str]) -> list[SimResult]:
    """The policy's rules on numpy arrays, one row per (candidate, run), a cycle per loop.

    A cycle is one wait for capacity and one attempt. Each rule mirrors a line of
    ``FallbackPolicy`` (``test_fast_engine_matches_policy_engine`` checks them run by run):
    the capacity deadline (timeout or deadline guard), the budgets and the guard after an
    interruption, and the climb back at the first checkpoint end where the policy would say
    so (``_climb_candidates``), with the remaining work a shell would report.
    """
    C = len(configs)
    K = len(configs[0][0])
    n = C * runs
    row = np.tile(np.arange(runs), C)  # draw row of each simulated run: candidates are paired
    cand = np.repeat(np.arange(C), runs)

    def per_tier(fn) -> np.ndarray:
        return np.array([[fn(t) for t in lad.tiers] for lad, _ in configs], dtype=float)[cand]

    maxpre = per_tier(lambda t: t.max_preemptions)
    maxfail = per_tier(lambda t: t.max_failures)
    timeout_s = per_tier(lambda t: math.inf if t.capacity_timeout_s is None else t.capacity_timeout_s)
    price = per_tier(lambda t: t.num_workers * t.price_per_worker_hour)
    workers = per_tier(lambda t: t.num_workers)
    is_spot = per_tier(lambda t: 1.0 if t.is_spot else 0.0).astype(bool)
    guarded = per_tier(lambda t: 1.0 if t.deadline_guard is not None else 0.0).astype(bool)
    g_work = per_tier(lambda t: t.deadline_guard.work_h if t.deadline_guard else 1.0)
    g_deadline = per_tier(lambda t: t.deadline_guard.deadline_h if t.deadline_guard else 1.0)
    g_margin = per_tier(lambda t: t.deadline_guard.margin_h if t.deadline_guard else 0.0)
    g_pace = per_tier(lambda t: t.deadline_guard.pace if t.deadline_guard else 0.0)
    climbable = per_tier(lambda t: 1.0 if t.climb_back else 0.0).astype(bool)
    dwell_s = per_tier(lambda t: t.min_dwell_s)
    fresh = per_tier(lambda t: 1.0 if t.climb_budgets == "fresh" else 0.0).astype(bool)
    any_climb = bool(climbable[:, :-1].any()) if K > 1 else False

    def per_job(fn) -> np.ndarray:
        return np.array([fn(job) for _, job in configs], dtype=float)[cand]

    W = per_job(lambda j: j.work_h)
    tau = per_job(lambda j: j.tau_h)
    delta = per_job(lambda j: j.checkpoint_cost_h)
    R = per_job(lambda j: j.restart_overhead_h)
    prov = per_job(lambda j: j.provisioning_delay_h)
    notice = per_job(lambda j: j.notice_s / 3600.0)
    jit = per_job(lambda j: float(j.jit_checkpoint)).astype(bool) & (notice >= delta)

    draws = _Draws(runs, seed)
    offset = _offsets(procs, runs, seed)[row]
    t = np.zeros(n)
    committed = np.zeros(n)
    tier = np.zeros(n, dtype=np.int64)
    wait_from = np.zeros(n)
    started = np.zeros(n, dtype=bool)
    col = np.zeros(n, dtype=np.int64)
    cnt_pre = np.zeros((n, K))
    cnt_fail = np.zeros((n, K))
    run_s = np.zeros((n, K))  # running seconds per tier, as the policy's tier_running_s
    reported_s = np.full(n, np.nan)  # the policy's remaining_work_s: last reported by a commit or an observation
    reported_gang = np.zeros(n)  # ... and the size of the gang that reported it
    climbs_to = np.zeros((n, K))
    tier_since = np.zeros(n)
    status = np.zeros(n, dtype=np.int64)
    spend, lost, billed, spot_h, work_spot = (np.zeros(n) for _ in range(5))
    pre, fail, switches, timeouts = (np.zeros(n, dtype=np.int64) for _ in range(4))

    def guard_at_s(idx: np.ndarray, k: np.ndarray) -> np.ndarray:
        """FallbackPolicy.guard_limits, in seconds: when tier k's guard says leave, progress frozen (inf: none).

        The remaining work is what the policy was last told: the shell reports it with every
        commit, so after any progress it is the wall time to finish from ``committed``.
        """
        out = np.full(idx.size, np.inf)
        on = guarded[idx, k]
        if on.any():
            i, kk = idx[on], k[on]
            gang, full = reported_gang[i], workers[i, kk]
            scaled = np.where(gang == full, reported_s[i], reported_s[i] * gang / full)  # policy.guard_limits
            rem_s = np.where(np.isnan(reported_s[i]), g_work[i, kk] * 3600.0, scaled)
            out[on] = _guard_leave_at_s(rem_s, g_work[i, kk], g_deadline[i, kk], g_margin[i, kk], g_pace[i, kk], True)
        return out

    def leave(idx: np.ndarray) -> None:
        nxt = tier[idx] + 1
        last = nxt >= K
        status[idx[last]] = FAILED
        moved = idx[~last]
        tier[moved] = nxt[~last]
        tier_since[moved] = t[moved]
        switches[moved] += 1

    while True:
        act = np.flatnonzero(status == 0)
        if act.size == 0:
            break
        draws.ensure(int(col[act].max()))
        k_act = tier[act]
        acq = np.empty(act.size)
        # FallbackPolicy.capacity_deadline, in its own units (seconds), so ties break alike.
        since_s = wait_from[act] * 3600.0
        cap_dl = np.minimum(since_s + timeout_s[act, k_act], np.maximum(since_s, guard_at_s(act, k_act))) / 3600.0
        for k in np.unique(k_act):
            m = k_act == k
            idx = act[m]
            acq[m] = _acquire(procs[k], draws, row[idx], col[idx], t[idx] + offset[idx], prov[idx], cap_dl[m] + offset[idx]) - offset[idx]
        timed = acq > cap_dl
        # Timed out with no deadline, or past the horizon: the run is stuck.
        stuck = (timed & (np.isinf(cap_dl) | (cap_dl > horizon_h))) | (~timed & (acq > horizon_h))
        si = act[stuck]
        status[si], t[si] = STUCK, horizon_h
        ti = act[timed & ~stuck]
        t[ti] = cap_dl[timed & ~stuck]
        timeouts[ti] += 1
        leave(ti)
        wait_from[ti] = t[ti]
        go = ~timed & ~stuck
        gi = act[go]
        if gi.size:
            t_acq = acq[go]
            kg = tier[gi]
            t_int = np.empty(gi.size)
            is_pre = np.empty(gi.size, dtype=bool)
            for k in np.unique(kg):
                m = kg == k
                idx = gi[m]
                ti_k, ip_k = _interrupt(procs[k], draws, row[idx], col[idx], t_acq[m] + offset[idx], workers[idx, k])
                t_int[m], is_pre[m] = ti_k - offset[idx], ip_k
            overhead = np.where(started[gi], R[gi], 0.0)
            started[gi] = True
            rem = W[gi] - committed[gi]
            t_fin = t_acq + overhead + wall_to_finish(rem, tau[gi], delta[gi])
            fin = t_fin <= t_int
            end = np.where(fin, t_fin, t_int)
            climbed = np.zeros(gi.size, dtype=bool)
            if any_climb:
                at, to, obs_s = _climb_candidates(
                    gi, kg, t_acq + overhead, end, committed, W, tau, delta, R + prov, procs, offset,
                    tier_since, climbs_to, climbable, dwell_s, fresh, cnt_pre, cnt_fail, maxpre, maxfail, run_s,
                    price, workers, guarded, g_work, g_deadline, g_margin, g_pace,
                )
                climbed = np.isfinite(at)
                if climbed.any():
                    ci, kc, jc, tc = gi[climbed], kg[climbed], to[climbed], at[climbed]
                    dur = tc - t_acq[climbed]
                    sp = is_spot[ci, kc]
                    gain, _ = cycle_progress(tc - (t_acq[climbed] + overhead[climbed]), tau[ci], delta[ci])
                    reported_s[ci] = obs_s[climbed]
                    reported_gang[ci] = workers[ci, kc]
                    spend[ci] += dur * price[ci, kc]
                    billed[ci] += dur
                    spot_h[ci] += np.where(sp, dur, 0.0)
                    work_spot[ci] += np.where(sp, gain, 0.0)
                    committed[ci] += gain
                    run_s[ci, kc] += tc * 3600.0 - t_acq[climbed] * 3600.0
                    t[ci] = tc
                    wait_from[ci] = tc
                    tier[ci] = jc
                    tier_since[ci] = tc
                    climbs_to[ci, jc] += 1
                    switches[ci] += 1
                    reset = fresh[ci, jc]
                    cnt_pre[ci[reset], jc[reset]] = 0
                    cnt_fail[ci[reset], jc[reset]] = 0
                    late = ci[t[ci] > horizon_h]
                    status[late], t[late] = STUCK, horizon_h
            stay = ~climbed
            gi, kg, t_acq, t_int, is_pre, overhead = gi[stay], kg[stay], t_acq[stay], t_int[stay], is_pre[stay], overhead[stay]
            rem, t_fin, fin, end = rem[stay], t_fin[stay], fin[stay], end[stay]
            dur = end - t_acq
            sp = is_spot[gi, kg]
            spend[gi] += dur * price[gi, kg]
            billed[gi] += dur
            spot_h[gi] += np.where(sp, dur, 0.0)
            # finished runs
            fi = gi[fin]
            work_spot[fi] += np.where(sp[fin], rem[fin], 0.0)
            committed[fi] = W[fi]
            t[fi] = t_fin[fin]
            status[fi] = FINISHED
            # interrupted runs
            ni = gi[~fin]
            if ni.size:
                x = t_int[~fin] - t_acq[~fin] - overhead[~fin]
                ip = is_pre[~fin]
                use_jit = ip & jit[ni]
                x_eff = np.where(use_jit, np.maximum(x - notice[ni], 0.0), np.maximum(x, 0.0))
                done, comm = cycle_progress(x_eff, tau[ni], delta[ni])
                gain = np.where(x > 0, np.where(use_jit, done, comm), 0.0)
                lost[ni] += np.where((x > 0) & ~use_jit, done - comm, 0.0)
                committed[ni] += gain
                reported_s[ni] = np.where(gain > 0, wall_to_finish(np.maximum(W[ni] - committed[ni], 0.0), tau[ni], delta[ni])
                                          * 3600.0, reported_s[ni])
                reported_gang[ni] = np.where(gain > 0, workers[ni, tier[ni]], reported_gang[ni])
                work_spot[ni] += np.where(sp[~fin], gain, 0.0)
                t[ni] = t_int[~fin]
                wait_from[ni] = t[ni]
                kn = tier[ni]
                run_s[ni, kn] += t[ni] * 3600.0 - t_acq[~fin] * 3600.0
                pi, fi2 = ni[ip], ni[~ip]
                cnt_pre[pi, kn[ip]] += 1
                pre[pi] += 1
                cnt_fail[fi2, kn[~ip]] += 1
                fail[fi2] += 1
                lim_p = maxpre[ni, kn]
                lim_f = maxfail[ni, kn]
                over = ((lim_p != -1) & (cnt_pre[ni, kn] > lim_p)) | ((lim_f != -1) & (cnt_fail[ni, kn] > lim_f))
                over |= t[ni] * 3600.0 >= guard_at_s(ni, kn)
                leave(ni[over])
                late = ni[(status[ni] == 0) & (t[ni] > horizon_h)]
                status[late], t[late] = STUCK, horizon_h
        col[act] += 1

    results = []
    for c in range(C):
        sl = slice(c * runs, (c + 1) * runs)
        res = _empty_result(labels[c], runs, configs[c][1].deadline_h)
        res.status[:] = status[sl]
        res.wall_h[:] = t[sl]
        res.spend[:] = spend[sl]
        res.lost_work_h[:] = lost[sl]
        res.billed_h[:] = billed[sl]
        res.spot_h[:] = spot_h[sl]
        res.work_on_spot_h[:] = work_spot[sl]
        res.preemptions[:] = pre[sl]
        res.failures[:] = fail[sl]
        res.switches[:] = switches[sl]
        res.capacity_timeouts[:] = timeouts[sl]
        res.final_tier[:] = tier[sl]
        results.append(res)
    return results


def _guard_leave_at_s(rem_s: np.ndarray, work_h: np.ndarray, deadline_h: np.ndarray, margin_h: np.ndarray,
                      pace: np.ndarray, on: np.ndarray) -> np.ndarray:
    """``min(FallbackPolicy.guard_limits)`` for a run started at 0, seconds; inf where ``on`` is False."""
    behind = _schedule_s(rem_s, work_h, deadline_h, pace) + margin_h * 3600.0
    must_go = 0.0 + deadline_h * 3600.0 - rem_s - margin_h * 3600.0
    return np.where(on, np.minimum(behind, must_go), np.inf)


def _schedule_s(rem_s: np.ndarray, work_h: np.ndarray, deadline_h: np.ndarray, pace: np.ndarray) -> np.ndarray:
    """``policy.schedule_time`` (same operations, so the same floats): inf at pace 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        line = 0.0 + (work_h * 3600.0 - rem_s) * deadline_h / np.where(pace > 0, pace * work_h, 1.0)
    return np.where(pace > 0, line, np.inf)


def _climb_candidates(gi, kg, start, end, committed, W, tau, delta, restart_h, procs, offset, tier_since, climbs_to,
                      climbable, dwell_s, fresh, cnt_pre, cnt_fail, maxpre, maxfail, run_s, price, workers, guarded,
                      g_work, g_deadline, g_margin, g_pace):
    """For runs ``gi`` running on tiers ``kg`` from ``start`` to ``end``: (time, tier, remaining_work_s) of a climb.

    The first checkpoint end at which ``FallbackPolicy._observed`` says ``ClimbBack``, with
    the observation ``simulator_beyond`` would feed: capacity of a higher climb-back tier
    fits, the dwell has passed, the deadline guard (if any) is ahead of schedule by two
    restarts with slack to spare, and ``climb_pays``. The tests are the policy's own
    arithmetic in its own units. Over the checkpoint ends of one attempt the remaining work
    falls by a cycle each, so ``climb_pays`` only gets worse, the slack stays and the
    schedule gets further ahead: the search jumps to the first end ahead of schedule and
    stops where paying ends. inf where there is no climb before ``end``.
    """
    best_at = np.full(gi.size, np.inf)
    best_to = np.zeros(gi.size, dtype=np.int64)
    best_rem = np.zeros(gi.size)
    for j in range(climbable.shape[1] - 1):
        sel = np.flatnonzero((kg > j) & climbable[gi, j])
        if sel.size == 0:
            continue
        idx, k = gi[sel], kg[sel]
        s, e, cyc = start[sel], end[sel], tau[idx] + delta[idx]
        since_s = tier_since[idx] * 3600.0
        dwell = dwell_s[idx, j] * 2.0 ** np.minimum(climbs_to[idx, j], 4)
        look = np.maximum(s, tier_since[idx] + dwell / 3600.0)
        kk = np.maximum(1.0, np.ceil((look - s) / cyc - _EPS))
        # The observation's fields and the policy's state that do not change during the attempt.
        restart_s = restart_h[idx] * 3600.0
        interval_s = tau[idx] * 3600.0
        w_cur, w_to = workers[idx, k], workers[idx, j]
        rate_cur, rate_to = price[idx, k], price[idx, j]
        per_pre = (restart_s / 3600.0 + interval_s / 7200.0) * rate_to
        pre_next = np.where(fresh[idx, j], 0.0, cnt_pre[idx, j]) + 1
        fails = np.where(fresh[idx, j], 0.0, cnt_fail[idx, j])
        trips = ((maxpre[idx, j] != -1) & (pre_next > maxpre[idx, j])) | ((maxfail[idx, j] != -1) & (fails > maxfail[idx, j]))
        per_pre = per_pre + np.where(trips, restart_s / 3600.0 * rate_cur, 0.0)
        lam = cnt_pre[idx, j] / (run_s[idx, j] / 3600.0 + 0.25)
        g, gw, gd, gm, gp = guarded[idx, j], g_work[idx, j], g_deadline[idx, j], g_margin[idx, j], g_pace[idx, j]
        # Jump to about the first checkpoint end ahead of schedule (remaining falls a cycle per end).
        rem0 = wall_to_finish(np.maximum(W[idx] - committed[idx], 0.0), tau[idx], delta[idx]) * w_cur / w_to
        with np.errstate(divide="ignore", invalid="ignore"):
            kappa = np.where(gp > 0, gd / np.where(gp > 0, gp * gw, 1.0), 0.0)  # schedule hours per hour of work
            gaining = kappa * w_cur / w_to > 1.0
            n_ahead = (s + 2.0 * restart_h[idx] - (gw - rem0) * kappa) / (cyc * (kappa * w_cur / w_to - 1.0))
        kk = np.where(g & gaining & np.isfinite(n_ahead), np.maximum(kk, np.ceil(n_ahead) - 2.0), kk)
        proc = procs[j]
        todo = np.ones(sel.size, dtype=bool)
        found_at = np.full(sel.size, np.inf)
        found_rem = np.zeros(sel.size)
        while True:
            q = np.flatnonzero(todo)
            if q.size == 0:
                break
            iq = idx[q]
            at = s[q] + kk[q] * cyc[q]
            past = at >= e[q]
            if isinstance(proc, TraceCapacity):
                ok = proc.is_ok(np.where(past, 0.0, at) + offset[iq]) & ~past
            else:
                ok = ~past
            t_s = at * 3600.0
            ok &= ~(t_s - since_s[q] < dwell[q])
            done, _ = cycle_progress(at - s[q], tau[iq], delta[iq])
            left = np.maximum(W[iq] - committed[iq] - done, 0.0)
            rem_s = wall_to_finish(left, tau[iq], delta[iq]) * 3600.0  # the observation's remaining_work_s
            # climb_pays
            rem_cur_h = rem_s / 3600.0
            rem_to_h = rem_cur_h * w_cur[q] / w_to[q]
            saving = rem_cur_h * rate_cur[q] - rem_to_h * rate_to[q]
            expected = lam[q] * rem_to_h * per_pre[q]
            pays = saving > restart_s[q] / 3600.0 * rate_to[q] + expected
            # guard_allows_climb
            rem_to_s = rem_s * w_cur[q] / w_to[q]
            behind = _schedule_s(rem_to_s, gw[q], gd[q], gp[q]) + gm[q] * 3600.0
            must_go = 0.0 + gd[q] * 3600.0 - rem_to_s - gm[q] * 3600.0
            need = t_s + 2.0 * restart_s[q]
            on_line = behind - gm[q] * 3600.0 >= need
            slack_ok = must_go >= need
            ahead = ~g[q] | (on_line & slack_ok)
            yes = ok & ahead & pays
            found_at[q[yes]] = at[yes]
            found_rem[q[yes]] = rem_s[yes]
            # The slack is the same at every end of the attempt (up to rounding: stop only when
            # it is short by more than a millisecond), the line is never reached when not gaining.
            short = must_go - need < -1e-3
            never = ~pays | (g[q] & short & (w_cur[q] == w_to[q])) | (g[q] & ~on_line & ~gaining[q])
            stop = yes | past | never
            todo[q[stop]] = False
            cont = q[~stop]
            nxt = kk[cont] + 1.0
            off = ~ok[~stop]
            if isinstance(proc, TraceCapacity) and off.any():  # jump to where the capacity is back
                r = cont[off]
                back = proc.next_available(s[r] + kk[r] * cyc[r] + offset[idx[r]]) - offset[idx[r]]
                nxt[off] = np.maximum(nxt[off], np.ceil((back - s[r]) / cyc[r] - _EPS))
            kk[cont] = nxt
        better = found_at < best_at[sel]
        best_at[sel[better]] = found_at[better]
        best_to[sel[better]] = j
        best_rem[sel[better]] = found_rem[better]
    return best_at, best_to, best_rem


# ---------------------------------------------------------------------------------------
# Public entry points

Engine = Literal["auto", "fast", "policy"]


def _compile_world(ladder: Ladder, world: Sequence[Process]) -> list:
    if len(world) != len(ladder):
        raise ValueError(f"world has {len(world)} processes for {len(ladder)} tiers; give one per tier")
    return [compile_process(p, t.num_workers) for p, t in zip(world, ladder.tiers, strict=True)]


def default_horizon_h(job: JobSpec) -> float:
    """Give up on a run (status 'stuck') after this long: 100x the work, or 10x the deadline."""
    return max(100.0 * job.work_h, 10.0 * (job.deadline_h or 0.0))


def simulate(
    ladder: Ladder | Sequence[Tier] | FallbackPolicy,
    job: JobSpec,
    world: Sequence[Process],
    runs: int = 1000,
    seed: int = 0,
    engine: Engine = "auto",
    horizon_h: float | None = None,
    label: str = "",
    start_h: float | None = None,
) -> SimResult:
    """Simulate ``runs`` independent runs of ``job`` under the ladder's fallback policy.

    ``engine="policy"`` drives ``FallbackPolicy.decide`` event by event (the reference; a
    ladder that climbs back or is elastic runs on ``simulator_beyond``, which also feeds the
    policy while the run runs); ``"fast"`` is the vectorised equivalent for the rules it
    implements (``fast_supports``, default leave rules); ``"auto"`` picks it whenever it
    applies. ``start_h``: start every run this many hours into the traces instead of at a
    random tick, to predict one recorded replay (the benchmarks compare such a prediction
    with a run on the local cluster); it uses the policy engine.
    """
    if runs <= 0:
        raise ValueError(f"runs must be > 0, got {runs}")
    policy = ladder if isinstance(ladder, FallbackPolicy) else FallbackPolicy(make_ladder(ladder))
    if start_h is not None and (uses_beyond(policy.ladder) or engine == "fast"):
        raise ValueError("start_h needs engine='policy' and a ladder that does not climb back or resize")
    fast_ok = (
        _uses_default_rules(policy)
        and fast_supports(policy.ladder)
        and not any(isinstance(p, ScriptedModel) for p in world)
    )
    if engine == "fast" and not fast_ok:
        raise ValueError(
            "the fast engine needs the default leave rules, no elastic tier, max_preemption_rate or "
            "expected_cost_exit, and no ScriptedModel; use engine='policy'"
        )
    if uses_beyond(policy.ladder) and (engine == "policy" or not fast_ok):
        from spotfallback.sim.beyond import simulate_beyond

        return simulate_beyond(policy, job, world, runs, seed, horizon_h, label)
    procs = _compile_world(policy.ladder, world)
    horizon = default_horizon_h(job) if horizon_h is None else horizon_h
    if engine != "policy" and fast_ok and start_h is None:
        return _fast_many([(policy.ladder, job)], procs, runs, seed, horizon, [label])[0]
    draws = _Draws(runs, seed)
    offsets = _offsets(procs, runs, seed) if start_h is None else np.full(runs, float(start_h))
    out = _empty_result(label, runs, job.deadline_h)
    for r in range(runs):
        _policy_run(policy, job, procs, draws, r, float(offsets[r]), horizon, out)
    return out


def simulate_many(
    configs: Sequence[tuple[Ladder, JobSpec]],
    world: Sequence[Process],
    runs: int = 1000,
    seed: int = 0,
    horizon_h: float | None = None,
    labels: Sequence[str] | None = None,
) -> list[SimResult]:
    """Many candidate (ladder, job) pairs in one vectorised pass, on the same random draws.

    Candidates must share the tier count and each tier's ``num_workers`` (the world's traces
    are compiled per gang size); prices, budgets, timeouts and job parameters may differ.
    """
    if not configs:
        return []
    ladders = [make_ladder(lad) for lad, _ in configs]
    if not all(fast_supports(lad) for lad in ladders):
        raise ValueError(
            "simulate_many runs the fast engine; elastic tiers, max_preemption_rate and expected_cost_exit need simulate()"
        )
    shape = [t.num_workers for t in ladders[0].tiers]
    for lad in ladders:
        if [t.num_workers for t in lad.tiers] != shape:
            raise ValueError("all candidate ladders must have the same tiers' num_workers")
    procs = _compile_world(ladders[0], world)
    if any(isinstance(p, ScriptedModel) for p in procs):
        raise ValueError("simulate_many runs the fast engine; ScriptedModel needs simulate(engine='policy')")
    horizon = horizon_h if horizon_h is not None else max(default_horizon_h(job) for _, job in configs)
    names = list(labels) if labels is not None else [""] * len(configs)
    return _fast_many(list(zip(ladders, [j for _, j in configs], strict=True)), procs, runs, seed, horizon, names)


# ---------------------------------------------------------------------------------------
# Baseline: Uniform Progress (Wu et al., "Can't Be Late", NSDI '24)

IDLE, ON_SPOT, ON_OD = 0, 1, 2


def simulate_uniform_progress(
    job: JobSpec,
    spot_tier: Tier,
    on_demand_tier: Tier,
    spot: Process,
    runs: int = 1000,
    seed: int = 0,
    tick_h: float | None = None,
    horizon_h: float | None = None,
    label: str = "uniform-progress",
    checkpoint_on_demand: bool = False,
) -> SimResult:
    """Deadline-aware baseline: spot while ahead of the straight line from start to deadline.

    Rules as in the paper, decided every ``tick_h`` (default 5 min, rounded to whole trace ticks):
    safety net (on-demand to the end once the slack is down to one restart + margin),
    hysteresis (stay on on-demand until progress >= ep(t + 2d)), exploitation (stay on spot
    until preempted), taking risks (spot whenever it is available), uniform progress
    (on-demand when idle and behind ep(t) = t * W / D), otherwise idle. d, the changeover
    delay, is provisioning + restart. A voluntary switch checkpoints first (delta, billed).
    On-demand sessions take no periodic checkpoints (nothing interrupts them here), which
    favours the baseline over a ladder that keeps one interval throughout; with
    ``checkpoint_on_demand=True`` they checkpoint every tau too and the safety net counts those
    writes in the time still needed: the same job as a ladder's, which is how the planner
    compares. Node failures without notice are not modelled here: only the spot process's
    preemptions and outages.
    """
    if job.deadline_h is None:
        raise ValueError("Uniform Progress needs a deadline (JobSpec.deadline_h)")
    proc = compile_process(spot, spot_tier.num_workers)
    if isinstance(proc, ScriptedModel):
        raise ValueError("Uniform Progress runs on a rate model or a trace, not a ScriptedModel")
    is_trace = isinstance(proc, TraceCapacity)
    if tick_h is None:  # decide every 5 minutes, or every trace tick if those are longer
        tick_h = proc.gap_h * max(1, round((1.0 / 12.0) / proc.gap_h)) if is_trace else 1.0 / 12.0
    elif is_trace and not math.isclose(tick_h / proc.gap_h, round(tick_h / proc.gap_h)):
        raise ValueError(f"tick_h must be a multiple of the trace gap ({proc.gap_h * 3600:g} s)")
    h = tick_h
    W, D, tau, delta = job.work_h, job.deadline_h, job.tau_h, job.checkpoint_cost_h
    R, prov, notice = job.restart_overhead_h, job.provisioning_delay_h, job.notice_s / 3600.0
    jit = job.jit_checkpoint and notice >= delta
    d = prov + R
    horizon = default_horizon_h(job) if horizon_h is None else horizon_h
    price = {ON_SPOT: spot_tier.price_per_hour(), ON_OD: on_demand_tier.price_per_hour()}
    rng = np.random.default_rng([seed, 2])
    offset = _offsets([proc], runs, seed)

    mode = np.zeros(runs, dtype=np.int64)
    last_kind = np.zeros(runs, dtype=np.int64)
    base = np.zeros(runs)  # committed progress when the current session started
    x = np.zeros(runs)  # compute-phase hours in the current session
    wait_left = np.zeros(runs)
    over_left = np.zeros(runs)
    hit = np.full(runs, np.inf)  # trace: when the current spot session is interrupted
    spot_back = np.zeros(runs)  # rate model: when spot capacity returns
    started = np.zeros(runs, dtype=bool)
    safety = np.zeros(runs, dtype=bool)
    out = _empty_result(label, runs, D)
    status = out.status
    if not is_trace:
        first_out = rng.random(runs) < proc.outage_probability
        spot_back = np.where(first_out, rng.standard_exponential(runs) * proc.mean_outage_h, 0.0)
    lam_p = proc.preemptions_per_node_hour * spot_tier.num_workers if not is_trace else 0.0

    tau_od = tau if checkpoint_on_demand else NEVER_H

    def tau_of(m: np.ndarray) -> np.ndarray:
        return np.where(m == ON_OD, tau_od, tau)

    def progress() -> tuple[np.ndarray, np.ndarray]:
        done, comm = cycle_progress(x, tau_of(mode), delta)
        return base + done, base + comm

    steps = int(math.ceil(horizon / h))
    for step in range(steps):
        act = status == 0
        if not act.any():
            break
        t = step * h
        done, comm = progress()
        spot_ok = proc.is_ok(offset + t) if is_trace else t >= spot_back
        need = prov + R + wall_to_finish(np.maximum(W - comm, 0.0), tau_od, delta)  # on-demand to the end
        safety |= act & (D - t <= need + d + h + delta)
        ep_now, ep_hyst = t * W / D, (t + 2 * d) * W / D
        target = np.where(
            safety,
            ON_OD,
            np.where(
                (mode == ON_OD) & (done < ep_hyst),
                ON_OD,
                np.where(mode == ON_SPOT, ON_SPOT, np.where(spot_ok, ON_SPOT, np.where(done < ep_now, ON_OD, IDLE))),
            ),
        )
        change = act & (target != mode)
        # Leaving an instance on purpose: checkpoint first (billed on it), then go.
        leaving = change & (mode != IDLE)
        if leaving.any():
            ckpt = np.where(leaving, delta, 0.0)
            for m_, p_ in price.items():
                sel = leaving & (mode == m_)
                out.spend[sel] += ckpt[sel] * p_
                out.billed_h[sel] += ckpt[sel]
                if m_ == ON_SPOT:
                    out.spot_h[sel] += ckpt[sel]
            out.work_on_spot_h[leaving & (mode == ON_SPOT)] += (done - base)[leaving & (mode == ON_SPOT)]
            base = np.where(leaving, done, base)
            x = np.where(leaving, 0.0, x)
        entering = change & (target != IDLE)
        out.switches[entering & started & (last_kind != target)] += 1
        wait_left = np.where(entering, prov + np.where(leaving, delta, 0.0), wait_left)
        over_left = np.where(entering, np.where(started, R, 0.0), over_left)
        base = np.where(change, np.where(leaving, base, comm), base)
        x = np.where(change, 0.0, x)
        last_kind = np.where(entering, target, last_kind)
        started |= entering
        mode = np.where(act, target, mode)
        if is_trace:
            new_spot = entering & (target == ON_SPOT)
            if new_spot.any():
                hit = np.where(new_spot, proc.hit(offset + t), hit)

        # Advance through [t, t + h).
        running = act & (mode != IDLE)
        t_int = np.full(runs, np.inf)
        on_spot = running & (mode == ON_SPOT)
        if is_trace:
            t_int = np.where(on_spot, hit - offset, np.inf)
        elif lam_p > 0:
            u = rng.random(runs)
            p_pre = 1.0 - math.exp(-lam_p * h)
            t_int = np.where(on_spot & (u < p_pre), t + rng.random(runs) * h, np.inf)
        end = np.minimum(t + h, t_int)
        dur = np.where(running, end - t, 0.0)
        w = np.minimum(dur, wait_left)
        wait_left -= w
        rest = dur - w
        o = np.minimum(rest, over_left)
        over_left -= o
        comp = rest - o
        x_need = wall_to_finish(np.maximum(W - base, 0.0), tau_of(mode), delta)
        fin = running & (x + comp >= x_need - _EPS)
        comp_used = np.where(fin, np.maximum(x_need - x, 0.0), comp)
        billed_now = np.where(running, o + comp_used, 0.0)
        for m_, p_ in price.items():
            sel = running & (mode == m_)
            out.spend[sel] += billed_now[sel] * p_
            out.billed_h[sel] += billed_now[sel]
            if m_ == ON_SPOT:
                out.spot_h[sel] += billed_now[sel]
        x = np.where(running, x + comp_used, x)
        fin_time = t + w + o + comp_used
        out.work_on_spot_h[fin & (mode == ON_SPOT)] += (W - base)[fin & (mode == ON_SPOT)]
        out.wall_h[fin] = fin_time[fin]
        status[fin] = FINISHED
        base = np.where(fin, W, base)
        mode = np.where(fin, IDLE, mode)
        interrupted = running & ~fin & (t_int <= t + h + _EPS)
        if interrupted.any():
            done_i, comm_i = cycle_progress(x, tau, delta)
            if jit:  # the notice covers a checkpoint: keep the work done until the notice
                keep, _ = cycle_progress(np.maximum(x - notice, 0.0), tau, delta)
            else:
                keep = comm_i
            if not jit:  # with a just-in-time checkpoint the workers hold: nothing is lost
                out.lost_work_h[interrupted] += (done_i - keep)[interrupted]
            out.work_on_spot_h[interrupted] += keep[interrupted]
            base = np.where(interrupted, base + keep, base)
            x = np.where(interrupted, 0.0, x)
            mode = np.where(interrupted, IDLE, mode)
            out.preemptions[interrupted] += 1
            if not is_trace:
                outage = np.where(
                    rng.random(runs) < proc.outage_probability, rng.standard_exponential(runs) * proc.mean_outage_h, 0.0
                )
                spot_back = np.where(interrupted, t_int + outage, spot_back)
    left = status == 0
    status[left] = STUCK
    out.wall_h[left] = horizon
    out.final_tier[:] = np.where(last_kind == ON_OD, 1, 0)
    return out


# ---------------------------------------------------------------------------------------
# The simulator's own optimum checkpoint interval, to check Young/Daly against


def simulated_optimal_interval(
    job: JobSpec,
    interruptions_per_node_hour: float,
    num_workers: int,
    taus_h: Sequence[float],
    runs: int = 2000,
    seed: int = 0,
) -> tuple[float, list[float]]:
    """The tau (from ``taus_h``) minimising mean wall time on one tier that never gives up.

    Interruptions are unannounced node failures, the setting Young's and Daly's formulas
    assume: work since the last checkpoint is lost, then the job restarts after R.
    """
    tier = Tier(name="gang", market="spot", num_workers=num_workers, max_preemptions=-1, max_failures=-1,
                capacity_timeout_s=None, price_per_worker_hour=1.0)
    world = [RateModel(failures_per_node_hour=interruptions_per_node_hour)]
    configs = [(Ladder(tiers=(tier,)), job.with_interval(tau)) for tau in taus_h]
    results = simulate_many(configs, world, runs=runs, seed=seed)
    means = [float(r.wall_h.mean()) for r in results]
    best = int(np.argmin(means))
    return float(taus_h[best]), means


__all__ = [
    "FAILED",
    "FINISHED",
    "STUCK",
    "Distribution",
    "JobSpec",
    "Process",
    "RateModel",
    "ScriptedModel",
    "SimResult",
    "TraceCapacity",
    "compile_node_trace",
    "compile_process",
    "compile_spot_trace",
    "complement_trace",
    "cycle_progress",
    "default_horizon_h",
    "fast_supports",
    "simulate",
    "simulate_many",
    "simulate_uniform_progress",
    "simulated_optimal_interval",
    "wall_to_finish",
    "world_for",
]
