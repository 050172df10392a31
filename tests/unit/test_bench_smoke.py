"""The benchmark harness cannot silently rot: its arguments, pure parts and renderer, in seconds.

No Ray cluster here (`python -m bench --quick` is the real thing): every measurement's
figures and description are computed from fixed rows shaped like the ones its ``run``
records (never from a timing taken here: under a loaded test run a timing can miss its
target, and the page would change with it), the page is rendered from a results JSON, the
simulator, ledger and cost-predictor benchmarks run at tiny sizes, and the call into
``bench/bench_notices.py`` is checked against that module's signature.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest
from bench import (
    bench_backtest,
    bench_checkpoint,
    bench_eviction,
    bench_ledger,
    bench_move,
    bench_move_autoscaled,
    bench_predict,
    bench_recovery,
    bench_throughput,
)
from bench.cli import MODULES, main, parser, registry, selected
from bench.harness import Figure, Results, Stat, Target, ratio_pairs, render
from bench.runs import step_intervals
from bench.trace_families import FAMILIES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def rows_like_a_run() -> dict[str, list[dict]]:
    """Rows of every measurement, shaped as each ``run`` records them, every target met (most values from real runs)."""
    overhead = []
    for rep, (ray_wall, sf_wall) in enumerate([(34.7, 31.4), (29.9, 31.3)]):
        for variant, wall in (("ray", ray_wall), ("spotfallback", sf_wall)):
            row = {"variant": variant, "rep": rep, "wall_s": wall, "to_first_step_s": 15.0 + rep, "train_s": 14.1,
                   "step_s": 0.506, "checkpoint_extra_s": 0.002, "after_last_step_s": 2.2, "steps": 30, "weights": "0403da35"}
            if variant == "spotfallback":
                row.update(startup_wait_s=10.2, first_overhead_s=3.1, teardown_s=2.2, commit_lag_s=0.91)
            overhead.append(row)
    recovery = []
    for rep in range(2):
        for variant, rec in (("ray-restart", 15.8), ("sf-restart", 15.5), ("sf-switch", 13.1)):
            row = {"variant": variant, "rep": rep, "recovery_s": rec + rep, "last_step_before": 10, "first_step_after": 9,
                   "redone_steps": 2, "step_s": 0.5, "final_step": 24, "kill_s": 0.4, "node_start_s": 3.0}
            if variant != "ray-restart":
                row.update(detect_s=4.0, restart_wait_s=6.0 if variant == "sf-restart" else 4.0, restart_overhead_s=3.0,
                           final_tier=int(variant == "sf-switch"))
            recovery.append(row)
    timeout = [{"rep": 0, "timeout_s": 10.0, "late_s": 0.3, "recorded_late_s": 0.1, "first_acquiring_s": 2.4,
                "acquisitions_on_spot": 4, "final_tier": 1}]
    notices = [
        {"scenario": f"{v} (x)", "variant": v, "notice_s": n, "rep": 0, "evicted_rank": 1, "last_before": 9,
         "resumed_at": 10 if n else 6, "redone": 0 if n else 4, "redone_s": 0.0 if n else 1.2, "stall_s": 9.0,
         "kill_to_new_s": 12.0, "weights_ok": True, **({"trained_into_notice_s": 1.4} if n else {})}
        for v, n in bench_eviction.SCENARIOS
    ]
    checkpoint = [
        {"variant": m, "rep": 0, "loop_s": 12.0 + i, "sections_s": 0.5 + 0.4 * i, "checkpoints": 0 if m == "none" else 8,
         "reports": 9, "call_s": None if m == "none" else 0.05, "step_s": 0.11}
        for i, m in enumerate(bench_checkpoint.MODES)
    ]
    predict = [{"variant": "calibration", "rep": -1, "step_s": 0.5}] + [
        {"variant": s, "rep": 0, "measured_spend": 0.05, "predicted_spend": 0.052, "spend_error_pct": 4.0,
         "measured_wall_s": 80.0, "predicted_wall_s": 77.0, "wall_error_pct": -3.75, "measured_events": "2 preemptions",
         "predicted_events": "2 preemptions", "measured_per_tier": {}}
        for s in bench_predict.SCENARIOS
    ]
    simulator = [
        {"kind": kind, "case": case, "rep": rep, "runs": runs, "seconds": runs / rate, "runs_per_s": rate}
        for rep in range(2)
        for kind, case, runs, rate in (
            ("rate", "rate model, M=3, timeout 1 h", 10_000, 21_000.0 + rep),
            ("rate", "rate model, spot forever", 10_000, 30_000.0),
            ("trace", "us-west-2a_v100_1.json", 1_000, 1_900.0),
            ("policy", "reference engine (FallbackPolicy.decide per event), rate model, M=3", 200, 310.0),
        )
    ]
    backtest = [
        {"kind": "plan", "case": "10 h job, 15 h deadline, 1 worker", "runs": 400, "seconds": 0.64, "optimum_s": 0.1,
         "x_optimum": 1.2},
        {"kind": "plan", "case": "100 h job, 150 h deadline, 8 workers", "runs": 400, "seconds": 4.1, "optimum_s": 3.0,
         "x_optimum": 1.1},
        {"kind": "backtest", "case": "us-west-2a_v100_1, every 1.6 h", "windows": 405, "seconds": 0.38},
    ] + [
        {"kind": "held_out", "case": case, "windows": 27, "x_optimum_mean": mean, "x_optimum_p95": 1.25,
         "costlier_than_on_demand": 0, "on_time_pct": 100.0, "plan_s": 1.3, "recommended": "M = 8, timeout 30 min"}
        for case, mean in (("availability/a.json", 1.05), ("availability/b.json", 1.08))
    ] + [
        {"kind": "bound", "case": "availability/a.json", "windows": 27, "ladders": 1200, "single_mean": 1.04,
         "single_p95": 1.2, "per_window_mean": 1.02, "per_window_p95": 1.1},
        {"kind": "bound", "case": "availability/b.json", "windows": 27, "ladders": 1200, "single_mean": None,
         "single_p95": None, "per_window_mean": 1.05, "per_window_p95": 1.2},
        {"kind": "family", "case": "flaky", "windows": 30, "x_optimum_mean": 1.26, "x_optimum_p95": 1.45,
         "x_on_demand_mean": 0.59, "costlier_than_on_demand": 0, "most_over_on_demand_pct": -6.7, "on_time_pct": 100.0,
         "recommended": "M = 8, timeout 30 min", "ladders": 2000, "single_mean": 1.26,
         "single_p95": 1.56, "per_window_mean": 1.16, "per_window_p95": 1.29},
    ]
    ledger = [
        {"kind": "layout", "store": store, "events": n, "objects": 100 if n == 100 else 40, "parse_s": n * 8e-6,
         "write_local_s": 3.0 if store == "local" else None}
        for n in (100, 20_000) for store in ("local", "s3")
    ] + [
        {"kind": "read", "store": store, "events": n, "variant": str(n), "rep": rep, "status_s": base * scale,
         "report_s": base * scale, "resume_s": base * scale * 0.8, "read_s": base * scale * 0.7}
        for rep in range(2)
        for store, base in (("local", 0.015), ("s3", 0.45))
        for n, scale in ((100, 1.0), (20_000, 1.2 + 0.1 * rep))
    ] + [
        {"kind": "requests", "variant": mode, "events": 1000, "per_event": {"GET": d, "PUT": 1.0, "total": 1.0 + d}}
        for mode, d in (("compacting", 0.02), ("not compacting", 0.0))
    ]
    move = [
        {"scenario": f"{v} (x)", "variant": v, "notice_s": n, "rep": 0, "evicted_rank": 1, "last_before": 9,
         "resumed_at": 10 if "jit" in v else 6, "redone": 0 if "jit" in v else 4, "weights_ok": True,
         "held_s": {"spotfallback+jit": 0.5, "spotfallback+jit+hold": n - 1.5}.get(v),
         "moved": v == "spotfallback+jit", "stall_s": {"spotfallback+jit": 11.0}.get(v, n + 9.0),
         "kill_to_new_s": 9.0 - n if v == "spotfallback+jit" else 9.0}
        for v, n in bench_move.SCENARIOS
    ]
    stall = {("ray", 0.0, "notice"): 9.0, ("spotfallback+jit", 5.0, "notice"): 8.5, ("spotfallback+jit", 60.0, "notice"): 38.0}
    move_autoscaled = [
        {"scenario": f"{v} (x)", "variant": v, "delay_s": d, "event": e, "notice_s": bench_move_autoscaled.NOTICE_S,
         "rep": 0, "last_before": 9, "resumed_at": 10, "redone": 0, "stall_s": stall.get((v, d, e), d + 25.0),
         "kill_to_new_s": 5.0, "notice_to_kill_s": 15.0, "held_s": 0.5 if v == "spotfallback+jit" else None,
         "moved": v == "spotfallback+jit" and d < 15, "weights_ok": True}
        for v, d, e in bench_move_autoscaled.SCENARIOS
    ]
    clusters = [
        {"scenario": sc, "variant": sc, "rep": rep, "kill_to_step_s": k + rep, "detect_s": 2.5, "workers_s": 6.0,
         "restore_step_s": 2.3, "redone_steps": 3, "identical": True,
         **({"stop_s": 3.3, "submit_s": 0.3, "driver_s": 3.2} if sc == "across" else {})}
        for rep in range(2) for sc, k in (("across", 18.5), ("within", 10.0))
    ]
    return {"simulator": simulator, "backtest": backtest, "ledger": ledger, "overhead": overhead, "recovery": recovery,
            "timeout": timeout, "notices": notices, "move": move, "move-autoscaled": move_autoscaled,
            "checkpoint": checkpoint, "predict": predict, "clusters": clusters}


def test_every_measurement_is_registered_and_parsed():
    reg = registry()
    assert list(reg) == list(MODULES)
    assert sorted(i for m in reg.values() for i in m.items) == list(range(1, 14))  # the eight figures, then 9 to 13
    for name in MODULES:
        assert parser().parse_args(["--quick", "--only", name]).only == [name]
    # The predictor calibrates from the overhead and recovery runs: asking for it runs them first.
    assert selected(["predict"], reg) == ["overhead", "recovery", "notices", "predict"]
    assert selected(None, reg) == list(MODULES)
    with pytest.raises(SystemExit):
        parser().parse_args(["--only", "nonsense"])


def test_figures_and_page_from_a_results_json(tmp_path):
    reg = registry()
    results = Results(command="python -m bench --quick", machine={"cores": 2, "cpu": "test"}, rows=rows_like_a_run(), quick=True)
    results = Results.from_json(json.loads(json.dumps(results.to_json())))  # what --render reads back
    page = render(reg, results)
    figures = [f for m in reg.values() for f in m.figures(results.rows[m.name])]
    assert {f.item for f in figures} == set(range(1, 14))
    summary = page.split("\n## ")[0]
    table = [line for line in summary.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert len(table) == len(figures)
    for f in figures:
        assert f.stat.n > 0 and math.isfinite(f.stat.median), f.name
    # A few figures worked out by hand from the rows above.
    by_name = {f.name: f for f in figures}
    wall = next(f for n, f in by_name.items() if n.startswith("No-failure overhead: `fit()`"))
    assert wall.stat.median == pytest.approx((31.4 / 34.7 + 31.3 / 29.9) / 2)
    sync = next(f for n, f in by_name.items() if "blocked per checkpoint, SYNC" in n)
    assert sync.stat.median == pytest.approx((0.9 - 0.5) / 8)
    notice = next(f for n, f in by_name.items() if f"with an {bench_eviction.NOTICE_S:g} s notice" in n and "just-in-time" in n)
    assert notice.met is True and notice.stat.median == 0
    # Ledger ratios pair the two sizes within each repetition: (0.015 * 1.2) / 0.015 and 1.3.
    local = by_name["Long run on local disk: `spotfallback status`, 20,000 events / 100 events"]
    assert local.stat.median == pytest.approx(1.25) and local.stat.n == 2
    extra = by_name["A move's time over a switch within one cluster, per repetition"]
    assert extra.stat.median == pytest.approx(8.5) and extra.stat.n == 2  # across - within, paired by repetition
    held = next(f for n, f in by_name.items() if n.endswith("spend / optimum, mean"))
    assert held.worst and held.stat.hi == pytest.approx(1.08)
    assert "**no**" not in page.split("## ")[0]  # every target in these rows is met
    # --render rebuilds the page from the JSON alone.
    (tmp_path / "benchmarks.json").write_text(json.dumps(results.to_json()))
    assert main(["--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "benchmarks.md").read_text() == page


def test_the_page_names_the_harness_cluster_only_when_a_measurement_used_it():
    reg, rows = registry(), rows_like_a_run()
    full = render(reg, Results(command="c", machine={"cluster": "autoscaled"}, rows=rows)).split("\n## ")[0]
    assert "on one local cluster" in full and "Ray's autoscaler v2" in full
    alone = render(reg, Results(command="c", machine={}, rows={"clusters": rows["clusters"]})).split("\n## ")[0]
    assert "on one local cluster" not in alone and "none uses the harness's own cluster" in alone


def test_a_missed_target_is_said_on_the_page_with_why():
    reg = registry()
    rows = rows_like_a_run()
    for r in rows["timeout"]:
        r["late_s"] = 7.5
    for r in rows["overhead"]:
        r["wall_s"] += 5.0 if r["variant"] == "spotfallback" else 0.0
        r.setdefault("to_run_started_s", 1.0) if r["variant"] == "spotfallback" else None
    for r in rows["recovery"]:
        r.update(to_new_group_s=0.2, new_group_start_s=5.0 + 3 * (r["variant"] != "ray-restart"), to_first_step_s=2.8)
        r["recovery_s"] += 6.0 * (r["variant"] != "ray-restart")
    for r in rows["notices"]:
        r["redone"] = 7 if r["notice_s"] is None else r["redone"]
    for r in rows["predict"]:
        if r["variant"] in bench_predict.SCENARIOS:
            r["wall_error_pct"] = 14.0
    rows["predict"][0]["spread"] = {"switch_wait_s": [4.5, 9.0]}
    [r for r in rows["backtest"] if r["kind"] == "held_out"][-1]["x_optimum_mean"] = 1.9  # one trace is enough to miss
    for r in rows["ledger"]:
        if r["kind"] == "read" and r["store"] == "local" and r["events"] == 20_000:
            r.update(status_s=0.45, read_s=0.28, resume_s=0.37)
    page = render(reg, Results(command="c", machine={}, rows=rows, notes={"timeout": "profiling failed: x"}))
    summary = page.split("\n## ")[0]
    for item in (1, 2, 3, 4, 5, 7, 9, 10):
        assert any(line.startswith(f"| {item} |") and line.endswith("| **no** |") for line in summary.splitlines()), item
    assert page.count("**Target missed:**") == 7  # items 2 and 3 share a section
    assert "`Ledger.read` of the long run takes 0.280 s on local disk" in page and "replay 0.090 s more" in page
    assert "is 30.0x on local disk and 1.2x on the S3 server" in page
    assert "`DriverLease.acquire`" in page and "phase by phase" in page and "not yet committed" in page
    assert "switch_wait_s 4.5–9.0 s" in page and "profiling failed: x" in page


def test_the_simulator_benchmark_at_tiny_size():
    """Its rows have the shape its figures read; the speed itself is the full run's to judge, not a loaded test's."""
    rows = bench_throughput.measure(1, rate_runs=200, trace_runs=20, policy_runs=20,
                                    trace_files=[FIXTURES / "us-west-2a_v100_1.json"])
    assert {r["kind"] for r in rows} == {"rate", "trace", "policy"}
    for f in bench_throughput.figures(rows):
        assert f.stat.n > 0 and math.isfinite(f.stat.median) and f.stat.median > 0, f.name
    assert "runs/s (median)" in bench_throughput.describe(rows)


def test_no_ladder_chosen_with_hindsight_beats_the_optimum():
    """The ladder bound on one trace: no on-time run below the optimum, a ladder per window no worse than one for all.

    With 7 windows and 0.95 on time asked, the best single ladder is on time in every window,
    so each window's best is at most its ratio there.
    """
    path = FIXTURES / "traces/spot-traces/preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json"
    grid = list(bench_backtest.ladder_grid(bench_backtest.SMALL))
    assert len(grid) == 2000 and len({(lad.model_dump_json(), tau) for lad, tau in grid}) == 2000
    (row,) = bench_backtest.ladder_bound_rows([path], path.parent)
    assert row["windows"] == 7 and row["ladders"] == 2000 and row["single_mean"] is not None
    assert 1.0 - 1e-9 <= row["per_window_mean"] <= row["single_mean"] + 1e-12


def test_a_large_gangs_search_is_measured_in_a_process_of_its_own():
    (row,) = bench_backtest.large_gang_rows(FIXTURES / "traces", gangs=((3.0, 4),))
    assert row["kind"] == "large_gang" and row["case"] == "3 h job, 4 nodes, deadline 4.5 h"
    assert row["seconds"] > 0 and row["peak_mb"] > 10 and row["optimum"] > 0 and row["sessions"] >= 1


def test_generated_trace_families_repeat_with_their_seed_and_hold_their_share_of_capacity():
    for family in FAMILIES:
        trace = family.trace(0)
        assert trace.gap_seconds == family.gap_s and len(trace.available) == round(30 * 86400 / family.gap_s)
        assert set(np.unique(trace.available)) <= {0, 1} and trace.name == f"generated {family.name}"
        assert np.array_equal(trace.available, family.trace(0).available)
        assert not np.array_equal(trace.available, family.trace(1).available)
        assert abs(trace.available.mean() - family.up_h / (family.up_h + family.down_h)) < 0.1, family.name


def test_a_generated_family_replays_the_ladder_planned_on_the_shared_traces():
    """Every shared trace (or the fixtures' copies) plans; the family's 30 days give 30 windows, judged as a backtest."""
    (row,) = bench_backtest.family_rows(bench_backtest.SMALL_ASKED, families=FAMILIES[:1], bounds=False)
    assert row["kind"] == "family" and row["case"] == "calm" and row["windows"] == 30
    assert row["x_on_demand_mean"] < 0.5 and row["on_time_pct"] == 100.0  # spot 97.5% of the time at 0.3x
    assert "Generated families" in bench_backtest.describe([row])


def test_the_ledger_benchmark_at_tiny_size():
    """Both sizes on both stores, alternated within each repetition, and the S3 writes counted."""
    rows = bench_ledger.measure((3, 40), reps=2, request_events=2, calls=1, log=lambda _: None)
    reads = [(r["rep"], r["store"], r["events"]) for r in rows if r["kind"] == "read"]
    assert reads == [(rep, store, n) for rep in range(2) for n in (3, 40) for store in ("local", "s3")]
    assert {r["variant"] for r in rows if r["kind"] == "requests"} == {"compacting", "not compacting"}
    figures = bench_ledger.figures(rows)
    assert len(figures) == 11 and all(f.stat.n > 0 and math.isfinite(f.stat.median) for f in figures)
    assert "Requests per event written" in bench_ledger.describe(rows)


def test_stats_targets_and_pairs():
    assert Stat.of([3.0, 1.0, 2.0, float("nan")]) == Stat(2.0, 1.0, 3.0, 3)
    assert Stat.of([]).n == 0 and Stat.of([5.0]).fmt(1) == ("5.0", "")
    assert Target("≤ 1", max=1.0).met(1.0) and not Target("≤ 1", max=1.0).met(1.01)
    assert Target("±5", abs_max=5).met(-4.9) and not Target("±5", abs_max=5).met(-5.1)
    assert Target("≥ 2", min=2).met(2) and Target("report").met(1e9) is None
    worst = Figure(4, "x", "s", Target("±5", abs_max=5), Stat.of([0.1, 6.0, 0.2]), worst=True)
    assert worst.met is False and Figure(4, "x", "s", worst.target, worst.stat).met is True
    rows = [{"rep": 0, "variant": "a", "v": 2.0}, {"rep": 0, "variant": "b", "v": 4.0}, {"rep": 1, "variant": "a", "v": 1.0}]
    assert ratio_pairs(rows, "rep", "b", "a", "v") == [2.0]  # rep 1 has no pair


def test_step_log_arithmetic():
    steps = [{"step": s, "t": t, "pid": 1} for s, t in [(1, 0.0), (2, 0.5), (3, 1.5), (4, 2.0)]]
    plain, ckpt = step_intervals(steps, checkpoint_every=2)
    assert plain == [0.5, 0.5] and ckpt == [1.0]
    log = FIXTURES.parent / "does-not-exist.steps"
    assert bench_eviction.redone_seconds(None, 9, 6) is None and bench_eviction.redone_seconds(log, 9, 10) == 0.0


def test_the_eviction_call_matches_bench_notices():
    """bench_eviction drives bench_notices' scenarios: a changed signature must fail here, not in the full run."""
    from bench import bench_notices

    inspect.signature(bench_notices.run_scenario).bind(None, None, Path("."), "spotfallback+jit", 8.0, 8, 1, "ref")
    inspect.signature(bench_notices.make_fit).bind("spotfallback", Path("."), "name", {})
    assert {"checkpoint_every", "total_steps"} <= set(bench_notices.CONFIG)
    fields = {f.name for f in __import__("dataclasses").fields(bench_notices.Row)}
    assert {"scenario", "last_before", "resumed_at", "redone", "stall_s", "kill_to_new_s", "weights_ok"} <= fields
    for variant, _ in bench_eviction.SCENARIOS:
        assert variant.partition("+")[0] in ("spotfallback", "ray")


def test_the_cost_predictor_at_tiny_size():
    """Calibration -> simulator prediction for both scenarios, on the rows shape the harness records."""
    rows = rows_like_a_run()
    cal = bench_predict.calibrate(rows)
    assert cal["step_s"] == pytest.approx(0.506) and cal["detect_s"] == 4.0 and cal["node_start_s"] == 3.0
    assert cal["jit_reaction_s"] == 1.4 and cal["switch_wait_s"] == 4.0 and cal["restart_wait_s"] == 6.0
    tiers, cfg, notice = bench_predict.demo_setup()
    from spotfallback.config import Ladder

    ladder = Ladder(tiers=tuple(tiers))
    demo = bench_predict.predict(ladder, bench_predict.job_spec(cal, cfg, notice), bench_predict.demo_world(cal, cfg, notice), cal)
    # The injector kills each spot attempt 23.6 s after its first step (5 steps, the commit, half a
    # poll, the 20 s notice); every start pays R (7.4 s) first, and training stops a save's lead
    # (3 s) before the kill: 2 x 20.6 s covers the 40.5 s of work, so the second attempt finishes.
    assert demo["status"] == "finished" and demo["preemptions"] == 1 and demo["switches"] == 0
    assert demo["wall_s"] > cfg["total_steps"] * cal["step_s"] and demo["spend"] > 0
    tiers, cfg = bench_predict.trace_setup()
    trace, ticks = bench_predict.trace_window()
    assert ticks == bench_predict.TRACE_WINDOW[1] - bench_predict.TRACE_WINDOW[0] and trace.available[ticks:].max() == 0
    from spotfallback.sim.world import RateModel

    ladder = Ladder(tiers=tuple(tiers))
    pred = bench_predict.predict(ladder, bench_predict.job_spec(cal, cfg, 0.0), [trace, RateModel()], cal, start_h=1 / 3600)
    assert pred["status"] == "finished" and pred["capacity_timeouts"] == 1 and pred["switches"] == 1
    with pytest.raises(RuntimeError, match="calibrates from"):
        bench_predict.calibrate({"overhead": rows["overhead"]})


def test_a_missed_prediction_credits_only_the_scenarios_within_target():
    """The explanation says which scenarios met the tolerance in every repetition, never a fixed one."""
    rows = [
        {"variant": "calibration", "spread": {"switch_wait_s": [7.9, 8.3]}},
        {"variant": "demo", "rep": 0, "spend_error_pct": 0.4, "wall_error_pct": -6.6},
        {"variant": "trace", "rep": 0, "spend_error_pct": 1.0, "wall_error_pct": -1.5},
        {"variant": "trace", "rep": 1, "spend_error_pct": -13.9, "wall_error_pct": -7.4},
    ]
    text = bench_predict.explain(rows)
    assert "every repetition of the demo scenario" in text and "trace scenario" not in text
    rows[1]["wall_error_pct"] = -10.5
    assert "every repetition" not in bench_predict.explain(rows)


def test_worker_side_code_is_importable_by_reference():
    """Ray pickles these by module path; the workers import them from the repository."""
    assert bench_checkpoint.train_fn.__module__ == "bench.bench_checkpoint"
    assert inspect.signature(bench_checkpoint.train_fn).parameters.keys() == {"config"}
    assert bench_recovery.MEASUREMENT.items == (2, 3)
