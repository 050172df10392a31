"""Trace-driven chaos soak: real spot traces replayed onto a local cluster, plus driver kills and S3 outages.

Each soak run trains the example job to the end, its checkpoints and ledger on S3 (moto),
while a SkyPilot spot trace (or the AWS p3 node trace) drives how many spot nodes exist
(preemptions with a notice, capacity gaps; a gap longer than the spot tier's 20 s capacity
timeout moves the run to on-demand), the driver is SIGKILLed and relaunched at random
moments, and the S3 endpoint goes away for a few seconds at random moments. Afterwards the same invariants as every other fault
test are checked: finished, weights bit-identical to an uninterrupted run, the ledger
consistent (no event lost or doubled), no committed checkpoint lost.

CI runs one short run (tests/e2e/test_reliability_soak.py). By hand::

    .venv/bin/python -m tests.support.soak --minutes 10

starts its own S3 server and local cluster, runs back-to-back soak runs until the time is up,
prints each run's outcome and writes the total as a row of docs/reliability.md. The cluster is
on Ray's autoscaler (the trace sets the spot cap; ``--cluster prestarted``: nodes started ahead
of time, which the trace adds and removes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
FIXTURES = REPO / "tests" / "fixtures"
RETRY_S = 8.0
CAPACITY_TIMEOUT_S = 20.0
TIERS = [
    # Spot rides out the trace's preemptions and short gaps; a gap longer than 20 s (at 6 s a
    # tick: four ticks without spot) moves the run on to on-demand.
    {"name": "spot", "market": "spot", "num_workers": 2, "max_preemptions": 50, "max_failures": 20,
     "capacity_timeout_s": CAPACITY_TIMEOUT_S},
    {"name": "on-demand", "market": "on-demand", "num_workers": 2, "capacity_timeout_s": 300},
]


def trace_files() -> list[Path]:
    """Spot traces from ../shared/data when present, else the two copies under tests/fixtures."""
    shared = sorted(SHARED.glob("spot-traces/**/*.json")) + sorted(SHARED.glob("node-traces/*.csv"))
    return shared or [FIXTURES / "us-west-2a_v100_1.json", FIXTURES / "aws-p3-trace.csv"]


@dataclass
class SoakResult:
    """What one soak run injected and what came out of it."""

    trace: str
    preemptions: int = 0
    capacity_gaps: int = 0  # trace ticks that took every spot node away
    capacity_timeouts: int = 0  # waits for a tier's workers that ran past its capacity_timeout_s
    tier_moves: int = 0  # switches to the next tier (after a budget spent or a capacity timeout)
    driver_kills: int = 0
    storage_outages: int = 0
    steps_redone: int = 0
    events_lost: int = 0
    checkpoints_lost: int = 0
    duplicated_events: int = 0
    finished: bool = False
    identical_weights: bool = False
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def injected(self) -> int:
        return self.preemptions + self.capacity_gaps + self.driver_kills + self.storage_outages


def soak_run(
    cluster: Any,
    s3: Any,
    workdir: Path,
    config: dict[str, Any],
    reference: str,
    *,
    trace: Path,
    rng: random.Random,
    tick_s: float = 6.0,
    start_tick: int | None = None,
    ticks: int | None = None,
    driver_kills: int = 1,
    storage_outages: int = 1,
    timeout_s: float = 600,
    tiers: list[dict[str, Any]] | None = None,
    kill_on: str | None = None,
) -> SoakResult:
    """One run of the example job on S3 under trace-driven capacity, driver kills and S3 outages.

    Driver kills come at random moments, or, with ``kill_on`` (a ledger event kind), right
    after the run records that event: a relaunched driver starts its tier's capacity wait
    afresh, so a kill inside a capacity gap can keep the gap from ever outlasting the timeout.
    """
    from spotfallback.local import Injector
    from spotfallback.store.ledger import LedgerTail
    from spotfallback.store.location import resolve_run
    from tests.support.reliability import check_run, final_result, steps_redone
    from tests.support.s3server import OutageProxy

    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    result = SoakResult(trace=trace.name)
    name = f"soak-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    step_log = workdir / "steps.jsonl"
    proxy = OutageProxy(s3.endpoint).start()  # the run's only way to its storage
    spec = {
        "address": cluster.address,
        "storage_path": f"{s3.bucket}/soak",
        "name": name,
        "config": {**config, "step_log": str(step_log)},
        "tiers": tiers or TIERS,
        "s3_endpoint": proxy.endpoint,
    }
    command = [sys.executable, "-m", "tests.support.api_driver", json.dumps(spec)]
    launches = 0

    def launch() -> subprocess.Popen:
        nonlocal launches
        launches += 1
        out = open(workdir / f"driver-{launches}.log", "w")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)

    injector = Injector(cluster)
    location = resolve_run(f"{s3.bucket}/soak", name, s3.filesystem())  # past the proxy: polling sees no outage
    ledger = LedgerTail(location)
    replay = None
    # Chaos on a schedule drawn up front: (seconds after start, what).
    horizon = max(20.0, config["total_steps"] * 0.4)
    kills = [(rng.uniform(8, horizon), "kill") for _ in range(driver_kills)]
    schedule = sorted(
        (kills if kill_on is None else [])
        + [(rng.uniform(8, horizon), "outage") for _ in range(storage_outages)]
    )
    proc = launch()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            code = proc.poll()
            elapsed = time.monotonic() - t0
            # The ledger is read only while something waits on it: the trace's start, a kill on an event.
            kinds = {r.event.kind for r in ledger.poll()} if replay is None or (kill_on and kills) else set()
            if replay is None and "workers_acquired" in kinds:
                # The trace starts once the run trains, so its first drops hit a running gang.
                replay = _start_replay(injector, trace, tick_s, start_tick, ticks, rng)
            if kill_on in kinds and kills:
                schedule = sorted(schedule + [(elapsed, "kill") for _ in kills])
                kills = []
            if schedule and elapsed >= schedule[0][0]:
                _, what = schedule.pop(0)
                if what == "kill" and code is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(30)
                    result.driver_kills += 1
                    proc = launch()
                    continue
                if what == "outage":
                    proxy.cut("soak outage", duration_s=rng.uniform(1.0, RETRY_S / 2))
                    result.storage_outages += 1
            if code is not None:
                if code == 0:
                    break
                result.problems.append(f"driver exited {code}: {(workdir / f'driver-{launches}.log').read_text()[-2000:]}")
                break
            if time.monotonic() > deadline:
                result.problems.append(f"the run did not finish within {timeout_s}s")
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if replay is not None:
            replay.stop()
        proxy.close()
        for market in ("spot", "on-demand"):
            injector.give_back(market)
            injector.replenish(market)
        injector.close()
    result.preemptions = len(injector.actions("preempt")) + len(injector.actions("kill"))
    result.capacity_gaps = _gaps(injector)
    records, problems, lost, dupes = check_run(location)
    result.capacity_timeouts = sum(r.event.kind == "capacity_timed_out" for r in records)
    result.tier_moves = sum((r.decision or {}).get("action") == "switch_tier" for r in records)
    result.problems += problems
    result.events_lost, result.checkpoints_lost, result.duplicated_events = len(problems), len(lost), dupes
    result.finished = bool(records) and records[-1].event.kind == "finished"
    if result.finished:
        final = final_result((workdir / f"driver-{launches}.log").read_text())
        result.identical_weights = final["metrics"]["weights_sha256"] == reference
        result.steps_redone = steps_redone(step_log, config["total_steps"])
    result.seconds = time.monotonic() - t0
    return result


def _start_replay(
    injector: Any, trace: Path, tick_s: float, start_tick: int | None, ticks: int | None, rng: random.Random
) -> Any:
    """Replay from a random (or the given) point; ``ticks`` bounds the window (None: until stopped)."""
    from spotfallback.sim.traces import load_node_trace, load_spot_trace

    if trace.suffix == ".csv":
        node_trace = load_node_trace(trace)
        start_s = rng.uniform(0, max(0.0, node_trace.duration_s - 3600))
        end_s = start_s + ticks * 600 if ticks else None
        return injector.replay_node_trace(
            node_trace, "spot", time_scale=600 / tick_s, start_s=start_s, end_s=end_s, notice_s=1.0
        )
    spot = load_spot_trace(trace)
    start = start_tick
    if start is None:
        # A window that opens at most 3 ticks before spot capacity is gone: long stretches of
        # full availability would let a run finish without meeting the trace at all.
        gaps = [int(i) for i in (spot.available == 0).nonzero()[0]]
        start = max(0, rng.choice(gaps) - rng.randint(0, 3)) if gaps else rng.randrange(0, max(1, len(spot.available) - 40))
    return injector.replay_spot_trace(
        spot, "spot", time_scale=spot.gap_seconds / tick_s, start_tick=start, ticks=ticks, nodes_per_unit=2, notice_s=1.0
    )


def _gaps(injector: Any) -> int:
    """Trace ticks that took the spot group to zero nodes after it had some (capacity gaps)."""
    gaps, had = 0, True  # the spot group starts full
    for entry in injector.actions("trace"):
        running = entry.detail.rsplit("running=", 1)[-1]
        try:
            n = int(running)
        except ValueError:
            continue
        if n == 0 and had:
            gaps += 1
        had = n > 0
    return gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="keep starting soak runs for this long")
    parser.add_argument("--seed", type=int, default=1, help="seeds the trace, its window and the chaos schedule")
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
    parser.add_argument("--cluster", choices=("autoscaled", "prestarted"), default="autoscaled",
                        help="autoscaled: Ray's autoscaler runs the nodes, the trace sets the spot cap (default); "
                             "prestarted: nodes started ahead of time, the trace adds and removes them")
    args = parser.parse_args(argv)
    from spotfallback.local import LocalSpotCluster, NodeGroup
    from tests.support.helpers_e2e import apply_env, autoscaled_cluster
    from tests.support.reliability import RUN_CONFIG, Outcome, publish, record, reference_hash
    from tests.support.s3server import S3Server

    apply_env()
    os.environ["SPOTFALLBACK_STORAGE_RETRY_S"] = str(RETRY_S)
    rng = random.Random(args.seed)
    config = {**RUN_CONFIG, "total_steps": args.steps}
    results: list[SoakResult] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sf-soak-") as tmp, S3Server() as s3:
        os.environ.update(s3.env())
        groups = [NodeGroup("spot", count=2), NodeGroup("on-demand", count=2)]
        with autoscaled_cluster(groups) if args.cluster == "autoscaled" else LocalSpotCluster(groups, connect=True) as cluster:
            reference = reference_hash(Path(tmp) / "ref", config)
            traces = trace_files()
            t0 = time.monotonic()  # the soak's minutes start once the cluster and reference are ready
            while not results or time.monotonic() - t0 < args.minutes * 60:
                trace = rng.choice(traces)
                r = soak_run(cluster, s3, Path(tmp) / f"run-{len(results)}", config, reference, trace=trace, rng=rng,
                             ticks=30, driver_kills=rng.randint(0, 2), storage_outages=rng.randint(0, 2))
                results.append(r)
                print(json.dumps({**r.__dict__, "injected": r.injected}), flush=True)
    bad = [r for r in results if r.problems or not r.identical_weights]
    outcome = record(
        Outcome(
            "trace-driven chaos soak (by hand, long, on S3)",
            injected=sum(r.injected for r in results),
            runs_completed=sum(r.finished and r.identical_weights for r in results),
            runs=len(results),
            steps_redone=sum(r.steps_redone for r in results),
            events_lost=sum(r.events_lost for r in results),
            checkpoints_lost=sum(r.checkpoints_lost for r in results),
            duplicated_events=sum(r.duplicated_events for r in results),
            seconds=time.monotonic() - t0,
            notes=f"{args.minutes:g} min, {len(results)} runs of {args.steps} steps, seed {args.seed}: " + _breakdown(results),
            test="tests/support/soak.py::main",
        )
    )
    doc = publish([outcome], command=" ".join(["python -m tests.support.soak", *(argv if argv is not None else sys.argv[1:])]))
    print(f"{doc} rewritten with this soak's row", flush=True)
    return 1 if bad else 0


def _breakdown(results: list[SoakResult]) -> str:
    total = {k: sum(getattr(r, k) for r in results) for k in (
        "preemptions", "capacity_gaps", "capacity_timeouts", "tier_moves", "driver_kills", "storage_outages")}
    return (
        f"{total['preemptions']} preemptions, {total['capacity_gaps']} capacity gaps "
        f"({total['capacity_timeouts']} past the capacity timeout, {total['tier_moves']} tier moves), "
        f"{total['driver_kills']} driver kills, {total['storage_outages']} S3 outages"
    )


if __name__ == "__main__":
    sys.exit(main())
