"""Monte Carlo of one gang-scheduled training job on a ladder of capacity tiers: the entry points.

Why this module: callers (the planner, ``spotfallback plan``, the benchmarks) ask for
outcomes, not for an engine. ``simulate`` picks one: the policy engine (``sim.engine``),
which feeds typed events to the very ``FallbackPolicy`` the live runner uses and so runs
every rule, or the vectorised engine (``sim.fast``), which gives the same outcomes run by
run for the rules it implements and is fast enough for the planner. ``simulate_many``
scores many candidate ladders on the same draws in one vectorised pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from spotfallback.config import Ladder, Tier, make_ladder
from spotfallback.policy import FallbackPolicy
from spotfallback.sim.engine import simulate_policy
from spotfallback.sim.fast import fast_supports, simulate_fast, uses_default_rules
from spotfallback.sim.job import JobSpec, default_horizon_h
from spotfallback.sim.results import SimResult
from spotfallback.sim.world import Process, RateModel, ScriptedModel, check_world, compile_world

Engine = Literal["auto", "fast", "policy"]


def _check_runs(runs: int, seed: int, horizon_h: float | None) -> None:
    """The arguments ``simulate`` and ``simulate_many`` share, refused by name."""
    if isinstance(runs, bool) or not isinstance(runs, int | np.integer) or runs <= 0:
        raise ValueError(f"runs must be a whole number > 0, got {runs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    if horizon_h is not None and not (isinstance(horizon_h, int | float) and math.isfinite(horizon_h) and horizon_h > 0):
        raise ValueError(f"horizon_h must be a positive number of hours (None: the job's default), got {horizon_h!r}")


def simulate(
    ladder: Ladder | Sequence[Tier] | FallbackPolicy,
    job: JobSpec,
    world: Sequence[Process],
    runs: int = 1000,
    seed: int = 0,
    engine: Engine = "auto",
    horizon_h: float | None = None,
    label: str = "",
    start_h: float | Sequence[float] | np.ndarray | None = None,
) -> SimResult:
    """Simulate ``runs`` independent runs of ``job`` under the ladder's fallback policy.

    ``engine="policy"`` drives ``FallbackPolicy.decide`` event by event (the reference: every
    rule, custom leave rules, elastic tiers and climbing back included); ``"fast"`` is the
    vectorised equivalent for the rules it implements (``fast_supports``, default leave
    rules); ``"auto"`` picks it whenever it applies. ``start_h``: start the runs this many
    hours into the traces instead of at a random tick, one value for all or one per run: to
    predict one recorded replay (the benchmarks compare such a prediction with a run on the
    local cluster) or to backtest a ladder on windows of a trace. Both engines take it, for
    every ladder they run, climbing ones included.
    """
    _check_runs(runs, seed, horizon_h)
    if engine not in ("auto", "fast", "policy"):
        raise ValueError(f"engine must be 'auto', 'fast' or 'policy', got {engine!r}")
    if not isinstance(job, JobSpec):
        raise TypeError(f"job: expected a JobSpec (e.g. JobSpec(work_h=10, ...)), got {type(job).__name__} {job!r:.60}")
    check_world(world)
    policy = ladder if isinstance(ladder, FallbackPolicy) else FallbackPolicy(make_ladder(ladder))
    starts = None if start_h is None else np.asarray(start_h, dtype=float)
    if starts is not None:
        if starts.ndim > 1 or (starts.ndim == 1 and len(starts) != runs):
            raise ValueError(f"start_h must be one number or one per run ({runs}), got shape {starts.shape}")
        if not np.isfinite(starts).all() or (starts < 0).any():
            raise ValueError("start_h must be finite and >= 0")
        starts = np.broadcast_to(starts, (runs,)).copy()
    fast_ok = (
        uses_default_rules(policy)
        and fast_supports(policy.ladder)
        and not any(isinstance(p, ScriptedModel) for p in world)
    )
    if engine == "fast" and not fast_ok:
        raise ValueError(
            "the fast engine needs the default leave rules, no elastic tier, max_preemption_rate or "
            "expected_cost_exit, and no ScriptedModel; use engine='policy'"
        )
    horizon = default_horizon_h(job) if horizon_h is None else horizon_h
    if engine != "policy" and fast_ok:
        procs = compile_world(policy.ladder, world)
        return simulate_fast([(policy.ladder, job)], procs, runs, seed, horizon, [label], starts)[0]  # type: ignore[arg-type]
    return simulate_policy(policy, job, world, runs, seed, horizon, label, starts)


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
    _check_runs(runs, seed, horizon_h)
    if labels is not None and len(labels) != len(configs):
        raise ValueError(f"labels gives {len(labels)} label(s) for {len(configs)} candidate(s); give one each, or none")
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
    procs = compile_world(ladders[0], world)
    if any(isinstance(p, ScriptedModel) for p in procs):
        raise ValueError("simulate_many runs the fast engine; ScriptedModel needs simulate(engine='policy')")
    horizon = horizon_h if horizon_h is not None else max(default_horizon_h(job) for _, job in configs)
    names = list(labels) if labels is not None else [""] * len(configs)
    pairs = list(zip(ladders, [j for _, j in configs], strict=True))
    return simulate_fast(pairs, procs, runs, seed, horizon, names)  # type: ignore[arg-type]


def simulated_optimal_interval(
    job: JobSpec,
    interruptions_per_node_hour: float,
    num_workers: int,
    taus_h: Sequence[float],
    runs: int = 2000,
    seed: int = 0,
) -> tuple[float, list[float]]:
    """The tau (from ``taus_h``) minimising mean wall time on one tier that never gives up.

    The simulator's own optimum, to check Young's and Daly's formulas against. Interruptions
    are unannounced node failures, the setting those formulas assume: work since the last
    checkpoint is lost, then the job restarts after R.
    """
    tier = Tier(name="gang", market="spot", num_workers=num_workers, max_preemptions=-1, max_failures=-1,
                capacity_timeout_s=None, price_per_worker_hour=1.0)
    world = [RateModel(failures_per_node_hour=interruptions_per_node_hour)]
    configs = [(Ladder(tiers=(tier,)), job.with_interval(tau)) for tau in taus_h]
    results = simulate_many(configs, world, runs=runs, seed=seed)
    means = [float(r.wall_h.mean()) for r in results]
    best = int(np.argmin(means))
    return float(taus_h[best]), means


__all__ = ["Engine", "simulate", "simulate_many", "simulated_optimal_interval"]
