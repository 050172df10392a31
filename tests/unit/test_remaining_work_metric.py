"""The ``remaining_work_s`` a training function reports: what the policy may weigh and what it ignores."""

from __future__ import annotations

import pytest

from spotfallback.runtime.hooks import remaining_work


@pytest.mark.parametrize(("value", "expected"), [
    (3600, 3600.0),
    (0.5, 0.5),
    (0, 0.0),
    (-1, None),
    (True, None),
    ("3600", None),
    (float("nan"), None),
    (float("inf"), None),
    pytest.param(10**400, None, id="int past the float range"),  # JSON reads 10**400 as one
    (None, None),
])
def test_only_a_finite_number_at_least_zero_counts_as_reported(value, expected):
    assert remaining_work({"remaining_work_s": value}) == expected


def test_a_report_without_it_is_none():
    assert remaining_work({"loss": 0.1}) is None
