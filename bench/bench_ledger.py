"""Reading a long run: `status`, `report` and the driver's resume on a 20,000-event ledger vs a 100-event one.

Run: ``.venv/bin/python -m bench.bench_ledger`` (``--sizes 100 20000 --reps 3``). Each ledger is
written by the real writer (``Ledger.append``, compacting as a run does) on the local disk, then
copied object for object to the S3 server the tests use (moto on loopback), so both stores hold
the same layout. Per store and size, the median wall time of:

- ``status``: the command itself, in this process (``spotfallback status RUN --json``);
- ``report``: what `report` reads and computes before drawing (the run, the lease, the cost report);
- ``resume``: the driver's read (``Ledger.read`` and the policy's replay);
- ``ledger read``: ``Ledger.read`` alone, and the share of it spent parsing records.

Then the requests one event costs to write on S3, counted by a proxy in front of moto, with
compaction (the default) and without. Targets: each read under 2 s on the S3 server and within
1.5x of the 100-event run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from spotfallback.config import Tier, make_ladder
from spotfallback.events import CheckpointCommitted, LedgerRecord, RunStarted, WorkersAcquired
from spotfallback.policy import FallbackPolicy
from spotfallback.store.ledger import COMPACT_EVERY, Ledger
from spotfallback.store.location import RunLocation, resolve_run

LADDER = make_ladder([
    Tier.spot(2, max_preemptions=3, price_per_worker_hour=0.92),
    Tier.on_demand(2, price_per_worker_hour=3.06),
])
T0 = 1_700_000_000.0
TARGET_S = 2.0
TARGET_RATIO = 1.5


def write_run(location: RunLocation, n_events: int) -> None:
    """A run that checkpoints every two minutes, written as the controller writes it."""
    ledger = Ledger(location, writer=f"ctl{uuid.uuid4().hex[:6]}")
    ledger.ensure_dirs()
    ledger.write_meta(LADDER, {"name": location.name, "progress_totals": {"total_steps": n_events}})
    policy = FallbackPolicy(LADDER)
    state = policy.initial_state()
    events = [RunStarted(T0), WorkersAcquired(T0 + 30, num_workers=2)]
    events += [CheckpointCommitted(T0 + 30 + 120 * k, step=k) for k in range(1, n_events - 1)]
    for ev in events:
        step = policy.decide(state, ev)
        info = {"metrics": {"step": ev.step, "loss": 0.5}} if isinstance(ev, CheckpointCommitted) else None
        ledger.append(ev, state.tier, step.decision.to_json(), info)
        state = step.state


def timed(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def status(uri: str) -> None:
    import typer
    from typer.testing import CliRunner

    from spotfallback.cli import status as cli_status

    app = typer.Typer()
    cli_status.register(app)
    app.command("noop")(lambda: None)  # two commands: typer then keeps the command's name
    result = CliRunner().invoke(app, ["status", uri, "--json", "--events", "10"])
    if result.exit_code != 0:
        raise RuntimeError(f"status {uri} failed: {result.output}")


def report(uri: str) -> None:
    from spotfallback.cli.common import load_run
    from spotfallback.view.report import cost_report
    from spotfallback.view.snapshot import charge_until, read_driver

    location, ladder, records, meta = load_run(uri)
    until = charge_until(records, read_driver(location), time.time())
    cost_report(ladder, records, run=location.uri(), now=until)


def resume(location: RunLocation) -> None:
    FallbackPolicy(LADDER).replay(r.event for r in Ledger(location).read())


def parse_share(location: RunLocation) -> float:
    """Seconds of a read spent turning stored JSON into records (CPU, whatever the store)."""
    records = Ledger(location).read()
    raw = [r.to_json() for r in records]
    start = time.perf_counter()
    for data in raw:
        LedgerRecord.from_json(data)
    return time.perf_counter() - start


def objects(location: RunLocation) -> int:
    infos = location.fs.get_file_info(pafs.FileSelector(location.path("ledger"), recursive=True))
    return sum(1 for i in infos if i.type == pafs.FileType.File)


_REQUEST = re.compile(rb"(GET|PUT|POST|HEAD|DELETE) \S+ HTTP/1\.[01]\r\n")


def requests_per_event(server: Any, n_events: int, compact_every: int) -> dict[str, float]:
    """HTTP requests per event written, by method, counted by a proxy in front of moto."""
    from tests.support.s3server import OutageProxy

    counts: Counter[str] = Counter()

    class Counting(OutageProxy):
        def _arrived(self, data: bytes) -> tuple[str, Any]:
            for m in _REQUEST.finditer(data):
                counts[m.group(1).decode()] += 1
            return super()._arrived(data)

    with Counting(server.endpoint) as proxy:
        location = resolve_run(server.uri("requests", proxy.endpoint), f"r{compact_every}")
        ledger = Ledger(location, writer="ctl", compact_every=compact_every)
        ledger.ensure_dirs()
        counts.clear()
        for k in range(n_events):
            ledger.append(CheckpointCommitted(T0 + 120 * k, step=k), 0, {"action": "continue"})
    out = {method: count / n_events for method, count in sorted(counts.items())}
    out["total"] = sum(counts.values()) / n_events
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_ledger", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 20_000])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--request-events", type=int, default=1000, help="events written to count requests")
    args = parser.parse_args(argv)

    from tests.support.s3server import S3Server

    rows: list[dict[str, Any]] = []
    root = tempfile.mkdtemp(prefix="bench-ledger-")
    try:
        with S3Server() as server:
            for key, value in server.env().items():
                os.environ.setdefault(key, value)
            s3 = server.filesystem()
            for n in args.sizes:
                name = f"run-{n}"
                local = resolve_run(root, name)
                start = time.perf_counter()
                write_run(local, n)
                write_s = time.perf_counter() - start
                pafs.copy_files(local.run_dir, f"{server.bucket}/runs/{name}", destination_filesystem=s3, use_threads=True)
                stores = (("local", f"{root}/{name}", local), ("s3", server.uri(f"runs/{name}"), resolve_run(server.uri("runs"), name)))
                for store, uri, location in stores:
                    status(uri)  # warm: imports, connections
                    row = {
                        "store": store, "events": n, "objects": objects(location),
                        "status_s": timed(lambda uri=uri: status(uri), args.reps),
                        "report_s": timed(lambda uri=uri: report(uri), args.reps),
                        "resume_s": timed(lambda location=location: resume(location), args.reps),
                        "read_s": timed(lambda location=location: Ledger(location).read(), args.reps),
                        "parse_s": parse_share(location),
                        "write_local_s": write_s if store == "local" else None,
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            per_event = {
                "compacting": requests_per_event(server, args.request_events, COMPACT_EVERY),
                "not compacting": requests_per_event(server, args.request_events, 0),
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"\n{'store':6} {'events':>7} {'objects':>8} {'status s':>9} {'report s':>9} {'resume s':>9} {'read s':>7} {'parse s':>8}")
    for r in rows:
        print(f"{r['store']:6} {r['events']:>7} {r['objects']:>8} {r['status_s']:>9.3f} {r['report_s']:>9.3f} "
              f"{r['resume_s']:>9.3f} {r['read_s']:>7.3f} {r['parse_s']:>8.3f}")
    small, large = min(args.sizes), max(args.sizes)
    for store in ("local", "s3"):
        by = {r["events"]: r for r in rows if r["store"] == store}
        if small == large or small not in by or large not in by:
            continue
        for what in ("status_s", "report_s", "resume_s"):
            ratio = by[large][what] / by[small][what]
            ok = by[large][what] < TARGET_S and ratio <= TARGET_RATIO
            print(f"{store:6} {what[:-2]:7} {large} events: {by[large][what]:.3f} s, {ratio:.1f}x the {small}-event run "
                  f"({'meets' if ok else 'misses'} < {TARGET_S:g} s and <= {TARGET_RATIO:g}x)")
    for label, counts in per_event.items():
        print(f"requests per event written on S3, {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
