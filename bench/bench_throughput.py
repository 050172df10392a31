"""Figure 8: simulator throughput, simulated runs per second (rate model and trace replay).

The job and the worlds are ``bench/bench_simulator.py``'s: a 100-hour, 8-worker job (tau
45 min, delta 5 min, R 6 min, provisioning 3 min, 120 s notices) on a spot → on-demand
ladder. Rate model: 10,000 runs (0.02 preemptions and 0.002 failures per node-hour, 20%
outages of 0.5 h). Trace replay: 1,000 replays of every shared trace (``../shared/data``,
else the copies in ``tests/fixtures``), spot forever. Each timing is repeated; the figure
is runs per second. The targets: 10,000 rate-model runs in under 1 s (≥ 10,000 runs/s)
and 1,000 replays of a shared trace in under 2 s (≥ 500 runs/s, every trace).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.harness import Figure, Measurement, Stat, Target, table, values

RATE_RUNS = 10_000
TRACE_RUNS = 1_000
POLICY_RUNS = 1_000


def traces() -> tuple[Path, list[Path]]:
    from bench.bench_simulator import FIXTURES, SHARED

    base = SHARED if SHARED.is_dir() else FIXTURES
    return base, sorted(base.rglob("*.json")) + sorted(base.rglob("*.csv"))


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(repeat: int, rate_runs: int = RATE_RUNS, trace_runs: int = TRACE_RUNS, policy_runs: int = POLICY_RUNS,
            trace_files: list[Path] | None = None) -> list[dict[str, Any]]:
    """Time each world ``repeat`` times; sizes are parameters so the CI smoke can run it small."""
    from bench.bench_simulator import JOB, RATE, ladder
    from spotfallback.sim.planner import load_process
    from spotfallback.sim.simulate import simulate
    from spotfallback.sim.world import world_for

    rows: list[dict[str, Any]] = []
    warm = ladder(3, 3600)
    simulate(warm, JOB, world_for(warm, RATE), runs=100)  # imports, numpy warm-up
    base, files = traces()
    files = files if trace_files is None else trace_files
    cases: list[tuple[str, str, int, Any]] = []
    for m, to, label in ((3, 3600.0, "rate model, M=3, timeout 1 h"), (-1, None, "rate model, spot forever")):
        lad = ladder(m, to)
        cases.append(("rate", label, rate_runs, lambda lad=lad: simulate(lad, JOB, world_for(lad, RATE), runs=rate_runs, seed=1)))
    forever = ladder(-1, None)
    for path in files:
        proc = load_process(str(path))
        label = str(path.relative_to(base)) if path.is_relative_to(base) else path.name
        cases.append(("trace", label, trace_runs,
                      lambda proc=proc: simulate(forever, JOB, world_for(forever, proc), runs=trace_runs, seed=1)))
    lad = ladder(3, 3600)
    cases.append(("policy", "reference engine (FallbackPolicy.decide per event), rate model, M=3", policy_runs,
                  lambda: simulate(lad, JOB, world_for(lad, RATE), runs=policy_runs, seed=1, engine="policy")))
    for rep in range(repeat):
        for kind, label, runs, fn in cases:
            secs = timed(fn)
            rows.append({"kind": kind, "case": label, "rep": rep, "runs": runs, "seconds": secs, "runs_per_s": runs / secs})
    return rows


def run(ctx: Any) -> list[dict[str, Any]]:
    return measure(ctx.reps(5, 2))


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    rate = values(rows, "runs_per_s", case="rate model, M=3, timeout 1 h")
    per_trace = [Stat.of(values(rows, "runs_per_s", case=c)).median for c in dict.fromkeys(r["case"] for r in rows if r["kind"] == "trace")]
    policy = values(rows, "runs_per_s", kind="policy")
    return [
        Figure(8, f"Simulator throughput, rate model ({RATE_RUNS:,} runs of a 100 h, 8-worker job)", "runs/s",
               Target("≥ 10,000 runs/s (10,000 runs < 1 s)", min=10_000), Stat.of(rate), 0),
        Figure(8, f"Simulator throughput, trace replay ({TRACE_RUNS:,} replays; spread across the shared traces)", "runs/s",
               Target("≥ 500 runs/s on every trace (1,000 < 2 s)", min=500), Stat.of(per_trace), 0, worst=True),
        Figure(8, "Simulator throughput, reference engine driving FallbackPolicy event by event", "runs/s",
               Target("report"), Stat.of(policy), 0),
    ]


def describe(rows: list[dict[str, Any]]) -> str:
    cases = list(dict.fromkeys(r["case"] for r in rows))
    body = []
    for c in cases:
        rs = [r for r in rows if r["case"] == c]
        s = Stat.of(r["seconds"] for r in rs)
        body.append((c, rs[0]["runs"], s.median, s.lo, s.hi, rs[0]["runs"] / s.median, len(rs)))
    return (__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n" + table(
        ["case", "runs", "median (s)", "min (s)", "max (s)", "runs/s (median)", "timings"], body
    )


MEASUREMENT = Measurement(
    name="simulator", items=(8,), title="Simulator throughput", run=run, figures=figures, describe=describe, cluster=False
)
