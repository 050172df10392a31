"""The just-in-time checkpoint helper without Ray, and the policy's view of informational events.

Ranks are threads whose Ray collectives are real barriers (``threading.Barrier`` with a
timeout): a rank that asks Ray a different number of times than another deadlocks the
barrier and fails the test, exactly as it would hang a real worker group.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from spotfallback.config import Ladder, Tier
from spotfallback.errors import JitHoldExpiredError
from spotfallback.events import (
    CheckpointCommitted,
    Continue,
    JitCheckpoint,
    Preempted,
    PreemptionNotice,
    RunStarted,
    WorkersAcquired,
    event_from_json,
)
from spotfallback.notices.jit import PreemptionWatch, missed_jit_checkpoints
from spotfallback.notices.runlog import RunLog
from spotfallback.policy import FallbackPolicy
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run
from tests.support.ranks import FakeSession, Group, Info, as_ranks


def run_ranks(world: int, steps: int, step_s: list[float], notice_at_call: int | None, every_s: float = 1.0):
    """Each rank calls check() once per step with its own clock; returns per-rank notices (call, info)."""
    group = Group(world)
    seen: dict[int, tuple[int, Any] | None] = {}

    def rank_main(rank: int) -> None:
        now = [0.0]
        session = FakeSession(group, rank)
        watch = PreemptionWatch(every_s=every_s, session=session, clock=lambda: now[0])
        session.watch = watch
        seen[rank] = None
        for call in range(1, steps + 1):
            if rank == 0 and notice_at_call is not None and call == notice_at_call:
                group.notice = Info(deadline_ms=int((time.time() + 30) * 1000))
            now[0] += step_s[rank]
            info = watch.check()
            if info is not None and seen[rank] is None:
                seen[rank] = (call, info)

    as_ranks(world, rank_main)
    return group, seen


def test_ranks_with_different_clocks_ask_at_the_same_calls_and_about_every_s():
    # Rank 0 sees 0.1 s steps, rank 1 a clock that says 0.35 s: rank 0's pace decides for both.
    group, seen = run_ranks(world=2, steps=200, step_s=[0.1, 0.35], notice_at_call=None)
    by_rank = {r: [c for rr, c in group.asks if rr == r] for r in (0, 1)}
    assert by_rank[0] == by_rank[1]
    asks = by_rank[0]
    assert asks[:2] == [1, 2]
    gaps = {b - a for a, b in zip(asks[2:], asks[3:], strict=False)}
    assert gaps == {10}  # every_s=1.0 at 0.1 s per step: one ask per 10 calls, not per call
    assert seen == {0: None, 1: None}


def test_notice_reaches_every_rank_at_the_same_call():
    group, seen = run_ranks(world=3, steps=120, step_s=[0.05, 0.05, 0.2], notice_at_call=47)
    calls = {seen[r][0] for r in range(3)}
    assert len(calls) == 1
    (call,) = calls
    assert 47 <= call <= 47 + 20  # the next ask after the notice (every_s / step_s = 20 calls)
    assert all(seen[r][1] is seen[0][1] for r in range(3))


def test_every_steps_is_fixed_and_never_broadcasts():
    group = Group(1)
    session = FakeSession(group, 0)
    calls: list[str] = []
    session.broadcast = lambda v: calls.append("broadcast") or v  # type: ignore[method-assign]
    watch = PreemptionWatch(every_steps=4, session=session)
    session.watch = watch
    for _ in range(17):
        watch.check()
    assert [c for _, c in group.asks] == [1, 5, 9, 13, 17] and calls == []
    with pytest.raises(ValueError):
        PreemptionWatch(every_steps=0, session=session)


# ----------------------------------------------------------------------------- ledger


@pytest.fixture()
def run_log(tmp_path):
    location = resolve_run(str(tmp_path), "jit-run")
    ledger = Ledger(location, writer="drv")
    ledger.ensure_dirs()
    ledger.write_meta(Ladder(tiers=(Tier.spot(2, max_preemptions=0), Tier.on_demand(2))))
    return RunLog(location, writer="test")


def _append(run_log: RunLog, event: Any, tier: int) -> None:
    run_log.ledger.append(event, tier, None)


def test_save_and_hold_reports_records_and_never_returns(run_log):
    group = Group(1)
    session = FakeSession(group, 0, run_log)
    watch = PreemptionWatch(every_steps=1, max_hold_s=0.3, session=session, move=False)
    session.watch = watch
    group.notice = Info(deadline_ms=int((time.time() + 0.2) * 1000))
    assert watch.check() is group.notice
    reported: list[int] = []
    t0 = time.monotonic()
    with pytest.raises(JitHoldExpiredError):
        watch.save_and_hold(lambda: reported.append(1), step=12)
    assert reported == [1]
    assert 0.4 < time.monotonic() - t0 < 3  # held until deadline + max_hold_s, then raised
    deadline = time.time() + 5
    while time.time() < deadline and len(run_log.read()) < 2:
        time.sleep(0.02)
    records = run_log.read()
    assert [(r.event.outcome, r.event.step) for r in records] == [("started", 12), ("reported", 12)]
    assert records[0].event.attempt == records[1].event.attempt
    assert records[1].info["nodes"] == ["node-a"] and records[1].info["write_s"] >= 0


def test_save_and_hold_needs_a_notice():
    watch = PreemptionWatch(every_steps=1, session=FakeSession(Group(1), 0))
    for leave in (watch.save_and_hold, watch.save_and_move):
        with pytest.raises(RuntimeError, match="need the notice"):
            leave(lambda: None)


def test_next_attempt_records_a_missed_jit_checkpoint_once(run_log):
    _append(run_log, RunStarted(1.0), 0)
    _append(run_log, WorkersAcquired(2.0, 2), 0)
    _append(run_log, CheckpointCommitted(3.0, "ckpt_10", 10), 0)
    _append(run_log, JitCheckpoint(4.0, "started", 12, 8.0, "att1"), 0)
    _append(run_log, Preempted(9.0), 0)
    _append(run_log, WorkersAcquired(12.0, 2), 1)  # the policy moved the run to on-demand
    for _ in range(2):  # a second attempt does not record it again
        PreemptionWatch(session=FakeSession(Group(1), 0, run_log))
    missed = [r for r in run_log.read() if r.event.kind == "jit_checkpoint" and r.event.outcome == "missed"]
    assert len(missed) == 1
    assert (missed[0].event.step, missed[0].event.attempt, missed[0].tier) == (12, "att1", 1)
    assert "resumed from the checkpoint of step 10" in missed[0].event.detail
    assert missed[0].info["resumed_from_step"] == 10


def test_committed_or_unfinished_jit_checkpoints_are_not_missed(run_log):
    _append(run_log, WorkersAcquired(2.0, 2), 0)
    _append(run_log, JitCheckpoint(4.0, "started", 12, 8.0, "ok"), 0)
    _append(run_log, CheckpointCommitted(5.0, "ckpt_12", 12), 0)
    _append(run_log, Preempted(9.0), 0)
    _append(run_log, WorkersAcquired(10.0, 2), 1)
    _append(run_log, JitCheckpoint(11.0, "started", 20, 15.0, "live"), 1)  # its attempt is still on
    assert missed_jit_checkpoints(run_log.read()) == []


def test_a_rank_other_than_zero_never_touches_the_ledger(run_log):
    class Refuse(FakeSession):
        def run_log(self) -> RunLog | None:
            raise AssertionError("only rank 0 records")

    PreemptionWatch(session=Refuse(Group(1), 1))


def test_plain_ray_train_run_without_ledger_is_not_recorded(tmp_path):
    assert not RunLog(resolve_run(str(tmp_path), "plain")).is_spotfallback_run()


# ----------------------------------------------------------------------------- policy


def test_informational_events_continue_and_change_no_state():
    policy = FallbackPolicy([Tier.spot(2, max_preemptions=0), Tier.on_demand(2)])
    infos = [
        PreemptionNotice(5.0, node_id="n1", deadline_s=35.0, source="gcp", action="preempt", drained=True),
        JitCheckpoint(6.0, outcome="started", step=7, deadline_s=35.0, attempt="a"),
        JitCheckpoint(7.0, outcome="missed", step=7, attempt="a"),
    ]
    for state in (
        policy.replay([RunStarted(0), WorkersAcquired(1)]),
        policy.replay([RunStarted(0), WorkersAcquired(1), Preempted(2)]),  # on tier 1, waiting
        policy.replay([RunStarted(0), WorkersAcquired(1), Preempted(2), Preempted(3)]),  # gave up
    ):
        for event in infos:
            step = policy.decide(state, event)
            assert step.decision == Continue() and step.state == state
        assert event_from_json(infos[0].to_json()) == infos[0]
    base = [RunStarted(0), WorkersAcquired(1), Preempted(2)]
    assert policy.replay(base + infos) == policy.replay(base)
