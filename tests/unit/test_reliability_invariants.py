"""The ledger invariants the fault suite asserts must themselves catch what they claim to."""

from __future__ import annotations

import json

from spotfallback.events import (
    CheckpointCommitted,
    Finished,
    LedgerRecord,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from tests.support.reliability import REPO, Outcome, final_result, ledger_problems, publish, render

RETRY = {"action": "retry", "tier": 0}


def rec(event, writer="ctl1", decision=None, info=None) -> LedgerRecord:
    return LedgerRecord(id=f"{writer}-{event.t}", writer=writer, tier=0, event=event, decision=decision, info=info or {})


def good() -> list[LedgerRecord]:
    return [
        rec(RunStarted(1), "drv1"),
        rec(WorkersAcquired(2)),
        rec(CheckpointCommitted(3, path="/r/checkpoint_a", step=5)),
        rec(Preempted(4), decision=RETRY),
        rec(WorkersAcquired(5)),
        # The driver was killed; its successor records a commit Ray had made, then starts.
        rec(CheckpointCommitted(6, path="/r/checkpoint_b", step=10), "drv2", info={"recorded_by": "driver"}),
        rec(RunStarted(7), "drv2"),
        rec(WorkersAcquired(8), "ctl2"),
        rec(Finished(9), "drv2"),
    ]


def test_a_run_that_could_have_happened_passes():
    assert ledger_problems(good()) == []


def test_a_lost_failure_event_is_caught():
    records = good()
    del records[3]  # the preemption between two workers_acquired
    assert any("acquired again" in p for p in ledger_problems(records))


def test_a_dead_controllers_late_event_is_caught():
    records = good()
    records.insert(7, rec(CheckpointCommitted(7.5, path="/r/checkpoint_c"), "ctl1"))
    assert any("session that had already ended" in p for p in ledger_problems(records))


def test_a_double_or_early_finish_is_caught():
    records = good()
    records.insert(5, rec(Finished(5.5), "drv1"))
    problems = ledger_problems(records)
    assert any("records follow the finish" in p for p in problems) and any("2 times" in p for p in problems)


# -- the table in docs/reliability.md ------------------------------------------------------------


def _row(kind: str, test: str, **kw) -> Outcome:
    return Outcome(kind, injected=1, runs_completed=1, runs=1, steps_redone=0, events_lost=0, checkpoints_lost=0,
                   test=test, **kw)


STORAGE_TEST = "tests/e2e/test_reliability_storage.py::test_s3_outage_in_the_middle_of_a_checkpoint_upload_only_pauses_the_run"
KILL_TEST = "tests/e2e/test_reliability_drivers.py::test_sigkill_the_driver_at_ten_random_moments_of_one_run"


def test_a_session_updates_its_rows_keeps_the_others_and_drops_rows_of_tests_that_are_gone(tmp_path):
    publish([_row("outage", STORAGE_TEST, notes="first"), _row("kills", KILL_TEST), _row("old", "tests/test_x.py::gone")],
            command="python -m pytest all", docs_dir=tmp_path)
    # The same test, its fault renamed: its row is replaced, not doubled.
    doc = publish([_row("S3 outage", STORAGE_TEST, notes="second")], command="python -m pytest -k outage", docs_dir=tmp_path)
    rows = {r["kind"]: r for r in json.loads((tmp_path / "reliability.json").read_text())["rows"]}
    assert set(rows) == {"S3 outage", "kills"}  # "old" names a test that does not exist
    rows["outage"] = rows.pop("S3 outage")
    assert rows["outage"]["notes"] == "second" and rows["outage"]["command"] == "python -m pytest -k outage"
    assert rows["kills"]["command"] == "python -m pytest all"
    text = doc.read_text()
    assert "| S3 outage | 1 | 1/1 |" in text and "`python -m pytest -k outage` on " in text and "`python -m pytest all` on " in text
    assert render(list(rows.values())) != "" and text.endswith("\n")


def test_a_test_that_fails_now_marks_its_kept_row(tmp_path):
    publish([_row("kills", KILL_TEST)], command="c1", docs_dir=tmp_path)
    doc = publish([], command="c2", failed_tests={KILL_TEST}, docs_dir=tmp_path)
    assert "**test failed at" in doc.read_text() and "**Failing now:** kills" in doc.read_text()
    publish([_row("kills", KILL_TEST)], command="c3", docs_dir=tmp_path)  # passes again: the mark goes
    assert "Failing now" not in (tmp_path / "reliability.md").read_text()


def test_the_committed_table_is_the_rendering_of_its_rows():
    """docs/reliability.md is never edited by hand: it is what the rows in reliability.json render to."""
    store = REPO / "docs" / "reliability.json"
    assert (REPO / "docs" / "reliability.md").read_text() == render(json.loads(store.read_text())["rows"])


def test_the_driver_prints_its_result_before_ray_logs_more():
    log = '{"status": "finished", "metrics": {"step": 3}}\n\x1b[33m(raylet)\x1b[0m WARNING: 8 PYTHON worker processes\n'
    assert final_result(log)["metrics"]["step"] == 3
