"""The policy engine: one run at a time, driving the very ``FallbackPolicy`` the runner uses.

Why it exists: a plan is only worth something if it predicts what the runner will do, so
this engine hands the policy the typed events a shell would and follows its decisions:
workers acquired, checkpoint commits with the remaining work a training function reports,
preemptions, node failures and capacity timeouts. For a ladder that moves while the run
runs it also makes the controller shell's ``CapacityObserved`` calls:

* the tiers above that allow a climb back: at the end of every checkpoint write after the
  tier's dwell at which their capacity is there (the shell observes after each commit, so a
  climb or a resize loses no work), until the policy says climb; a climb costs one restart
  (``R``) and the provisioning delay like any other move. A gang that checkpoints on request
  (``JobSpec.checkpoint_on_request``) is observed every ``LOOK_EVERY_H`` instead, and its
  climb waits for the checkpoint it asks for: one write, billed on the gang it leaves;
* an elastic tier (``min_workers``): it starts with whatever the trace offers between min
  and max, a gang of ``s`` of ``N`` workers progresses at ``s/N`` of the full rate and costs
  ``s`` workers; losing a node restarts it smaller at once; a shrunk gang is observed at
  every checkpoint end, so more capacity after the dwell grows it and its deadline guard can
  send it down.

Every rule the policy has therefore runs here, custom leave rules included; the vectorised
engine (``sim.fast``) re-implements the common ones on arrays and is checked against this
one run by run, on the same random draws.

The world, per run (hours internally, seconds in the events handed to the policy): a gang
of N workers, losing any node stops all; after every ``tau`` hours of work a checkpoint
that takes ``delta``; every start costs ``R`` (billed, no progress), the first one too, as
a real first start pays it, and every acquisition waits ``provisioning_delay_h`` (not
billed, matching the run ledger). A preemption comes with ``notice_s`` of warning: when the notice covers a
checkpoint write the workers train on until the save's lead is left (``JobSpec.jit_lead_h``, the
runtime's rule), checkpoint just in time and hold, so no work is lost; a node failure (no
notice) loses the work since the last committed checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from spotfallback.config import Ladder, Tier
from spotfallback.events import (
    CapacityObserved,
    CapacityTimedOut,
    CheckpointCommitted,
    ClimbBack,
    Complete,
    Finished,
    GiveUp,
    NodeFailed,
    Preempted,
    Resize,
    RunStarted,
    SwitchTier,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy, PolicyState, Step
from spotfallback.sim.draws import Draws, acquire, interrupt, run_offsets
from spotfallback.sim.job import EPS, JobSpec, cycle_progress, wall_to_finish
from spotfallback.sim.results import FAILED, FINISHED, STUCK, SimResult
from spotfallback.sim.traces import NodeTrace, SpotTrace
from spotfallback.sim.world import Process, RateModel, ScriptedModel, TraceCapacity, compile_process

Compiled = RateModel | TraceCapacity | ScriptedModel
_ALWAYS = RateModel()  # "capacity or not": observe at every checkpoint end


def moves_while_running(ladder: Ladder) -> bool:
    """Whether a run can move while it runs: a tier climbs back or is elastic."""
    return any(t.climb_back or t.is_elastic for t in ladder.tiers)


def simulate_policy(policy: FallbackPolicy, job: JobSpec, world: Sequence[Process], runs: int, seed: int,
                    horizon_h: float, label: str = "", start_h: float | np.ndarray | None = None) -> SimResult:
    """``runs`` runs of ``job`` under ``policy``; ``start_h``: where they start in the traces (one, or one per run)."""
    caps = compile_tiers(policy.ladder, world)
    draws = Draws(runs, seed)
    if start_h is None:
        offsets = run_offsets([c[min(c)] for c in caps], runs, seed)
    else:
        offsets = np.broadcast_to(np.asarray(start_h, dtype=float), (runs,))
    engine = _Engine(policy, job, caps, draws, horizon_h, moves_while_running(policy.ladder))
    out = SimResult.empty(label, runs, job.deadline_h)
    for r in range(runs):
        engine.run(r, float(offsets[r])).record(out, r)
    return out


def compile_tiers(ladder: Ladder, world: Sequence[Process]) -> list[dict[int, Compiled]]:
    """Each tier's process compiled per gang size it may run with (one size unless elastic)."""
    if len(world) != len(ladder):
        raise ValueError(f"world has {len(world)} processes for {len(ladder)} tiers; give one per tier")
    moves = moves_while_running(ladder)
    out = []
    for process, tier in zip(world, ladder.tiers, strict=True):
        if isinstance(process, ScriptedModel) and moves:
            raise ValueError("a ladder that climbs back or resizes runs rate models and traces, not a ScriptedModel")
        if tier.is_elastic and not isinstance(process, SpotTrace | NodeTrace):
            raise ValueError(f"elastic tier {tier.name!r} needs a trace (how many nodes are up), not a rate model")
        sizes = range(tier.fewest_workers, tier.num_workers + 1) if tier.is_elastic else [tier.num_workers]
        out.append({s: compile_process(process, s) for s in sizes})
    return out


