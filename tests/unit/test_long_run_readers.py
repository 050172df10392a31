"""`report` and the progress display of a long run read from the ledger's stored snapshot: the same figures as from every event, for the cost of a short run."""

from __future__ import annotations

import io
import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotfallback.events import CheckpointCommitted
from spotfallback.store.ledger import Ledger, LedgerTail
from spotfallback.store.ledger_snapshot import SAMPLE, advance, digest, sample_checkpoints
from spotfallback.view.intervals import announced_evictions, run_intervals
from spotfallback.view.report import cost_report
from spotfallback.view.snapshot import build_snapshot, charge_until
from spotfallback.view.watcher import JsonSink, RunWatcher
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
kinds = st.lists(st.tuples(st.sampled_from(sorted(MAKERS)), st.floats(min_value=0.001, max_value=600.0)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(kinds=kinds, split=st.integers(min_value=0, max_value=60))
def test_the_digest_replays_to_the_same_intervals_and_evictions_as_every_record(kinds, split):
    records = drawn_records(kinds)
    split = min(split, len(records))
    kept = digest(digest((), records[:split]), records[split:])  # built in two steps, as compactions build it
    assert kept == digest((), records)
    end = records[-1].t + 50 if records else T0
    assert run_intervals(kept, end) == run_intervals(records, end)
    assert announced_evictions(kept) == announced_evictions(records)
    assert [r for r in records if not isinstance(r.event, CheckpointCommitted)] == [
        r for r in kept if not isinstance(r.event, CheckpointCommitted)]


def test_the_digest_of_a_long_run_is_bounded_by_its_faults_not_its_checkpoints():
    records = drawn_records([("start", 1.0), ("up", 30.0)] + [("checkpoint", 120.0)] * 5_000 + [("preempted", 5.0)]
                       + [("up", 30.0)] + [("checkpoint", 120.0)] * 5_000)
    kept = digest((), records)
    assert [r.event.kind for r in kept] == ["run_started", "workers_acquired", "checkpoint_committed", "preempted",
                                            "workers_acquired", "checkpoint_committed"]
    assert kept[2] is records[5_001] and kept[-1] is records[-1]


def test_the_checkpoint_sample_stays_evenly_spread_however_long_the_run():
    records = drawn_records([("start", 1.0), ("up", 30.0)] + [("checkpoint", 120.0)] * 20_000)
    sample, stride = (), 1
    count = 0
    for lo in range(0, len(records), 500):  # as the compactions of a run extend it
        chunk = records[lo:lo + 500]
        sample, stride = sample_checkpoints(sample, stride, count, chunk)
        count += sum(isinstance(r.event, CheckpointCommitted) for r in chunk)
    assert SAMPLE <= len(sample) <= 2 * SAMPLE
    assert [n for n, _ in sample] == list(range(stride, 20_000 + 1, stride))
    assert all(r.event.step == n + 1 for n, r in sample)  # the n-th checkpoint written (steps count from 2 here)
    assert (sample, stride) == sample_checkpoints((), 1, 0, records)


def _report(ledger: Ledger, now: float, *, snapshot: bool) -> dict:
    view = ledger.read_view(LADDER) if snapshot else None
    base, records = (view.snapshot, view.tail) if view else (None, ledger.read())
    latest = [*base.recent, *records] if base else records
    if not latest:
        return {}
    return cost_report(LADDER, records, now=charge_until(latest, None, now), base=base).to_json()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_report_from_the_snapshot_and_the_events_after_it_equals_report_from_every_event(steps):
    with tempfile.TemporaryDirectory() as root:
        ledger, t = write_drawn_run(root, steps)
        assert _report(ledger, t + 100.0, snapshot=True) == _report(ledger, t + 100.0, snapshot=False)


def test_a_snapshot_carried_over_each_compaction_equals_one_over_the_whole_ledger(tmp_path):
    ledger, _ = write_long_run(str(tmp_path), 1_203, 100)
    view = ledger.read_view(LADDER)
    assert view.snapshot is not None
    records = ledger.read()[: view.snapshot.events]
    whole = advance(LADDER, None, [(str(k), r) for k, r in enumerate(records)], [])
    assert (whole.digest, whole.sample, whole.stride, whole.counted) == (
        view.snapshot.digest, view.snapshot.sample, view.snapshot.stride, view.snapshot.counted)


def test_report_of_a_long_run_reads_only_the_snapshot_and_what_came_after_it(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from spotfallback.cli import report as cli_report

    app = cli_app(cli_report.register)
    ledger, _ = write_long_run(str(tmp_path), 2_000 + 7, 100)
    read = counting_reads(monkeypatch)
    png = tmp_path / "t.png"
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--json", "--out", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["checkpoints"] == 2_005 and png.stat().st_size > 10_000
    assert sorted(os.path.basename(p) for p in read) == sorted(
        ["snapshot.json"] + [os.path.basename(p) for p in ledger._list(strict=True)[0]])
    full = _report(ledger, data["wall_h"] * 3600 + T0, snapshot=False)
    assert data["spend"] == full["spend"] and data["tiers"] == full["tiers"]

    read.clear()  # the page lists every event: it reads them all
    page = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(png), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert len(read) > 20 and "checkpoint committed at step 100<" in page.read_text()


def test_a_tail_from_the_snapshot_sees_what_a_tail_of_every_record_sees(tmp_path):
    ledger, t = write_long_run(str(tmp_path), 1_250, 100)
    tail = LedgerTail(ledger.location, LADDER, rebase_after=300)
    records = tail.poll()
    assert tail.base is not None and tail.base.events == 1_200 and len(records) == 50 == len(tail.fresh)
    every = LedgerTail(ledger.location)
    writer = Ledger(ledger.location, writer="ctl2", compact_every=100)
    for k in range(1, 400):  # the run goes on, compacting every 100 events
        writer.append(CheckpointCommitted(t + 120 * k, step=5_000 + k), 0, {"action": "continue"})
        if k % 37 == 0:
            before = len(records)
            records = tail.poll()
            assert [r.event.step for r in tail.fresh][-1] == 5_000 + k
            assert len(records) <= 300 + 100 + 37 and (len(records) >= before or tail.base.events > 1_200)
            whole = every.poll()
            mine = build_snapshot(LADDER, records, now=t + 99_999, base=tail.base).to_json()
            theirs = build_snapshot(LADDER, whole, now=t + 99_999).to_json()
            assert mine == theirs
    assert tail.base.events > 1_200  # it moved on to a newer snapshot


def test_the_progress_display_of_a_long_run_reads_the_snapshot_and_shows_what_came_after_it(tmp_path, monkeypatch):
    ledger, t = write_long_run(str(tmp_path), 2_000 + 7, 100)
    read = counting_reads(monkeypatch)
    out = io.StringIO()
    watcher = RunWatcher(LADDER, [JsonSink(LADDER, out)], interval_s=0.05)
    with watcher.watch(ledger.location):
        Ledger(ledger.location, writer="late").append(CheckpointCommitted(t + 60, step=9_999), 0, {"action": "continue"})
        import time

        time.sleep(0.4)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    events = [o for o in lines if o["type"] == "event"]
    assert len(events) == 7 + 1 and events[-1]["step"] == 9_999  # those after the snapshot, then the new one
    status = [o for o in lines if o["type"] == "status"][-1]
    assert status["checkpoints"] == 2_006
    assert "snapshot.json" in {os.path.basename(p) for p in read}
    assert not any("/segments/" in p for p in read)  # every segment is in the snapshot


def test_a_notice_record_on_a_long_run_finds_the_tier_from_the_snapshot(tmp_path, monkeypatch):
    from spotfallback.events import PreemptionNotice
    from spotfallback.notices.runlog import RunLog
    from spotfallback.policy import FallbackPolicy

    ledger, t = write_drawn_run(str(tmp_path), [("start", 1.0, 0.0, None), ("up", 30.0, 0.0, None)]
                       + [("checkpoint", 120.0, 0.0, None)] * 300
                       + [("preempted", 5.0, 0.0, None), ("up", 30.0, 0.0, None)] * 2
                       + [("preempted", 5.0, 0.0, 100), ("up", 30.0, 0.0, None), ("checkpoint", 120.0, 0.0, None)])
    assert ledger.read_view(LADDER).snapshot is not None
    read = counting_reads(monkeypatch)
    log = RunLog(ledger.location, writer="agent")
    record = log.append(PreemptionNotice(t + 1, node_id="n"))
    assert "snapshot.json" in {os.path.basename(p) for p in read} and not any("/segments/" in p for p in read)
    assert record.tier == FallbackPolicy(LADDER).replay(r.event for r in ledger.read()[:-1]).tier == 1


def test_a_new_attempt_finds_the_missed_just_in_time_checkpoint_from_the_snapshot(tmp_path, monkeypatch):
    from spotfallback.events import JitCheckpoint, Preempted, WorkersAcquired
    from spotfallback.notices.jit import missed_jit_checkpoints
    from spotfallback.notices.runlog import RunLog
    from spotfallback.policy import FallbackPolicy

    ledger, t = write_long_run(str(tmp_path), 260, 1_000)
    writer = Ledger(ledger.location, writer="ctl", compact_every=0)
    for attempt, committed in (("a1", True), ("a2", False)):  # taken and committed; taken and cut short
        t += 60
        writer.append(JitCheckpoint(t, outcome="started", step=700, attempt=attempt), 0, {"action": "continue"})
        writer.append(CheckpointCommitted(t + 1, step=699), 0, {"action": "continue"})  # a periodic one in flight
        if committed:
            writer.append(CheckpointCommitted(t + 2, step=700), 0, {"action": "continue"})
        writer.append(Preempted(t + 30), 0, {"action": "continue"})
        writer.append(WorkersAcquired(t + 40, num_workers=2), 0, {"action": "continue"})
    for k in range(300 - len(ledger.read())):  # the run trains on to 300 events
        writer.append(CheckpointCommitted(t + 50 + k, step=701 + k), 0, {"action": "continue"})
    Ledger(ledger.location, writer="drv", compact_every=100).compact()
    assert Ledger(ledger.location).read_view(LADDER).tail == []  # the JIT records are in the snapshot
    read = counting_reads(monkeypatch)
    tier, records = RunLog(ledger.location).digest()
    assert not any("/segments/" in p for p in read)
    every = ledger.read()
    assert len(records) < 20 < len(every)
    assert [(m.step, m.attempt) for m in missed_jit_checkpoints(records, now=0.0)] == [
        (m.step, m.attempt) for m in missed_jit_checkpoints(every, now=0.0)] == [(700, "a2")]
    assert tier == RunLog(ledger.location).current_tier() == FallbackPolicy(LADDER).replay(r.event for r in every).tier


def test_a_snapshot_of_the_format_before_the_digest_reads_every_event_until_the_next_compaction(tmp_path):
    ledger, t = write_long_run(str(tmp_path), 25, 10)
    fs = ledger.location.fs
    stored = json.loads(fs.open_input_stream(ledger.snapshot_path).readall())
    old = {k: v for k, v in stored.items() if k not in ("digest", "sample", "stride", "counted")}
    with fs.open_output_stream(ledger.snapshot_path) as out:  # as the previous version wrote it
        out.write(json.dumps({**old, "v": 1, "eviction_records": []}).encode())
    view = Ledger(ledger.location).read_view(LADDER)
    assert view.snapshot is None and view.tail == ledger.read()
    for k in range(10):
        ledger.append(CheckpointCommitted(t + 120 * (k + 1), step=500 + k), 0, {"action": "continue"})
    Ledger(ledger.location, compact_every=10).compact()
    view = Ledger(ledger.location).read_view(LADDER)
    assert view.snapshot is not None and view.snapshot.events == 30
