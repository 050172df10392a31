"""Status snapshots, cost reports, the timeline picture and the progress watcher, on ledgers built by hand.

The run below is written event by event with ``Ledger.append`` (decisions from the real
policy), with times chosen so every number has a hand-computed value:

    t=0 start, 30 workers up on spot, checkpoints every 600 s (steps 10..60 at 630..3630),
    3830 preempted (200 s redone), 3900 up again on spot, checkpoints at 4500/5100/5700,
    5800 preempted -> on-demand (100 s redone), 6000 up on on-demand, checkpoints every
    600 s (steps 100..140), 9000 finished.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
import time
import types

import pytest
from PIL import Image
from rich.console import Console

from spotfallback.config import Tier, make_ladder
from spotfallback.events import (
    CheckpointCommitted,
    Finished,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy
from spotfallback.store.heartbeat import HeartbeatThrottle, read_heartbeat, write_heartbeat
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run
from spotfallback.view.report import cost_report, cost_table, html_report, summary_lines
from spotfallback.view.snapshot import AgentInfo, DriverInfo, build_snapshot
from spotfallback.view.text import (
    agents_table,
    ago,
    describe_event,
    snapshot_line,
    snapshot_renderable,
)
from spotfallback.view.timeline import timeline_png
from spotfallback.view.watcher import JsonSink, PlainSink, RunWatcher
from tests.support.ledgers import LADDER, OD_PRICE, SPOT_PRICE, T0, run_events, write_ledger


@pytest.fixture()
def finished_run(tmp_path):
    location, ledger = write_ledger(tmp_path, run_events())
    return location, ledger.read()


# ---------------------------------------------------------------------------------------
# Cost report


def test_cost_report_numbers_match_the_hand_computed_ledger(finished_run):
    location, records = finished_run
    r = cost_report(LADDER, records, run=location.uri())
    spot, od = r.tiers
    assert r.status == "finished"
    assert spot.running_h == pytest.approx((3800 + 1900) / 3600)
    assert od.running_h == pytest.approx(3000 / 3600)
    assert spot.redone_h == pytest.approx(300 / 3600) and od.redone_h == 0
    assert spot.waiting_h == pytest.approx(100 / 3600) and od.waiting_h == pytest.approx(200 / 3600)
    assert (spot.preemptions, spot.attempts, od.attempts) == (2, 2, 1)
    # Spend per tier is running hours x (workers x price per worker-hour), to the cent.
    assert round(spot.spend, 2) == round(5700 / 3600 * 2 * SPOT_PRICE, 2) == 2.91
    assert round(od.spend, 2) == round(3000 / 3600 * 2 * OD_PRICE, 2) == 5.10
    assert round(r.spend, 2) == 8.01
    useful_h = 8400 / 3600
    assert r.useful_h == pytest.approx(useful_h)
    assert r.on_demand_spend == pytest.approx(useful_h * 2 * OD_PRICE)
    assert r.savings == pytest.approx(1 - r.spend / r.on_demand_spend)
    assert r.alpha == pytest.approx(5400 / 8400)
    assert (r.interruptions, r.tier_switches, r.checkpoints) == (2, 1, 14)


def test_seed_prediction_uses_the_runs_own_t_m_dt_alpha(finished_run):
    _, records = finished_run
    seed = cost_report(LADDER, records).seed
    assert seed is not None
    t_h, m, wall_h, alpha = 8400 / 3600, 2, 9000 / 3600, 5400 / 8400
    d = 1 - SPOT_PRICE / OD_PRICE
    assert (seed.work_h, seed.interruptions) == (pytest.approx(t_h), m)
    assert seed.overhead_h == pytest.approx((wall_h - t_h) / m)
    assert seed.discount == pytest.approx(d)
    # The seed's closed form, written out: C_new = (T + M*dt) * C_o * (1 - d*alpha).
    assert seed.predicted == pytest.approx((t_h + m * (wall_h - t_h) / m) * 2 * OD_PRICE * (1 - d * alpha))


def table_text(report) -> str:
    console = Console(width=220, record=True, file=io.StringIO())
    console.print(cost_table(report))
    for line in summary_lines(report):
        console.print(line)
    return console.export_text()


def test_cost_table_hours_times_price_is_the_spend_shown_to_the_cent(finished_run):
    _, records = finished_run
    report = cost_report(LADDER, records)
    text = table_text(report)
    rows = re.findall(r"│ (spot|on-demand)\s+│ \S+\s+│\s+\$([\d.]+)/h │\s+([\d.]+) h │\s+\$([\d.]+) │", text)
    assert [r[0] for r in rows] == ["spot", "on-demand"], text
    for (_, price, hours, spend), tier in zip(rows, report.tiers, strict=True):
        assert round(float(hours) * float(price), 2) == round(float(spend), 2)  # 1.5833 h x $1.84 = $2.91
        assert abs(float(hours) * float(price) - float(spend)) < 0.005
        assert float(spend) == round(tier.spend, 2)
    assert "+43.9% saved" in text
    assert "predicts $8.42; measured $8.01 (-4.8% against the prediction)" in text  # as the plan's line: outcome / prediction


def test_timeline_png_is_a_valid_picture_with_tiers_events_and_checkpoints(finished_run):
    location, records = finished_run
    png = timeline_png(LADDER, records, title=location.uri())
    image = Image.open(io.BytesIO(png))
    image.verify()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.format is None or image.format == "PNG"
    assert 900 <= image.width <= 2000 and 450 <= image.height <= 1400, image.size
    counts = {c: n for n, c in image.getcolors(maxcolors=1 << 20)}

    def share(hex_colour: str) -> float:
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        return counts.get(rgb, 0) / (image.width * image.height)

    assert share("#2a9d8f") > 0.02  # spot band
    assert share("#e76f51") > 0.01  # on-demand band
    assert share("#d62828") > 0.0002  # preemption marks
    assert share("#000000") > 0.001  # checkpoint ticks


def test_timeline_of_a_run_without_events_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no ledger events"):
        timeline_png(LADDER, [])


def test_html_page_is_self_contained(finished_run):
    location, records = finished_run
    report = cost_report(LADDER, records, run=location.uri())
    png = timeline_png(LADDER, records)
    page = html_report(report, png, ["  0.0s  run started"])
    embedded = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    assert base64.b64decode(embedded) == png
    assert "<td>$2.91</td>" in page and "<td>$5.10</td>" in page and "run started" in page
    assert "http" not in page.replace(location.uri(), "")  # nothing fetched from elsewhere


# ---------------------------------------------------------------------------------------
# Snapshot (what `run` shows live and `status` prints)


def test_snapshot_of_a_live_run_mid_way(tmp_path):
    events = run_events()[:12]  # ... up again on spot at 3900, checkpoints at 4500 and 5100 (step 80)
    location, ledger = write_ledger(tmp_path, events)
    now = T0 + 5200
    driver = DriverInfo("h", 1, renewed_at=now - 3, expires_at=now + 7)
    heartbeat = {"t": now - 1, "metrics": {"step": 83}}
    snap = build_snapshot(LADDER, ledger.read(), run="x", now=now, heartbeat=heartbeat, driver=driver,
                          config={"total_steps": 140})
    assert snap.status == "running" and snap.tier == "spot" and snap.next_tier == "on-demand"
    assert (snap.workers_up, snap.workers_wanted) == (2, 2)
    assert (snap.preemptions, snap.preemptions_left) == (1, 0)
    assert snap.progress.value == 83 and snap.progress.total == 140
    assert snap.last_checkpoint_step == 80 and snap.checkpoint_age_s == pytest.approx(100)
    # Open segment charged up to now: (3830-30) + (5200-3900) seconds on spot.
    assert snap.spend == pytest.approx((3800 + 1300) / 3600 * 2 * SPOT_PRICE)
    assert snap.lost_s == pytest.approx(200)


def test_snapshot_shows_the_training_error_budget_apart_from_node_failures(tmp_path):
    """max_failures bounds training-function errors on their own count: a run two errors in
    must not read as having its whole budget left."""
    from spotfallback.events import ApplicationFailed

    errors = [ApplicationFailed(T0 + 700 + k, error_type="ValueError", message="bad batch") for k in range(2)]
    location, ledger = write_ledger(tmp_path, [*run_events()[:3], *errors, WorkersAcquired(T0 + 760, num_workers=2)])
    now = T0 + 800
    snap = build_snapshot(LADDER, ledger.read(), now=now, driver=DriverInfo("h", 1, now, now + 10))
    limit = LADDER[0].max_failures
    assert (snap.failures, snap.failures_left) == (0, limit)
    assert (snap.app_errors, snap.app_errors_left) == (2, limit - 2)
    assert snap.to_json()["app_errors_left"] == limit - 2
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(snapshot_renderable(snap))
    assert f"node failures {limit} of {limit} left, training errors {limit - 2} of {limit} left" in console.export_text()


def test_progress_from_before_a_restart_is_not_shown(tmp_path):
    # Preempted at 3830 after reporting step 64; resumed at 3900 from the checkpoint of step 60.
    location, ledger = write_ledger(tmp_path, run_events()[:10])
    now = T0 + 3950
    driver = DriverInfo("h", 1, renewed_at=now, expires_at=now + 10)
    before = {"t": T0 + 3820, "metrics": {"step": 64}}
    snap = build_snapshot(LADDER, ledger.read(), now=now, heartbeat=before, driver=driver)
    assert snap.progress.value == 60 and snap.last_checkpoint_step == 60
    after = {"t": T0 + 3940, "metrics": {"step": 61}}
    assert build_snapshot(LADDER, ledger.read(), now=now, heartbeat=after, driver=driver).progress.value == 61


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 10**400, True, "12"])
def test_progress_is_a_finite_number_or_none(bad):
    """Python's JSON reads NaN, Infinity and integers past any float: such a step is no progress
    (`status` would print `nan`, and `--json` no JSON), and such a total no total."""
    from spotfallback.store.heartbeat import scalar_metrics
    from spotfallback.view.snapshot import find_progress

    assert find_progress({"step": bad}, T0) is None
    assert find_progress({"step": 7, "total_steps": bad}, T0) == find_progress({"step": 7}, T0)
    assert scalar_metrics({"step": bad, "loss": 0.5}) == ({"step": True, "loss": 0.5} if bad is True else
                                                          {"step": "12", "loss": 0.5} if bad == "12" else {"loss": 0.5})


def test_snapshot_of_a_run_whose_driver_died_is_stalled_and_not_charged_after_death(tmp_path):
    location, ledger = write_ledger(tmp_path, run_events()[:12])
    dead = DriverInfo("h", 1, renewed_at=T0 + 5300, expires_at=T0 + 5330)
    snap = build_snapshot(LADDER, ledger.read(), now=T0 + 90000, driver=dead)
    assert snap.status == "stalled"
    assert snap.spend == pytest.approx((3800 + 1400) / 3600 * 2 * SPOT_PRICE)
    # A node's agent may record a notice after the driver died (or on a clock hours ahead): no
    # sign of the run's life, so it bills nothing more.
    ledger.append(PreemptionNotice(T0 + 3 * 3600 + 5300, node_id="n1", source="gcp", action="preempt"), 0, {"action": "continue"})
    late = build_snapshot(LADDER, ledger.read(), now=T0 + 90000, driver=dead)
    assert late.status == "stalled" and late.spend == pytest.approx(snap.spend)


def test_snapshot_while_waiting_shows_capacity_time_left(tmp_path):
    ladder = make_ladder([Tier.spot(2, capacity_timeout_s=600), Tier.on_demand(2)])
    location = resolve_run(str(tmp_path), "w")
    ledger = Ledger(location)
    ledger.ensure_dirs()
    ledger.append(RunStarted(T0), 0, {"action": "continue"})
    now = T0 + 100
    snap = build_snapshot(ladder, ledger.read(), now=now, driver=DriverInfo("h", 1, now, now + 10))
    assert snap.status == "waiting" and snap.workers_up == 0 and snap.capacity_left_s == pytest.approx(500)
    assert snap.progress is None and snap.spend == 0


def test_event_lines_say_what_happened_and_what_was_decided(finished_run):
    _, records = finished_run
    lines = [describe_event(r, T0, LADDER) for r in records]
    text = "\n".join(lines)
    assert "2 workers up on [bold]spot[/]" in lines[1]
    assert "restart on spot from the latest checkpoint" in text
    assert "fall back to on-demand" in text and "max_preemptions=1" in text
    assert "checkpoint committed at step 60" in text
    assert lines[-1].endswith("[green]finished[/] on [bold]on-demand[/]")


# ---------------------------------------------------------------------------------------
# Heartbeat and watcher


def test_heartbeat_round_trip_and_throttle(tmp_path):
    location = resolve_run(str(tmp_path), "hb")
    location.fs.create_dir(location.state_dir, recursive=True)
    assert read_heartbeat(location) is None
    write_heartbeat(location, 1, {"step": 7, "loss": float("nan"), "name": "x", "blob": object()})
    hb = read_heartbeat(location)
    assert hb["tier"] == 1 and hb["metrics"] == {"step": 7, "name": "x"}
    throttle = HeartbeatThrottle(interval_s=5)
    assert throttle.due(100.0) and not throttle.due(104.0) and throttle.due(105.5)


def test_watcher_streams_events_and_status_as_json_lines_while_the_ledger_grows(tmp_path):
    location = resolve_run(str(tmp_path), "live")
    ledger = Ledger(location, writer="w")
    ledger.ensure_dirs()
    out = io.StringIO()
    plain = io.StringIO()
    sinks = [JsonSink(LADDER, out), PlainSink(LADDER, Console(file=plain, width=200), every_s=3600)]
    watcher = RunWatcher(LADDER, sinks, interval_s=0.05)
    policy = FallbackPolicy(LADDER)
    state = policy.initial_state()
    now = time.time()
    with watcher.watch(location):
        for i, ev in enumerate([RunStarted(now), WorkersAcquired(now + 1, num_workers=2),
                                CheckpointCommitted(now + 2, step=5), Preempted(now + 3),
                                WorkersAcquired(now + 4, num_workers=2), Finished(now + 5)]):
            step = policy.decide(state, ev)
            ledger.append(ev, state.tier, step.decision.to_json())
            state = step.state
            if i % 2:
                time.sleep(0.2)  # let the watcher see the ledger part-way
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    events = [o["kind"] for o in lines if o["type"] == "event"]
    assert events == ["run_started", "workers_acquired", "checkpoint_committed", "preempted",
                      "workers_acquired", "finished"]
    statuses = [o for o in lines if o["type"] == "status"]
    assert len(statuses) >= 2 and statuses[-1]["status"] == "finished"
    assert statuses[-1]["progress"]["value"] == 5 and statuses[-1]["checkpoints"] == 1
    text = plain.getvalue()
    assert "preemption on spot" in text and "checkpoint committed" not in text  # quiet: no checkpoints
    assert "finished on spot" in text


def test_a_failing_sink_is_dropped_without_stopping_the_watch(tmp_path):
    class Broken:
        def on_event(self, *a):
            raise RuntimeError("boom")

        def on_snapshot(self, *a):
            pass

        def close(self, *a):
            pass

    location, _ = write_ledger(tmp_path, run_events())
    out = io.StringIO()
    watcher = RunWatcher(LADDER, [Broken(), JsonSink(LADDER, out)], interval_s=0.05)
    with watcher.watch(location):
        time.sleep(0.3)
    assert len(watcher.sinks) == 1
    assert sum(1 for line in out.getvalue().splitlines() if '"type": "event"' in line) == len(run_events())


# ---------------------------------------------------------------------------------------
# MLflow sink, against a stand-in that records calls (mlflow itself is not a dependency)


class FakeClient:
    def __init__(self):
        self.runs: dict[str, dict] = {}
        self.metrics: list[tuple[str, str, float, int]] = []
        self.terminated: dict[str, str] = {}

    def create_run(self, experiment_id, run_name=None, tags=None):
        run_id = f"run{len(self.runs)}"
        self.runs[run_id] = {"name": run_name, "tags": dict(tags or {}), "experiment": experiment_id}
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id))

    def search_runs(self, experiment_ids, filter_string, max_results):
        name = re.search(r"= '(.+)'", filter_string).group(1)
        return [types.SimpleNamespace(info=types.SimpleNamespace(run_id=i)) for i, r in self.runs.items()
                if r["experiment"] in experiment_ids and r["tags"].get("spotfallback.run_name") == name][:max_results]

    def get_run(self, run_id):
        return types.SimpleNamespace(data=types.SimpleNamespace(tags=self.runs[run_id]["tags"]))

    def get_experiment_by_name(self, name):
        return None

    def create_experiment(self, name):
        return "0"

    def set_tag(self, run_id, key, value):
        self.runs[run_id]["tags"][key] = value

    def log_metric(self, run_id, key, value, timestamp=None, step=None):
        self.metrics.append((run_id, key, value, step))

    def set_terminated(self, run_id, status):
        self.terminated[run_id] = status


def test_mlflow_sink_logs_tier_switches_and_spend_and_resumes_the_same_run(tmp_path, monkeypatch):
    client = FakeClient()
    fake = types.ModuleType("mlflow")
    fake.MlflowClient = lambda: client
    fake.active_run = lambda: None
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    from spotfallback.integrations.mlflow import MlflowSink

    location, _ = write_ledger(tmp_path, run_events()[:5])  # up to the first checkpoints
    first = MlflowSink(LADDER, run_name="r1")
    with RunWatcher(LADDER, [first], interval_s=0.05).watch(location):
        time.sleep(0.2)
    run_id = first.run_id
    logged_before = len(client.metrics)
    assert client.runs[run_id]["name"] == "r1" and client.runs[run_id]["tags"]["spotfallback.tier"] == "spot"

    # A new driver after a crash: the whole run is in the ledger now; same MLflow run, no repeats.
    location, _ = write_ledger(tmp_path, run_events(), name="r1-full")
    second = MlflowSink(LADDER, run_name="r1")
    assert second.run_id == run_id and second.skip == 5
    with RunWatcher(LADDER, [second], interval_s=0.05).watch(location):
        time.sleep(0.2)
    new = client.metrics[logged_before:]
    tiers = [v for (_, k, v, _) in new if k == "spotfallback.tier"]
    assert tiers == [0, 0, 1, 1, 1]  # preempted (retry), up again, preempted (switch to 1), up on 1, finished
    switches = [v for (_, k, v, _) in new if k == "spotfallback.tier_switches"]
    assert switches and switches[-1] == 1
    spend = [v for (_, k, v, _) in new if k == "spotfallback.spend"]
    assert spend[-1] == pytest.approx(cost_report(LADDER, Ledger(location).read()).spend)
    assert client.runs[run_id]["tags"]["spotfallback.tier"] == "on-demand"
    assert client.terminated[run_id] == "FINISHED"


def test_live_panel_on_a_terminal_prints_events_and_the_final_panel(tmp_path):
    from spotfallback.view.watcher import LiveSink

    location, _ = write_ledger(tmp_path, run_events())
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)
    with RunWatcher(LADDER, [LiveSink(LADDER, console)], config={"total_steps": 140}, interval_s=0.05).watch(location):
        time.sleep(0.3)
    text = screen.getvalue()
    assert "fall back to on-demand" in text and "finished on on-demand" in text
    assert "checkpoint committed" not in text  # this run's checkpoints predate the watch: history
    assert "step 140/140  (100%)" in text and "$8.01 so far" in text


# ---------------------------------------------------------------------------------------
# Climbs back, resizes, preemption notices and just-in-time checkpoints

from spotfallback.events import CapacityObserved, JitCheckpoint, PreemptionNotice  # noqa: E402
from spotfallback.view.text import money  # noqa: E402

BEYOND = make_ladder([
    Tier.spot((1, 2), max_preemptions=0, price_per_worker_hour=SPOT_PRICE, climb_back=True, min_dwell_s=0),
    Tier.on_demand(2, price_per_worker_hour=OD_PRICE),
])


def beyond_events() -> list:
    """Spot (2 workers) -> notice, JIT checkpoint, preempted -> on-demand -> climb back to spot
    with 1 worker -> grows back to 2 (resize) -> finished. Hand-computed below."""
    return [
        RunStarted(T0), WorkersAcquired(T0 + 30, num_workers=2), CheckpointCommitted(T0 + 630, step=10),
        PreemptionNotice(T0 + 1200, node_id="n1", deadline_s=T0 + 1230, source="aws", action="terminate", drained=True),
        JitCheckpoint(T0 + 1202, outcome="started", step=19, attempt="a1", detail="28.0s before the deadline"),
        JitCheckpoint(T0 + 1204, outcome="reported", step=19, attempt="a1", detail="written and reported in 2.00s"),
        CheckpointCommitted(T0 + 1204, step=19), Preempted(T0 + 1230),
        WorkersAcquired(T0 + 1300, num_workers=2), CheckpointCommitted(T0 + 1900, step=30),
        CapacityObserved(T0 + 1910, tier=0, available_workers=1, remaining_work_s=3000, restart_s=60,
                         checkpoint_interval_s=600),
        WorkersAcquired(T0 + 1980, num_workers=1), CheckpointCommitted(T0 + 2580, step=40),
        CapacityObserved(T0 + 2590, tier=0, available_workers=2, remaining_work_s=2000, restart_s=60,
                         checkpoint_interval_s=600),
        WorkersAcquired(T0 + 2650, num_workers=2), CheckpointCommitted(T0 + 3250, step=50), Finished(T0 + 3300),
    ]


def write_beyond(storage, name: str = "b1") -> tuple:
    location, ledger = write_ledger(storage, beyond_events(), name, ladder=BEYOND)
    records = ledger.read()
    actions = [r.decision["action"] for r in records if r.event.kind == "capacity_observed"]
    assert actions == ["climb_back", "resize"]  # the real policy decided both
    return location, records


def test_climbs_resizes_notices_and_jit_checkpoints_are_counted_in_the_report(tmp_path):
    _, records = write_beyond(tmp_path)
    r = cost_report(BEYOND, records)
    spot, od = r.tiers
    assert (r.climbs, r.resizes, r.tier_switches, r.interruptions) == (1, 1, 1, 1)
    assert (r.notices, r.jit_checkpoints, r.jit_missed) == (1, 1, 0)
    # Spot ran 30-1230 (2 workers), 1980-2590 (1 worker) and 2650-3300 (2 workers): charged per worker.
    assert spot.running_h == pytest.approx((1200 + 610 + 650) / 3600)
    assert spot.worker_h == pytest.approx((2400 + 610 + 1300) / 3600)
    assert spot.spend == pytest.approx(spot.worker_h * SPOT_PRICE)
    assert od.running_h == pytest.approx(610 / 3600) and od.spend == pytest.approx(610 / 3600 * 2 * OD_PRICE)
    # Waiting for the new gang after the climb (1910-1980) and after the resize (2590-2650) is spot's.
    assert spot.waiting_h == pytest.approx((30 + 70 + 60) / 3600) and od.waiting_h == pytest.approx(70 / 3600)
    # 1204 (just-in-time checkpoint) -> 1230 (node gone): billed and lost, but held, not redone.
    assert spot.redone_h == 0 and spot.held_h == pytest.approx(26 / 3600) and r.held_h == spot.held_h
    # The seed's M counts every restart from a checkpoint: the preemption, the climb and the resize.
    assert r.seed.interruptions == 3
    text = " ".join(table_text(r).split())  # the lines as one, whatever the console's width
    assert "1 interruptions, 1 tier switches, 1 climbs back, 1 resizes" in text
    assert "redone work 0.0000 h and held after just-in-time checkpoints 0.0072 h" in text
    assert "1 preemption notices; 1 just-in-time checkpoints reported before the node went, 0 missed" in text
    assert f"spot ran with a varying gang: 1.1972 worker-h x {money(SPOT_PRICE)}/worker-h = {money(spot.spend)}" in text
    assert r.to_json()["climbs"] == 1


def test_timeline_waits_replay_the_same_rules_as_accounting(tmp_path, finished_run):
    from spotfallback.accounting import summarize
    from spotfallback.view.intervals import run_intervals

    for ladder, records in ((BEYOND, write_beyond(tmp_path)[1]), (LADDER, finished_run[1])):
        summary = summarize(ladder, records)
        waiting, redone, held = run_intervals(records, summary.ended_at)
        for i, usage in enumerate(summary.tiers):
            assert sum(b - a for t, a, b in waiting if t == i) == pytest.approx(usage.waiting_s), (i, waiting)
            # Lost time is either redone work or the hold after a just-in-time checkpoint.
            lost = sum(b - a for t, a, b in (*redone, *held) if t == i)
            assert lost == pytest.approx(usage.lost_s), (i, redone, held)
    waiting, redone, held = run_intervals(write_beyond(tmp_path, "b2")[1], T0 + 3300)
    assert (0, T0 + 1910, T0 + 1980) in waiting and (0, T0 + 2590, T0 + 2650) in waiting
    assert held == [(0, T0 + 1204, T0 + 1230)] and redone == []  # the JIT checkpoint: nothing redone


def test_event_lines_for_climbs_resizes_notices_and_jit_checkpoints(tmp_path):
    _, records = write_beyond(tmp_path)
    text = "\n".join(filter(None, (describe_event(r, T0, BEYOND) for r in records)))
    assert "preemption notice[/] (aws, 30s before the node goes) on [bold]spot[/]; node drained" in text
    assert "just-in-time checkpoint of step 19 reported[/] on [bold]spot[/] (written and reported in 2.00s)" in text
    assert "→ climb back from on-demand to spot[/] (capacity back on 'spot'" in text
    assert "→ resize spot to 2 workers" in text


def test_a_notice_taken_back_or_announced_days_ahead_is_shown_as_such_and_not_counted(tmp_path):
    """Azure may cancel an event the agent drained for, and announces some maintenance days ahead
    (recorded at once, drained within the hour): neither is a notice of a node going now."""
    events = beyond_events()
    events[3:3] = [
        PreemptionNotice(T0 + 100, node_id="n1", deadline_s=T0 + 3 * 86400, source="azure", action="host-maintenance"),
        PreemptionNotice(T0 + 200, node_id="n1", source="azure", action="cancelled"),
    ]
    location, ledger = write_ledger(tmp_path, events, "b3", ladder=BEYOND)
    records = ledger.read()
    assert cost_report(BEYOND, records).notices == 1
    text = "\n".join(filter(None, (describe_event(r, T0, BEYOND) for r in records)))
    assert "host maintenance announced[/] (azure, 71h58m before the node goes) on [bold]spot[/]" in text
    assert "notice taken back[/] (azure: cancelled before its time) on [bold]spot[/]" in text
    assert text.count("preemption notice[/]") == 1
    png = timeline_png(BEYOND, records, title="x")
    assert colour_share(png, "#f77f00") == pytest.approx(colour_share(timeline_png(BEYOND, write_beyond(tmp_path, "b4")[1], title="x"), "#f77f00"), rel=0.05)


def colour_share(png: bytes, hex_colour: str) -> float:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    counts = {c: n for n, c in image.getcolors(maxcolors=1 << 20)}
    rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return counts.get(rgb, 0) / (image.width * image.height)


def test_timeline_png_marks_notices_jit_checkpoints_climbs_and_resizes(tmp_path):
    location, records = write_beyond(tmp_path)
    png = timeline_png(BEYOND, records, title="climb back and resize")
    plain = timeline_png(LADDER, write_ledger(tmp_path, run_events(), name="plain")[1].read())
    for colour in ("#f77f00", "#2b9348", "#3a86ff"):  # notice / JIT checkpoint and climb arrow / resize
        assert colour_share(png, colour) > 0.00003, colour
        assert colour_share(plain, colour) == 0, colour  # drawn only when such events happened


# ---------------------------------------------------------------------------------------
# The plan's prediction beside the outcome


def test_plan_prediction_beside_the_outcome(finished_run):
    from spotfallback.config import PlanPrediction
    from spotfallback.view.report import plan_rows, plan_table

    location, records = finished_run
    plan = PlanPrediction(spend=7.5, wall_h=2.0, p90_wall_h=2.4, deadline_h=3.0, on_time_probability=0.97,
                          made_with="trace aws-spot-a, 500 runs")
    r = cost_report(LADDER, records, run=location.uri(), plan=plan)
    p = r.plan
    assert p.final and p.measured_spend == pytest.approx(r.spend) and p.measured_wall_h == pytest.approx(2.5)
    assert p.spend_error == pytest.approx(r.spend / 7.5 - 1) and p.wall_error == pytest.approx(0.25)
    assert p.deadline_met is True
    assert plan_rows(p) == [
        ("spend", "$7.50", "$8.01", "+6.8%"),
        ("wall time", "2h00m", "2h30m", "+25.0%"),
        ("wall time, p90", "2h24m", "2h30m", "beyond"),
        ("deadline", "3h00m (planned on time: 97%)", "2h30m", "met"),
    ]
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(plan_table(r))
    assert "Plan vs outcome (trace aws-spot-a, 500 runs)" in console.export_text()
    assert "plan: $7.50 in 2h00m; outcome: $8.01 in 2h30m (+6.8% spend); deadline met" in table_text(r)
    data = json.loads(json.dumps(r.to_json()))
    assert data["plan"]["predicted_spend"] == 7.5 and data["plan"]["deadline_met"] is True
    assert data["plan"]["spend_error"] == pytest.approx(p.spend_error)
    page = html_report(r, timeline_png(LADDER, records))
    assert "Plan vs outcome" in page and "<td>3h00m (planned on time: 97%)</td>" in page
    # While the run goes, the measured side is "so far" and no verdict is given on the deadline.
    live = cost_report(LADDER, records[:12], plan=plan, now=T0 + 5000).plan
    assert not live.final and live.deadline_met is None and plan_rows(live)[0][2].endswith("so far")
    assert cost_report(LADDER, records).plan is None and plan_table(cost_report(LADDER, records)) is None


def test_the_plans_deadline_is_missed_once_the_wall_time_is_past_it_or_the_run_failed(finished_run, tmp_path):
    from spotfallback.config import PlanPrediction
    from spotfallback.events import Fatal
    from spotfallback.view.report import plan_rows

    _, records = finished_run
    plan = PlanPrediction(spend=7.5, wall_h=2.0, deadline_h=1.0)
    running_late = cost_report(LADDER, records[:12], plan=plan, now=T0 + 5000).plan  # 1h23m in, due at 1h
    assert not running_late.final and running_late.deadline_met is False
    assert plan_rows(running_late)[-1][3] == "missed"
    _, ledger = write_ledger(tmp_path, [*run_events()[:4], Fatal(T0 + 1800, message="no access to bucket")], name="failed")
    failed = cost_report(LADDER, ledger.read(), plan=PlanPrediction(spend=7.5, wall_h=2.0, deadline_h=3.0))
    assert failed.status == "failed" and failed.plan is not None and failed.plan.failed
    assert failed.plan.deadline_met is False  # it will never finish, on time or not
    assert not any(row[2].endswith("so far") for row in plan_rows(failed.plan))  # its figures are its outcome


def test_report_calls_a_run_whose_driver_is_gone_stalled_as_status_does(finished_run):
    _, records = finished_run
    assert cost_report(LADDER, records[:12], now=T0 + 5000).status == "running"
    assert cost_report(LADDER, records[:12], now=T0 + 5000, driver_live=False).status == "stalled"
    assert cost_report(LADDER, records, driver_live=False).status == "finished"  # ended runs need no driver


def test_a_failed_runs_restart_reads_as_waiting_for_the_first_tier(tmp_path):
    """A reset restart is recorded on the tier the run failed on; it waits for the first tier."""
    from spotfallback.events import Fatal

    events = [*run_events()[:14], Fatal(T0 + 6100, message="no access to bucket"), RunStarted(T0 + 9000, reset=True)]
    _, ledger = write_ledger(tmp_path, events, name="again")
    restart = ledger.read()[-1]
    assert restart.tier == 1  # on-demand, where it failed
    line = describe_event(restart, T0, LADDER)
    assert line is not None and "run started again with fresh budgets; waiting for [bold]spot[/] workers" in line


def test_a_host_maintenance_notice_reads_as_one_not_as_a_preemption(tmp_path):
    """GCP's TERMINATE_ON_HOST_MAINTENANCE is drained like a preemption but is not one."""
    location, ledger = write_ledger(tmp_path, run_events()[:3], name="maint")
    notice = PreemptionNotice(T0 + 700, node_id="n1", deadline_s=T0 + 760, source="gcp", action="host-maintenance", drained=True)
    ledger.append(notice, 0, {"action": "continue"})
    line = describe_event(ledger.read()[-1], T0, LADDER)
    assert line is not None and "host maintenance notice[/] (gcp, 1m00s before the node goes)" in line
    assert "preemption" not in line