# ---------------------------------------------------------------------------------------
# One run


@dataclass(slots=True)
class _Run:
    """One run's position, the policy's state and the tallies, in hours."""

    state: PolicyState
    row: np.ndarray  # the run's row of the random draws, as an index array
    acquisitions: list[int]  # per tier, for a ScriptedModel's i-th acquisition
    t: float = 0.0
    committed: float = 0.0
    col: int = 0  # the wait-and-run cycle: the column of the random draws
    status: int = 0
    spend: float = 0.0
    lost: float = 0.0
    billed: float = 0.0
    spot_h: float = 0.0
    work_spot: float = 0.0
    pre: int = 0
    fail: int = 0
    switches: int = 0
    timeouts: int = 0
    cluster: str | None = None  # the last attempt's Ray cluster (a ladder across clusters)

    def bill(self, tier: Tier, workers: int, hours: float) -> None:
        self.spend += hours * (workers * tier.price_per_worker_hour)
        self.billed += hours
        if tier.is_spot:
            self.spot_h += hours

    def progress(self, tier: Tier, gain: float) -> None:
        self.committed += gain
        if tier.is_spot:
            self.work_spot += gain

    def record(self, out: SimResult, r: int) -> None:
        out.status[r], out.wall_h[r], out.spend[r], out.lost_work_h[r] = self.status, self.t, self.spend, self.lost
        out.billed_h[r], out.spot_h[r], out.work_on_spot_h[r] = self.billed, self.spot_h, self.work_spot
        out.preemptions[r], out.failures[r], out.switches[r] = self.pre, self.fail, self.switches
        out.capacity_timeouts[r], out.final_tier[r] = self.timeouts, self.state.tier


class _Attempt(NamedTuple):
    """One gang's attempt on tier ``k``: workers up at ``t0``, computing after ``overhead`` at ``f`` of full speed."""

    k: int
    size: int
    t0: float
    overhead: float
    start: float
    end: float  # when it finishes or is interrupted, whichever comes first
    f: float
    tau_w: float  # work between checkpoints, in this gang's hours


