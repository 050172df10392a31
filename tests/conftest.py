"""Session hook: the reliability suite writes docs/reliability.md from what its tests recorded.

Each fault test calls ``reliability.record(...)``; at the end of the session the rows are
merged into ``docs/reliability.json`` and the table re-rendered (``reliability.publish``).
Sessions that ran no reliability test leave the page alone.
"""

from __future__ import annotations

import sys

_failed: set[str] = set()
_published: list[str] = []


def pytest_runtest_logreport(report):
    if report.failed and "test_reliability_" in report.nodeid:
        _failed.add(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    reliability = sys.modules.get("reliability")
    if reliability is None or not (reliability.RECORDED or _failed):
        return
    command = " ".join(["python -m pytest", *session.config.invocation_params.args])
    doc = reliability.publish(reliability.RECORDED, command=command, failed_tests=_failed)
    if doc is not None:
        _published.append(f"{doc} rewritten: {len(reliability.RECORDED)} row(s) from this session")
    reliability.RECORDED.clear()


def pytest_terminal_summary(terminalreporter):
    for line in _published:
        terminalreporter.write_line(line)
