"""Training through a preemption notice: the just-in-time save as late as is safe (no Ray).

Ranks are threads with real barriers (``tests.unit.test_jit``), each with its own fake clock
that moves a step's time per call, so the steps at which the gang looks and saves are exact.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from spotfallback.errors import JitHoldExpiredError
from spotfallback.events import JitCheckpoint
from spotfallback.notice_window import (
    SAVE_MARGIN_S,
    commit_margin_s,
    save_due,
    save_lead_s,
    trained_on_s,
)
from spotfallback.notices.jit import PreemptionWatch
from spotfallback.notices.runlog import RunLog
from spotfallback.sim.job import JobSpec
from tests.support.ranks import FakeSession, Group, Info, as_ranks
from tests.unit.test_jit_move import FakeCluster, run_log  # noqa: F401 - the fixture

WALL0 = 1_000_000.0
STEP_S = 0.1


def run_gang(world: int, *, deadline_in_s: float, notice_at_call: int, steps: int = 400,
             on_call: Any = None, session_log: RunLog | None = None, **watch_kw: Any) -> tuple[Group, dict[int, int | None]]:
    """Each rank steps STEP_S a call on its own fake clocks; returns the call at which each rank's save was due."""
    group = Group(world)
    due: dict[int, int | None] = {}

    def rank_main(rank: int) -> None:
        now = [0.0]
        session = FakeSession(group, rank, session_log if rank == 0 else None)
        watch = PreemptionWatch(every_s=1.0, session=session, clock=lambda: now[0], wall=lambda: WALL0 + now[0],
                                **{"save_margin_s": SAVE_MARGIN_S, **watch_kw})
        session.watch = watch
        due[rank] = None
        for call in range(1, steps + 1):
            if rank == 0 and call == notice_at_call:
                group.notice = Info(deadline_ms=int((WALL0 + now[0] + deadline_in_s) * 1000))
            if rank == 0 and on_call is not None:
                on_call(call)
            now[0] += STEP_S
            if watch.check() is not None:
                due[rank] = call
                return

    as_ranks(world, rank_main, timeout_s=30.0)
    return group, due


def _seen_at(group: Group, notice_at_call: int) -> int:
    """The call at which the ranks first asked Ray after the notice was up (every_s = 10 calls)."""
    return min(c for r, c in group.asks if r == 0 and c >= notice_at_call)


def test_with_a_write_estimate_the_gang_trains_through_the_notice_and_every_rank_saves_at_the_same_step():
    # 30 s notice, 2 s write: the lead is 1.5 x 2 + 3 = 6 s, the looks every 1 s (10 calls).
    group, due = run_gang(3, deadline_in_s=30.0, notice_at_call=35, save_s=2.0)
    seen = _seen_at(group, 35)
    assert due[0] == due[1] == due[2]
    trained_s = (due[0] - seen) * STEP_S
    left_s = 30.0 - (due[0] + 1 - 35) * STEP_S  # what was left of the notice when the save began
    assert trained_s > 20.0  # not at the notice, as without an estimate
    assert save_lead_s(2.0) <= left_s <= save_lead_s(2.0) + 1.0 + STEP_S  # at most one look before the lead


def test_without_a_write_estimate_the_save_is_due_at_the_notice():
    group, due = run_gang(2, deadline_in_s=30.0, notice_at_call=35)
    assert due[0] == due[1] == _seen_at(group, 35)


def test_train_on_off_saves_at_the_notice_even_with_an_estimate():
    group, due = run_gang(2, deadline_in_s=30.0, notice_at_call=35, save_s=1.0, train_on=False)
    assert due[0] == due[1] == _seen_at(group, 35)


def test_a_notice_shorter_than_the_lead_is_saved_at_once():
    group, due = run_gang(2, deadline_in_s=5.0, notice_at_call=35, save_s=2.0)  # lead 6 s > 5 s
    assert due[0] == due[1] == _seen_at(group, 35)


def test_the_save_is_due_at_the_first_look_after_the_replacement_is_up(run_log):  # noqa: F811 - the fixture
    cluster = FakeCluster(capacity=3)  # one node of four is draining: the gang does not fit yet
    group, due = run_gang(
        1, deadline_in_s=120.0, notice_at_call=35, save_s=2.0, session_log=run_log, placement=cluster.placement(),
        on_call=lambda call: setattr(cluster, "free", 4) if call == 100 else None,
    )
    assert due[0] is not None and 100 <= due[0] <= 100 + 10  # the next look (every 1 s = 10 calls)
    assert cluster.requests == []  # on its own tier it asks for nothing more (Ray Train's request covers it)


def test_a_long_notice_with_the_replacement_never_up_saves_at_the_lead(run_log):  # noqa: F811 - the fixture
    cluster = FakeCluster(capacity=3)
    group, due = run_gang(1, deadline_in_s=120.0, notice_at_call=35, steps=2000, save_s=2.0, session_log=run_log,
                          placement=cluster.placement())
    left_s = 120.0 - (due[0] + 1 - 35) * STEP_S
    assert save_lead_s(2.0) <= left_s <= save_lead_s(2.0) + 1.0 + STEP_S


