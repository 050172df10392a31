"""The ledger invariants the fault suite asserts must themselves catch what they claim to."""

from __future__ import annotations

from reliability import ledger_problems
from spotfallback.events import (
    CheckpointCommitted,
    Finished,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.ledger import LedgerRecord

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
