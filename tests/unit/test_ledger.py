"""The run ledger, the driver lease and the accounting replay, on a real local filesystem."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import time

import pyarrow.fs as pafs
import pytest

from spotfallback.accounting import summarize
from spotfallback.errors import ConfigError, DriverAlreadyRunningError, LedgerError
from spotfallback.events import (
    CapacityObserved,
    CapacityTimedOut,
    CheckpointCommitted,
    Finished,
    Preempted,
    PreemptionNotice,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy
from spotfallback.store.lease import DriverLease
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import list_dir, resolve_run, split_run_uri
from spotfallback.view.intervals import run_intervals
from tests.support.ledgers import spot_then_on_demand

LADDER = spot_then_on_demand(1.0, 3.0)


def write_run(ledger: Ledger) -> None:
    policy = FallbackPolicy(LADDER)
    state = policy.initial_state()
    events = [
        RunStarted(0), WorkersAcquired(10), CheckpointCommitted(1810, step=5), Preempted(3610),
        WorkersAcquired(3620), Preempted(7220), WorkersAcquired(7300), CheckpointCommitted(9000, step=9),
        Finished(10900),
    ]
    for e in events:
        step = policy.decide(state, e)
        ledger.append(e, state.tier, step.decision.to_json())
        state = step.state


def test_append_and_replay_in_order_with_state_and_spend(tmp_path):
    ledger = Ledger(resolve_run(str(tmp_path), "run-1"))
    ledger.ensure_dirs()
    write_run(ledger)
    records = ledger.read()
    assert [r.event.kind for r in records][:3] == ["run_started", "workers_acquired", "checkpoint_committed"]
    assert [r.tier for r in records] == [0, 0, 0, 0, 0, 0, 1, 1, 1]
    s = summarize(LADDER, records)
    assert s.status == "finished" and s.state.tier == 1 and s.state.tier_history == (0, 1)
    spot, od = s.tiers
    assert spot.preemptions == 2 and spot.running_s == pytest.approx(3600 + 3600)
    assert od.running_s == pytest.approx(3600)
    # 2 workers x $1/h x 2 h on spot + 2 workers x $3/h x 1 h on on-demand
    assert s.spend == pytest.approx(4.0 + 6.0)
    # Lost work: 1800 s after the step-5 checkpoint, then the whole second spot attempt.
    assert spot.lost_s == pytest.approx(1800 + 3600)
    assert s.useful_s == pytest.approx(7200 + 3600 - 5400)
    assert s.on_demand_spend == pytest.approx(s.useful_s / 3600 * 6.0)
    assert [c[1] for c in s.checkpoints] == [5, 9]
    # Every object is plain JSON, no pickles.
    for name in os.listdir(ledger.directory):
        json.loads((tmp_path / "run-1" / "_spotfallback" / "ledger" / name).read_text())


def test_damaged_or_foreign_ledger_objects_are_named(tmp_path):
    ledger = Ledger(resolve_run(str(tmp_path), "run-2"))
    ledger.ensure_dirs()
    write_run(ledger)
    bad = os.path.join(ledger.directory, "99999999999999999999-zz-finished.json")
    with open(bad, "w") as f:
        f.write('{"v": 1, "id": "x", "writer": "w", "tier": 0, "event": {"kind": "finished"}}')
    with pytest.raises(LedgerError, match=r"99999999999999999999-zz-finished.json.*'t'"):
        ledger.read()
    with open(bad, "w") as f:
        f.write("{torn")
    with pytest.raises(LedgerError, match="not valid JSON"):
        ledger.read()
    os.remove(bad)
    # Leftover temporary objects from a crash mid-write are ignored, and so are the hidden and partial
    # files of the tools a run is synced down with (a desktop, rsync, gsutil).
    for leftover in (".tmp-abc-0001-w-finished.json", ".DS_Store", ".00000000000000009500-w-finished.json.Xy12Ab",
                     "00000000000000009500-w-finished.json.gstmp"):
        with open(os.path.join(ledger.directory, leftover), "w") as f:
            f.write("{half")
    assert len(ledger.read()) == 9


@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"tier": 2, "event": {"kind": "preempted", "t": 9500}}, r"tier 2 is not a tier of the run's ladder \(its 2 tiers "
                                                                 r"are 0-1\); this ledger is not the run's \(.*run\.json\)"),
        ({"tier": 0, "event": {"kind": "capacity_observed", "t": 9500, "tier": 5}}, "tier 5 is not a tier"),
        ({"tier": 0, "event": {"kind": "preempted", "t": 9500}, "decision": {"action": "switch_tier", "to_tier": 7}},
         "tier 7 is not a tier"),
        ({"tier": 0, "event": {"kind": "preempted", "t": 9500}, "decision": {"action": "switch_tier", "to_tier": "on-demand"}},
         "tier 'on-demand' is not a tier"),
        ({"tier": 0, "event": {"kind": "workers_acquired", "t": 9500, "num_workers": -3}},
         "workers_acquired: field 'num_workers' must not be negative, got -3"),
        ({"tier": 0, "event": {"kind": "capacity_timed_out", "t": 9500, "waited_s": -60.0}}, "'waited_s' must not be negative"),
        # JSON reads a long integer as an int past the float range: no time, and no OverflowError.
        ({"tier": 0, "event": {"kind": "capacity_timed_out", "t": 9500, "waited_s": 10**400}}, "'waited_s'"),
    ],
)
def test_a_record_the_run_cannot_hold_is_named_not_billed(tmp_path, record, error):
    """A tier past the ladder's end would be billed and drawn as no tier at all; a negative count as fewer than none."""
    ledger = Ledger(resolve_run(str(tmp_path), "run-2"))
    ledger.ensure_dirs()
    ledger.write_meta(LADDER)
    write_run(ledger)
    with open(os.path.join(ledger.directory, "00000000000000009500-zz-odd.json"), "w") as f:
        json.dump({"v": 1, "id": "x", "writer": "w", **record}, f)
    for read in (ledger.read_view, ledger.read):  # a view for status, every event for report --html
        with pytest.raises(LedgerError, match=rf"00000000000000009500-zz-odd.json: .*{error}"):
            read(LADDER)


