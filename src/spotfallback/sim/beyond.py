"""Monte Carlo of the ladder beyond one-way fallback: climbing back and elastic tiers.

Why a second engine: the reference engine in ``simulator`` follows one gang of a fixed size
per acquisition and never looks at the tiers above the current one. This engine extends it,
again driving the very ``FallbackPolicy`` the runner uses, with the two things the shell
feeds the policy while a run is running (``CapacityObserved``):

* the tiers above that allow a climb back: at the end of every checkpoint write after the
  tier's dwell at which their capacity is there (the controller shell observes after each
  commit, so a climb or a resize loses no work), until the policy says climb; a climb costs
  one restart (``R``) and the provisioning delay like any other move;
* an elastic tier (``min_workers``): it starts with whatever the trace offers between min and
  max, a gang of ``s`` of ``N`` workers progresses at ``s/N`` of the full rate and costs ``s``
  workers; losing a node restarts it smaller at once; a shrunk gang is observed at every
  checkpoint end, so more capacity after the dwell grows it and its deadline guard can send
  it down.

Commits carry the ``remaining_work_s`` a training function reports (wall time left on the
running gang); preemption-rate rules and the expected-cost exit need nothing more: the policy
sees each event with its time. On a one-way, rigid ladder this engine takes the same random
draws and gives the same outcome as ``simulate(engine="policy")`` run by run (a test checks
it), and on guarded and climbing ladders the same as the vectorised engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from spotfallback.config import Ladder, Tier, make_ladder
from spotfallback.events import (
    CapacityObserved,
    CapacityTimedOut,
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
from spotfallback.policy import FallbackPolicy
from spotfallback.sim.simulator import (
    FAILED,
    FINISHED,
    STUCK,
    JobSpec,
    Process,
    RateModel,
    ScriptedModel,
    SimResult,
    TraceCapacity,
    _acquire,
    _Draws,
    _empty_result,
    _interrupt,
    _offsets,
    commits_of_attempt,
    compile_process,
    cycle_progress,
    default_horizon_h,
    wall_to_finish,
)
from spotfallback.sim.traces import NodeTrace, SpotTrace

_EPS = 1e-9
Compiled = RateModel | TraceCapacity
_ALWAYS = RateModel()  # "capacity or not": observe at every checkpoint end


def _compile_tier(process: Process, tier: Tier) -> dict[int, Compiled]:
    """The tier's process compiled per gang size it may run with (one size unless elastic)."""
    if isinstance(process, ScriptedModel):
        raise ValueError("simulate_beyond runs rate models and traces, not a ScriptedModel")
    sizes = range(tier.fewest_workers, tier.num_workers + 1) if tier.is_elastic else [tier.num_workers]
    if tier.is_elastic and not isinstance(process, SpotTrace | NodeTrace):
        raise ValueError(f"elastic tier {tier.name!r} needs a trace (how many nodes are up), not a rate model")
    return {s: compile_process(process, s) for s in sizes}  # type: ignore[misc]


def _is_ok(proc: Compiled, t_abs: float) -> bool:
    return True if isinstance(proc, RateModel) else bool(proc.is_ok(np.array([t_abs]))[0])


def _next_ok(proc: Compiled, t_abs: float) -> float:
    return t_abs if isinstance(proc, RateModel) else float(proc.next_available(np.array([t_abs]))[0])


def _available(caps: dict[int, Compiled], t_abs: float) -> int:
    """Largest gang the tier could place at ``t_abs`` (0 if not even its smallest)."""
    ok = [s for s, proc in caps.items() if _is_ok(proc, t_abs)]
    return max(ok) if ok else 0


def _checkpoint_end_after(t_c: float, start: float, tau: float, delta: float) -> float:
    """First end of a checkpoint write at or after ``t_c`` for compute that began at ``start``."""
    cycle = tau + delta
    k = max(1.0, math.ceil((t_c - start) / cycle - _EPS))
    return start + k * cycle


