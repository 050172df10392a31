"""The vectorised engine: the policy's rules on numpy arrays, one row per (candidate, run).

Why a second engine: the planner scores hundreds of candidate ladders on thousands of runs
each, which the policy engine (one ``decide`` call per event) cannot do in seconds. This one
advances every live run by one wait-and-run cycle per loop. Each rule mirrors a line of
``FallbackPolicy`` and calls the policy's own formulas and constants (``schedule_line``,
``latest_start``, ``on_gang``, ``observed_rate``, ``repreemption_cost``, ``climb_balance``,
``CLIMB_DWELL_DOUBLINGS``, ``capped_spend``, ``spend_cap``), in the policy's units and order
of operations, so ties break alike: the capacity deadline (timeout or deadline guard), the
budgets, the guard and the cost cap after an interruption, and the climb back at the first
checkpoint end (or look, for a gang that checkpoints on request) where the policy would say
so, with the remaining work a shell would report.
``tests/unit/test_simulator.py`` and ``tests/unit/test_fast_cost_cap.py`` check it against
the policy engine run by run, on the same draws.

It covers the default leave rules (budgets), capacity timeouts, deadline guards, cost caps
and climbing back (``fast_supports``); elastic tiers, the preemption-rate rule and the
expected-cost exit need the policy engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from spotfallback.config import Ladder, Tier
from spotfallback.policy import (
    CLIMB_DWELL_DOUBLINGS,
    FallbackPolicy,
    capped_spend,
    climb_balance,
    climbed_cutoff,
    guard_kept_h,
    latest_start,
    leave_rule_for,
    observed_rate,
    on_gang,
    over_cap,
    repreemption_cost,
    schedule_line,
    spend_cap,
    waiting_cutoff,
)
from spotfallback.sim.draws import Draws, acquire, interrupt, run_offsets
from spotfallback.sim.job import EPS, LOOK_EVERY_H, NEVER_H, JobSpec, cycle_progress, wall_to_finish
from spotfallback.sim.results import FAILED, FINISHED, STUCK, SimResult
from spotfallback.sim.world import RateModel, TraceCapacity


def fast_supports(ladder: Ladder) -> bool:
    """Whether the vectorised engine implements every rule of the ladder.

    It does the budgets, capacity timeouts, deadline guards, cost caps and climbing back;
    elastic tiers, the preemption-rate rule and the expected-cost exit need the policy engine.
    """
    return not any(t.is_elastic or t.max_preemption_rate is not None or t.expected_cost_exit for t in ladder.tiers)


def uses_default_rules(policy: FallbackPolicy) -> bool:
    """Whether the policy leaves tiers by their configured budgets only (no custom rules)."""
    return all(rule == leave_rule_for(t) for rule, t in zip(policy.rules, policy.tiers, strict=True))


def simulate_fast(configs: Sequence[tuple[Ladder, JobSpec]], procs: Sequence[RateModel | TraceCapacity], runs: int,
                  seed: int, horizon_h: float, labels: Sequence[str], starts_h: np.ndarray | None = None) -> list[SimResult]:
    """``runs`` runs of every (ladder, job) candidate, paired on the same draws; one result each.

    The candidates share the tier count and each tier's gang size: ``procs`` is the world
    compiled for them. ``starts_h``: where run ``r`` starts in the traces (default: a random
    tick each), for replays from chosen points such as backtest windows.
    """
    cfg = _Rows.of(configs, runs)
    offsets = run_offsets(procs, runs, seed) if starts_h is None else np.asarray(starts_h, dtype=float)
    world = _World(procs, Draws(runs, seed), offsets[cfg.row], horizon_h)
    s = _State.start(cfg.n, cfg.K)
    while True:
        act = np.flatnonzero(s.status == 0)
        if act.size == 0:
            break
        world.draws.ensure(int(s.col[act].max()))
        gi, t_acq = _wait_for_capacity(cfg, s, world, act)
        if gi.size:
            _run_attempts(cfg, s, world, gi, t_acq)
        s.col[act] += 1
    return [s.result(labels[c], slice(c * runs, (c + 1) * runs), configs[c][1].deadline_h) for c in range(len(configs))]


# ---------------------------------------------------------------------------------------
# Inputs and state, as arrays


@dataclass(frozen=True)
class _Rows:
    """The candidates' ladders and jobs, one row per simulated run: ``(n, K)`` per tier, ``(n,)`` per job."""

    n: int
    K: int
    row: np.ndarray  # draw row of each simulated run: candidates are paired on the same draws
    maxpre: np.ndarray
    maxfail: np.ndarray
    timeout_s: np.ndarray
    price: np.ndarray  # per hour of the tier's gang
    workers: np.ndarray
    is_spot: np.ndarray
    guarded: np.ndarray
    g_work: np.ndarray
    g_deadline: np.ndarray
    g_margin: np.ndarray
    g_reserve: np.ndarray  # DeadlineGuard.reserve_h
    g_pace: np.ndarray
    g_lead_s: np.ndarray  # FallbackPolicy.guard_lead_s
    climbable: np.ndarray
    dwell_s: np.ndarray
    fresh: np.ndarray
    W: np.ndarray
    tau: np.ndarray
    delta: np.ndarray
    R: np.ndarray
    prov: np.ndarray
    jit_lead: np.ndarray  # hours before a preemption the just-in-time save begins
    jit: np.ndarray
    on_request: np.ndarray  # JobSpec.checkpoint_on_request: climbs looked at every LOOK_EVERY_H
    climb_write: np.ndarray  # JobSpec.climb_write_h
    any_climb: bool
    cap_on: np.ndarray  # (n, K): the tier has a cost_cap
    any_cap: bool  # some tier but the last has one: else no row is ever moved by a cap
    cap_risk: np.ndarray  # ... one lost attempt on the tier's gang: price x first_commit_h
    cap_restart_h: np.ndarray
    cap_limit: np.ndarray  # ... policy.spend_cap
    cluster: np.ndarray  # (n, K) int: each tier's Ray cluster, numbered per ladder (-1: none named)
    move_h: np.ndarray  # JobSpec.move_restart_h
    move_cost: np.ndarray  # JobSpec.move_cost

    @classmethod
    def of(cls, configs: Sequence[tuple[Ladder, JobSpec]], runs: int) -> _Rows:
        C, K = len(configs), len(configs[0][0])
        cand = np.repeat(np.arange(C), runs)

        def per_tier(fn: Callable[[Tier], float]) -> np.ndarray:
            return np.array([[fn(t) for t in lad.tiers] for lad, _ in configs], dtype=float)[cand]

        def flag(fn: Callable[[Tier], bool]) -> np.ndarray:
            return per_tier(lambda t: 1.0 if fn(t) else 0.0).astype(bool)

        def per_job(fn: Callable[[JobSpec], float]) -> np.ndarray:
            return np.array([fn(job) for _, job in configs], dtype=float)[cand]

        climbable = flag(lambda t: t.climb_back)
        guarded = flag(lambda t: t.deadline_guard is not None)
        guarded[:, -1] = False  # FallbackPolicy.guard_limits: the last tier has nowhere to send the run
        delta, notice = per_job(lambda j: j.checkpoint_cost_h), per_job(lambda j: j.notice_s / 3600.0)
        price = per_tier(lambda t: t.num_workers * t.price_per_worker_hour)
        rate_last = price[:, -1:]
        cap_restart_h = per_tier(lambda t: t.cost_cap.restart_h if t.cost_cap else 0.0)
        cap_on = flag(lambda t: t.cost_cap is not None)
        cluster = np.array([_cluster_numbers(lad) for lad, _ in configs], dtype=np.int64)[cand]
        return cls(
            n=C * runs,
            K=K,
            row=np.tile(np.arange(runs), C),
            maxpre=per_tier(lambda t: t.max_preemptions),
            maxfail=per_tier(lambda t: t.max_failures),
            timeout_s=per_tier(lambda t: math.inf if t.capacity_timeout_s is None else t.capacity_timeout_s),
            price=price,
            workers=per_tier(lambda t: t.num_workers),
            is_spot=flag(lambda t: t.is_spot),
            guarded=guarded,
            g_work=per_tier(lambda t: t.deadline_guard.work_h if t.deadline_guard else 1.0),
            g_deadline=per_tier(lambda t: t.deadline_guard.deadline_h if t.deadline_guard else 1.0),
            g_margin=per_tier(lambda t: t.deadline_guard.margin_h if t.deadline_guard else 0.0),
            g_reserve=per_tier(lambda t: t.deadline_guard.reserve_h if t.deadline_guard else 0.0),
            g_pace=per_tier(lambda t: t.deadline_guard.pace if t.deadline_guard else 0.0),
            g_lead_s=per_tier(lambda t: t.deadline_guard.first_commit_h * 3600.0 if t.deadline_guard else 0.0),
            climbable=climbable,
            dwell_s=per_tier(lambda t: t.min_dwell_s),
            fresh=flag(lambda t: t.climb_budgets == "fresh"),
            W=per_job(lambda j: j.work_h),
            tau=per_job(lambda j: j.tau_h),
            delta=delta,
            R=per_job(lambda j: j.restart_overhead_h),
            prov=per_job(lambda j: j.provisioning_delay_h),
            jit_lead=per_job(lambda j: j.jit_lead_h),
            jit=per_job(lambda j: float(j.jit_checkpoint)).astype(bool) & (notice >= delta),
            on_request=per_job(lambda j: float(j.checkpoint_on_request)).astype(bool),
            climb_write=per_job(lambda j: j.climb_write_h),
            any_climb=bool(climbable[:, :-1].any()) if K > 1 else False,
            cap_on=cap_on,
            any_cap=bool(cap_on[:, :-1].any()),
            cap_risk=price * per_tier(lambda t: t.cost_cap.first_commit_h if t.cost_cap else 0.0),
            cap_restart_h=cap_restart_h,
            cap_limit=spend_cap(per_tier(lambda t: t.cost_cap.factor if t.cost_cap else 1.0), rate_last,
                                per_tier(lambda t: t.cost_cap.work_h if t.cost_cap else 0.0), cap_restart_h),
            cluster=cluster,
            move_h=per_job(lambda j: j.move_restart_h),
            move_cost=per_job(lambda j: j.move_cost),
        )