def _agent(name: str, state: str, *, since: float, seen: float, stale: bool = False, gone: bool = False, **more: object) -> AgentInfo:
    fields: dict[str, object] = {"node_id": "ab" * 28, "cloud": "aws", "detail": "", "deadline_s": None, "notices": 0}
    fields.update(more)
    return AgentInfo(agent=name, host=name, state=state, since=since, last_seen=seen, stale=stale, gone_with_node=gone, **fields)  # type: ignore[arg-type]


def test_snapshot_shows_each_notice_agent_and_flags_the_stale_ones(tmp_path):
    now = T0 + 1000
    agents = [
        _agent("pod-a", "watching", since=now - 600, seen=now - 5),
        _agent("pod-b", "waiting-for-ray", since=now - 312, seen=now - 10, node_id=None, detail="no live Ray node has this machine's address 10.1.2.3"),
        _agent("pod-c", "metadata-failing", since=now - 90, seen=now - 2, detail="aws instance-action: timed out"),
        _agent("vm-d", "enabling", since=now - 60, seen=now - 3, cloud="azure"),
        _agent("pod-e", "watching", since=now - 900, seen=now - 400, stale=True),
        _agent("pod-f", "drained", since=now - 500, seen=now - 450, stale=True, gone=True, deadline_s=now - 380),
    ]
    _, ledger = write_ledger(tmp_path, run_events()[:2], name="agents")
    snap = build_snapshot(LADDER, ledger.read(), now=now, agents=agents, agents_not_shown=3)
    console = Console(width=250, record=True, color_system=None)
    console.print(snapshot_renderable(snap))
    console.print(agents_table(snap))
    text = console.export_text()
    summary = "notice agents  6 (and 3 older records): 1 stale, 1 failing to reach metadata, 1 waiting for the Ray node, "
    assert summary + "1 enabling Scheduled Events, 1 gone with their nodes, 1 watching" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("pod-", "vm-"))}
    assert "waiting for the Ray node for 5m02s" in rows["pod-b"] and "no live Ray node has this machine's address" in rows["pod-b"]
    assert rows["pod-b"].split()[1] == "-"  # no node yet
    assert "failing to reach metadata for 1m28s" in rows["pod-c"] and "6m40s ago STALE" in rows["pod-e"]
    assert "deadline passed 6m20s ago" in rows["pod-f"] and "(gone with its node)" in rows["pod-f"]
    assert "STALE" not in rows["pod-a"] + rows["pod-f"]
    data = snap.to_json()
    assert [a["state"] for a in data["agents"]][:2] == ["watching", "waiting-for-ray"] and data["agents"][4]["stale"] is True