def _beyond_run(policy: FallbackPolicy, job: JobSpec, caps: list[dict[int, Compiled]], draws: _Draws, r: int,
                offset: float, horizon_h: float, out: SimResult) -> None:
    tiers = policy.tiers
    W, tau, delta = job.work_h, job.tau_h, job.checkpoint_cost_h
    R, prov = job.restart_overhead_h, job.provisioning_delay_h
    notice_h = job.notice_s / 3600.0
    jit = job.jit_checkpoint and notice_h >= delta
    state = policy.decide(policy.initial_state(), RunStarted(t=0.0)).state
    t = committed = 0.0
    col, started = 0, False
    spend = lost = billed = spot_h = work_spot = 0.0
    pre = fail = switches = timeouts = 0
    status = 0
    one = np.ones(1)
    while status == 0:
        k = state.tier
        tier = tiers[k]
        smallest = caps[k][min(caps[k])]
        deadline_s = policy.capacity_deadline(state)
        cap_deadline = math.inf if deadline_s is None else deadline_s / 3600.0
        wait_from = t
        draws.ensure(col)
        row, c = np.array([r]), np.array([col])
        acq = float(_acquire(smallest, draws, row, c, np.array([t + offset]), prov * one, np.array([cap_deadline + offset]))[0]) - offset
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
            size = max(_available(caps[k], t + offset), min(caps[k])) if tier.is_elastic else tier.num_workers
            proc = caps[k][size]
            state = policy.decide(state, WorkersAcquired(t=t * 3600.0, num_workers=size)).state
            ti, ip = _interrupt(proc, draws, row, c, np.array([t + offset]), np.array([float(size)]))
            t_int, is_pre = float(ti[0]) - offset, bool(ip[0])
            overhead = R if started else 0.0
            started = True
            f = size / tier.num_workers  # share of the full gang's speed
            tau_w = tau / f
            start = t + overhead
            rem = W - committed
            t_fin = start + float(wall_to_finish(rem / f, tau_w, delta))
            end = min(t_fin, t_int)
            move = _move_while_running(policy, state, caps, k, size, f, start, end, tau_w, delta, committed, W, offset, job)
            rate = size * tier.price_per_worker_hour
            stop = move[0] if move is not None else end
            spend += (stop - t) * rate
            billed += stop - t
            if tier.is_spot:
                spot_h += stop - t
            if move is not None:
                t_move, step = move
                done, _ = cycle_progress(t_move - start, tau_w, delta)
                gain = float(done) * f  # the move starts right after a committed checkpoint
                committed += gain
                if tier.is_spot:
                    work_spot += gain
                t = t_move
            elif t_fin <= t_int:
                if tier.is_spot:
                    work_spot += rem
                committed, t = W, t_fin
                step = policy.decide(state, Finished(t=t * 3600.0))
            else:
                x = t_int - start
                if x > 0:
                    if is_pre and jit:
                        done, _ = cycle_progress(max(x - notice_h, 0.0), tau_w, delta)
                        gain, lost_here = float(done) * f, 0.0
                    else:
                        done, comm = cycle_progress(x, tau_w, delta)
                        gain, lost_here = float(comm) * f, (float(done) - float(comm)) * f
                    # What the shell reports: wall time left on this gang after each commit.
                    for commit in commits_of_attempt(W / f, committed / f, start, x, gain / f, t_int, tau_w, delta):
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
        if isinstance(decision, SwitchTier | ClimbBack):
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