def _cluster_numbers(ladder: Ladder) -> list[int]:
    """Each tier's Ray cluster as a number (first appearance order), -1 where none is named."""
    number = {key: n for n, key in enumerate(ladder.clusters)}
    return [-1 if (key := ladder.cluster_key(i)) is None else number[key] for i in range(len(ladder))]


@dataclass(frozen=True)
class _World:
    """Each tier's compiled process, the shared draws, and each row's start in trace time."""

    procs: Sequence[RateModel | TraceCapacity]
    draws: Draws
    offset: np.ndarray
    horizon_h: float


@dataclass
class _State:
    """Every run's position and tallies, and the parts of ``PolicyState`` the rules read, as arrays."""

    t: np.ndarray
    committed: np.ndarray
    tier: np.ndarray
    wait_from: np.ndarray
    col: np.ndarray
    cnt_pre: np.ndarray  # (n, K): the tiers' preemptions and failures, as TierStats
    cnt_fail: np.ndarray
    run_s: np.ndarray  # (n, K): running seconds per tier, as the policy's tier_running_s
    reported_s: np.ndarray  # the policy's remaining_work_s: last reported by a commit or an observation
    reported_gang: np.ndarray  # ... and the size of the gang that reported it
    climbs_to: np.ndarray  # (n, K)
    tier_since: np.ndarray
    status: np.ndarray
    spend: np.ndarray
    unseen: np.ndarray  # spend the policy does not bill a gang with: egress, a climb's requested checkpoint
    lost: np.ndarray
    billed: np.ndarray
    spot_h: np.ndarray
    work_spot: np.ndarray
    pre: np.ndarray
    fail: np.ndarray
    switches: np.ndarray
    timeouts: np.ndarray
    cluster: np.ndarray  # the last attempt's Ray cluster (-1: none yet)
    after_climb: np.ndarray  # waiting for the gang of a climb back (FallbackPolicy.just_climbed)

    @classmethod
    def start(cls, n: int, K: int) -> _State:
        def z() -> np.ndarray:
            return np.zeros(n)

        def zi() -> np.ndarray:
            return np.zeros(n, dtype=np.int64)

        return cls(t=z(), committed=z(), tier=zi(), wait_from=z(), col=zi(),
                   cnt_pre=np.zeros((n, K)), cnt_fail=np.zeros((n, K)), run_s=np.zeros((n, K)),
                   reported_s=np.full(n, np.nan), reported_gang=z(), climbs_to=np.zeros((n, K)), tier_since=z(),
                   status=zi(), spend=z(), unseen=z(), lost=z(), billed=z(), spot_h=z(), work_spot=z(),
                   pre=zi(), fail=zi(), switches=zi(), timeouts=zi(), cluster=np.full(n, -1, dtype=np.int64),
                   after_climb=np.zeros(n, dtype=bool))

    def policy_spent(self, idx: np.ndarray) -> np.ndarray:
        """``PolicyState.spent`` of rows ``idx``: the gangs' billed hours, as the policy counts them."""
        return self.spend[idx] - self.unseen[idx]

    def leave(self, idx: np.ndarray) -> None:
        """``FallbackPolicy._leave``: down one tier, or fail from the last."""
        nxt = self.tier[idx] + 1
        last = nxt >= self.cnt_pre.shape[1]
        self.status[idx[last]] = FAILED
        moved = idx[~last]
        self.tier[moved] = nxt[~last]
        self.tier_since[moved] = self.t[moved]
        self.switches[moved] += 1

    def to_last(self, idx: np.ndarray, moved: np.ndarray) -> None:
        """``FallbackPolicy._leave(to=last)``, or its skip to the last tier: ``moved`` rows already count the switch."""
        self.tier[idx] = self.cnt_pre.shape[1] - 1
        self.tier_since[idx] = self.t[idx]
        self.switches[idx[~moved]] += 1

    def stuck_past(self, idx: np.ndarray, horizon_h: float) -> None:
        late = idx[(self.status[idx] == 0) & (self.t[idx] > horizon_h)]
        self.status[late], self.t[late] = STUCK, horizon_h

    def result(self, label: str, sl: slice, deadline_h: float | None) -> SimResult:
        res = SimResult.empty(label, sl.stop - sl.start, deadline_h)
        res.status[:] = self.status[sl]
        res.wall_h[:] = self.t[sl]
        res.spend[:] = self.spend[sl]
        res.lost_work_h[:] = self.lost[sl]
        res.billed_h[:] = self.billed[sl]
        res.spot_h[:] = self.spot_h[sl]
        res.work_on_spot_h[:] = self.work_spot[sl]
        res.preemptions[:] = self.pre[sl]
        res.failures[:] = self.fail[sl]
        res.switches[:] = self.switches[sl]
        res.capacity_timeouts[:] = self.timeouts[sl]
        res.final_tier[:] = self.tier[sl]
        return res


