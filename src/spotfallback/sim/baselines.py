"""Baselines the planner compares a ladder with, run in the same world.

Why apart from the engines: a baseline is not a ladder, so ``FallbackPolicy`` does not
drive it; it follows its own published rules. ``simulate_uniform_progress`` runs the
deadline-aware policy of *Can't Be Late* (Wu et al., NSDI '24) on a tick grid as in the
paper, on the same compiled processes and result arrays as the engines.
"""

from __future__ import annotations

import math

import numpy as np

from spotfallback.config import Tier
from spotfallback.sim.costmodel import daly_interval
from spotfallback.sim.draws import run_offsets
from spotfallback.sim.job import (
    EPS,
    NEVER_H,
    JobSpec,
    cycle_progress,
    default_horizon_h,
    start_to_finish_h,
    wall_to_finish,
)
from spotfallback.sim.results import FINISHED, STUCK, SimResult
from spotfallback.sim.world import (
    Process,
    RateModel,
    ScriptedModel,
    TraceCapacity,
    compile_process,
    observed_mtbf_h,
)

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

    Its progress is what has been committed, as in the paper, so it checkpoints periodically:
    every ``job.tau_h``, or, for a job without an interval whose preemptions lose work (no
    notice long enough for a checkpoint), every Daly interval for the spot gang's observed
    mean time between interruptions, counted as at most the deadline (so a trace that never
    interrupts still gets a finite one; ``uniform_progress_interval``). Without one, the safety
    net would see no progress for the whole of a long spot session and send the run to
    on-demand for good.
    """
    job = job.with_interval(uniform_progress_interval(job, spot, spot_tier.num_workers))
    if job.deadline_h is None:
        raise ValueError("Uniform Progress needs a deadline (JobSpec.deadline_h)")
    proc = compile_process(spot, spot_tier.num_workers)
    if isinstance(proc, ScriptedModel):
        raise ValueError("Uniform Progress runs on a rate model or a trace, not a ScriptedModel")
    if tick_h is None:  # decide every 5 minutes, or every trace tick if those are longer
        tick_h = proc.gap_h * max(1, round((1.0 / 12.0) / proc.gap_h)) if isinstance(proc, TraceCapacity) else 1.0 / 12.0
    elif isinstance(proc, TraceCapacity) and not math.isclose(tick_h / proc.gap_h, round(tick_h / proc.gap_h)):
        raise ValueError(f"tick_h must be a multiple of the trace gap ({proc.gap_h * 3600:g} s)")
    h = tick_h
    W, D, tau, delta = job.work_h, job.deadline_h, job.tau_h, job.checkpoint_cost_h
    R, prov, notice = job.restart_overhead_h, job.provisioning_delay_h, job.notice_s / 3600.0
    jit = job.jit_checkpoint and notice >= delta
    d = prov + R
    horizon = default_horizon_h(job) if horizon_h is None else horizon_h
    price = {ON_SPOT: spot_tier.price_per_hour(), ON_OD: on_demand_tier.price_per_hour()}
    rng = np.random.default_rng([seed, 2])
    offset = run_offsets([proc], runs, seed)

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
    out = SimResult.empty(label, runs, D)
    status = out.status
    if isinstance(proc, RateModel):
        first_out = rng.random(runs) < proc.outage_probability
        spot_back = np.where(first_out, rng.standard_exponential(runs) * proc.mean_outage_h, 0.0)
    lam_p = proc.preemptions_per_node_hour * spot_tier.num_workers if isinstance(proc, RateModel) else 0.0

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
        spot_ok = proc.is_ok(offset + t) if isinstance(proc, TraceCapacity) else t >= spot_back
        need = start_to_finish_h(np.maximum(W - comm, 0.0), tau_od, delta, prov, R)  # on-demand to the end
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
        over_left = np.where(entering, R, over_left)  # every start pays R, the first included
        base = np.where(change, np.where(leaving, base, comm), base)
        x = np.where(change, 0.0, x)
        last_kind = np.where(entering, target, last_kind)
        started |= entering
        mode = np.where(act, target, mode)
        if isinstance(proc, TraceCapacity):
            new_spot = entering & (target == ON_SPOT)
            if new_spot.any():
                hit = np.where(new_spot, proc.hit(offset + t), hit)

        # Advance through [t, t + h).
        running = act & (mode != IDLE)
        t_int = np.full(runs, np.inf)
        on_spot = running & (mode == ON_SPOT)
        if isinstance(proc, TraceCapacity):
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
        fin = running & (x + comp >= x_need - EPS)
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
        interrupted = running & ~fin & (t_int <= t + h + EPS)
        if interrupted.any():
            done_i, comm_i = cycle_progress(x, tau, delta)
            if jit:  # the notice covers a checkpoint: keep the work done until the save began
                keep, _ = cycle_progress(np.maximum(x - job.jit_lead_h, 0.0), tau, delta)
            else:
                keep = comm_i
            if not jit:  # with a just-in-time checkpoint the workers hold: nothing is lost
                out.lost_work_h[interrupted] += (done_i - keep)[interrupted]
            out.work_on_spot_h[interrupted] += keep[interrupted]
            base = np.where(interrupted, base + keep, base)
            x = np.where(interrupted, 0.0, x)
            mode = np.where(interrupted, IDLE, mode)
            out.preemptions[interrupted] += 1
            if isinstance(proc, RateModel):
                outage = np.where(
                    rng.random(runs) < proc.outage_probability, rng.standard_exponential(runs) * proc.mean_outage_h, 0.0
                )
                spot_back = np.where(interrupted, t_int + outage, spot_back)
    left = status == 0
    status[left] = STUCK
    out.wall_h[left] = horizon
    out.final_tier[:] = np.where(last_kind == ON_OD, 1, 0)
    return out


def uniform_progress_interval(job: JobSpec, spot: Process, num_workers: int) -> float | None:
    """The checkpoint interval Uniform Progress runs with: the job's, else Daly's where work can be lost.

    Daly's interval is taken for the spot gang's observed mean time between interruptions,
    counted as at most the deadline: the baseline's progress is what it has committed, so it
    needs an interval that commits within the run even where the trace shows few or no
    interruptions (an infinite MTBF would give none, and the safety net, seeing no progress,
    would send every run to on-demand a few hours in). An MTBF of the deadline is the longest
    that still expects one interruption in the time the run may take.
    """
    if job.checkpoint_interval_h is not None or job.jit_saves or job.checkpoint_cost_h <= 0:
        return job.checkpoint_interval_h
    mtbf, _ = observed_mtbf_h(spot, num_workers)
    if job.deadline_h is not None:
        mtbf = min(mtbf, job.deadline_h)
    if not math.isfinite(mtbf):
        return None
    return min(daly_interval(job.checkpoint_cost_h, mtbf), job.work_h)


__all__ = ["simulate_uniform_progress", "uniform_progress_interval"]