def test_a_slack_past_the_deadline_is_read_as_negative(tmp_path):
    """The one number allowed below 0: the time to the deadline once it has passed."""
    ledger = Ledger(resolve_run(str(tmp_path), "run-2"))
    ledger.ensure_dirs()
    ledger.write_meta(LADDER)
    ledger.append(CapacityObserved(5.0, tier=0, available_workers=2, slack_s=-120.0), 1)
    assert [r.event.slack_s for r in ledger.read_view(LADDER).tail] == [-120.0]


def test_duplicate_records_are_read_once(tmp_path):
    ledger = Ledger(resolve_run(str(tmp_path), "run-3"))
    ledger.ensure_dirs()
    rec = ledger.append(RunStarted(1.0), 0)
    src = os.path.join(ledger.directory, sorted(os.listdir(ledger.directory))[0])
    with open(src) as f, open(os.path.join(ledger.directory, "00000000000000000002-dup-run_started.json"), "w") as g:
        g.write(f.read())
    assert [r.id for r in ledger.read()] == [rec.id]


def test_live_run_is_charged_until_now(tmp_path):
    ledger = Ledger(resolve_run(str(tmp_path), "run-4"))
    ledger.ensure_dirs()
    ledger.append(RunStarted(0), 0)
    ledger.append(WorkersAcquired(100, num_workers=2), 0)
    s = summarize(LADDER, ledger.read(), now=3700)
    assert s.status == "running" and s.tiers[0].running_s == pytest.approx(3600)
    assert s.tiers[0].waiting_s == pytest.approx(100)


def test_crashed_driver_segment_ends_at_its_last_sign_of_life(tmp_path):
    ledger = Ledger(resolve_run(str(tmp_path), "run-5"))
    ledger.ensure_dirs()
    ledger.append(RunStarted(0), 0)
    ledger.append(WorkersAcquired(0, num_workers=2), 0)
    ledger.append(RunStarted(5000, previous_seen=3600), 0)
    ledger.append(CapacityTimedOut(5600, waited_s=600), 0, {"action": "switch_tier"})
    s = summarize(LADDER, ledger.read(), now=5600)
    assert s.tiers[0].running_s == pytest.approx(3600)
    assert s.state.tier == 1


def append_as_the_driver(ledger: Ledger, events) -> None:
    """Each event on the tier the run is on when it happens, with the policy's decision (as the trainer writes)."""
    policy = FallbackPolicy(LADDER)
    state = policy.replay(r.event for r in ledger.read())
    for e in events:
        step = policy.decide(state, e)
        ledger.append(e, state.tier, step.decision.to_json())
        state = step.state