# ---------------------------------------------------------------------------------------
# The deadline guard's arithmetic, as the policy does it


def _schedule_s(rem_s: np.ndarray, work_h: np.ndarray, deadline_h: np.ndarray, pace: np.ndarray) -> np.ndarray:
    """``policy.schedule_time`` for a run started at 0 with ``rem_s`` left: inf at pace 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        line = schedule_line(0.0, work_h * 3600.0 - rem_s, deadline_h, np.where(pace > 0, pace, 1.0), work_h)
    return np.where(pace > 0, line, np.inf)


def _guard_limits_s(rem_s: np.ndarray, work_h: np.ndarray, deadline_h: np.ndarray, margin_h: np.ndarray,
                    pace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``FallbackPolicy.guard_limits`` for a run started at 0, seconds: (behind schedule, slack down to the margin)."""
    behind = _schedule_s(rem_s, work_h, deadline_h, pace) + margin_h * 3600.0
    return behind, latest_start(0.0, deadline_h, rem_s, margin_h * 3600.0)


def _guard_at_s(cfg: _Rows, s: _State, idx: np.ndarray, k: np.ndarray, with_reserve: bool) -> np.ndarray:
    """When tier k's guard says leave with progress frozen, seconds (inf: no guard); ``with_reserve``
    as ``FallbackPolicy.guard_limits``.

    The remaining work is what the policy was last told: the shell reports it with every
    commit, so after any progress it is the wall time to finish from ``committed``.
    """
    out = np.full(idx.size, np.inf)
    on = cfg.guarded[idx, k]
    if on.any():
        i, kk = idx[on], k[on]
        gang, full = s.reported_gang[i], cfg.workers[i, kk]
        scaled = np.where(gang == full, s.reported_s[i], on_gang(s.reported_s[i], gang, full))
        rem_s = np.where(np.isnan(s.reported_s[i]), cfg.g_work[i, kk] * 3600.0, scaled)
        kept = guard_kept_h(cfg.g_margin[i, kk], cfg.g_reserve[i, kk], with_reserve)
        behind, must_go = _guard_limits_s(rem_s, cfg.g_work[i, kk], cfg.g_deadline[i, kk], kept, cfg.g_pace[i, kk])
        out[on] = np.minimum(behind, must_go)
    return out


