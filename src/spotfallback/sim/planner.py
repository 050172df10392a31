"""Planner: pick the ladder's budgets, capacity timeouts, deadline guard, climb back and tau.

The objective is the expected spend, subject to finishing by the deadline with the required
probability. Every candidate is simulated on the same random draws (the same trace start
ticks, the same exponential samples), so differences between candidates are differences of
policy, not of luck. All candidates run on the vectorised engine, which implements the same
rules as ``FallbackPolicy`` (a test checks them run by run), so what is recommended is what
the runner does with the YAML the planner writes.

The search: one-way ladders (budgets and timeouts, then tau), then, with a deadline, spot
tiers with a ``deadline_guard`` (Uniform Progress's line at several paces and margins, with
and without climbing back), then climb-back ladders without a guard; finally the first
tier's budget and tau are swept around the best. It contains the three ladder baselines
(on-demand only, spot forever, the seed's fixed-M fallback), so on the sample it is
evaluated on the recommendation never costs more than any of them that meets the deadline,
except that with a deadline a guarded ladder is preferred to an unguarded one (``_better``).
Given further samples of the market (``more``), every candidate must hold on each.
The fourth baseline, Uniform Progress (simulated as in the paper on the same job), is not a
ladder; ``tests/unit/test_planner.py`` checks on every shared trace that the recommendation costs
no more than it either.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from spotfallback.config import (
    MAX_DURATION_S,
    MAX_WORKERS,
    ClusterRef,
    CostCap,
    DeadlineGuard,
    Ladder,
    NumbersNotBooleans,
    PlannedJob,
    PlanPrediction,
    Tier,
)
from spotfallback.sim.baselines import simulate_uniform_progress
from spotfallback.sim.costmodel import (
    SeedComparison,
    compare_seed_with_exact,
    daly_interval,
    young_interval,
)
from spotfallback.sim.job import EPS, MAX_HOURS, NEVER_H, JobSpec, wall_to_finish
from spotfallback.sim.results import SimResult
from spotfallback.sim.simulate import simulate_many
from spotfallback.sim.traces import NodeTrace, SpotTrace
from spotfallback.sim.world import Process, RateModel, gating_note, observed_mtbf_h, repeat_note

DEFAULT_TIMEOUT_S: float = Tier.model_fields["capacity_timeout_s"].default  # a tier's own, 10 minutes
M_GRID: tuple[int, ...] = (0, 1, 2, 3, 5, 8, 12, 20, 32, -1)
TIMEOUT_GRID_S: tuple[float | None, ...] = (600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, None)
TAU_FACTORS: tuple[float, ...] = (0.5, 0.71, 1.0, 1.41, 2.0)
# Deadline guards: paces of the start-to-deadline line (1 = Uniform Progress, 0 = slack only).
PACE_GRID: tuple[float, ...] = (1.0, 0.9, 0.75, 0.5, 0.0)
GUARD_TAU_FACTORS: tuple[float, ...] = (0.71, 1.0, 1.41)
# The most simulated runs per candidate a plan takes: the runs' draws are held in memory, about
# 7.5 kB a run (3 million took 22.5 GB), so this keeps a plan under a gigabyte.
MAX_RUNS = 100_000
# The shortest checkpoint interval tried: a minute of work. Where a write costs more than half
# the gang's mean time between interruptions, Daly's optimum is that mean time, which on a trace
# flipping within seconds rounds to nothing: no interval makes progress there, and a finer one
# would only multiply the simulated writes.
TAU_MIN_H = round(1.0 / 60.0, 6)  # to the grid's six decimals, so that it is one candidate
# Slack-rule guards that climb back: reserves, as shares of the job's slack (deadline less the
# wall hours to finish) the guard keeps for coming back (``DeadlineGuard.reserve_h``).
RESERVE_SHARES: tuple[float, ...] = (0.15, 0.3)
# Ladders whose mean spend is within this share of the least are as good as it: a few hundred
# runs on a handful of traces cannot tell them apart, and among them the plan takes the one that
# counts least on those traces' particulars (``_robust``).
ROBUST_TOLERANCE = 0.01
# Climbing back without a guard: dwell times and capacity timeouts tried with them.
DWELL_GRID_S: tuple[float, ...] = (600.0, 3600.0)
CLIMB_TIMEOUT_GRID_S: tuple[float | None, ...] = (1800.0, 3600.0)


# The planned job's costs of a move between clusters, left out of a ladder on one cluster's job file:
# only a ladder across clusters moves.
_MOVE_COSTS = {"move_restart_h", "move_cost"}


class Rung(NamedTuple):
    """Settings of one spot tier.

    ``dwell_s`` None = one-way (the tier is never climbed back to); ``guard`` = (pace,
    margin_h, reserve_h) of a ``deadline_guard`` for the request's deadline, None = no guard.
    """

    max_preemptions: int
    timeout_s: float | None
    dwell_s: float | None = None
    budgets: Literal["carry", "fresh"] = "carry"
    guard: tuple[float, float, float] | None = None

    @property
    def climbs(self) -> bool:
        return self.dwell_s is not None


class PlanRequest(NumbersNotBooleans):
    """The job to plan for; durations in hours, prices per worker-hour."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf hours: a simulation without end

    work_h: float = Field(gt=0, le=MAX_HOURS, description="Training hours on an uninterrupted gang.")
    num_workers: int = Field(gt=0, le=MAX_WORKERS)
    checkpoint_cost_h: float = Field(ge=0, le=MAX_HOURS)
    restart_overhead_h: float = Field(ge=0, le=MAX_HOURS)
    provisioning_delay_h: float = Field(default=0.0, ge=0, le=MAX_HOURS)
    notice_s: float = Field(default=120.0, ge=0, le=MAX_HOURS * 3600.0)
    jit_checkpoint: bool = True
    checkpoint_on_request: bool = Field(
        default=False,
        description="The training function checkpoints when the controller asks (PreemptionWatch(answer_requests="
        "True)): climbs back come between periodic checkpoints.",
    )
    spot_price: float = Field(ge=0, description="Spot price per worker-hour.")
    pool_prices: tuple[Annotated[float, Field(ge=0)], ...] = Field(
        default=(),
        description="Spot price per worker-hour of each spot pool, in ladder order (pools differ: another GPU, "
        "zone or region); empty: spot_price for every pool.",
    )
    on_demand_price: float = Field(gt=0, description="On-demand price per worker-hour.")
    deadline_h: float | None = Field(default=None, gt=0, le=MAX_HOURS)
    deadline_probability: float = Field(default=0.95, gt=0, le=1)
    seed_max_preemptions: int = Field(default=5, ge=0, description="M of the seed's fixed-M baseline.")
    cost_cap_factor: float | None = Field(
        default=None,
        ge=1.0,
        description="Put a cost_cap on the spot tiers of every candidate, the spot-forever and seed baselines "
        "included: leave for on-demand before a run can cost more than this multiple of on-demand alone. Off by "
        "default: it bounds the worst windows but raises the mean spend (docs/planner.md); None = no cap.",
    )
    runs: int = Field(default=400, gt=0, le=MAX_RUNS, description="Simulated runs per candidate ladder (their draws are "
                      "held in memory: MAX_RUNS keeps a plan under a gigabyte).")
    seed: int = Field(default=0, ge=0, description="Seed of the random draws; the same for every candidate.")
    clusters: tuple[str, ...] = Field(
        default=(),
        description="The Ray Jobs API address of each spot pool's cluster, in pool order, then the on-demand tier's "
        "(a ladder across clusters); empty: every tier on the cluster the run is on.",
    )
    move_restart_h: float = Field(default=0.0, ge=0, le=MAX_HOURS, description="Extra billed hours of a start on another cluster.")
    move_cost: float = Field(default=0.0, ge=0, description="Cost of each move to another cluster (checkpoint egress).")

    @field_validator("clusters")
    @classmethod
    def _check_clusters(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for address in v:
            ClusterRef(address=address)  # the address's own error, naming the fix
        if v and len(set(v)) < 2:
            raise ValueError("all tiers on one cluster: leave the clusters out (a ladder across clusters names two or more)")
        return v

    @model_validator(mode="after")
    def _check_deadline(self) -> PlanRequest:
        if self.deadline_h is not None and self.deadline_h < self.work_h:
            raise ValueError(f"deadline_h ({self.deadline_h:g}) is shorter than the work itself ({self.work_h:g} h)")
        least = self.least_deadline_h
        if self.deadline_h is not None and self.deadline_h < least - EPS:
            # Every candidate would miss it, on-demand only included: a plan would recommend the
            # "most likely" of ladders that all have P = 0.
            least_up = math.ceil(least * 1e4 - 1e-6) / 1e4  # shown rounded up, so that it is accepted
            raise ValueError(
                f"deadline_h ({self.deadline_h:g}) is shorter than the least wall time a run can take, {least_up:g} h: "
                f"the work ({self.work_h:g} h), the first start's restart ({self.restart_overhead_h * 3600:g} s) and "
                f"provisioning delay ({self.provisioning_delay_h * 3600:g} s), on on-demand from the start; give a "
                f"deadline of at least {least_up:g} h, or none")
        return self

    @property
    def least_deadline_h(self) -> float:
        """The least deadline a run can meet: the job's wall time on on-demand from the start, as
        the simulator bills it (``JobSpec.least_wall_h``: provisioning, restart, the work)."""
        return self.job(None).least_wall_h

    def job(self, tau_h: float | None) -> JobSpec:
        return JobSpec(
            work_h=self.work_h,
            checkpoint_interval_h=tau_h,
            checkpoint_cost_h=self.checkpoint_cost_h,
            restart_overhead_h=self.restart_overhead_h,
            provisioning_delay_h=self.provisioning_delay_h,
            notice_s=self.notice_s,
            jit_checkpoint=self.jit_checkpoint,
            checkpoint_on_request=self.checkpoint_on_request,
            deadline_h=self.deadline_h,
            move_restart_h=self.move_restart_h,  # charged only where the ladder changes cluster
            move_cost=self.move_cost,
        )

    def cluster(self, i: int) -> ClusterRef | None:
        """Spot pool ``i``'s cluster (``i = -1``: the on-demand tier's), when the ladder spans clusters."""
        return ClusterRef(address=self.clusters[i]) if self.clusters else None

    def spot_tier(self, i: int = 0, max_preemptions: int = 3, capacity_timeout_s: float | None = 600.0,
                  **beyond: object) -> Tier:
        """Spot tier ``i``; ``beyond`` sets the climb-back fields (``climb_back``, ``min_dwell_s`` ...)."""
        return Tier(
            name="spot" if i == 0 else f"spot-{i + 1}",
            market="spot",
            num_workers=self.num_workers,
            max_preemptions=max_preemptions,
            capacity_timeout_s=self.reachable_timeout_s(capacity_timeout_s),
            price_per_worker_hour=self.pool_price(i),
            cluster=self.cluster(i),
            **beyond,  # type: ignore[arg-type]
        )

    def pool_price(self, i: int) -> float:
        """Spot price per worker-hour of spot pool ``i``."""
        return self.pool_prices[i] if self.pool_prices else self.spot_price

    def on_demand_tier(self) -> Tier:
        return Tier.on_demand(self.num_workers, price_per_worker_hour=self.on_demand_price, cluster=self.cluster(-1),
                              capacity_timeout_s=self.reachable_timeout_s(DEFAULT_TIMEOUT_S))

    def reachable_timeout_s(self, timeout_s: float | None) -> float | None:
        """A capacity timeout the tier's gang can meet: the wait counts the provisioning delay, so
        one no longer than the delay would give up on every gang before it is up (and on the last
        tier fail the run); such a one is given the delay on top."""
        prov_s = self.provisioning_delay_h * 3600.0
        return timeout_s if timeout_s is None or timeout_s > prov_s else timeout_s + prov_s

    def wall_h(self, tau_h: float | None) -> float:
        """Wall hours the work takes uninterrupted with a checkpoint every ``tau_h`` (None: no periodic ones), writes included."""
        return float(wall_to_finish(self.work_h, tau_h or NEVER_H, self.checkpoint_cost_h))

    def slack_h(self, tau_h: float | None) -> float:
        """Hours the deadline leaves beyond the uninterrupted work (``wall_h``), at least 0."""
        assert self.deadline_h is not None
        return max(self.deadline_h - self.wall_h(tau_h), 0.0)

    def guard(self, tau_h: float | None, pace: float, margin_h: float, reserve_h: float = 0.0) -> DeadlineGuard:
        """A deadline guard for this job: its work in wall hours includes the checkpoint writes.

        Its lead (``first_commit_h``) is what a new gang risks before its progress is safe: the
        restore, plus a whole interval and its write, or only the part of the notice the gang
        cannot train through when the notice holds a checkpoint (``JobSpec.jit_lead_h``; without
        periodic checkpoints nothing bounds the risk: the restore alone).
        """
        assert self.deadline_h is not None
        work = self.wall_h(tau_h)
        first = self.restart_overhead_h
        job = self.job(tau_h)
        if job.jit_saves:
            first += job.jit_lead_h
        elif tau_h is not None:
            first += tau_h + self.checkpoint_cost_h
        return DeadlineGuard(deadline_h=self.deadline_h, work_h=round(work, 9), pace=pace, margin_h=round(margin_h, 9),
                             first_commit_h=round(first, 9), reserve_h=round(reserve_h, 9))

    def planned_job(self) -> PlannedJob:
        """The job itself, for the job file's ``plan:`` block (prices and deadline are kept elsewhere)."""
        return PlannedJob(**self.model_dump(include=set(PlannedJob.model_fields)))

    def cost_cap(self, tau_h: float | None) -> CostCap | None:
        """The spot tiers' cost cap for this job: on-demand alone runs its work and one restart.

        A lost attempt risks the restore and a whole interval with its write, the notice
        notwithstanding (a node failure gives none); without periodic checkpoints, all the work.
        """
        if self.cost_cap_factor is None:
            return None
        work = self.wall_h(tau_h)
        risk = self.restart_overhead_h + (work if tau_h is None else tau_h + self.checkpoint_cost_h)
        return CostCap(work_h=round(work, 9), restart_h=self.restart_overhead_h, first_commit_h=round(risk, 9),
                       factor=self.cost_cap_factor)


@dataclass
class Candidate:
    """One simulated policy: a ladder and a checkpoint interval, with its outcomes."""

    label: str
    ladder: Ladder | None  # None for Uniform Progress, which is not a ladder
    tau_h: float | None
    result: SimResult
    deadline_h: float | None
    by_trace: tuple[SimResult, ...] = ()  # one per sample of the spot markets, when several were given

    @property
    def mean_spend(self) -> float:
        return self.result.mean_spend

    @property
    def p_deadline(self) -> float:
        """Share of runs on time; with several samples, on the worst of them (what a new trace may be like)."""
        if self.by_trace:
            return min(r.deadline_probability(self.deadline_h) for r in self.by_trace)
        return self.result.deadline_probability(self.deadline_h)

    @property
    def mean_wall_h(self) -> float:
        return float(self.result.wall_h.mean())

    def meets(self, probability: float) -> bool:
        return self.p_deadline >= probability - 1e-12

    @property
    def unfinished(self) -> int:
        """Runs that never finished: the simulator gave up on them (``default_horizon_h``), so the
        spend and wall time count only the hours until then and their means are lower bounds."""
        return int((~self.result.finished).sum())


def unfinished_note(c: Candidate, name: str, recommended: bool = False) -> str:
    """A note for a compared policy some of whose runs never finished: its figures are lower bounds,
    and (a baseline) not a spend the recommendation is held to."""
    gave_up_h = float(c.result.wall_h[~c.result.finished].max())
    head = (f"{name}: {c.unfinished} of {c.result.runs} runs never finished (a spot tier that never gets far enough "
            f"on the trace and never gives up); the simulator gave up on them after {gave_up_h:,.0f} h, so its spend "
            "and wall time are those of the hours until then and its means are lower bounds")
    if recommended:
        return (f"{head}; no ladder tried finishes every run: give the spot tiers a max_preemptions or "
                "capacity_timeout_s, or checkpoint more often")
    return f"{head}; the plan recommends a ladder whose runs all finish over it, whatever either spends"


@dataclass
class Plan:
    request: PlanRequest
    recommended: Candidate
    feasible: bool
    baselines: list[Candidate]
    candidates: list[Candidate]
    gang_mtbf_h: float
    lossy_mtbf_h: float
    tau_young_h: float | None
    tau_daly_h: float | None
    seed_check: SeedComparison | None = None
    notes: list[str] = field(default_factory=list)
    made_with: str = ""

    def comparison(self) -> list[Candidate]:
        return [self.recommended, *self.baselines]

    def sweep_over_m(self) -> list[Candidate]:
        """Candidates that differ from the recommendation only in the first tier's budget."""
        rec = self.recommended
        if rec.ladder is None or len(rec.ladder) < 2:
            return []
        first = rec.ladder[0]
        rows = [
            c for c in self.candidates
            if c.ladder is not None and len(c.ladder) == len(rec.ladder) and c.tau_h == rec.tau_h
            and len(c.ladder) > 1
            and c.ladder[0].model_copy(update={"max_preemptions": first.max_preemptions}) == first
            and all(a == b for a, b in zip(c.ladder.tiers[1:], rec.ladder.tiers[1:], strict=True))
        ]
        return sorted(_unique(rows), key=lambda c: _m_key(c.ladder[0].max_preemptions))  # type: ignore[index]

    def sweep_over_tau(self) -> list[Candidate]:
        rec = self.recommended
        if rec.ladder is None:
            return []
        # Same rungs (the label), other tau: a guard's work_h follows tau, so ladders differ.
        rows = [c for c in self.candidates if c.label == rec.label and c.ladder is not None and c.tau_h is not None]
        return sorted(_unique(rows), key=lambda c: c.tau_h)  # type: ignore[arg-type,return-value]

    def tiers_yaml(self) -> str:
        return ladder_yaml(self.recommended.ladder, self.recommended.tau_h) if self.recommended.ladder else ""

    def prediction(self) -> PlanPrediction:
        """What the recommendation is expected to do, for the job file's ``plan:`` block."""
        rec, d = self.recommended, self.request.deadline_h
        return PlanPrediction(
            spend=round(rec.mean_spend, 6),
            wall_h=round(rec.mean_wall_h, 6),
            p90_wall_h=round(float(np.percentile(rec.result.wall_h, 90)), 6),
            deadline_h=d,
            on_time_probability=None if d is None else round(rec.p_deadline, 6),
            checkpoint_interval_h=None if rec.tau_h is None else round(rec.tau_h, 6),
            checkpoint_on_request=self.request.checkpoint_on_request,
            made_with=self.made_with,
            job=self.request.planned_job(),
        )

    def job_yaml(self, name: str, storage_path: str, entrypoint: str,
                 train_loop_config: dict[str, Any] | None = None,
                 resources_per_worker: dict[str, float] | None = None,
                 trace_counts: Literal["available", "preempted"] = "available") -> str:
        """A complete job file for ``spotfallback run``: the recommended tiers and the plan's prediction.

        ``resources_per_worker`` goes on every tier (a GPU count sets ``use_gpu``): the plan prices
        workers, the runtime and the deployment files need their shape. ``trace_counts``: how the
        plan read its JSON traces, recorded for ``backtest``. Validated through
        ``JobConfig`` before it is returned, so a bad name or entrypoint is a ``ConfigError``
        naming the field, not a file the runner later rejects.
        """
        from spotfallback.config import JobConfig, format_validation_error
        from spotfallback.errors import ConfigError

        if self.recommended.ladder is None:
            raise ConfigError("the recommendation is not a ladder")
        data: dict[str, Any] = {
            "name": name,
            "storage_path": storage_path,
            "entrypoint": entrypoint,
            "train_loop_config": dict(train_loop_config or {}),
            "tiers": [{**tier, **_shape(resources_per_worker)} for tier in yaml.safe_load(ladder_yaml(self.recommended.ladder))["tiers"]],
            "plan": self.prediction().model_copy(update={"trace_counts": trace_counts}).model_dump(
                mode="json", exclude=None if self.request.clusters else {"job": _MOVE_COSTS}),
        }
        try:
            JobConfig.model_validate(data)
        except ValidationError as e:
            raise ConfigError(format_validation_error(e)) from None
        tau = self.recommended.tau_h
        head = (
            "# Written by `spotfallback plan`. `spotfallback run` runs it; `plan:` is the prediction that\n"
            "# `spotfallback report` sets beside what the run did, and `plan.job` the job it was made for,\n"
            "# which `spotfallback backtest` replays.\n"
        )
        if tau is not None:
            head += f"# Checkpoint every {tau * 60:.1f} min of training (tau, chosen by the plan).\n"
        if self.request.checkpoint_on_request and any(t.climb_back for t in self.recommended.ladder.tiers):
            head += ("# The plan assumes the training function answers checkpoint requests (PreemptionWatch(\n"
                     "# answer_requests=True)); without that the run climbs back only just after a periodic checkpoint.\n")
        readers = [f for f in ("deadline_guard", "cost_cap")
                   if any(getattr(t, f) is not None for t in self.recommended.ladder.tiers)]
        if readers:
            head += (f"# {' and '.join(readers)} read{'s' if len(readers) == 1 else ''} the `remaining_work_s` metric "
                     "(wall seconds left, checkpoints included)\n# that the training function reports with each "
                     "checkpoint.\n")
        return head + yaml.safe_dump(data, sort_keys=False)


def _shape(resources_per_worker: dict[str, float] | None) -> dict[str, Any]:
    """A tier's worker shape in a job file: its resources, and ``use_gpu`` when they hold a GPU."""
    if not resources_per_worker:
        return {}
    return {"resources_per_worker": dict(resources_per_worker), **({"use_gpu": True} if resources_per_worker.get("GPU") else {})}


def _m_key(m: int) -> float:
    return math.inf if m == -1 else m


def _unique(cands: Sequence[Candidate]) -> list[Candidate]:
    seen: dict[tuple, Candidate] = {}
    for c in cands:
        seen.setdefault((c.label, c.tau_h), c)
    return list(seen.values())


def ladder_yaml(ladder: Ladder, tau_h: float | None = None) -> str:
    """The ladder as the YAML the runner reads (``tiers: [...]``), tau as a trailing comment."""
    tiers = []
    for t in ladder.tiers:
        d = t.model_dump(mode="json")
        if d.get("resources_per_worker") is None:
            d.pop("resources_per_worker", None)
        if "placement" not in t.model_fields_set:  # deployment detail; left out unless the ladder set it
            d.pop("placement", None)
        tiers.append(d)
    text = yaml.safe_dump({"tiers": tiers}, sort_keys=False)
    if tau_h is not None:
        text += f"# checkpoint every {tau_h * 60:.1f} min of training (tau, chosen by spotfallback plan)\n"
    return text


# ---------------------------------------------------------------------------------------


def _between_neighbours(m: int, grid: Sequence[int], per_side: int = 3) -> list[int]:
    """Integer budgets between ``m`` and its neighbours on the grid (-1, forever, is last)."""
    finite = sorted(g for g in grid if g != -1)
    if m == -1:
        top = finite[-1] if finite else 0
        return [top * 3 // 2, top * 2, top * 3] if top else [1, 2, 4]
    if m not in finite:
        return []
    k = finite.index(m)
    lower = finite[k - 1] if k > 0 else m
    upper = finite[k + 1] if k + 1 < len(finite) else m * 2
    out: set[int] = set()
    for a, b in ((lower, m), (m, upper)):
        step = max(1, (b - a) // (per_side + 1))
        out.update(range(a + step, b, step))
    out.discard(m)
    return sorted(out)[: 2 * per_side]


def _tau_grid(daly_h: float | None, work_h: float) -> Sequence[float | None]:
    if daly_h is None or not math.isfinite(daly_h) or daly_h >= work_h:
        return [None, work_h / 4, work_h / 8]
    return _scaled(daly_h, work_h)


def _scaled(tau_h: float, work_h: float, factors: Sequence[float] = TAU_FACTORS) -> list[float]:
    """``tau_h`` times each factor, no shorter than TAU_MIN_H and no longer than the work."""
    return sorted({min(max(round(tau_h * f, 6), TAU_MIN_H), work_h) for f in factors})


def _spot_tier(req: PlanRequest, i: int, rung: Rung, tau_h: float | None) -> Tier:
    beyond: dict[str, Any] = {}
    if rung.climbs:
        beyond.update(climb_back=True, min_dwell_s=rung.dwell_s, climb_budgets=rung.budgets)
    if rung.guard is not None:
        beyond["deadline_guard"] = req.guard(tau_h, *rung.guard)
    cap = req.cost_cap(tau_h)
    if cap is not None:
        beyond["cost_cap"] = cap
    return req.spot_tier(i, rung.max_preemptions, rung.timeout_s, **beyond)


def _ladder(req: PlanRequest, spots: Sequence[Rung], tau_h: float | None) -> Ladder:
    return Ladder(tiers=(*[_spot_tier(req, i, r, tau_h) for i, r in enumerate(spots)], req.on_demand_tier()))


def _label(spots: Sequence[Rung]) -> str:
    parts = []
    for i, r in enumerate(spots):
        ms = "inf" if r.max_preemptions == -1 else str(r.max_preemptions)
        ts = "none" if r.timeout_s is None else f"{r.timeout_s / 60:g}m"
        extra = ""
        if r.guard is not None:
            extra += f",guard pace={r.guard[0]:g} margin={r.guard[1] * 60:.0f}m"
            if r.guard[2]:
                extra += f" reserve={r.guard[2] * 60:.0f}m"
        if r.climbs:
            extra += f",climb back after {r.dwell_s / 60:g}m"  # type: ignore[operator]
            if r.budgets == "fresh":
                extra += ",fresh budgets"
        parts.append(f"{'spot' if i == 0 else f'spot-{i + 1}'}(M={ms},timeout={ts}{extra})")
    return " > ".join([*parts, "on-demand"])


def _two_way_grid(best: Rung) -> list[Rung]:
    """Climb-back variants (no guard) around a one-way rung: budget, timeout, dwell, budgets."""
    ms = dict.fromkeys([best.max_preemptions, -1])
    tos = dict.fromkeys([best.timeout_s, *CLIMB_TIMEOUT_GRID_S])
    return [Rung(m, to, dwell, budgets) for m in ms for to in tos for dwell in DWELL_GRID_S for budgets in ("fresh", "carry")]


def _guard_grid(best: Rung, req: PlanRequest, tau_h: float | None) -> list[Rung]:
    """Deadline-guarded variants of a rung: pace x margin x climbing back x (its budgets, none).

    Margins: one changeover (restart + provisioning) plus a checkpoint write; two of them
    (room for a last failed attempt); and the same plus half or all of a checkpoint interval
    (work lost to a preemption without notice, since the guard decides only after one).
    Slack-rule guards that climb back also try keeping ``RESERVE_SHARES`` of the slack: the
    slack rule alone leaves when the slack is down to the margin, where on-demand can never
    make room to return. Only reserves a climb can spend: at least its two changeovers and
    the guard's lead, else the run only leaves earlier.
    """
    if _past_deadline(req, tau_h):
        return []
    change = req.restart_overhead_h + req.provisioning_delay_h
    tau = tau_h or 0.0
    margins = dict.fromkeys(
        round(m, 6)
        for m in (change + req.checkpoint_cost_h, 2 * change + req.checkpoint_cost_h,
                  change + req.checkpoint_cost_h + tau / 2, 2 * change + req.checkpoint_cost_h + tau)
    )
    budgets = dict.fromkeys([(-1, None), (best.max_preemptions, best.timeout_s)])
    slack = req.slack_h(tau_h)
    climb_needs = 2 * change + req.guard(tau_h, 0.0, 0.0).first_commit_h
    reserves = [0.0, *dict.fromkeys(round(share * slack, 6) for share in RESERVE_SHARES if share * slack >= climb_needs)]
    return [
        Rung(m, to, dwell, "carry", (pace, margin, reserve))
        for pace in PACE_GRID
        for margin in margins
        for dwell in (0.0, None)
        for reserve in (reserves if pace == 0 and dwell is not None else [0.0])
        for m, to in budgets
    ]


def _past_deadline(req: PlanRequest, tau_h: float | None) -> bool:
    """Whether the job's uninterrupted wall time, a write every ``tau_h`` included, is past its deadline."""
    return req.deadline_h is not None and req.wall_h(tau_h) > req.deadline_h


def guarded(c: Candidate) -> bool:
    """Whether the ladder keeps the deadline by its own rules: every spot tier guarded (or no spot tier)."""
    return c.ladder is not None and all(t.deadline_guard is not None for t in c.ladder.tiers if t.is_spot)


def _better(a: Candidate, b: Candidate | None, probability: float) -> bool:
    """Is ``a`` a better recommendation than ``b``: feasible first, then every run finished, then
    guarded, then cheaper, then faster.

    A ladder some of whose runs never finish (a spot tier that waits or restarts for ever) has
    a spend counted only up to where the simulator gave up on them: a lower bound, which would
    make it look cheaper than the ladders that pay to finish. With a deadline, a feasible
    ladder whose spot tiers carry a deadline guard beats one that
    met it on the sample by its budgets and timeouts alone: the guard watches the slack on
    any trace, budgets and timeouts only fit the one they were tuned on (even ladders with
    every sampled run on time were late on other traces).
    """
    if b is None:
        return True
    fa, fb = a.meets(probability), b.meets(probability)
    if fa != fb:
        return fa
    if (a.unfinished == 0) != (b.unfinished == 0):
        return a.unfinished == 0
    if fa and a.deadline_h is not None and guarded(a) != guarded(b):
        return guarded(a)
    if not fa and not math.isclose(a.p_deadline, b.p_deadline):
        return a.p_deadline > b.p_deadline
    if not math.isclose(a.mean_spend, b.mean_spend, rel_tol=1e-12):
        return a.mean_spend < b.mean_spend
    return a.mean_wall_h < b.mean_wall_h


def trace_counts(c: Candidate) -> int:
    """How many of the ladder's rules count events of the traces it was planned on: each spot
    tier's preemption budget and capacity timeout. Their best values are the traces' numbers of
    preemptions and lengths of outages, which differ from trace to trace; a deadline guard reads
    the job's own slack."""
    assert c.ladder is not None
    return sum((t.max_preemptions != -1) + (t.capacity_timeout_s is not None) for t in c.ladder.tiers if t.is_spot)


def _robust(best: Candidate, candidates: Sequence[Candidate], probability: float, bar: float) -> Candidate:
    """The recommendation among the ladders as good as ``best``: as feasible, as finished and as guarded, their
    mean spend within ``ROBUST_TOLERANCE`` of its (and no more than ``bar``), the one with the
    fewest ``trace_counts`` (then the cheapest). Settings that fit the sampled traces' counts
    often fit other traces worst: a budget the planning runs never spent ties with none, and
    on a trace that preempts more it sends the run to on-demand (docs/planner.md, section 9)."""
    if best.ladder is None or not best.meets(probability) or not any(c is best for c in candidates):
        return best
    near = [c for c in candidates if c.ladder is not None and c.meets(probability) and guarded(c) == guarded(best)
            and (c.unfinished == 0) == (best.unfinished == 0)
            and c.mean_spend <= max(min(best.mean_spend * (1 + ROBUST_TOLERANCE), bar), best.mean_spend)]
    return min(near, key=lambda c: (trace_counts(c), c.mean_spend, c.mean_wall_h))


def describe_process(process: Process) -> str:
    """One line naming a spot process, for a plan's ``made_with``."""
    if isinstance(process, SpotTrace | NodeTrace):
        return f"trace {process.name}"
    if isinstance(process, RateModel):
        return (f"rate model ({process.preemptions_per_node_hour:g} preemptions and {process.failures_per_node_hour:g} "
                f"failures per node-hour, outages {process.outage_probability:g} x {process.mean_outage_h:g} h)")
    return type(process).__name__


def _checked_grids(req: PlanRequest, m_grid: Sequence[int], timeout_grid_s: Sequence[float | None]
                   ) -> tuple[tuple[int, ...], tuple[float | None, ...]]:
    """The grids ``plan`` searches, refused with the argument's name where a tier could not take a
    value, and each timeout made one the gang can meet (``PlanRequest.reachable_timeout_s``)."""
    if not m_grid:
        raise ValueError("m_grid: give at least one preemption budget, e.g. (0, 3, 8, -1)")
    if not timeout_grid_s:
        raise ValueError("timeout_grid_s: give at least one capacity timeout in seconds (None: wait for ever), e.g. (600, 3600, None)")
    for m in m_grid:
        if isinstance(m, bool) or not isinstance(m, int) or m < -1:
            raise ValueError(f"m_grid: {m!r} is not a preemption budget; give whole numbers, 0 or more, or -1 for no limit")
    for to in timeout_grid_s:
        if to is not None and (isinstance(to, bool) or not isinstance(to, int | float) or not 0 < to <= MAX_DURATION_S):
            raise ValueError(f"timeout_grid_s: {to!r} is not a capacity timeout; give seconds above 0, or None to wait for ever")
    return tuple(dict.fromkeys(m_grid)), tuple(dict.fromkeys(req.reachable_timeout_s(t) for t in timeout_grid_s))


def _process_list(value: Any) -> list[Any]:
    """``value`` as a list: one process (a trace, or a path the engine then names whole) or a list of them."""
    return [value] if isinstance(value, str | Path) or not isinstance(value, Sequence) else list(value)


def plan(
    request: PlanRequest,
    spot: Process | Sequence[Process],
    m_grid: Sequence[int] = M_GRID,
    timeout_grid_s: Sequence[float | None] = TIMEOUT_GRID_S,
    climb: bool = True,
    more: Sequence[Process | Sequence[Process]] = (),
) -> Plan:
    """Recommend budgets, capacity timeouts, a deadline guard and climb back per spot tier, and tau.

    ``spot`` is one process per spot tier (several = several spot pools, tried in order);
    the ladder always ends on a reliable on-demand tier. ``climb=False`` searches one-way
    ladders without guards only (the seed's kind of ladder). ``more`` are further samples of
    the same markets (other zones or dates: one process, or one per spot tier, each): every
    candidate runs on each sample (``runs`` split between them), spends their mean, and must
    meet the deadline on the worst of them. Settings that hold on every sample are the ones
    likely to hold on a trace none of them is; the best on one trace often is not.
    """
    spots = _process_list(spot)
    if not spots:
        raise ValueError("give at least one spot process")
    req = request
    m_grid, timeout_grid_s = _checked_grids(req, m_grid, timeout_grid_s)
    first_timeout = req.reachable_timeout_s(DEFAULT_TIMEOUT_S)
    n_spot = len(spots)
    if req.pool_prices and len(req.pool_prices) != n_spot:
        raise ValueError(f"pool_prices gives {len(req.pool_prices)} prices for {n_spot} spot pool(s); give one per pool")
    if req.clusters and len(req.clusters) != n_spot + 1:
        raise ValueError(f"clusters gives {len(req.clusters)} cluster(s) for {n_spot} spot pool(s) and on-demand; "
                         "give one per spot pool, in order, then the on-demand tier's")
    samples: list[list[Process]] = [spots]
    for other in _process_list(more):
        sample = _process_list(other)
        if len(sample) != n_spot:
            raise ValueError(f"each further sample needs {n_spot} spot process(es), one per spot tier")
        samples.append(sample)
    worlds: list[list[Process]] = [[*s, RateModel()] for s in samples]
    runs_each = max(1, math.ceil(req.runs / len(samples)))
    prob = req.deadline_probability

    # The interval is sized for the most interrupted sample of each tier.
    mtbfs = [observed_mtbf_h(p, req.num_workers) for sample in samples for p in sample]
    gang_mtbf = min(m for m, _ in mtbfs)
    jit_covers = req.jit_checkpoint and req.notice_s / 3600.0 >= req.checkpoint_cost_h
    lossy = min(f for _, f in mtbfs) if jit_covers else gang_mtbf
    tau_young: float | None
    tau_daly: float | None
    if math.isfinite(lossy) and req.checkpoint_cost_h > 0:
        tau_young, tau_daly = young_interval(req.checkpoint_cost_h, lossy), daly_interval(req.checkpoint_cost_h, lossy)
    else:
        tau_young = tau_daly = None
    taus = _tau_grid(tau_daly, req.work_h)
    tau0 = max(tau_daly, TAU_MIN_H) if tau_daly is not None and tau_daly < req.work_h else None
    horizon_h, horizon = (req.deadline_h, "deadline") if req.deadline_h is not None else (req.work_h, "of work")
    notes: list[str] = list(dict.fromkeys(n for sample in samples for p in sample for n in (
        gating_note(p, req.num_workers), repeat_note(p, req.num_workers, horizon_h, horizon)) if n))
    if tau_daly is None:
        notes.append("no interruption loses work (or checkpoints are free): periodic checkpoints are optional")

    candidates: list[Candidate] = []
    cache: dict[tuple, Candidate] = {}

    def evaluate(settings: list[tuple[tuple[Rung, ...], float | None]]) -> list[Candidate]:
        # A guard is refused work past its deadline (DeadlineGuard); no tier could finish in time anyway.
        settings = [(s, tau) for s, tau in settings if not (_past_deadline(req, tau) and any(r.guard for r in s))]
        todo = list(dict.fromkeys((s, tau) for s, tau in settings if (s, tau) not in cache))
        configs = [(_ladder(req, s, tau), req.job(tau)) for s, tau in todo]
        labels = [_label(s) for s, _ in todo]
        per_world = [simulate_many(configs, w, runs=runs_each, seed=req.seed, labels=labels) for w in worlds]
        for i, ((s, tau), (lad, _)) in enumerate(zip(todo, configs, strict=True)):
            parts = tuple(results[i] for results in per_world)
            cand = Candidate(_label(s), lad, tau, SimResult.concat(parts), req.deadline_h,
                             parts if len(parts) > 1 else ())
            cache[(s, tau)] = cand
            candidates.append(cand)
        return [cache[k] for k in settings]

    def best_of(cands: Sequence[Candidate]) -> Candidate:
        best: Candidate | None = None
        for c in cands:
            if _better(c, best, prob):
                best = c
        assert best is not None
        return best

    def same_on_every_tier(rungs: Sequence[Rung], tau_h: float | None) -> list[Candidate]:
        return evaluate([(tuple([r] * n_spot), tau_h) for r in rungs])

    # 1. One-way ladders: coordinate descent over the spot tiers' (M, timeout), then tau, then
    # once more if tau moved; finally refine each tier's M between its grid neighbours.
    current: list[Rung] = [Rung(3, first_timeout)] * n_spot
    tau = tau0
    for _round in range(2):
        for i in range(n_spot):
            settings = []
            for m in m_grid:
                for to in timeout_grid_s:
                    s = list(current)
                    s[i] = Rung(m, to)
                    settings.append((tuple(s), tau))
            current = list(_spots_of(best_of(evaluate(settings)), n_spot))
        tau_best = best_of(evaluate([(tuple(current), t) for t in taus]))
        if tau_best.tau_h == tau:
            break
        tau = tau_best.tau_h
    for i in range(n_spot):
        settings = []
        for m in _between_neighbours(current[i].max_preemptions, m_grid):
            s = list(current)
            s[i] = Rung(m, current[i].timeout_s)
            settings.append((tuple(s), tau))
        if settings:
            current = list(_spots_of(best_of([*evaluate(settings), cache[(tuple(current), tau)]]), n_spot))
    best = cache[(tuple(current), tau)]

    if climb:
        # 2. Deadline guards (the same on every spot tier), around the best one-way budgets; with
        # no periodic checkpoints, also with the interval grid's: a guard that climbs back looks
        # at the higher tier only at commits, unless the gang answers checkpoint requests.
        if req.deadline_h is not None:
            if tau is None:
                guard_taus: Sequence[float | None] = taus
            else:
                guard_taus = _scaled(tau, req.work_h, GUARD_TAU_FACTORS)
            for t in guard_taus:
                best = best_of([best, *same_on_every_tier(_guard_grid(current[0], req, t), t)])
        # 3. Climbing back without a guard (it pays by climb_pays alone).
        best = best_of([best, *same_on_every_tier(_two_way_grid(current[0]), tau)])
        current, tau = list(_spots_of(best, n_spot)), best.tau_h
        # 4. Sweep the first tier's budget and tau around the best: a refinement, and the
        # rows of the plot.
        settings = []
        for m in m_grid:
            s = list(current)
            s[0] = current[0]._replace(max_preemptions=m)
            settings.append((tuple(s), tau))
        best = best_of([best, *evaluate(settings)])
        current = list(_spots_of(best, n_spot))
        best = best_of([best, *evaluate([(tuple(current), t) for t in _around(tau, taus, req.work_h)])])

    # Baselines, on the same draws.
    od_ladder = Ladder(tiers=(req.on_demand_tier(),))
    od_res = simulate_many([(od_ladder, req.job(None))], [RateModel()], runs=req.runs, seed=req.seed, labels=["on-demand only"])[0]
    od = Candidate("on-demand only", od_ladder, None, od_res, req.deadline_h)
    forever = evaluate([(tuple([Rung(-1, None)] * n_spot), tau0)])[0]
    seed_m = evaluate([(tuple([Rung(req.seed_max_preemptions, first_timeout)] * n_spot), tau0)])[0]
    baselines = [
        od,
        Candidate("spot forever", forever.ladder, forever.tau_h, forever.result, req.deadline_h),
        Candidate(f"seed M={req.seed_max_preemptions}", seed_m.ladder, seed_m.tau_h, seed_m.result, req.deadline_h),
    ]
    if req.deadline_h is not None:
        ups = tuple(
            simulate_uniform_progress(req.job(tau0), req.spot_tier(), req.on_demand_tier(), s[0], runs=runs_each,
                                      seed=req.seed, checkpoint_on_demand=True)
            for s in samples
        )
        baselines.append(Candidate("uniform progress", None, tau0, SimResult.concat(ups), req.deadline_h,
                                   ups if len(ups) > 1 else ()))
    else:
        notes.append("no deadline given: the Uniform Progress baseline and deadline guards need one and are left out")

    # No dearer than a baseline that meets the deadline: a plan never recommends paying more. One with
    # runs that never finished spent less than it would have (a lower bound): no bar.
    bar = min((b.mean_spend for b in baselines if b.meets(prob) and not b.unfinished), default=math.inf)
    best = _robust(best_of([best, *candidates, od]), candidates, prob, bar)
    feasible = best.meets(prob)
    if best.unfinished:
        notes.append(unfinished_note(best, f"the recommended ladder, {best.label}", recommended=True))
    notes += [unfinished_note(b, f"baseline {b.label!r}") for b in baselines if b.unfinished and b.result is not best.result]
    if not feasible:
        notes.append(
            f"no ladder meets the deadline with probability {prob:g}; "
            f"the best reaches {best.p_deadline:.3f}"
        )
    climbs = best.ladder is not None and any(t.climb_back for t in best.ladder.tiers)
    if climbs and req.checkpoint_on_request:
        notes.append("the recommended ladder climbs back between checkpoints: the training function must answer "
                     "checkpoint requests (PreemptionWatch(answer_requests=True)), or it climbs back only just after "
                     "a periodic checkpoint")
    elif climbs and best.tau_h is None:
        notes.append("climbing back needs checkpoints: the ladder climbs back only just after a commit (the runner "
                     "looks then, so a move loses no work), so without periodic ones a run that left a tier does not "
                     "return to it, unless the training function answers checkpoint requests (--checkpoint-on-request)")
    seed_check = None
    res = best.result
    if best.ladder is not None and len(best.ladder) > 1:
        alpha_work = float(res.work_on_spot_h.mean() / req.work_h)
        m_mean = float(res.interruptions.mean())
        per_failure = req.restart_overhead_h + req.provisioning_delay_h
        lost = float(res.lost_work_h.mean() / m_mean) if m_mean > 0 else 0.0
        discount = 1.0 - req.pool_price(0) / req.on_demand_price
        t_eff = req.wall_h(best.tau_h)
        seed_check = compare_seed_with_exact(
            t_eff, min(alpha_work, 1.0), max(round(m_mean), 0), per_failure,
            req.on_demand_price * req.num_workers, min(max(discount, 0.0), 1.0), lost,
        )
    made_with = (f"{'; '.join(describe_process(p) for s in samples for p in s)}; {req.work_h:g} h on {req.num_workers} workers; "
                 f"{req.runs} runs, seed {req.seed}")
    return Plan(req, best, feasible, baselines, candidates + [od], gang_mtbf, lossy, tau_young, tau_daly, seed_check,
                notes, made_with)


def _around(tau: float | None, taus: Sequence[float | None], work_h: float) -> Sequence[float | None]:
    """The tau grid, rescaled around ``tau`` when the search moved it."""
    if tau is None:
        return list(taus)
    return _scaled(tau, work_h)


def _spots_of(c: Candidate, n_spot: int) -> tuple[Rung, ...]:
    assert c.ladder is not None
    if len(c.ladder) == 1:
        return tuple([Rung(0, DEFAULT_TIMEOUT_S)] * n_spot)
    rungs = []
    for t in c.ladder.tiers[:n_spot]:
        g = t.deadline_guard
        guard = (g.pace, g.margin_h, g.reserve_h) if g is not None else None
        dwell = t.min_dwell_s if t.climb_back else None
        budgets = t.climb_budgets if t.climb_back else "carry"
        rungs.append(Rung(t.max_preemptions, t.capacity_timeout_s, dwell, budgets, guard))
    return tuple(rungs)


def load_process(path: str | os.PathLike[str], kind: Literal["spot", "node"] | None = None) -> SpotTrace | NodeTrace:
    """A trace file by extension (``.json`` SkyPilot, ``.csv`` node trace) or explicit kind."""
    from spotfallback.sim.traces import load_node_trace, load_spot_trace

    if kind not in (None, "spot", "node"):
        raise ValueError(f"kind: expected 'spot' (a SkyPilot JSON trace) or 'node' (a node trace CSV), got {kind!r}")
    name = os.fspath(path)
    k = kind or ("node" if name.lower().endswith(".csv") else "spot")
    return load_node_trace(name) if k == "node" else load_spot_trace(name)
