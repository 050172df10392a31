"""The ledger's stored snapshot: a snapshot and the events after it read as the whole ledger does, and cost only those."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotfallback.accounting import Carry, fold, summarize
from spotfallback.config import make_ladder
from spotfallback.events import (
    CheckpointCommitted,
    PreemptionNotice,
    RunStarted,
)
from spotfallback.policy import FallbackPolicy
from spotfallback.store import ledger as ledger_module
from spotfallback.store.checkpoints import prepare_resume
from spotfallback.store.ledger import Ledger
from spotfallback.store.ledger_snapshot import SNAPSHOT_DIR, covered_prefix
from spotfallback.store.location import TMP_PREFIX, resolve_run
from spotfallback.view.snapshot import DriverInfo, build_snapshot, charge_until
from tests.support.ledgers import (
    MAKERS,
    T0,
    cli_app,
    counting_reads,
    drawn_records,
    drawn_runs,
    write_drawn_run,
    write_long_run,
)
from tests.support.ledgers import THREE_TIERS as LADDER

steps = drawn_runs(list(MAKERS))


def _same_summary(a, b) -> None:
    assert (a.state, a.tiers, a.status, a.segments, a.started_at, a.ended_at, a.climbs, a.resizes, a.give_up_reason,
            a.checkpoint_count, a.checkpoints[-1:]) == (
        b.state, b.tiers, b.status, b.segments, b.started_at, b.ended_at, b.climbs, b.resizes, b.give_up_reason,
        b.checkpoint_count, b.checkpoints[-1:])
    assert a.spend == b.spend


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.tuples(st.sampled_from(sorted(MAKERS)), st.floats(min_value=0.001, max_value=600.0)),
                      max_size=40),
       split=st.integers(min_value=0, max_value=40), now_after=st.one_of(st.none(), st.floats(0.0, 7200.0)))
def test_summarizing_the_tail_from_a_stored_carry_equals_summarizing_everything(kinds, split, now_after):
    records = drawn_records(kinds)
    split = min(split, len(records))
    now = None if now_after is None or not records else records[-1].t + now_after
    stored = Carry.from_json(json.loads(json.dumps(fold(LADDER, records[:split]).to_json(keep_checkpoints=2))))
    _same_summary(summarize(LADDER, records[split:], now=now, start=stored), summarize(LADDER, records, now=now))
    whole = Carry.from_json(json.loads(json.dumps(fold(LADDER, records[:split]).to_json())))
    assert summarize(LADDER, records[split:], now=now, start=whole).checkpoints == summarize(LADDER, records).checkpoints


def test_a_stored_carry_is_left_as_it_was_by_summarizing_from_it():
    records = drawn_records([("start", 1.0), ("up", 30.0), ("checkpoint", 60.0), ("preempted", 10.0)])
    carry = fold(LADDER, records[:2])
    before = carry.to_json()
    summarize(LADDER, records[2:], now=T0 + 9999, start=carry)
    assert carry.to_json() == before


def _status(ledger: Ledger, now: float, driver: DriverInfo | None, heartbeat_t: float, *, snapshot: bool) -> dict:
    view = ledger.read_view(LADDER) if snapshot else None
    base, records = (view.snapshot, view.tail) if view else (None, ledger.read())
    latest = [*base.recent, *records] if base else records
    summary = summarize(LADDER, records, now=charge_until(latest, driver, now), start=base.carry if base else None)
    heartbeat = {"t": heartbeat_t, "metrics": {"step": 999}}
    snap = build_snapshot(LADDER, records, now=now, driver=driver, heartbeat=heartbeat, config={"total_steps": 100},
                          summary=summary, base=base)
    return {**snap.to_json(), "latest": [r.to_json() for r in latest[-5:]]}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, live=st.booleans(), heartbeat_at=st.floats(0.0, 1.0))
def test_status_from_the_snapshot_and_the_events_after_it_equals_status_from_every_event(steps, live, heartbeat_at):
    with tempfile.TemporaryDirectory() as root:
        ledger, t = write_drawn_run(root, steps)
        view = ledger.read_view(LADDER)
        assert view.events == len(ledger.read())
        now = t + 100.0
        driver = DriverInfo("h", 1, t, now + 30 if live else t + 30)
        heartbeat_t = T0 + heartbeat_at * (now - T0)  # before or after the latest restart
        assert _status(ledger, now, driver, heartbeat_t, snapshot=True) == _status(ledger, now, driver, heartbeat_t,
                                                                                   snapshot=False)
        base = view.snapshot.carry.summary.state if view.snapshot else None
        policy = FallbackPolicy(LADDER)
        assert policy.replay((r.event for r in view.tail), base) == policy.replay(r.event for r in ledger.read())


def test_a_compaction_stores_a_snapshot_of_every_whole_segment(tmp_path):
    ledger, _ = write_long_run(str(tmp_path), 53, 10)
    view = ledger.read_view(LADDER)
    assert view.snapshot is not None
    assert view.snapshot.events == 50 and len(view.tail) == 3
    assert summarize(LADDER, [], start=view.snapshot.carry).checkpoint_count == 48
    assert view.snapshot.committed[-1] == "checkpoint_000049"


def test_status_and_resume_of_a_long_run_read_only_the_snapshot_and_what_came_after_it(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from spotfallback.cli import status as cli_status

    app = cli_app(cli_status.register)
    ledger, _ = write_long_run(str(tmp_path), 2_000 + 7, 100)
    read = counting_reads(monkeypatch)
    result = CliRunner().invoke(app, ["status", str(tmp_path / "run"), "--json", "--events", "20"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["checkpoints"] == 2_005
    assert len(json.loads(result.output)["events"]) == 20
    assert sorted(os.path.basename(p) for p in read) == sorted(
        ["snapshot.json"] + [os.path.basename(p) for p in ledger._list(strict=True)[0]])
    assert len(read) == 1 + 7

    read.clear()
    view = Ledger(ledger.location).read_view(LADDER)
    prepare_resume(ledger.location, Ledger(ledger.location), view.tail, 0, snapshot=view.snapshot)
    assert len(read) == 1 + 7


def test_a_crash_while_writing_the_snapshot_leaves_an_object_readers_skip(tmp_path):
    ledger, _ = write_long_run(str(tmp_path), 45, 10)
    before = ledger.read_view(LADDER)
    directory = ledger.location.path("ledger", SNAPSHOT_DIR)
    with ledger.location.fs.open_output_stream(f"{directory}/{TMP_PREFIX}torn-snapshot.json") as out:
        out.write(b'{"v": 1, "carr')
    after = Ledger(ledger.location).read_view(LADDER)
    assert after.snapshot == before.snapshot and after.tail == before.tail
    assert Ledger(ledger.location).read() == ledger.read()


def test_a_snapshot_older_than_the_segments_still_reads_every_event(tmp_path):
    ledger, t = write_long_run(str(tmp_path), 25, 10)
    old = ledger.location.fs.open_input_stream(ledger.snapshot_path).readall()
    for k in range(30):
        ledger.append(CheckpointCommitted(t + 120 * (k + 1), step=100 + k), 0, {"action": "continue"})
    Ledger(ledger.location, compact_every=10).compact()
    with ledger.location.fs.open_output_stream(ledger.snapshot_path) as out:  # as if the newer ones were never written
        out.write(old)
    view = Ledger(ledger.location).read_view(LADDER)
    assert view.snapshot is not None and view.snapshot.events == 20
    assert view.events == 55
    _same_summary(summarize(LADDER, view.tail, start=view.snapshot.carry), summarize(LADDER, ledger.read()))


@pytest.mark.parametrize("how", ["loose copy of a covered event", "late event", "covered segment gone", "other ladder"])
def test_a_snapshot_that_does_not_fit_the_ledger_is_not_used(tmp_path, how):
    ledger, t = write_long_run(str(tmp_path), 25, 10)
    fs = ledger.location.fs
    segments = ledger._list(strict=True)[1]
    if how == "loose copy of a covered event":  # a compaction that crashed before deleting the chunk
        [raw] = ledger_module.read_objects(fs, [segments[0]])
        name, record = json.loads(raw)["events"][3]
        with fs.open_output_stream(f"{ledger.directory}/{name}") as out:
            out.write(json.dumps(record).encode())
    elif how == "late event":  # an agent whose clock is far behind
        Ledger(ledger.location, writer="agent").append(PreemptionNotice(T0 + 5, node_id="n"), 0, {"action": "continue"})
    elif how == "covered segment gone":
        fs.delete_file(segments[0])
    ladder = LADDER if how != "other ladder" else make_ladder([*LADDER.tiers[:2]])
    view = Ledger(ledger.location).read_view(ladder)
    assert view.snapshot is None
    assert view.tail == Ledger(ledger.location).read()


def test_the_next_compaction_stores_a_snapshot_that_fits_again(tmp_path):
    ledger, t = write_long_run(str(tmp_path), 25, 10)
    Ledger(ledger.location, writer="agent").append(PreemptionNotice(T0 + 5, node_id="n"), 0, {"action": "continue"})
    assert ledger.read_view(LADDER).snapshot is None
    for k in range(10):
        ledger.append(CheckpointCommitted(t + 120 * (k + 1), step=100 + k), 0, {"action": "continue"})
    Ledger(ledger.location, compact_every=10).compact()
    view = Ledger(ledger.location).read_view(LADDER)
    assert view.snapshot is not None
    _same_summary(summarize(LADDER, view.tail, start=view.snapshot.carry), summarize(LADDER, ledger.read()))


def test_a_run_without_a_snapshot_reads_as_it_always_did(tmp_path):
    steps = [("start", 1.0, 0.0, None), ("up", 30.0, 0.0, None)] + [("checkpoint", 120.0, 0.0, None)] * 30
    ledger, _ = write_drawn_run(str(tmp_path), steps)
    Ledger(ledger.location, compact_every=10).compact()
    ledger.location.fs.delete_dir(ledger.location.path("ledger", SNAPSHOT_DIR))
    view = Ledger(ledger.location).read_view(LADDER)
    assert view.snapshot is None and view.tail == ledger.read() and len(view.tail) == 32


def test_a_snapshot_covers_whole_segments_up_to_the_first_loose_event():
    rec = drawn_records([("start", 1.0)])[0]
    items = [("1", rec, "s1"), ("2", rec, "s2"), ("3", rec, "s1"), ("4", rec, "s3"), ("5", rec, None), ("6", rec, "s4")]
    assert covered_prefix(items) == 4
    assert covered_prefix([("1", rec, "s1"), ("2", rec, None)]) == 1
    assert covered_prefix([("1", rec, "s1"), ("2", rec, "s2"), ("3", rec, None), ("4", rec, "s1")]) == 0
    assert covered_prefix([("1", rec, None)]) == 0


def test_status_from_a_snapshot_ignores_a_heartbeat_from_before_a_restart_it_covers(tmp_path):
    steps = [("start", 1.0, 0.0, None), ("up", 30.0, 0.0, None), ("checkpoint", 120.0, 0.0, None),
             ("preempted", 100.0, 0.0, None), ("up", 30.0, 0.0, None), ("checkpoint", 120.0, 0.0, None),
             ("preempted", 100.0, 0.0, None), ("up", 30.0, 0.0, 4)]
    ledger, t = write_drawn_run(str(tmp_path), steps)
    assert ledger.read_view(LADDER).snapshot is not None
    now = t + 60.0
    driver = DriverInfo("h", 1, now, now + 30)
    between = T0 + 450.0  # after the first preemption and the latest checkpoint, before the second preemption
    got = _status(ledger, now, driver, between, snapshot=True)
    assert got == _status(ledger, now, driver, between, snapshot=False)
    assert got["progress"]["value"] == 5  # the latest checkpoint's step, not the heartbeat's stale 999


def test_a_resume_from_the_snapshot_records_only_the_commits_the_whole_ledger_misses(tmp_path):
    from tests.unit.test_checkpoints import NAMES, make_checkpoint, ray_snapshot

    run_dir = tmp_path / "runs" / "job"
    for i, name in enumerate(NAMES):
        make_checkpoint(run_dir / name, 5 * (i + 1))
    (run_dir / "checkpoint_manager_snapshot.json").write_text(ray_snapshot(NAMES))
    location = resolve_run(str(tmp_path / "runs"), "job")
    ledger = Ledger(location, writer="ctl", compact_every=10)
    ledger.ensure_dirs()
    ledger.write_meta(LADDER, {"name": "job"})
    ledger.append(RunStarted(T0), 0)
    ledger.append(CheckpointCommitted(T0 + 1, path=str(run_dir / NAMES[0]), step=5), 0)
    for k in range(78):  # pushes the first commit out of the snapshot's latest names
        ledger.append(CheckpointCommitted(T0 + 2 + k, path=f"/elsewhere/checkpoint_{k}", step=6 + k), 0)
    view = Ledger(location).read_view(LADDER)
    assert view.snapshot is not None and NAMES[0] not in view.snapshot.committed
    resume = prepare_resume(location, Ledger(location), view.tail, 0, snapshot=view.snapshot)
    assert [e.path.rsplit("/", 1)[1] for e in resume.recorded] == NAMES[1:]