def _cap_breaks(cfg: _Rows, idx: np.ndarray, k: np.ndarray, spent: np.ndarray, rem_s: np.ndarray,
                gang: np.ndarray) -> np.ndarray:
    """``FallbackPolicy.cost_cap_reason``: rows ``idx`` would break tier k's cost cap (``rem_s`` left on ``gang`` workers)."""
    last = cfg.K - 1
    on = cfg.cap_on[idx, k] & (k < last)
    if not on.any():  # no cap here (the default): nothing to price
        return on
    w_last = cfg.workers[idx, last]
    rem_last = np.where((gang == 0) | (gang == w_last), rem_s, on_gang(rem_s, np.where(gang == 0, 1.0, gang), w_last))
    most = capped_spend(spent, cfg.cap_risk[idx, k], cfg.price[idx, last], np.maximum(rem_last, 0.0) / 3600.0,
                        cfg.cap_restart_h[idx, k])
    known = ~np.isnan(rem_s)
    return on & known & over_cap(np.where(known, most, 0.0), cfg.cap_limit[idx, k])


def _cap_moves(cfg: _Rows, s: _State, idx: np.ndarray, moved: np.ndarray) -> None:
    """Rows ``idx`` about to wait on their tier go straight to the last one where its cost cap says so."""
    if not cfg.any_cap:
        return
    live = s.status[idx] == 0
    i = idx[live]
    jump = _cap_breaks(cfg, i, s.tier[i], s.policy_spent(i), s.reported_s[i], s.reported_gang[i])
    s.to_last(i[jump], moved[live][jump])


# ---------------------------------------------------------------------------------------
# One cycle: wait for capacity, then run


def _present(tiers: np.ndarray, K: int) -> np.ndarray:
    """The tiers that occur in ``tiers``, in order (``np.unique``'s answer, without its sort or hash)."""
    return np.flatnonzero(np.bincount(tiers, minlength=K))