def test_a_failed_run_waits_for_nothing_until_it_is_started_again_on_the_first_tier(tmp_path):
    """Given up at 2200 on on-demand and started again at 3500: the 1300 s it lay failed are no
    wait for capacity, and the restart (recorded on the tier it failed on) waits for spot."""
    ledger = Ledger(resolve_run(str(tmp_path), "run-failed"))
    ledger.ensure_dirs()
    append_as_the_driver(ledger, [
        RunStarted(0), WorkersAcquired(30, num_workers=2), CapacityTimedOut(1600, waited_s=600),
        CapacityTimedOut(2200, waited_s=600),
    ])
    failed = ledger.read()
    assert failed[-1].decision["action"] == "give_up"
    for now in (None, 3000):  # failed: nothing is open, however late it is read
        s = summarize(LADDER, failed, now=now)
        assert s.status == "failed" and [t.waiting_s for t in s.tiers] == pytest.approx([30, 600])
    append_as_the_driver(ledger, [RunStarted(3500, reset=True)])
    restart = ledger.read()[-1]
    assert restart.tier == 1  # the trainer records a restart on the tier the run failed on
    waiting = summarize(LADDER, ledger.read(), now=3520)
    assert waiting.status == "running" and [t.waiting_s for t in waiting.tiers] == pytest.approx([50, 600])
    append_as_the_driver(ledger, [WorkersAcquired(3550, num_workers=2), Finished(4000)])
    records = ledger.read()
    assert [r.tier for r in records[-2:]] == [0, 0]
    s = summarize(LADDER, records)
    assert s.status == "finished" and [t.waiting_s for t in s.tiers] == pytest.approx([30 + 50, 600])
    # The timeline's intervals replay the same rules: the same waits, on the same tiers.
    waits, _, _ = run_intervals(records, s.ended_at)
    assert waits == [(0, 0, 30), (1, 1600, 2200), (0, 3500, 3550)]


def test_a_notice_agents_clock_does_not_move_the_runs_start_or_end(tmp_path):
    """The agent's clock is 500 s behind the driver's on one node and 900 s ahead on another."""
    location = resolve_run(str(tmp_path), "run-skew")
    ledger, agent = Ledger(location, writer="driver"), Ledger(location, writer="agent")
    ledger.ensure_dirs()
    append_as_the_driver(ledger, [RunStarted(1000), WorkersAcquired(1030, num_workers=2)])
    agent.append(PreemptionNotice(600, node_id="behind", source="aws"), 0, {"action": "continue"})
    append_as_the_driver(ledger, [Preempted(1200), WorkersAcquired(1300, num_workers=2), Finished(2000)])
    agent.append(PreemptionNotice(2900, node_id="ahead", source="aws"), 1, {"action": "continue"})
    records = ledger.read()
    assert [r.event.kind for r in (records[0], records[-1])] == ["preemption_notice", "preemption_notice"]
    s = summarize(LADDER, records)
    assert (s.started_at, s.ended_at, s.wall_s) == (1000, 2000, 1000)
    # Read while it runs, its latest record the notice from ahead: charged up to now, not to the notice.
    live = summarize(LADDER, [*records[:-2], records[-1]], now=1500)
    assert live.status == "running" and (live.started_at, live.ended_at) == (1000, 1500)
    assert live.tiers[0].running_s + live.tiers[1].running_s == pytest.approx(170 + 200)


def test_run_names_cannot_escape_the_storage_root(tmp_path):
    for bad in ("../up", "/abs", "a/b", "x\n", "", ".hidden", "a..b"):
        with pytest.raises(ConfigError, match="name"):
            resolve_run(str(tmp_path), bad)
    assert split_run_uri("s3://bucket/runs/my-run") == ("s3://bucket/runs", "my-run")
    with pytest.raises(ConfigError):
        split_run_uri("justaname")


def test_second_live_driver_is_refused_and_stale_lease_expires(tmp_path):
    loc = resolve_run(str(tmp_path), "run-6")
    first = DriverLease(loc, ttl_s=2.0, settle_s=0.05)
    first.acquire()
    try:
        with pytest.raises(DriverAlreadyRunningError, match="another driver is running"):
            DriverLease(loc, ttl_s=2.0, settle_s=0.05).acquire()
    finally:
        first.release()
    # A lease whose holder stopped renewing (a killed driver elsewhere) expires.
    stale = {"token": "dead", "host": "other-host", "pid": 1, "renewed_at": time.time() - 10, "expires_at": time.time() + 0.5}
    with open(os.path.join(loc.state_dir, "lease.json"), "w") as f:
        json.dump(stale, f)
    with pytest.raises(DriverAlreadyRunningError):
        DriverLease(loc, ttl_s=2.0, settle_s=0.05).acquire()
    time.sleep(0.6)
    lease = DriverLease(loc, ttl_s=2.0, settle_s=0.05)
    lease.acquire()
    assert lease.previous is not None and lease.previous.token == "dead"
    lease.release()
    assert not os.path.exists(os.path.join(loc.state_dir, "lease.json"))


