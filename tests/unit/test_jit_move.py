"""Leaving a draining node at once: the next gang, the replacement request, move or hold (no Ray)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from spotfallback.config import Ladder, Tier
from spotfallback.errors import GangMovedError, JitHoldExpiredError
from spotfallback.events import (
    CheckpointCommitted,
    LedgerRecord,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.notices.jit import PreemptionWatch
from spotfallback.notices.move import NextGang, Placement, committed_since, next_gang
from spotfallback.notices.runlog import RunLog
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run
from tests.unit.test_jit import FakeSession, Group, Info

LADDER = Ladder(tiers=(Tier.spot(4, max_preemptions=1), Tier.on_demand(2)))


def _records(*events: Any) -> list[LedgerRecord]:
    return [LedgerRecord(id=f"{i:04d}", writer="test", tier=0, event=e) for i, e in enumerate(events)]


def test_the_next_gang_replaces_only_the_preempted_ranks_while_the_tier_has_budget():
    records = _records(RunStarted(1.0), WorkersAcquired(2.0, 4))
    assert next_gang(LADDER, records, 10.0, preempted_ranks=1) == NextGang(tier=0, num_workers=4, new_workers=1)


def test_the_next_gang_is_the_whole_next_tier_once_the_budget_is_spent():
    records = _records(RunStarted(1.0), WorkersAcquired(2.0, 4), Preempted(5.0), WorkersAcquired(6.0, 4))
    assert next_gang(LADDER, records, 10.0, preempted_ranks=1) == NextGang(tier=1, num_workers=2, new_workers=2)


def test_there_is_no_next_gang_when_the_preemption_ends_the_run():
    last = Ladder(tiers=(Tier.spot(2, max_preemptions=0),))
    assert next_gang(last, _records(RunStarted(1.0), WorkersAcquired(2.0, 2)), 10.0, preempted_ranks=1) is None


def test_a_commit_counts_only_after_the_checkpoint_began():
    records = _records(CheckpointCommitted(5.0, "ckpt_10", 10), CheckpointCommitted(9.0, "ckpt_12", 12))
    assert committed_since(records, 8.0, 12)
    assert not committed_since(records, 8.0, 13)
    assert not committed_since(records, 9.5, None)
    assert committed_since(records, 8.5, None)


@pytest.fixture()
def run_log(tmp_path) -> RunLog:
    location = resolve_run(str(tmp_path), "move-run")
    ledger = Ledger(location, writer="drv")
    ledger.ensure_dirs()
    ledger.write_meta(LADDER)
    ledger.append(RunStarted(time.time() - 10), 0, None)
    ledger.append(WorkersAcquired(time.time() - 9, 4), 0, None)
    return RunLog(location, writer="test")


class FakeCluster:
    """What a tier could hold, changeable while the watch waits; and the requests it got."""

    def __init__(self, capacity: int) -> None:
        self.free = capacity
        self.requests: list[tuple[str, int, float]] = []

    def placement(self) -> Placement:
        return Placement(capacity=lambda tier: self.free, request=self.request)

    def request(self, tier: Tier, workers: int, expire_s: float) -> bool:
        self.requests.append((tier.name, workers, expire_s))
        return True


def _noticed_watch(run_log: RunLog | None, cluster: FakeCluster, deadline_s: float) -> PreemptionWatch:
    session = FakeSession(Group(1), 0, run_log)
    watch = PreemptionWatch(every_steps=1, max_hold_s=0.2, session=session, placement=cluster.placement(), move_poll_s=0.02)
    session.watch = watch
    session.group.notice = Info(deadline_ms=int((time.time() + deadline_s) * 1000), preempted_ranks=(1,))
    assert watch.check() is not None
    return watch


def _commit(run_log: RunLog, step: int) -> None:
    run_log.ledger.append(CheckpointCommitted(time.time(), f"ckpt_{step}", step), 0, None)


def _outcomes(run_log: RunLog, wait_for: int) -> list[str]:
    until = time.time() + 5
    while time.time() < until:
        outcomes = [r.event.outcome for r in run_log.read() if r.event.kind == "jit_checkpoint"]
        if len(outcomes) >= wait_for:
            return outcomes
        time.sleep(0.02)
    return outcomes


def test_the_replacement_is_asked_for_at_the_notice_and_the_gang_leaves_once_committed(run_log):
    cluster = FakeCluster(capacity=4)
    watch = _noticed_watch(run_log, cluster, deadline_s=20.0)
    assert [(name, n) for name, n, _ in cluster.requests] == [("spot", 1)]  # the preempted rank, before any write
    assert cluster.requests[0][2] > 20.0  # the request outlives the notice: provisioning may be slower
    t0 = time.monotonic()
    with pytest.raises(GangMovedError, match="step 12 is committed"):
        watch.save_and_move(lambda: _commit(run_log, 12), step=12)
    assert time.monotonic() - t0 < 2.0  # long before the 20 s deadline
    assert _outcomes(run_log, 3) == ["started", "reported", "moved"]


def test_the_gang_holds_until_a_checkpoint_is_committed(run_log):
    cluster = FakeCluster(capacity=4)
    watch = _noticed_watch(run_log, cluster, deadline_s=0.5)
    with pytest.raises(JitHoldExpiredError):
        watch.save_and_move(lambda: None, step=12)  # reported, never committed
    assert "moved" not in _outcomes(run_log, 2)


def test_the_gang_holds_while_nothing_can_be_placed_and_moves_when_capacity_arrives(run_log):
    cluster = FakeCluster(capacity=3)  # one node of four is draining: the gang does not fit
    watch = _noticed_watch(run_log, cluster, deadline_s=10.0)
    threading.Timer(0.4, lambda: setattr(cluster, "free", 4)).start()  # the replacement node joins
    t0 = time.monotonic()
    with pytest.raises(GangMovedError):
        watch.save_and_move(lambda: _commit(run_log, 7), step=7)
    assert 0.35 < time.monotonic() - t0 < 3.0


def test_without_room_before_the_deadline_the_gang_holds_as_before(run_log):
    cluster = FakeCluster(capacity=0)
    watch = _noticed_watch(run_log, cluster, deadline_s=0.4)
    t0 = time.monotonic()
    with pytest.raises(JitHoldExpiredError):
        watch.save_and_move(lambda: _commit(run_log, 7), step=7)
    assert time.monotonic() - t0 > 0.5  # the deadline, then max_hold_s


def test_a_plain_ray_train_run_never_moves_and_asks_for_nothing():
    cluster = FakeCluster(capacity=8)
    watch = _noticed_watch(None, cluster, deadline_s=0.3)
    with pytest.raises(JitHoldExpiredError):
        watch.save_and_move(lambda: None, step=3)
    assert cluster.requests == []


def test_other_ranks_hold_while_rank_zero_decides(run_log):
    cluster = FakeCluster(capacity=4)
    session = FakeSession(Group(1), 1, run_log)  # rank 1: no ledger of its own, never raises the move
    watch = PreemptionWatch(every_steps=1, max_hold_s=0.1, session=session, placement=cluster.placement())
    session.watch = watch
    session.group.notice = None
    watch.notice = Info(deadline_ms=int((time.time() + 0.3) * 1000))
    with pytest.raises(JitHoldExpiredError):
        watch.save_and_move(lambda: _commit(run_log, 5), step=5)
    assert cluster.requests == []
