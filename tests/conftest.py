"""Session hooks: the same Hypothesis examples in every run, a time budget, and ``make reliability``'s table.

Hypothesis draws some values from the constants of every project module loaded so far, so
which examples a test sees used to depend on which test files its xdist worker had run
before it: a CI run could meet a slow or failing example no local run had drawn. Every
project module is loaded before the first test and examples are derandomized, so each run
draws the same ones. ``HYPOTHESIS_PROFILE=explore`` draws fresh ones (and keeps failures).

CI stops a run at 90 minutes, and a stopped run says nothing of what went wrong. Past
``SPOTFALLBACK_SUITE_BUDGET_MIN`` minutes each test not yet started fails at once, naming the
budget, so the run ends with its summary of failures; 0 turns it off. The minutes count from
``SPOTFALLBACK_SUITE_STARTED`` (seconds since the epoch), which ``make test`` sets to its own
start, so the set-up before the tests (the venv, ruff and mypy) is inside the budget, and gives
86. A spent budget fails the run either way, so it is as late as leaves CI's last 4 minutes to
the tests in flight (by then unit tests, seconds each) and the summary. Without it the minutes
count from pytest's start, and the default is 65.

The wheel's install (``tests/e2e/test_wheel_install.py``, mostly waits) and the fault suite's
cluster modules start first, then the other cluster modules, then the unit tests. Past
``SPOTFALLBACK_CLUSTER_BUDGET_MIN`` minutes (counted the same way; ``make test`` gives 70,
unset or 0 means no limit) a cluster test outside the fault suite that has not started is
skipped, naming the variable, so that on a slow machine the unit tests still run and the run
ends inside CI's time; ``SPOTFALLBACK_CLUSTER_BUDGET_MIN=0 make test`` runs every one.

Each fault test calls ``reliability.record(...)``. Only a session started with
``SPOTFALLBACK_PUBLISH_RELIABILITY=1`` (the ``make reliability`` target) merges the rows into
``docs/reliability.json`` and re-renders the table (``reliability.publish``); an ordinary test
run never rewrites a tracked file.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import sys
import time

import pytest
from hypothesis import HealthCheck, settings

# No per-example deadline: on a shared 2-core machine beside the cluster tests an example can take
# seconds, and a test here pins behaviour, not speed (the benchmarks time things).
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True, **_UNTIMED)
settings.register_profile("explore", **_UNTIMED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

# Packages whose modules tests import; run-as-script modules (``__main__``) and conftests, which
# pytest loads itself, are left out.
_PROJECT_PACKAGES = ("spotfallback", "tests", "bench", "scripts")
_NOT_IMPORTED = ("__main__", "conftest")

_STARTED_VAR = "SPOTFALLBACK_SUITE_STARTED"
_started = time.time()  # pytest_configure reads SPOTFALLBACK_SUITE_STARTED over it
_BUDGET_VAR = "SPOTFALLBACK_SUITE_BUDGET_MIN"
_budget_min = 65.0  # minutes; pytest_configure reads SPOTFALLBACK_SUITE_BUDGET_MIN over it
_CLUSTER_BUDGET_VAR = "SPOTFALLBACK_CLUSTER_BUDGET_MIN"
_cluster_budget_min = 0.0  # minutes (0: no limit); pytest_configure reads SPOTFALLBACK_CLUSTER_BUDGET_MIN
_CLUSTER_TESTS = "tests/e2e/"
_WHEEL_INSTALL = "tests/e2e/test_wheel_install.py"  # mostly waits: it starts beside the first cluster module
_RUN_FIRST = "tests/e2e/test_reliability_"  # the fault suite, which CI runs whole
_failed: set[str] = set()
_published: list[str] = []


def pytest_configure(config):
    global _budget_min, _cluster_budget_min, _started
    _budget_min = _number(_BUDGET_VAR, _budget_min, "give the suite's budget in minutes (0 turns it off)")
    _cluster_budget_min = _number(_CLUSTER_BUDGET_VAR, _cluster_budget_min,
                                  "give the cluster tests' share of the suite's time in minutes (0 turns it off)")
    _started = _number(_STARTED_VAR, _started,
                       "give the time the suite's command began, in seconds since the epoch (`date +%s`), or leave it unset")
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the xdist controller runs no test
    _load_every_project_module()


def _number(var: str, default: float, fix: str) -> float:
    raw = os.environ.get(var) or str(default)
    try:
        return float(raw)
    except ValueError:
        raise pytest.UsageError(f"{var}={raw!r}: {fix}") from None


def _load_every_project_module() -> None:
    """Import every module of the project, so Hypothesis's pool of constants is whole from the start.

    One that cannot load here (an optional extra missing, a test module that skips itself)
    is left to collection, which reports it as it would have.
    """
    for name in _PROJECT_PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if module.name.rpartition(".")[2] not in _NOT_IMPORTED:
                with contextlib.suppress(Exception, pytest.skip.Exception):
                    importlib.import_module(module.name)


def pytest_collection_modifyitems(session, config, items):
    """The wheel's install, the fault suite's cluster modules, the other cluster modules, the unit tests.

    With ``--no-loadscope-reorder`` xdist hands out whole files in this order, so the cluster
    tests that CI must run start first and the unit tests (seconds each) fill the end.
    """
    items.sort(key=_run_order)


_WHEEL, _FAULT_SUITE, _OTHER_CLUSTER_TESTS, _UNIT_TESTS = 0, 1, 2, 3  # run in this order


def _run_order(item) -> int:
    path = item.nodeid.partition("::")[0]
    if path == _WHEEL_INSTALL:
        return _WHEEL
    return _FAULT_SUITE if path.startswith(_RUN_FIRST) else _OTHER_CLUSTER_TESTS if path.startswith(_CLUSTER_TESTS) else _UNIT_TESTS


def pytest_runtest_setup(item):
    spent_min = (time.time() - _started) / 60
    if _budget_min > 0 and spent_min > _budget_min:
        pytest.fail(f"not run: the suite's {_budget_min:g}-minute budget is spent ({spent_min:.0f} min); a slower "
                    f"test before it says why ({_BUDGET_VAR} sets the budget)", pytrace=False)
    if _run_order(item) == _OTHER_CLUSTER_TESTS and _cluster_budget_min > 0 and spent_min > _cluster_budget_min:
        pytest.skip(f"not run: the cluster tests' {_cluster_budget_min:g} minutes are spent ({spent_min:.0f} min), "
                    f"so that the unit tests still run inside CI's time; {_CLUSTER_BUDGET_VAR}=0 runs every one")


def pytest_runtest_logreport(report):
    if report.failed and "test_reliability_" in report.nodeid:
        _failed.add(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    reliability = sys.modules.get("tests.support.reliability")
    if os.environ.get("SPOTFALLBACK_PUBLISH_RELIABILITY") != "1" or reliability is None or not (reliability.RECORDED or _failed):
        return
    command = " ".join(["python -m pytest", *session.config.invocation_params.args])
    doc = reliability.publish(reliability.RECORDED, command=command, failed_tests=_failed)
    if doc is not None:
        _published.append(f"{doc} rewritten: {len(reliability.RECORDED)} row(s) from this session")
    reliability.RECORDED.clear()


def pytest_terminal_summary(terminalreporter):
    for line in _published:
        terminalreporter.write_line(line)