def test_a_driver_finds_its_lease_taken_at_its_next_renewal_and_is_told_once(tmp_path):
    """Cut off from the storage past its TTL, a driver may find another holding the lease: it must stop."""
    loc = resolve_run(str(tmp_path), "run-taken")
    told: list[str] = []
    lease = DriverLease(loc, ttl_s=0.6, settle_s=0.01, on_lost=lambda holder: told.append(holder.host))
    lease.acquire()
    try:
        assert lease.lost is None
        other = {"token": "other", "host": "elsewhere", "pid": 1, "renewed_at": time.time(), "expires_at": time.time() + 60}
        with open(os.path.join(loc.state_dir, "lease.json"), "w") as f:
            json.dump(other, f)
        deadline = time.monotonic() + 5
        while lease.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # renewals have stopped: told once, and the other's lease is left as it is
        assert lease.lost is not None and lease.lost.host == "elsewhere" and told == ["elsewhere"]
    finally:
        lease.release()
    with open(os.path.join(loc.state_dir, "lease.json")) as f:
        assert json.load(f)["token"] == "other"


def test_a_lease_renewed_on_a_machine_whose_clock_is_ahead_is_refused_without_a_negative_age(tmp_path):
    """The refusal dates the lease by its writer's clock, which may be ahead of this machine's."""
    loc = resolve_run(str(tmp_path), "run-ahead")
    os.makedirs(loc.state_dir)
    now = time.time()
    ahead = {"token": "t", "host": "other-host", "pid": 1, "renewed_at": now + 120, "expires_at": now + 150}
    with open(os.path.join(loc.state_dir, "lease.json"), "w") as f:
        json.dump(ahead, f)
    with pytest.raises(DriverAlreadyRunningError) as refused:
        DriverLease(loc, ttl_s=2.0, settle_s=0.05).acquire()
    assert re.search(r"lease renewed (1m5\ds|2m00s) ahead of this machine's clock\. ", str(refused.value)), refused.value
    behind = {**ahead, "renewed_at": now - 12.4, "expires_at": now + 20}
    with open(os.path.join(loc.state_dir, "lease.json"), "w") as f:
        json.dump(behind, f)
    with pytest.raises(DriverAlreadyRunningError, match=r"lease renewed 1\ds ago\. "):
        DriverLease(loc, ttl_s=2.0, settle_s=0.05).acquire()


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    loc = resolve_run(str(tmp_path), "run-7")
    os.makedirs(loc.state_dir)
    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    proc.start()
    proc.join()
    stale = {"token": "gone", "host": os.uname().nodename, "pid": proc.pid, "renewed_at": time.time(), "expires_at": time.time() + 600}
    with open(os.path.join(loc.state_dir, "lease.json"), "w") as f:
        json.dump(stale, f)
    with DriverLease(loc, ttl_s=5, settle_s=0.05) as lease:
        assert lease.previous.token == "gone"


def _race(path: str, barrier, results) -> None:
    loc = resolve_run(path, "race")
    barrier.wait()
    try:
        lease = DriverLease(loc, ttl_s=10, settle_s=0.5)
        lease.acquire()
        results.put("won")
        time.sleep(1.5)
        lease.release()
    except DriverAlreadyRunningError:
        results.put("refused")


def test_two_drivers_started_at_the_same_instant_exactly_one_wins(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert sorted(results.get(timeout=5) for _ in range(2)) == ["refused", "won"]


def test_a_directory_that_appears_while_it_is_listed_is_listed_not_an_error(tmp_path):
    """pyarrow lists first and checks for a missing directory after, so a ledger created in
    between raised FileNotFoundError despite allow_not_found (seen in CI: a test reading the
    ledger of a run that was just starting). The listing is tried again and sees it."""
    local = pafs.LocalFileSystem()
    target = tmp_path / "ledger"

    class CreatedMidListing:
        def get_file_info(self, selector):
            if not target.exists():
                target.mkdir()
                (target / "e.json").write_text("{}")
                raise FileNotFoundError(f"Cannot list directory '{target}'")
            return local.get_file_info(selector)

    assert [i.base_name for i in list_dir(CreatedMidListing(), str(target))] == ["e.json"]
    assert list_dir(local, str(tmp_path / "missing" / "deeper")) == []