def test_a_record_dated_ahead_of_this_machines_clock_says_so_instead_of_zero_seconds_ago(tmp_path):
    """The driver's lease, an agent's health record and the latest checkpoint, each written on a
    machine whose clock is ahead of the one `status` runs on."""
    assert (ago(12.0), ago(0.0), ago(-0.4), ago(None)) == ("12s ago", "0.0s ago", "0.0s ago", "- ago")
    assert ago(-3.2) == "3.2s ahead of this machine's clock" and ago(-400) == "6m40s ahead of this machine's clock"
    now = T0 + 500  # this machine's clock; the run's latest checkpoint is dated T0 + 630
    _, ledger = write_ledger(tmp_path, run_events()[:3], name="ahead")
    agents = [_agent("pod-a", "watching", since=now - 600, seen=now + 503),
              _agent("pod-b", "stopped", since=now + 620, seen=now + 620)]
    driver = DriverInfo("h", 1, renewed_at=now + 3.2, expires_at=now + 13.2)
    snap = build_snapshot(LADDER, ledger.read(), now=now, driver=driver, agents=agents)
    console = Console(width=250, record=True, color_system=None)
    console.print(snapshot_renderable(snap))
    console.print(agents_table(snap))
    text = console.export_text()
    assert "h pid 1, live, seen 3.2s ahead of this machine's clock" in text
    assert "latest step 10, 2m10s ahead of this machine's clock" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("pod-")}
    assert "8m23s ahead of this machine's clock" in rows["pod-a"] and "STALE" not in rows["pod-a"]
    assert "stopped 10m20s ahead of this machine's clock" in rows["pod-b"]
    assert "0.0s ago" not in text
    assert "checkpoint 10 (2m10s ahead of this machine's clock)" in snapshot_line(snap)


