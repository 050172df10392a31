"""Closed-form cost model: the seed's formula, generalised and corrected, and checkpoint intervals.

The seed (``seeds/000_*.txt``) prices a spot-first job that falls back to on-demand after M
interruptions. Its derivation applies the spot fraction alpha to the *total* runtime, overhead
included, although it defines the spot time as alpha * T (work only). This module keeps the
seed's formula (so its worked example reproduces exactly), adds the break-even condition and the
runtime-flexibility table with the ratio and the percentage (the seed's "217% longer" row is a
2.17x runtime, i.e. 117% longer), and puts an exact accounting model next to it that charges
every hour to the tier it ran on. The simulator does the same accounting run by run.

Young's and Daly's checkpoint intervals live here too: the planner seeds its search with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_DISCOUNT = 0.9
"""The seed's spot discount: spot costs 10% of on-demand."""

SEED_TABLE_CLAIMS: dict[float, float] = {0.3: 36.0, 0.4: 56.0, 0.5: 81.0, 0.6: 217.0}
"""The seed's runtime-flexibility table as printed: alpha -> "up to X% longer runtime"."""


def _check(name: str, value: float, *, lo: float = 0.0, hi: float | None = None, strict: bool = False) -> None:
    bad = math.isnan(value) or (value <= lo if strict else value < lo) or (hi is not None and value > hi)
    if bad:
        bound = f"{'>' if strict else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
        raise ValueError(f"{name} must be {bound}, got {value}")


@dataclass(frozen=True)
class SeedEstimate:
    """The seed's closed form: C_new = (T + M*dt) * C_o * (1 - d*alpha)."""

    t_total_h: float
    cost_new: float
    cost_old: float
    savings: float  # fraction of the all-on-demand cost saved; negative = costs more
    break_even_ratio: float  # largest T_total / T that still saves

    @property
    def saves(self) -> bool:
        return self.cost_new < self.cost_old


def break_even_ratio(alpha: float, discount: float = DEFAULT_DISCOUNT) -> float:
    """Largest T_total / T at which spot-with-fallback still costs no more: 1 / (1 - d*alpha)."""
    _check("alpha", alpha, hi=1.0)
    _check("discount", discount, hi=1.0)
    blended = 1.0 - discount * alpha
    return math.inf if blended == 0 else 1.0 / blended


def seed_closed_form(
    work_h: float,
    alpha: float,
    max_failures: int,
    overhead_h: float,
    on_demand_price: float = 1.0,
    discount: float = DEFAULT_DISCOUNT,
) -> SeedEstimate:
    """The seed's formula with the discount as a parameter (the seed fixes d = 0.9).

    T = ``work_h`` (hours on on-demand alone), alpha the fraction on spot, M failures each
    adding ``overhead_h``. Exact only when alpha is the spot share of *billed time*, overhead
    included; see ``exact_accounting`` for alpha as the share of work.
    """
    _check("work_h", work_h, strict=True)
    _check("max_failures", max_failures)
    _check("overhead_h", overhead_h)
    _check("on_demand_price", on_demand_price)
    ratio = break_even_ratio(alpha, discount)
    t_total = work_h + max_failures * overhead_h
    cost_new = t_total * on_demand_price * (1.0 - discount * alpha)
    cost_old = work_h * on_demand_price
    savings = 1.0 - cost_new / cost_old if cost_old > 0 else 0.0
    return SeedEstimate(t_total, cost_new, cost_old, savings, ratio)


def max_overhead_break_even_h(work_h: float, alpha: float, discount: float = DEFAULT_DISCOUNT) -> float:
    """Total overhead M*dt (hours) the seed's formula tolerates before the job costs more."""
    return work_h * (break_even_ratio(alpha, discount) - 1.0)


@dataclass(frozen=True)
class FlexibilityRow:
    """One row of the runtime-flexibility table, computed rather than copied."""

    alpha: float
    ratio: float  # break-even T_total / T
    percent_longer: float  # (ratio - 1) * 100
    seed_claim_percent: float | None  # what the seed printed, if it had this row

    @property
    def seed_is_right(self) -> bool | None:
        """Whether the seed's printed figure is the percentage (truncated to a whole number)."""
        if self.seed_claim_percent is None:
            return None
        return math.floor(self.percent_longer) == self.seed_claim_percent


def runtime_flexibility_table(
    alphas: Sequence[float] = (0.3, 0.4, 0.5, 0.6), discount: float = DEFAULT_DISCOUNT
) -> list[FlexibilityRow]:
    """How much longer the job may run before spot stops saving, for each spot fraction."""
    rows = []
    for a in alphas:
        ratio = break_even_ratio(a, discount)
        claim = SEED_TABLE_CLAIMS.get(round(a, 6)) if discount == DEFAULT_DISCOUNT else None
        rows.append(FlexibilityRow(a, ratio, (ratio - 1.0) * 100.0, claim))
    return rows