def test_the_timed_writes_set_the_estimate_and_a_given_one_is_a_floor():
    watch = PreemptionWatch(every_steps=1, session=FakeSession(Group(1), 0), save_s=0.01)
    assert watch.save_estimate_s == 0.01
    with watch.timing_save():
        time.sleep(0.05)
    with watch.timing_save():
        pass
    assert watch.save_estimate_s is not None and 0.05 <= watch.save_estimate_s < 1.0  # the longest, not the last
    with pytest.raises(ValueError, match="save_s"):
        PreemptionWatch(every_steps=1, session=FakeSession(Group(1), 0), save_s=-1)


def test_the_started_record_says_how_long_the_gang_trained_on(run_log):  # noqa: F811 - the fixture
    now = [0.0]
    session = FakeSession(Group(1), 0, run_log)
    watch = PreemptionWatch(every_s=1.0, session=session, clock=lambda: now[0], wall=lambda: WALL0 + now[0],
                            save_s=1.0, save_margin_s=SAVE_MARGIN_S, max_hold_s=0.05, move=False)
    session.watch = watch
    calls = 0
    while watch.check() is None:
        calls += 1
        if calls == 25:  # the pace is known by then
            session.group.notice = Info(deadline_ms=int((WALL0 + now[0] + 20.0) * 1000))
        now[0] += STEP_S
        assert calls < 1000
    seen = _seen_at(session.group, 25)
    with pytest.raises(JitHoldExpiredError):  # the (fake) deadline is long past in real time
        watch.save_and_hold(lambda: None, step=calls)
    until = time.time() + 5
    started: list[Any] = []
    while time.time() < until and not started:
        started = [r for r in run_log.read() if isinstance(r.event, JitCheckpoint) and r.event.outcome == "started"]
        time.sleep(0.02)
    [rec] = started
    assert "after training on" in rec.event.detail
    trained = watch.calls - seen
    assert trained > 100  # 20 s notice, 1 s write: about 15 s of steps
    assert rec.info["trained_on_calls"] == trained
    assert rec.info["trained_on_s"] == pytest.approx(trained * STEP_S, abs=STEP_S)


# ----------------------------------------------------------------------------- the rule, pure


@pytest.mark.parametrize(("interval", "margin"), [(None, 3.0), ("0.25", 1.25), ("5", 6.0), ("soon", 3.0)])
def test_the_margin_is_one_poll_of_ray_trains_controller_plus_clock_skew(monkeypatch, interval, margin):
    # The controller collects a reported checkpoint at its next poll: a save must leave time for one.
    if interval is None:
        monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", raising=False)
    else:
        monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", interval)
    watch = PreemptionWatch(every_steps=1, session=FakeSession(Group(1), 0))
    assert watch.save_margin_s == pytest.approx(margin)
    assert commit_margin_s() == SAVE_MARGIN_S == 3.0  # the simulator plans with Ray's default


def test_the_lead_is_the_scaled_write_plus_the_margin():
    assert save_lead_s(4.0) == pytest.approx(1.5 * 4.0 + SAVE_MARGIN_S)
    assert save_lead_s(4.0, margin_s=0.0) == pytest.approx(6.0)
    assert trained_on_s(120.0, 4.0) == pytest.approx(120.0 - 9.0)
    assert trained_on_s(8.0, 4.0) == 0.0


@pytest.mark.parametrize(
    ("now", "deadline", "save_s", "next_look_s", "ready", "due"),
    [
        (0.0, None, 2.0, 1.0, False, True),  # no deadline: nothing to plan with
        (0.0, 120.0, None, 1.0, False, True),  # no write estimate
        (0.0, 120.0, 2.0, 1.0, True, True),  # the replacement is up: save and move
        (0.0, 120.0, 2.0, 1.0, False, False),  # train on
        (113.0, 120.0, 2.0, 1.0, False, True),  # the next look would leave less than the 6 s lead
        (112.9, 120.0, 2.0, 1.0, False, False),
    ],
)
def test_when_the_save_is_due(now, deadline, save_s, next_look_s, ready, due):
    assert save_due(now, deadline, save_s, next_look_s=next_look_s, replacement_ready=ready) is due


def test_the_simulator_keeps_the_work_done_until_the_runtime_would_begin_its_save():
    job = JobSpec(work_h=10, checkpoint_cost_h=10 / 3600, notice_s=120)
    assert job.jit_lead_h * 3600 == pytest.approx(save_lead_s(10.0))  # 18 s of the 2 minutes
    assert JobSpec(work_h=10, checkpoint_cost_h=10 / 3600, notice_s=12).jit_lead_h * 3600 == pytest.approx(12.0)