def _wait_for_capacity(cfg: _Rows, s: _State, world: _World, act: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``act`` wait on their tier until the capacity deadline; (rows that got workers, when).

    The others timed out (and leave the tier) or are stuck past the horizon.
    """
    k_act = s.tier[act]
    acq = np.empty(act.size)
    # FallbackPolicy.capacity_deadline, in its own units (seconds), so ties break alike.
    since_s = s.wait_from[act] * 3600.0
    lead = cfg.g_lead_s[act, k_act]
    guard_s = waiting_cutoff(_guard_at_s(cfg, s, act, k_act, True), lead)
    climbed = s.after_climb[act]
    if climbed.any():  # a climb's gang gets the margin to come up, within the margin's cut-off
        plain = waiting_cutoff(_guard_at_s(cfg, s, act, k_act, False), lead)
        given = climbed_cutoff(guard_s, plain, since_s, cfg.g_margin[act, k_act] * 3600.0, np.minimum, np.maximum)
        guard_s = np.where(climbed, given, guard_s)
    s.after_climb[act] = False  # the climb's gang comes up now, or the run leaves the tier
    cap_dl = np.minimum(since_s + cfg.timeout_s[act, k_act], np.maximum(since_s, guard_s)) / 3600.0
    off = world.offset
    horizon_h = world.horizon_h
    for k in _present(k_act, cfg.K):
        m = k_act == k
        idx = act[m]
        # Searched up to the horizon at most, as the policy engine does.
        acq[m] = acquire(world.procs[k], world.draws, cfg.row[idx], s.col[idx], s.t[idx] + off[idx], cfg.prov[idx],
                         np.minimum(cap_dl[m], horizon_h) + off[idx]) - off[idx]
    timed = acq > cap_dl
    # Timed out with no deadline, or past the horizon: the run is stuck.
    stuck = (timed & (np.isinf(cap_dl) | (cap_dl > horizon_h))) | (~timed & (acq > horizon_h))
    si = act[stuck]
    s.status[si], s.t[si] = STUCK, horizon_h
    ti = act[timed & ~stuck]
    s.t[ti] = cap_dl[timed & ~stuck]
    s.timeouts[ti] += 1
    s.leave(ti)
    _cap_moves(cfg, s, ti, np.ones(ti.size, dtype=bool))
    s.wait_from[ti] = s.t[ti]
    go = ~timed & ~stuck
    return act[go], acq[go]


def _run_attempts(cfg: _Rows, s: _State, world: _World, gi: np.ndarray, t_acq: np.ndarray) -> None:
    """Rows ``gi`` got workers at ``t_acq``: each finishes, climbs back or is interrupted."""
    kg = s.tier[gi]
    t_int = np.empty(gi.size)
    is_pre = np.empty(gi.size, dtype=bool)
    off = world.offset
    for k in _present(kg, cfg.K):
        m = kg == k
        idx = gi[m]
        ti_k, ip_k = interrupt(world.procs[k], world.draws, cfg.row[idx], s.col[idx], t_acq[m] + off[idx],
                               cfg.workers[idx, k])
        t_int[m], is_pre[m] = ti_k - off[idx], ip_k
    overhead = cfg.R[gi].copy()  # every start pays R, the first included (as in the policy engine)
    here = cfg.cluster[gi, kg]
    moved = (s.cluster[gi] >= 0) & (here != s.cluster[gi])  # to another Ray cluster: egress, a longer restart
    overhead += np.where(moved, cfg.move_h[gi], 0.0)
    s.spend[gi] += np.where(moved, cfg.move_cost[gi], 0.0)
    s.unseen[gi] += np.where(moved, cfg.move_cost[gi], 0.0)
    s.cluster[gi] = here
    rem = cfg.W[gi] - s.committed[gi]
    t_fin = t_acq + overhead + wall_to_finish(rem, cfg.tau[gi], cfg.delta[gi])
    fin = t_fin <= t_int - np.where(is_pre & cfg.jit[gi], cfg.jit_lead[gi], 0.0)  # the save's lead (policy engine)
    end = np.where(fin, t_fin, t_int)
    if cfg.any_climb:
        stay = ~_climb(cfg, s, world, gi, kg, t_acq, overhead, end)
        gi, kg, t_acq, t_int, is_pre, overhead = gi[stay], kg[stay], t_acq[stay], t_int[stay], is_pre[stay], overhead[stay]
        rem, t_fin, fin, end = rem[stay], t_fin[stay], fin[stay], end[stay]
    dur = end - t_acq
    sp = cfg.is_spot[gi, kg]
    s.spend[gi] += dur * cfg.price[gi, kg]
    s.billed[gi] += dur
    s.spot_h[gi] += np.where(sp, dur, 0.0)
    fi = gi[fin]
    s.work_spot[fi] += np.where(sp[fin], rem[fin], 0.0)
    s.committed[fi] = cfg.W[fi]
    s.t[fi] = t_fin[fin]
    s.status[fi] = FINISHED
    if (~fin).any():
        nf = ~fin
        _interrupted(cfg, s, world, gi[nf], t_acq[nf], overhead[nf], t_int[nf], is_pre[nf], sp[nf])


def _interrupted(cfg: _Rows, s: _State, world: _World, ni: np.ndarray, t_acq: np.ndarray, overhead: np.ndarray,
                 t_int: np.ndarray, ip: np.ndarray, sp: np.ndarray) -> None:
    """Keep what was committed (or checkpointed on the notice), count the interruption, apply the budgets and the guard."""
    x = t_int - t_acq - overhead
    use_jit = ip & cfg.jit[ni]
    x_eff = np.where(use_jit, np.maximum(x - cfg.jit_lead[ni], 0.0), np.maximum(x, 0.0))
    done, comm = cycle_progress(x_eff, cfg.tau[ni], cfg.delta[ni])
    gain = np.where(x > 0, np.where(use_jit, done, comm), 0.0)
    s.lost[ni] += np.where((x > 0) & ~use_jit, done - comm, 0.0)
    s.committed[ni] += gain
    left_s = wall_to_finish(np.maximum(cfg.W[ni] - s.committed[ni], 0.0), cfg.tau[ni], cfg.delta[ni]) * 3600.0
    s.reported_s[ni] = np.where(gain > 0, left_s, s.reported_s[ni])
    s.reported_gang[ni] = np.where(gain > 0, cfg.workers[ni, s.tier[ni]], s.reported_gang[ni])
    s.work_spot[ni] += np.where(sp, gain, 0.0)
    s.t[ni] = t_int
    s.wait_from[ni] = s.t[ni]
    kn = s.tier[ni]
    s.run_s[ni, kn] += s.t[ni] * 3600.0 - t_acq * 3600.0
    pi, fi = ni[ip], ni[~ip]
    s.cnt_pre[pi, kn[ip]] += 1
    s.pre[pi] += 1
    s.cnt_fail[fi, kn[~ip]] += 1
    s.fail[fi] += 1
    lim_p = cfg.maxpre[ni, kn]
    lim_f = cfg.maxfail[ni, kn]
    over = ((lim_p != -1) & (s.cnt_pre[ni, kn] > lim_p)) | ((lim_f != -1) & (s.cnt_fail[ni, kn] > lim_f))
    over |= s.t[ni] * 3600.0 >= _guard_at_s(cfg, s, ni, kn, True)
    s.leave(ni[over])
    _cap_moves(cfg, s, ni, over)
    s.stuck_past(ni, world.horizon_h)


# ---------------------------------------------------------------------------------------
# Climbing back


def _climb(cfg: _Rows, s: _State, world: _World, gi: np.ndarray, kg: np.ndarray, t_acq: np.ndarray,
           overhead: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Rows ``gi`` that climb back before ``end``, moved up; a mask of them over ``gi``."""
    at, to, obs_s = _climb_candidates(cfg, s, world, gi, kg, t_acq, t_acq + overhead, end)
    climbed = np.isfinite(at)
    if not climbed.any():
        return climbed
    ci, kc, jc, tc = gi[climbed], kg[climbed], to[climbed], at[climbed]
    # A requested checkpoint's write: the gang is billed until it ends (none across clusters: at a checkpoint's end).
    write = np.where(cfg.cluster[ci, jc] == cfg.cluster[ci, kc], cfg.climb_write[ci], 0.0)
    dur = tc + write - t_acq[climbed]
    sp = cfg.is_spot[ci, kc]
    gain, _ = cycle_progress(tc - (t_acq[climbed] + overhead[climbed]), cfg.tau[ci], cfg.delta[ci])
    s.reported_s[ci] = obs_s[climbed]
    s.reported_gang[ci] = cfg.workers[ci, kc]
    s.spend[ci] += dur * cfg.price[ci, kc]
    s.unseen[ci] += write * cfg.price[ci, kc]
    s.billed[ci] += dur
    s.spot_h[ci] += np.where(sp, dur, 0.0)
    s.work_spot[ci] += np.where(sp, gain, 0.0)
    s.committed[ci] += gain
    s.run_s[ci, kc] += tc * 3600.0 - t_acq[climbed] * 3600.0
    s.t[ci] = tc + write
    s.wait_from[ci] = tc
    s.tier[ci] = jc
    s.tier_since[ci] = tc
    s.after_climb[ci] = True
    s.climbs_to[ci, jc] += 1
    s.switches[ci] += 1
    reset = cfg.fresh[ci, jc]
    s.cnt_pre[ci[reset], jc[reset]] = 0
    s.cnt_fail[ci[reset], jc[reset]] = 0
    late = ci[s.t[ci] > world.horizon_h]
    s.status[late], s.t[late] = STUCK, world.horizon_h
    return climbed


def _climb_candidates(cfg: _Rows, s: _State, world: _World, gi: np.ndarray, kg: np.ndarray, t_acq: np.ndarray,
                      start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows ``gi`` running on tiers ``kg`` from ``start`` to ``end``: (time, tier, remaining_work_s) of a climb.

    The first checkpoint end at which ``FallbackPolicy._observed`` says ``ClimbBack``, with
    the observation the policy engine would feed: capacity of a higher climb-back tier fits,
    the dwell has passed, the deadline guard (if any) is ahead of schedule by two restarts
    with slack to spare, ``climb_pays`` and the tier's cost cap. Over the checkpoint ends of one attempt the
    remaining work falls by a cycle each, so ``climb_pays`` only gets worse, the slack stays
    and the schedule gets further ahead: the search jumps to the first end ahead of schedule
    and stops where paying ends. inf where there is no climb before ``end``.
    """
    best_at = np.full(gi.size, np.inf)
    best_to = np.zeros(gi.size, dtype=np.int64)
    best_rem = np.zeros(gi.size)
    for j in range(cfg.K - 1):
        sel = np.flatnonzero((kg > j) & cfg.climbable[gi, j])
        if sel.size == 0:
            continue
        found_at, found_rem = _first_climb_to(cfg, s, world, j, gi[sel], kg[sel], t_acq[sel], start[sel], end[sel])
        better = found_at < best_at[sel]
        best_at[sel[better]] = found_at[better]
        best_to[sel[better]] = j
        best_rem[sel[better]] = found_rem[better]
    return best_at, best_to, best_rem


def _first_climb_to(cfg: _Rows, s: _State, world: _World, j: int, idx: np.ndarray, k: np.ndarray, acq: np.ndarray,
                    st: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(time, remaining_work_s) of the first look at which rows ``idx`` on tiers ``k`` climb to ``j``.

    The looks are the checkpoint ends, or every ``LOOK_EVERY_H`` for a gang that checkpoints on
    request (``JobSpec.climb_grid_h``), whose move comes a write later; a tier on another
    cluster only at the checkpoint ends (the moving driver cannot ask for a checkpoint).
    """
    # The moving driver looks at a tier on another cluster, only at checkpoint ends, and the climb is a move.
    across = cfg.cluster[idx, j] != cfg.cluster[idx, k]
    look_h = np.where(cfg.on_request[idx] & ~across, LOOK_EVERY_H, cfg.tau[idx] + cfg.delta[idx])  # between looks
    write = np.where(across, 0.0, cfg.climb_write[idx])
    since_s = s.tier_since[idx] * 3600.0
    dwell = cfg.dwell_s[idx, j] * 2.0 ** np.minimum(s.climbs_to[idx, j], CLIMB_DWELL_DOUBLINGS)
    look = np.maximum(st, s.tier_since[idx] + dwell / 3600.0)
    kk = np.maximum(1.0, np.ceil((look - st) / look_h - EPS))
    # The observation's fields and the policy's state that do not change during the attempt.
    restart_s = (cfg.R[idx] + cfg.prov[idx] + np.where(across, cfg.move_h[idx], 0.0)) * 3600.0
    interval_s = np.where(cfg.tau[idx] >= NEVER_H, 0.0, cfg.tau[idx] * 3600.0)  # as measured: none without periodic ones
    w_cur, w_to = cfg.workers[idx, k], cfg.workers[idx, j]
    rate_cur, rate_to = cfg.price[idx, k], cfg.price[idx, j]
    per_pre = repreemption_cost(restart_s, interval_s, rate_to)
    pre_next = np.where(cfg.fresh[idx, j], 0.0, s.cnt_pre[idx, j]) + 1
    fails = np.where(cfg.fresh[idx, j], 0.0, s.cnt_fail[idx, j])
    maxpre, maxfail = cfg.maxpre[idx, j], cfg.maxfail[idx, j]
    trips = ((maxpre != -1) & (pre_next > maxpre)) | ((maxfail != -1) & (fails > maxfail))
    per_pre = per_pre + np.where(trips, restart_s / 3600.0 * rate_cur, 0.0)  # the next preemption sends it down
    lam = observed_rate(s.cnt_pre[idx, j], s.run_s[idx, j])
    g, gw, gd = cfg.guarded[idx, j], cfg.g_work[idx, j], cfg.g_deadline[idx, j]
    gm, gp, lead = cfg.g_margin[idx, j], cfg.g_pace[idx, j], cfg.g_lead_s[idx, j]
    # Jump to about the first checkpoint end ahead of schedule (remaining falls a cycle per end).
    rem0 = on_gang(wall_to_finish(np.maximum(cfg.W[idx] - s.committed[idx], 0.0), cfg.tau[idx], cfg.delta[idx]), w_cur, w_to)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(gp > 0, gd / np.where(gp > 0, gp * gw, 1.0), 0.0)  # schedule hours per hour of work
        gaining = kappa * w_cur / w_to > 1.0
        n_ahead = (st + 2.0 * restart_s / 3600.0 + lead / 3600.0 - (gw - rem0) * kappa) / (look_h * (kappa * w_cur / w_to - 1.0))
        # On the request grid the remaining work falls by a look per look, give or take a write:
        # that many looks fewer, at the rate the line is gained.
        back_off = 2.0 + np.ceil(write / (look_h * np.where(gaining, kappa * w_cur / w_to - 1.0, 1.0)))
    kk = np.where(g & gaining & np.isfinite(n_ahead), np.maximum(kk, np.ceil(n_ahead) - back_off), kk)
    proc = world.procs[j]
    todo = np.ones(idx.size, dtype=bool)
    found_at = np.full(idx.size, np.inf)
    found_rem = np.zeros(idx.size)
    while True:
        q = np.flatnonzero(todo)
        if q.size == 0:
            break
        iq = idx[q]
        at = st[q] + kk[q] * look_h[q]
        past = at + write[q] >= e[q]
        at = np.where(past, st[q], at)  # no look there (it may be inf: capacity never back); kept finite for the sums below
        ok = proc.is_ok(at + world.offset[iq]) & ~past if isinstance(proc, TraceCapacity) else ~past
        t_s = at * 3600.0
        ok &= ~(t_s - since_s[q] < dwell[q])
        done, _ = cycle_progress(at - st[q], cfg.tau[iq], cfg.delta[iq])
        left = np.maximum(cfg.W[iq] - s.committed[iq] - done, 0.0)
        rem_s = wall_to_finish(left, cfg.tau[iq], cfg.delta[iq]) * 3600.0  # the observation's remaining_work_s
        spent = s.policy_spent(iq) + (at - acq[q]) * rate_cur[q]
        need = t_s + 2.0 * restart_s[q] + lead[q]

        def verdicts(rem_s: np.ndarray, q: np.ndarray = q, iq: np.ndarray = iq, spent: np.ndarray = spent,
                     need: np.ndarray = need) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            """(climb pays, on the guard's line, slack to spare, tier j's cost cap breaks) with ``rem_s`` left."""
            # FallbackPolicy.climb_pays
            rem_cur_h = rem_s / 3600.0
            saving, restart, expected = climb_balance(rem_cur_h, on_gang(rem_cur_h, w_cur[q], w_to[q]), rate_cur[q],
                                                      rate_to[q], restart_s[q] / 3600.0, lam[q], per_pre[q])
            # FallbackPolicy.guard_allows_climb
            behind, must_go = _guard_limits_s(on_gang(rem_s, w_cur[q], w_to[q]), gw[q], gd[q], gm[q], gp[q])
            # FallbackPolicy.cost_cap_reason for tier j, the running gang billed up to the look
            capped = _cap_breaks(cfg, iq, np.full(q.size, j), spent, rem_s, w_cur[q])
            return saving > restart + expected, behind - gm[q] * 3600.0 >= need, must_go - need, capped

        pays, on_line, slack, capped = verdicts(rem_s)
        ahead = ~g[q] | (on_line & (slack >= 0.0))
        yes = ok & ahead & pays & ~capped
        found_at[q[yes]] = at[yes]
        found_rem[q[yes]] = rem_s[yes]
        # Where a later look cannot do better, the search stops. At checkpoint ends the remaining
        # work falls by a cycle per cycle: paying only gets worse, the slack stays (up to rounding:
        # stop only when it is short by more than a millisecond), the guard's line is never reached
        # when not gaining. Between checkpoint ends (looks on request) the remaining work also
        # holds still during each write, so it wanders a write above that trend: judged at the
        # edge of that band a verdict holds for every later look too.
        band_s = write[q] * 3600.0
        if band_s.any():
            pays, _, _, _ = verdicts(rem_s + band_s)
            _, on_line, slack, capped = verdicts(np.maximum(rem_s - band_s, 0.0))
        short = slack < -1e-3
        never = ~pays | (g[q] & short & (w_cur[q] == w_to[q])) | (g[q] & ~on_line & ~gaining[q])
        # The cap's slack grows only while this gang's hour costs less than the hour of work it saves on the last tier.
        never |= capped & (rate_cur[q] >= on_gang(cfg.price[iq, cfg.K - 1], w_cur[q], cfg.workers[iq, cfg.K - 1]))
        stop = yes | past | never
        todo[q[stop]] = False
        cont = q[~stop]
        nxt = kk[cont] + 1.0
        off = ~ok[~stop]
        if isinstance(proc, TraceCapacity) and off.any():  # jump to where the capacity is back
            r = cont[off]
            back = proc.next_available(st[r] + kk[r] * look_h[r] + world.offset[idx[r]]) - world.offset[idx[r]]
            nxt[off] = np.maximum(nxt[off], np.ceil((back - st[r]) / look_h[r] - EPS))
        kk[cont] = nxt
    return found_at, found_rem


__all__ = ["fast_supports", "simulate_fast", "uses_default_rules"]