@dataclass(frozen=True)
class ExactCost:
    """Spend from hours on each tier times that tier's price."""

    spot_hours: float
    on_demand_hours: float
    wall_h: float
    cost: float
    cost_old: float

    @property
    def savings(self) -> float:
        return 1.0 - self.cost / self.cost_old if self.cost_old > 0 else 0.0

    @property
    def spot_share_of_time(self) -> float:
        """The alpha under which the seed's formula is exact for this run."""
        total = self.spot_hours + self.on_demand_hours
        return self.spot_hours / total if total > 0 else 0.0


def exact_accounting(
    work_h: float,
    alpha: float,
    max_failures: int,
    overhead_h: float,
    on_demand_price: float = 1.0,
    discount: float = DEFAULT_DISCOUNT,
    lost_per_failure_h: float = 0.0,
    restarts_on_spot: int | None = None,
) -> ExactCost:
    """Honest accounting of the seed's scenario: each hour is billed on the tier it ran on.

    alpha is the fraction of the *work* done on spot (the seed's T_S = alpha*T). The job sees
    ``max_failures`` spot interruptions; the last one ends the spot phase, so by default
    M - 1 restarts (overhead and re-done lost work) happen on spot and one on on-demand. With
    alpha = 1 there is no fallback and every restart is on spot.
    """
    _check("work_h", work_h, strict=True)
    _check("alpha", alpha, hi=1.0)
    _check("max_failures", max_failures)
    _check("overhead_h", overhead_h)
    _check("lost_per_failure_h", lost_per_failure_h)
    _check("discount", discount, hi=1.0)
    if restarts_on_spot is None:
        restarts_on_spot = max_failures if alpha >= 1.0 else max(max_failures - 1, 0)
    if not 0 <= restarts_on_spot <= max_failures:
        raise ValueError(f"restarts_on_spot must be in [0, {max_failures}], got {restarts_on_spot}")
    per_restart = overhead_h + lost_per_failure_h
    spot_hours = alpha * work_h + restarts_on_spot * per_restart
    od_hours = (1.0 - alpha) * work_h + (max_failures - restarts_on_spot) * per_restart
    spot_price = on_demand_price * (1.0 - discount)
    cost = spot_hours * spot_price + od_hours * on_demand_price
    return ExactCost(spot_hours, od_hours, spot_hours + od_hours, cost, work_h * on_demand_price)


@dataclass(frozen=True)
class SeedComparison:
    """The three ways to price the seed's scenario, side by side."""

    seed_formula: SeedEstimate  # alpha applied to T_total (the seed's derivation)
    seed_decomposition: ExactCost  # the seed's own T_S, T_O: all overhead billed on on-demand
    exact: ExactCost  # overhead and lost work billed on the tier that incurs it

    @property
    def formula_error(self) -> float:
        """Relative error of the seed's formula against the exact accounting."""
        return self.seed_formula.cost_new / self.exact.cost - 1.0


def compare_seed_with_exact(
    work_h: float,
    alpha: float,
    max_failures: int,
    overhead_h: float,
    on_demand_price: float = 1.0,
    discount: float = DEFAULT_DISCOUNT,
    lost_per_failure_h: float = 0.0,
) -> SeedComparison:
    """Where the seed's formula and the exact accounting disagree, for one scenario."""
    return SeedComparison(
        seed_closed_form(work_h, alpha, max_failures, overhead_h, on_demand_price, discount),
        exact_accounting(
            work_h, alpha, max_failures, overhead_h, on_demand_price, discount, lost_per_failure_h, restarts_on_spot=0
        ),
        exact_accounting(work_h, alpha, max_failures, overhead_h, on_demand_price, discount, lost_per_failure_h),
    )


# ---------------------------------------------------------------------------------------
# Checkpoint intervals. Units are whatever the caller uses, as long as both agree.


def young_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Young (1974): tau = sqrt(2 * delta * M), first-order optimum of work between checkpoints."""
    _check("checkpoint_cost", checkpoint_cost)
    _check("mtbf", mtbf, strict=True)
    return math.sqrt(2.0 * checkpoint_cost * mtbf)


def daly_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Daly (2006) higher-order optimum; equals M when delta >= 2M (checkpointing cannot pay)."""
    _check("checkpoint_cost", checkpoint_cost)
    _check("mtbf", mtbf, strict=True)
    if math.isinf(mtbf):
        return math.inf
    if checkpoint_cost >= 2.0 * mtbf:
        return mtbf
    x = checkpoint_cost / (2.0 * mtbf)
    return math.sqrt(2.0 * checkpoint_cost * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - checkpoint_cost


def gang_mtbf_h(interruptions_per_node_hour: float, num_workers: int) -> float:
    """Mean time between interruptions of a gang: any one node lost stops all N."""
    _check("interruptions_per_node_hour", interruptions_per_node_hour)
    if num_workers <= 0:
        raise ValueError(f"num_workers must be > 0, got {num_workers}")
    rate = interruptions_per_node_hour * num_workers
    return math.inf if rate == 0 else 1.0 / rate