def _move_while_running(policy: FallbackPolicy, state, caps: list[dict[int, Compiled]], k: int, size: int, f: float,
                        start: float, end: float, tau_w: float, delta: float, committed: float, W: float,
                        offset: float, job: JobSpec):
    """The first climb back or elastic growth the policy takes before ``end``: (t, Step) or None.

    As in the controller shell, the policy is asked at the end of every checkpoint write
    (after the tier's dwell) at which the other tier, or a larger gang, could be placed, in
    time order (lower tiers first at the same time), until it says move.
    """
    tiers = policy.tiers
    since_h = (state.tier_since if state.tier_since is not None else state.running_since) / 3600.0
    cycle = tau_w + delta
    needs: dict[int, Compiled] = {}
    pending: dict[int, float] = {}
    for j in range(k + 1):
        target = tiers[j]
        if j < k and not target.climb_back:
            continue
        if j == k and not (target.is_elastic and size < target.num_workers):
            continue
        if j < k:
            look = max(start, since_h + policy.climb_dwell_s(state, j) / 3600.0)
            needs[j] = caps[j][min(caps[j])]
        else:
            # The shell observes a shrunk elastic gang after every checkpoint, whatever the
            # capacity (the policy checks its deadline guard and whether growing pays).
            look = start
            needs[j] = _ALWAYS
        at = _next_candidate(needs[j], look, start, end, tau_w, delta, offset)
        if at is not None:
            pending[j] = at
    restart_s = (job.restart_overhead_h + job.provisioning_delay_h) * 3600.0
    while pending:
        j = min(pending, key=lambda i: (pending[i], i))
        at = pending[j]
        done, _ = cycle_progress(at - start, tau_w, delta)
        left_h = max(W - committed - float(done) * f, 0.0) / f
        event = CapacityObserved(
            t=at * 3600.0,
            tier=j,
            available_workers=_available(caps[j], at + offset),
            remaining_work_s=float(wall_to_finish(left_h, tau_w, delta)) * 3600.0,
            restart_s=restart_s,
            checkpoint_interval_s=tau_w * 3600.0 if math.isfinite(tau_w) else 0.0,
        )
        step = policy.decide(state, event)
        if isinstance(step.decision, ClimbBack | Resize | SwitchTier | GiveUp):
            return at, step
        nxt = _next_candidate(needs[j], at + 0.5 * cycle, start, end, tau_w, delta, offset)
        if nxt is None:
            del pending[j]
        else:
            pending[j] = nxt
    return None


def _next_candidate(need: Compiled, look: float, start: float, end: float, tau_w: float, delta: float,
                    offset: float) -> float | None:
    """First end of a checkpoint write at or after ``look`` and before ``end`` at which ``need`` fits."""
    while True:  # capacity may vanish again before the checkpoint ends
        found = _next_ok(need, look + offset) - offset
        if not math.isfinite(found) or found >= end:
            return None
        at = _checkpoint_end_after(found, start, tau_w, delta)
        if at >= end:
            return None
        if _is_ok(need, at + offset):
            return at
        look = at


def simulate_beyond(
    ladder: Ladder | Sequence[Tier] | FallbackPolicy,
    job: JobSpec,
    world: Sequence[Process],
    runs: int = 1000,
    seed: int = 0,
    horizon_h: float | None = None,
    label: str = "",
) -> SimResult:
    """Simulate ``runs`` runs with climbing back, elastic tiers and rate rules all in play.

    Same inputs and random draws as ``simulator.simulate``; ``switches`` counts climbs too.
    """
    if runs <= 0:
        raise ValueError(f"runs must be > 0, got {runs}")
    policy = ladder if isinstance(ladder, FallbackPolicy) else FallbackPolicy(make_ladder(ladder))
    if len(world) != len(policy.tiers):
        raise ValueError(f"world has {len(world)} processes for {len(policy.tiers)} tiers; give one per tier")
    caps = [_compile_tier(p, t) for p, t in zip(world, policy.tiers, strict=True)]
    horizon = default_horizon_h(job) if horizon_h is None else horizon_h
    draws = _Draws(runs, seed)
    offsets = _offsets([c[min(c)] for c in caps], runs, seed)
    out = _empty_result(label, runs, job.deadline_h)
    for r in range(runs):
        _beyond_run(policy, job, caps, draws, r, float(offsets[r]), horizon, out)
    return out


__all__ = ["simulate_beyond"]
