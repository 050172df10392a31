"""Leaving a draining node at once: the next gang, the replacement request, move or hold (no Ray)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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
from spotfallback.notices.move import Move, NextGang, Placement, committed_since, next_gang
from spotfallback.notices.runlog import RunLog
from spotfallback.store.ledger import Ledger
from spotfallback.store.ledger_snapshot import KEEP_CHECKPOINTS
from spotfallback.store.location import resolve_run
from tests.support.ledgers import counting_reads
from tests.support.ranks import FakeSession, Group, Info

LADDER = Ladder(tiers=(Tier.spot(4, max_preemptions=1), Tier.on_demand(2)))


def _records(*events: Any) -> list[LedgerRecord]:
    return [LedgerRecord(id=f"{i:04d}", writer="test", tier=0, event=e) for i, e in enumerate(events)]


def test_the_next_gang_on_the_same_tier_asks_for_nothing_ray_trains_own_request_covers():
    records = _records(RunStarted(1.0), WorkersAcquired(2.0, 4))
    assert next_gang(LADDER, records, 10.0) == NextGang(tier=0, num_workers=4, new_workers=0)


def test_the_next_gang_is_the_whole_next_tier_once_the_budget_is_spent():
    records = _records(RunStarted(1.0), WorkersAcquired(2.0, 4), Preempted(5.0), WorkersAcquired(6.0, 4))
    assert next_gang(LADDER, records, 10.0) == NextGang(tier=1, num_workers=2, new_workers=2)


def test_there_is_no_next_gang_when_the_preemption_ends_the_run():
    last = Ladder(tiers=(Tier.spot(2, max_preemptions=0),))
    assert next_gang(last, _records(RunStarted(1.0), WorkersAcquired(2.0, 2)), 10.0) is None


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
        self.requests: list[tuple[str, int, float, str]] = []

    def placement(self) -> Placement:
        return Placement(capacity=lambda tier: self.free, request=self.request)

    def request(self, tier: Tier, workers: int, expire_s: float, requester: str) -> bool:
        self.requests.append((tier.name, workers, expire_s, requester))
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


def test_the_gang_leaves_once_committed_and_asks_for_nothing_on_its_own_tier(run_log):
    cluster = FakeCluster(capacity=4)
    watch = _noticed_watch(run_log, cluster, deadline_s=20.0)
    assert cluster.requests == []  # Ray Train's request for the tier's gang asks for the rank once its node drains
    t0 = time.monotonic()
    with pytest.raises(GangMovedError, match="step 12 is committed"):
        watch.save_and_move(lambda: _commit(run_log, 12), step=12)
    assert time.monotonic() - t0 < 2.0  # long before the 20 s deadline
    assert _outcomes(run_log, 3) == ["started", "reported", "moved"]


def test_the_next_tiers_gang_is_asked_for_at_the_notice_under_the_runs_own_requester_id(run_log):
    run_log.ledger.append(Preempted(time.time() - 8), 0, None)  # the spot tier's one preemption is spent
    run_log.ledger.append(WorkersAcquired(time.time() - 7, 4), 0, None)
    cluster = FakeCluster(capacity=0)
    _noticed_watch(run_log, cluster, deadline_s=20.0)
    [(tier, workers, expire_s, requester)] = cluster.requests  # before any write
    assert (tier, workers, requester) == ("on-demand", 2, "spotfallback-replacement-move-run")
    assert expire_s > 20.0  # it outlives the notice: provisioning may be slower


def test_the_gang_holds_until_a_checkpoint_is_committed(run_log):
    cluster = FakeCluster(capacity=4)
    watch = _noticed_watch(run_log, cluster, deadline_s=0.5)
    with pytest.raises(JitHoldExpiredError):
        watch.save_and_move(lambda: None, step=12)  # reported, never committed
    assert "moved" not in _outcomes(run_log, 2)


def test_the_gang_holds_while_nothing_can_be_placed_and_moves_when_capacity_arrives(run_log):
    cluster = FakeCluster(capacity=3)  # one node of four is draining: the gang does not fit
    watch = _noticed_watch(run_log, cluster, deadline_s=10.0)
    t0 = time.monotonic()
    threading.Timer(0.4, lambda: setattr(cluster, "free", 4)).start()  # the replacement node joins
    with pytest.raises(GangMovedError):
        watch.save_and_move(lambda: _commit(run_log, 7), step=7)
    assert 0.35 < time.monotonic() - t0 < 3.0


def test_without_room_before_the_deadline_the_gang_holds_as_before(run_log):
    cluster = FakeCluster(capacity=0)
    t0 = time.monotonic()  # before the notice: its deadline counts from there, however slow the set-up
    watch = _noticed_watch(run_log, cluster, deadline_s=0.4)
    with pytest.raises(JitHoldExpiredError):
        watch.save_and_move(lambda: _commit(run_log, 7), step=7)
    assert time.monotonic() - t0 > 0.55  # the deadline (0.4 s), then max_hold_s (0.2 s)


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


def _twin_logs(tmp_path, events: list[Any]) -> dict[str, RunLog]:
    """The same run written twice: compacted in chunks of 4 as it goes (so with a stored snapshot), and never."""
    logs = {}
    for name, every in (("compacted", 4), ("whole", 0)):
        location = resolve_run(str(tmp_path), name)
        ledger = Ledger(location, writer="ctl", compact_every=every)
        ledger.ensure_dirs()
        ledger.write_meta(LADDER)
        for event in events:
            ledger.append(event, 0, None)
        logs[name] = RunLog(location, writer="test")
    return logs


def _commits(t0: float, first_step: int, n: int, every_s: float) -> list[Any]:
    return [CheckpointCommitted(t0 + every_s * k, f"ckpt_{first_step + k}", first_step + k) for k in range(n)]


T = time.time() - 3600.0
RUNS: dict[str, Callable[[], list[Any]]] = {
    "budget left": lambda: [RunStarted(T), WorkersAcquired(T + 1, 4), *_commits(T + 60, 1, 21, 60.0)],
    "budget spent": lambda: [RunStarted(T), WorkersAcquired(T + 1, 4), *_commits(T + 60, 1, 9, 60.0), Preempted(T + 700),
                             WorkersAcquired(T + 760, 4), *_commits(T + 800, 9, 11, 60.0)],
    # More recent commits than a snapshot keeps: only the whole ledger tells about the older ones.
    "a burst of commits": lambda: [RunStarted(T), WorkersAcquired(T + 1, 4),
                                   *_commits(T + 60, 1, KEEP_CHECKPOINTS + 30, 0.25)],
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_move_on_a_compacted_ledger_answers_as_on_the_whole_ledger(tmp_path, run):
    events = RUNS[run]()
    logs = _twin_logs(tmp_path, events)
    compacted = logs["compacted"].ledger.read_view(LADDER)
    assert compacted.snapshot is not None and len(compacted.tail) < 4
    cluster = FakeCluster(capacity=4)
    moves = {name: Move.at_notice(log, Info(deadline_ms=None), None, cluster.placement()) for name, log in logs.items()}
    assert moves["compacted"] is not None and moves["whole"] is not None
    assert moves["compacted"].gang == moves["whole"].gang
    asked = [(tier, workers) for tier, workers, _, _ in cluster.requests]
    assert asked[: len(asked) // 2] == asked[len(asked) // 2 :]
    commits = [e for e in events if isinstance(e, CheckpointCommitted)]
    n = len(commits)
    picked = [commits[max(0, i)] for i in sorted({0, n // 2, n - KEEP_CHECKPOINTS - 3, n - KEEP_CHECKPOINTS, n - 2, n - 1})]
    times = sorted({e.t + d for e in picked for d in (-30.5, -29.5, -0.1, 0.0, 0.1)})
    steps = [None, *(e.step for e in picked), 10_000]
    answers = {name: [move.ready(since, step) for since in times for step in steps] for name, move in moves.items()}
    assert answers["compacted"] == answers["whole"]
    assert any(answers["whole"]) and not all(answers["whole"])


def test_a_move_on_a_long_run_reads_the_snapshot_and_the_new_events_only(tmp_path, monkeypatch):
    location = resolve_run(str(tmp_path), "long")
    ledger = Ledger(location, writer="ctl", compact_every=50)
    ledger.ensure_dirs()
    ledger.write_meta(LADDER)
    for event in [RunStarted(T), WorkersAcquired(T + 1, 4), *_commits(T + 60, 1, 1_000 + 7, 1.0)]:
        ledger.append(event, 0, None)
    read = counting_reads(monkeypatch)
    move = Move.at_notice(RunLog(location), Info(deadline_ms=None), None, FakeCluster(capacity=4).placement())
    assert move is not None
    assert sorted(read) == sorted([ledger.snapshot_path, *ledger._list(strict=True)[0]])  # no segment
    read.clear()
    assert not move.ready(time.time(), 2_000)
    assert read == [ledger.snapshot_path]  # the loose events it has seen are not fetched again
    read.clear()
    ledger.append(CheckpointCommitted(time.time(), "ckpt_2000", 2_000), 0, None)
    assert move.ready(time.time() - 1.0, 2_000)
    assert len(read) == 2  # the snapshot and the new commit


def test_the_new_gang_withdraws_only_its_own_runs_replacement_request():
    from spotfallback.notices.placement import withdraw_replacement

    class Client:  # Ray Train's coordinator client: one per requester id
        cancelled: list[str] = []

        def __init__(self, requester_id: str) -> None:
            self._requester_id = requester_id

        def cancel_resource_request(self) -> None:
            Client.cancelled.append(self._requester_id)

    withdraw_replacement(None, "move-run")  # before the controller has a client: nothing to withdraw
    withdraw_replacement(Client("train-move-run"), "move-run")
    assert Client.cancelled == ["spotfallback-replacement-move-run"]
