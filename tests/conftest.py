"""Session hook: ``make reliability`` writes docs/reliability.md from what the fault tests recorded.

Each fault test calls ``reliability.record(...)``. Only a session started with
``SPOTFALLBACK_PUBLISH_RELIABILITY=1`` (the ``make reliability`` target) merges the rows into
``docs/reliability.json`` and re-renders the table (``reliability.publish``); an ordinary test
run never rewrites a tracked file.
"""

from __future__ import annotations

import os
import sys

_failed: set[str] = set()
_published: list[str] = []


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