class _Engine:
    """The per-run loop: wait for capacity, run an attempt, hand the outcome to the policy."""

    def __init__(self, policy: FallbackPolicy, job: JobSpec, caps: list[dict[int, Compiled]], draws: Draws,
                 horizon_h: float, moves: bool):
        self.policy, self.job, self.caps, self.draws = policy, job, caps, draws
        self.horizon_h, self.moves = horizon_h, moves
        self.jit_lead_h = job.jit_lead_h
        self.jit = job.jit_saves

    def run(self, r: int, offset: float) -> _Run:
        policy = self.policy
        run = _Run(state=policy.decide(policy.initial_state(), RunStarted(t=0.0)).state, row=np.array([r]),
                   acquisitions=[0] * len(policy.tiers))
        while run.status == 0:
            step = self._cycle(run, offset)
            if step is None:  # past the horizon: stuck
                run.t, run.status = self.horizon_h, STUCK
                break
            self._follow(run, step)
        return run

    def _cycle(self, run: _Run, offset: float) -> Step | None:
        """Wait for the current tier's capacity, then run on it: the policy's next step (None: stuck)."""
        policy = self.policy
        k = run.state.tier
        deadline_s = policy.capacity_deadline(run.state)
        cap_deadline = math.inf if deadline_s is None else deadline_s / 3600.0
        wait_from = run.t
        self.draws.ensure(run.col)
        acq, up = self._acquire(run, k, offset, cap_deadline)
        if acq > cap_deadline:
            if cap_deadline > self.horizon_h:
                return None
            run.t = cap_deadline
            run.timeouts += 1
            return policy.decide(run.state, CapacityTimedOut(t=run.t * 3600.0, waited_s=(run.t - wait_from) * 3600.0))
        if acq > self.horizon_h:
            return None
        return self._attempt(run, k, acq, up, offset)

    def _acquire(self, run: _Run, k: int, offset: float, cap_deadline: float) -> tuple[float, float]:
        """(when the workers are up, a script's uptime) on tier ``k``, the tier's smallest gang."""
        caps = self.caps[k]
        proc = caps[min(caps)]
        prov = self.job.provisioning_delay_h
        if isinstance(proc, ScriptedModel):
            n = run.acquisitions[k]
            wait = proc.waits_h[n] if n < len(proc.waits_h) else 0.0
            up = proc.uptimes_h[n] if n < len(proc.uptimes_h) else math.inf
            return run.t + wait + prov, up
        c = np.array([run.col])
        # Past the horizon the run is stuck whatever it finds: a trace whose capacity never lasts the
        # provisioning would otherwise be searched for ever.
        acq = acquire(proc, self.draws, run.row, c, np.array([run.t + offset]), np.array([prov]),
                      np.array([min(cap_deadline, self.horizon_h) + offset]))
        return float(acq[0]) - offset, math.inf

    def _attempt(self, run: _Run, k: int, acq: float, up: float, offset: float) -> Step:
        """Workers up at ``acq``: run until finished, interrupted or moved by the policy."""
        policy, job = self.policy, self.job
        tier = policy.tiers[k]
        caps = self.caps[k]
        run.t = acq
        run.acquisitions[k] += 1
        size = max(_available(caps, acq + offset), min(caps)) if tier.is_elastic else tier.num_workers
        proc = caps[size]
        run.state = policy.decide(run.state, WorkersAcquired(t=acq * 3600.0, num_workers=size)).state
        if isinstance(proc, ScriptedModel):
            t_int, is_pre = acq + up, proc.kind == "preempt"
        else:
            c = np.array([run.col])
            ti, ip = interrupt(proc, self.draws, run.row, c, np.array([acq + offset]), np.array([float(size)]))
            t_int, is_pre = float(ti[0]) - offset, bool(ip[0])
        overhead = job.restart_overhead_h  # every start pays it, the first included
        cluster = policy.ladder.cluster_key(k)
        if run.cluster is not None and cluster != run.cluster:  # a move to another cluster: egress, a longer restart
            overhead += job.move_restart_h
            run.spend += job.move_cost
        run.cluster = cluster
        f = size / tier.num_workers  # share of the full gang's speed
        tau_w = job.tau_h / f
        start = acq + overhead
        rem = job.work_h - run.committed
        t_fin = acq + overhead + float(wall_to_finish(rem / f, tau_w, job.checkpoint_cost_h))
        # A notice the just-in-time save acts on stops the training a lead before the kill (the
        # runtime saves then and holds): a finish inside that lead is not reached on this gang.
        finishes = t_fin <= t_int - (self.jit_lead_h if is_pre and self.jit else 0.0)
        att = _Attempt(k, size, acq, overhead, start, t_fin if finishes else t_int, f, tau_w)
        move = self._move_while_running(run, att, offset) if self.moves else None
        if move is not None:
            return self._moved(run, att, *move)
        run.bill(tier, size, att.end - acq)
        if finishes:
            run.progress(tier, rem)
            run.committed, run.t = job.work_h, t_fin
            return policy.decide(run.state, Finished(t=t_fin * 3600.0))
        return self._interrupted(run, att, t_int, is_pre)

    def _moved(self, run: _Run, att: _Attempt, t_move: float, step: Step) -> Step:
        """The policy moved the gang at ``t_move``: at the end of a checkpoint write all work so far is
        committed; a climb on a requested checkpoint saves it too, and the gang is billed while it writes."""
        tier = self.policy.tiers[att.k]
        write = self._write_h(step.decision.to_tier, att) if isinstance(step.decision, ClimbBack) else 0.0
        run.bill(tier, att.size, t_move + write - att.t0)
        done, _ = cycle_progress(t_move - att.start, att.tau_w, self.job.checkpoint_cost_h)
        run.progress(tier, float(done) * att.f)
        run.t = t_move + write
        return step

    def _interrupted(self, run: _Run, att: _Attempt, t_int: float, is_pre: bool) -> Step:
        """Keep what was committed (or checkpointed on the notice), report the commits, then the loss."""
        policy, job = self.policy, self.job
        delta, f = job.checkpoint_cost_h, att.f
        x = t_int - att.t0 - att.overhead
        if x > 0:
            if is_pre and self.jit:
                done, _ = cycle_progress(max(x - self.jit_lead_h, 0.0), att.tau_w, delta)
                gain, lost_here = float(done) * f, 0.0
            else:
                done, comm = cycle_progress(x, att.tau_w, delta)
                gain, lost_here = float(comm) * f, (float(done) - float(comm)) * f
            # What the shell reports: wall time left on this gang after each commit.
            for commit in commits_of_attempt(job.work_h / f, run.committed / f, att.start, x, gain / f, t_int,
                                             att.tau_w, delta):
                run.state = policy.decide(run.state, commit).state
            run.progress(policy.tiers[att.k], gain)
            run.lost += lost_here
        run.t = t_int
        if is_pre:
            run.pre += 1
            return policy.decide(run.state, Preempted(t=t_int * 3600.0))
        run.fail += 1
        return policy.decide(run.state, NodeFailed(t=t_int * 3600.0))

    def _follow(self, run: _Run, step: Step) -> None:
        """Take the policy's decision: move, give up, finish or carry on."""
        run.state, decision = step.state, step.decision
        if isinstance(decision, SwitchTier | ClimbBack):
            run.switches += 1
        elif isinstance(decision, GiveUp):
            run.status = FAILED
        elif isinstance(decision, Complete):
            run.status = FINISHED
        if run.status == 0 and run.t > self.horizon_h:
            run.t, run.status = self.horizon_h, STUCK
        run.col += 1

    # -- what the controller shell observes while a gang runs -------------------------------

    def _move_while_running(self, run: _Run, att: _Attempt, offset: float) -> tuple[float, Step] | None:
        """The first climb back or elastic growth the policy takes before the attempt ends: (t, Step) or None.

        As in the controller shell, the policy is asked at the end of every checkpoint write
        (after the tier's dwell) at which the other tier, or a larger gang, could be placed, in
        time order (lower tiers first at the same time), until it says move. A gang that
        checkpoints on request is asked about higher tiers every ``LOOK_EVERY_H`` instead, and a
        climb then waits for the requested checkpoint's write (``JobSpec.climb_write_h``). A
        higher tier on another Ray cluster is looked at by the moving driver, which cannot ask the
        gang for a checkpoint: only at checkpoint ends, and its climb pays a move's restart.
        """
        policy, state, job = self.policy, run.state, self.job
        delta = job.checkpoint_cost_h
        cycle = att.tau_w + delta
        grids: dict[int, float] = {}
        since = state.tier_since if state.tier_since is not None else state.running_since
        assert since is not None, "the gang runs: WorkersAcquired set running_since"
        since_h = since / 3600.0
        needs: dict[int, RateModel | TraceCapacity] = {}
        pending: dict[int, float] = {}
        restart_s = (job.restart_overhead_h + job.provisioning_delay_h) * 3600.0
        restarts: dict[int, float] = {}  # a climb to another cluster is a move: it pays the move's restart too
        writes: dict[int, float] = {}
        for j in range(att.k + 1):
            target = policy.tiers[j]
            if j < att.k and target.climb_back:
                here = policy.ladder.same_cluster(j, att.k)
                look = max(att.start, since_h + policy.climb_dwell_s(state, j) / 3600.0)
                needs[j] = _observable(self.caps[j][min(self.caps[j])])
                grids[j] = job.climb_grid_h(cycle) if here else cycle
            elif j == att.k and target.is_elastic and att.size < target.num_workers:
                # The shell observes a shrunk elastic gang after every checkpoint, whatever the
                # capacity (the policy checks its deadline guard and whether growing pays).
                here = True
                look = att.start
                needs[j] = _ALWAYS
                grids[j] = cycle
            else:
                continue
            restarts[j] = restart_s if here else restart_s + job.move_restart_h * 3600.0
            writes[j] = self._write_h(j, att)
            at = _next_candidate(needs[j], look, att, grids[j], writes[j], offset)
            if at is not None:
                pending[j] = at
        while pending:
            j = min(pending, key=lambda i: (pending[i], i))
            at = pending[j]
            done, _ = cycle_progress(at - att.start, att.tau_w, delta)
            left_h = max(job.work_h - run.committed - float(done) * att.f, 0.0) / att.f
            event = CapacityObserved(
                t=at * 3600.0,
                tier=j,
                available_workers=_available(self.caps[j], at + offset),
                remaining_work_s=float(wall_to_finish(left_h, att.tau_w, delta)) * 3600.0,
                restart_s=restarts[j],
                # What the shell measured between two commits: none without periodic checkpoints.
                checkpoint_interval_s=att.tau_w * 3600.0 if job.checkpoint_interval_h is not None else 0.0,
            )
            step = policy.decide(state, event)
            if isinstance(step.decision, ClimbBack | Resize | SwitchTier | GiveUp):
                return at, step
            nxt = _next_candidate(needs[j], at + 0.5 * grids[j], att, grids[j], writes[j], offset)
            if nxt is None:
                del pending[j]
            else:
                pending[j] = nxt
        return None

    def _write_h(self, j: int, att: _Attempt) -> float:
        """The write between deciding a move to tier ``j`` and the gang's end: a climb's requested checkpoint
        (none for a climb to another cluster, decided at a checkpoint's end)."""
        return self.job.climb_write_h if j < att.k and self.policy.ladder.same_cluster(j, att.k) else 0.0


