"""The seed's closed form, its corrected table, the exact accounting and Young/Daly."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotfallback.sim.costmodel import (
    break_even_ratio,
    compare_seed_with_exact,
    daly_interval,
    exact_accounting,
    gang_mtbf_h,
    max_overhead_break_even_h,
    runtime_flexibility_table,
    seed_closed_form,
    young_interval,
)


def test_seed_worked_example_reproduces_exactly():
    est = seed_closed_form(work_h=5, alpha=0.6, max_failures=5, overhead_h=0.2)
    assert est.t_total_h == pytest.approx(6.0)
    assert est.cost_new == pytest.approx(2.76)
    assert est.cost_old == pytest.approx(5.0)
    assert est.savings == pytest.approx(0.448)
    assert est.saves


def test_seed_example_scales_with_on_demand_price():
    assert seed_closed_form(5, 0.6, 5, 0.2, on_demand_price=3.06).cost_new == pytest.approx(2.76 * 3.06)


@pytest.mark.parametrize(
    ("alpha", "percent", "ratio"),
    [(0.3, 36.99, 1.370), (0.4, 56.25, 1.5625), (0.5, 81.82, 1.818), (0.6, 117.39, 2.174)],
)
def test_runtime_flexibility_rows(alpha, percent, ratio):
    row = next(r for r in runtime_flexibility_table() if r.alpha == alpha)
    assert round(row.percent_longer, 2) == percent
    assert row.ratio == pytest.approx(ratio, abs=5e-4)
    assert row.percent_longer == pytest.approx((row.ratio - 1) * 100)


def test_seed_table_last_row_is_the_ratio_not_the_percentage():
    rows = {r.alpha: r for r in runtime_flexibility_table()}
    assert [rows[a].seed_is_right for a in (0.3, 0.4, 0.5)] == [True, True, True]
    last = rows[0.6]
    assert last.seed_claim_percent == 217
    assert last.seed_is_right is False
    assert round(last.ratio * 100) == 217  # what the seed printed is 100 x the ratio


def test_discount_is_a_parameter():
    assert break_even_ratio(0.5, discount=0.7) == pytest.approx(1 / (1 - 0.35))
    assert seed_closed_form(5, 0.6, 5, 0.2, discount=0.7).cost_new == pytest.approx(6 * (1 - 0.42))
    assert runtime_flexibility_table(discount=0.7)[0].seed_claim_percent is None
    assert break_even_ratio(1.0, discount=1.0) == math.inf


@given(
    work=st.floats(0.5, 500),
    alpha=st.floats(0, 1),
    m=st.integers(0, 50),
    dt=st.floats(0, 5),
    d=st.floats(0.05, 0.95),
)
def test_break_even_condition_matches_savings_sign(work, alpha, m, dt, d):
    est = seed_closed_form(work, alpha, m, dt, discount=d)
    ratio = est.t_total_h / work
    if not math.isclose(ratio, est.break_even_ratio, rel_tol=1e-9):
        assert est.saves == (ratio < est.break_even_ratio)
    assert max_overhead_break_even_h(work, alpha, d) == pytest.approx(work * (est.break_even_ratio - 1))


def test_exact_accounting_of_the_worked_example_and_where_it_disagrees():
    cmp = compare_seed_with_exact(5, 0.6, 5, 0.2)
    assert cmp.seed_formula.cost_new == pytest.approx(2.76)
    # The seed's own decomposition T_S = 3 h spot, T_O = 2 h + 5 x 0.2 h on-demand.
    assert cmp.seed_decomposition.cost == pytest.approx(3.0 * 0.1 + 3.0)
    # Overhead where it happened: 4 restarts on spot, the fallback restart on on-demand.
    assert cmp.exact.spot_hours == pytest.approx(3.8)
    assert cmp.exact.on_demand_hours == pytest.approx(2.2)
    assert cmp.exact.cost == pytest.approx(2.58)
    assert cmp.exact.savings == pytest.approx(0.484)
    assert cmp.formula_error == pytest.approx(2.76 / 2.58 - 1)
    # The seed's formula is exact when alpha is the spot share of billed time.
    alpha_time = cmp.exact.spot_share_of_time
    assert seed_closed_form(5, alpha_time, 5, 0.2).cost_new == pytest.approx(cmp.exact.cost)


@given(
    work=st.floats(0.5, 200),
    alpha=st.floats(0, 1),
    m=st.integers(0, 30),
    dt=st.floats(0, 3),
    lost=st.floats(0, 2),
    d=st.floats(0, 1),
)
def test_seed_formula_is_exact_with_alpha_as_share_of_billed_time(work, alpha, m, dt, lost, d):
    ex = exact_accounting(work, alpha, m, dt, discount=d, lost_per_failure_h=lost)
    assert ex.wall_h == pytest.approx(work + m * (dt + lost))
    via_seed = seed_closed_form(ex.wall_h, ex.spot_share_of_time, 0, 0.0, discount=d)
    assert via_seed.cost_new == pytest.approx(ex.cost, rel=1e-9, abs=1e-9)


def test_exact_accounting_rejects_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        exact_accounting(5, 1.5, 1, 0.1)
    with pytest.raises(ValueError, match="restarts_on_spot"):
        exact_accounting(5, 0.5, 1, 0.1, restarts_on_spot=2)
    with pytest.raises(ValueError, match="work_h"):
        seed_closed_form(0, 0.5, 1, 0.1)


@pytest.mark.parametrize(("mtbf_min", "expected_min"), [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_matches_published_examples(mtbf_min, expected_min):
    assert daly_interval(5, mtbf_min) == pytest.approx(expected_min, rel=0.01)


def test_young_and_daly_limits():
    assert young_interval(5, 24 * 60) == pytest.approx(120)
    assert young_interval(5, 15) == pytest.approx(math.sqrt(150))
    assert daly_interval(30, 10) == 10  # delta >= 2M: checkpointing cannot pay
    assert daly_interval(5, math.inf) == math.inf
    assert gang_mtbf_h(0.01, 8) == pytest.approx(12.5)
    assert gang_mtbf_h(0.0, 8) == math.inf
    with pytest.raises(ValueError):
        young_interval(5, 0)


def _exact_optimum(delta: float, mtbf: float) -> float:
    """Best tau for exponential failures, restart free: minimise M (e^((tau+delta)/M) - 1) / tau.

    The expected wall time per unit of work of a checkpointed job (Daly 2006, eq. 13, R = 0),
    minimised on a fine grid: the yardstick both formulas approximate.
    """
    import numpy as np

    taus = np.linspace(mtbf * 1e-3, 3 * mtbf, 200_001)
    return float(taus[np.argmin(mtbf * (np.exp((taus + delta) / mtbf) - 1) / taus)])


@pytest.mark.parametrize(("delta", "mtbf", "young_off"), [(5, 24 * 60, 0.029), (5, 6 * 60, 0.058), (5, 15, 0.34)])
def test_young_and_daly_against_the_exact_optimum(delta, mtbf, young_off):
    # Young's tau minimises the first-order waste delta/tau + tau/(2M) exactly ...
    import numpy as np

    young = young_interval(delta, mtbf)
    taus = np.linspace(young * 0.5, young * 1.5, 20_001)
    assert taus[np.argmin(delta / taus + taus / (2 * mtbf))] == pytest.approx(young, rel=1e-4)
    # ... and so overshoots the true optimum by a share that grows with delta/M (3% at
    # Daly's 24 h example, 34% at 15 min), while Daly's higher-order formula stays within 0.3%.
    opt = _exact_optimum(delta, mtbf)
    assert young / opt - 1 == pytest.approx(young_off, abs=0.005)
    assert daly_interval(delta, mtbf) == pytest.approx(opt, rel=0.003)