def test_each_announced_eviction_shows_its_hold_and_idle_time_and_whether_it_moved(tmp_path):
    # The beyond run held 1204 -> 1230 (the node went) and its next gang started at 1300.
    _, records = write_beyond(tmp_path)
    r = cost_report(BEYOND, records)
    assert (r.held_per_eviction_s, r.idle_per_eviction_s, r.evictions_moved) == (26.0, 96.0, 0)
    text = " ".join(table_text(r).split())
    assert "per announced eviction: held 26.0 s after the checkpoint, idle 96.0 s until the next gang started; 0 of 1 moved" in text
    # The same eviction, moved: the gang left 1 s after its checkpoint instead of holding 26 s.
    moved = [e for e in beyond_events() if not isinstance(e, Preempted)]
    at = next(i for i, e in enumerate(moved) if isinstance(e, CheckpointCommitted) and e.step == 19) + 1
    moved[at:at] = [JitCheckpoint(T0 + 1205, outcome="moved", step=19, attempt="a1", detail="left 25.0s before the deadline"),
                    Preempted(T0 + 1205, detail="moved off the draining node(s) early")]
    _, ledger = write_ledger(tmp_path, moved, "moved", ladder=BEYOND)
    records = ledger.read()
    r = cost_report(BEYOND, records)
    assert (r.held_per_eviction_s, r.evictions_moved) == (1.0, 1) and r.tiers[0].held_h == pytest.approx(1 / 3600)
    snap = build_snapshot(BEYOND, records, now=T0 + 3300)
    assert [(e.held_s, e.idle_s, e.moved) for e in snap.evictions] == [(1.0, 96.0, True)]
    console = Console(width=220, record=True, file=io.StringIO())
    console.print(snapshot_renderable(snap))
    row = " ".join(console.export_text().split())
    assert "1 announced, 1 moved before the node went; per eviction held 1.0s, idle 1m36s until the next gang" in row
    line = describe_event(next(r for r in records if getattr(r.event, "outcome", "") == "moved"), T0, BEYOND)
    assert line is not None and "gang moved off the draining node(s)" in line