def _observable(proc: Compiled) -> RateModel | TraceCapacity:
    """``proc`` as a process whose capacity the shell can observe while a gang runs.

    Only ladders that move observe capacity, and ``compile_tiers`` keeps a ScriptedModel
    (which has acquisitions but no capacity over time) off those.
    """
    assert not isinstance(proc, ScriptedModel), "a ScriptedModel has no capacity to observe"
    return proc


def _is_ok(proc: RateModel | TraceCapacity, t_abs: float) -> bool:
    return True if isinstance(proc, RateModel) else bool(proc.is_ok(np.array([t_abs]))[0])


def _next_ok(proc: RateModel | TraceCapacity, t_abs: float) -> float:
    return t_abs if isinstance(proc, RateModel) else float(proc.next_available(np.array([t_abs]))[0])


def _available(caps: dict[int, Compiled], t_abs: float) -> int:
    """Largest gang the tier could place at ``t_abs`` (0 if not even its smallest)."""
    ok = [s for s, proc in caps.items() if _is_ok(_observable(proc), t_abs)]
    return max(ok) if ok else 0


def _next_candidate(need: RateModel | TraceCapacity, look: float, att: _Attempt, grid: float, write: float,
                    offset: float) -> float | None:
    """First look (every ``grid`` hours from the attempt's compute start) at or after ``look`` at which ``need``
    fits and whose move, ``write`` hours later, comes before the attempt's end."""
    while True:  # capacity may vanish again before the checkpoint ends
        found = _next_ok(need, look + offset) - offset
        if not math.isfinite(found) or found >= att.end:
            return None
        at = att.start + max(1.0, math.ceil((found - att.start) / grid - EPS)) * grid
        if at + write >= att.end:
            return None
        if _is_ok(need, at + offset):
            return at
        look = at


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
    periodic = int(math.floor(x / cyc + EPS)) if math.isfinite(cyc) and x > 0 else 0
    out = []
    for k in sorted({1, periodic - 1, periodic}):
        if k >= 1 and k * tau <= gain + EPS:
            out.append(CheckpointCommitted(t=(start + k * cyc) * 3600.0,
                                           remaining_work_s=remaining_s(work_h, committed_h + k * tau, tau, delta)))
    if not out or gain > periodic * tau + EPS:
        out.append(CheckpointCommitted(t=t_end * 3600.0, remaining_work_s=remaining_s(work_h, committed_h + gain, tau, delta)))
    return out


def remaining_s(work_h: float, committed_h: float, tau: float, delta: float) -> float:
    """The ``remaining_work_s`` a training function reports with a checkpoint: wall seconds to finish."""
    return float(wall_to_finish(max(work_h - committed_h, 0.0), tau, delta)) * 3600.0


__all__ = ["commits_of_attempt", "compile_tiers", "moves_while_running", "simulate_policy"]
