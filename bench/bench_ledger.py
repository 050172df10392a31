"""Reading a long run: `status`, `report` and the driver's resume on a 20,000-event ledger vs a 100-event one.

Run: ``.venv/bin/python -m bench.bench_ledger`` (``--sizes 100 20000 --reps 3``). Each ledger is
written by the real writer (``Ledger.append``, compacting as a run does) on the local disk, then
copied object for object to the S3 server the tests use (moto on loopback), so both stores hold
the same layout. Per store and size, the wall time (the fastest of three calls in each repetition;
the sizes alternate within a repetition, so each ratio pairs runs made under the same load) of:

- ``status``: the command itself, in this process (``spotfallback status RUN --json``);
- ``report``: what `report` reads and computes before drawing (the run, the lease, the cost report);
- ``resume``: the driver's read (``Ledger.read`` and the policy's replay);
- ``ledger read``: ``Ledger.read`` alone, and the share of it spent parsing records.

Then the requests one event costs to write on S3, counted by a proxy in front of moto, with
compaction (the default) and without, and compacting through pyarrow alone (boto3 hidden: the
path a store without conditional writes takes). Targets: each read under 2 s on the S3 server and within
1.5x of the 100-event run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow.fs as pafs

from bench.harness import (
    REPO,
    Figure,
    Measurement,
    Stat,
    Target,
    best_of,
    ratio_pairs,
    table,
    values,
)
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
SIZES = (100, 20_000)
PYARROW_ONLY = "compacting, pyarrow only (no boto3)"  # the writes without conditional ones, for comparison


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

    location, ladder, view, meta = load_run(uri)
    until = charge_until(view.latest, read_driver(location), time.time())
    cost_report(ladder, view.tail, run=location.uri(), now=until, base=view.snapshot)


def resume(location: RunLocation) -> None:
    """The driver's read: the ledger's stored snapshot, and the replay of the events after it."""
    view = Ledger(location).read_view(LADDER)
    FallbackPolicy(LADDER).replay((r.event for r in view.tail), view.start_state)


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


def requests_per_event(server: Any, n_events: int, compact_every: int, boto3: bool = True) -> dict[str, float]:
    """HTTP requests per event written, by method, counted by a proxy in front of moto.

    The run has its ``run.json``, so each compaction also stores the ledger's snapshot, as a run's
    writer does. ``boto3=False``: as if boto3 were not installed (pyarrow's temporary name and move).
    """
    import sys
    from unittest import mock

    from tests.support.s3server import OutageProxy

    counts: Counter[str] = Counter()

    class Counting(OutageProxy):
        def _arrived(self, data: bytes) -> tuple[str, Any]:
            for m in _REQUEST.finditer(data):
                counts[m.group(1).decode()] += 1
            return super()._arrived(data)

    hidden = {} if boto3 else {"boto3": None}  # `import boto3` raises ImportError
    with Counting(server.endpoint) as proxy, mock.patch.dict(sys.modules, hidden):
        location = resolve_run(server.uri("requests", proxy.endpoint), f"r{compact_every}-{'boto3' if boto3 else 'pyarrow'}")
        ledger = Ledger(location, writer="ctl", compact_every=compact_every)
        ledger.ensure_dirs()
        ledger.write_meta(LADDER)
        counts.clear()
        for k in range(n_events):
            ledger.append(CheckpointCommitted(T0 + 120 * k, step=k), 0, {"action": "continue"})
    out = {method: count / n_events for method, count in sorted(counts.items())}
    out["total"] = sum(counts.values()) / n_events
    return out


@contextlib.contextmanager
def s3_credentials(env: dict[str, str]) -> Iterator[None]:
    """The test server's credentials for this process while it runs; the caller's own ones win, and come back after."""
    added = {k: v for k, v in env.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def measure(sizes: Sequence[int] = SIZES, reps: int = 3, request_events: int = 1000, calls: int = 3,
            log: Callable[[str], None] = print, pyarrow_only: bool = False) -> list[dict[str, Any]]:
    """Rows: one ``layout`` per store and size, one ``read`` per repetition, store and size, one ``requests`` per mode.

    ``pyarrow_only``: also count the writes without boto3 (pyarrow's path, what the S3 writes cost before).

    Each read is the fastest of ``calls`` (the least disturbed by other load); the sizes alternate
    within each repetition, so a ratio compares runs made under the same load.
    """
    from tests.support.s3server import S3Server

    if importlib.util.find_spec("moto") is None:  # S3Server would skip, which is no error to the harness
        raise RuntimeError("the S3 test server needs moto[server], in the dev extra: pip install -e '.[dev]'")

    rows: list[dict[str, Any]] = []
    root = tempfile.mkdtemp(prefix="bench-ledger-")
    try:
        with S3Server() as server, s3_credentials(server.env()):
            s3 = server.filesystem()
            runs: list[tuple[str, int, str, RunLocation]] = []
            for n in sizes:
                name = f"run-{n}"
                local = resolve_run(root, name)
                start = time.perf_counter()
                write_run(local, n)
                write_s = time.perf_counter() - start
                pafs.copy_files(local.run_dir, f"{server.bucket}/runs/{name}", destination_filesystem=s3, use_threads=True)
                for store, uri, location in (("local", f"{root}/{name}", local),
                                             ("s3", server.uri(f"runs/{name}"), resolve_run(server.uri("runs"), name))):
                    status(uri)  # warm: imports, connections
                    runs.append((store, n, uri, location))
                    rows.append({"kind": "layout", "store": store, "events": n, "objects": objects(location),
                                 "parse_s": parse_share(location), "write_local_s": write_s if store == "local" else None})
            for rep in range(reps):
                for store, n, uri, location in runs:
                    row = {
                        "kind": "read", "store": store, "events": n, "variant": str(n), "rep": rep,
                        "status_s": best_of(calls, lambda uri=uri: status(uri))[0],
                        "report_s": best_of(calls, lambda uri=uri: report(uri))[0],
                        "resume_s": best_of(calls, lambda location=location: resume(location))[0],
                        "read_s": best_of(calls, lambda location=location: Ledger(location).read())[0],
                    }
                    rows.append(row)
                    log(json.dumps(row))
            modes = [("compacting", COMPACT_EVERY, True), ("not compacting", 0, True)]
            if pyarrow_only:
                modes.append((PYARROW_ONLY, COMPACT_EVERY, False))
            for mode, every, boto3 in modes:
                rows.append({"kind": "requests", "variant": mode, "events": request_events,
                             "per_event": requests_per_event(server, request_events, every, boto3)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def medians(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per store and size: the layout and the median of each read."""
    out = []
    for lay in (r for r in rows if r["kind"] == "layout"):
        match = {"kind": "read", "store": lay["store"], "events": lay["events"]}
        out.append({**lay, **{k: Stat.of(values(rows, k, **match)).median for k in READS + ("read_s",)}})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_ledger", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--request-events", type=int, default=1000, help="events written to count requests")
    args = parser.parse_args(argv)
    rows = measure(args.sizes, args.reps, args.request_events, pyarrow_only=True)
    print(f"\n{'store':6} {'events':>7} {'objects':>8} {'status s':>9} {'report s':>9} {'resume s':>9} {'read s':>7} {'parse s':>8}")
    for r in medians(rows):
        print(f"{r['store']:6} {r['events']:>7} {r['objects']:>8} {r['status_s']:>9.3f} {r['report_s']:>9.3f} "
              f"{r['resume_s']:>9.3f} {r['read_s']:>7.3f} {r['parse_s']:>8.3f}")
    for f in figures(rows):
        med, spread = f.stat.fmt(f.digits)
        print(f"{f.name}: {med} {f.unit} [{spread}] (target {f.target.text}: {'met' if f.met else 'missed'})")
    for r in (r for r in rows if r["kind"] == "requests"):
        print(f"requests per event written on S3, {r['variant']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["per_event"].items()))


# ----------------------------------------------------------------------------- `python -m bench`

READS = ("status_s", "report_s", "resume_s")
READ_LABELS = {"status_s": "`spotfallback status`", "report_s": "`report` (its reads and the cost report)",
               "resume_s": "the driver's resume (the ledger from its snapshot, and the replay)"}
STORES = {"local": "local disk", "s3": "the S3 server"}


def run(ctx: Any) -> list[dict[str, Any]]:
    return measure(SIZES, ctx.reps(5, 2), 2 * COMPACT_EVERY, log=ctx.log, pyarrow_only=True)  # two compactions in the count


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    reads = [r for r in rows if r["kind"] == "read"]
    small, large = min(r["events"] for r in reads), max(r["events"] for r in reads)
    out = []
    for what in READS:
        out.append(Figure(10, f"Long run on the S3 server: {READ_LABELS[what]}, {large:,} events", "s",
                          Target(f"< {TARGET_S:g} s", max=TARGET_S), Stat.of(values(reads, what, store="s3", events=large)), 3))
    for store, where in STORES.items():
        for what in READS:
            ratio = ratio_pairs([r for r in reads if r["store"] == store], "rep", str(large), str(small), what)
            out.append(Figure(10, f"Long run on {where}: {READ_LABELS[what]}, {large:,} events / {small:,} events", "×",
                              Target(f"≤ {TARGET_RATIO:g}×", max=TARGET_RATIO), Stat.of(ratio), 2))
    for r in (r for r in rows if r["kind"] == "requests" and r["variant"] != PYARROW_ONLY):
        target = Target("≤ 1", max=1.0) if r["variant"] == "not compacting" else Target("report only")
        note = "" if r["variant"] == "not compacting" else "the event's write, and each compaction's requests shared out"
        out.append(Figure(10, f"Requests per event written on the S3 server (conditional writes), {r['variant']}", "",
                          target, Stat.of([r["per_event"]["total"]]), 2, note=note))
    return out


def describe(rows: list[dict[str, Any]]) -> str:
    body = [(STORES[r["store"]], r["events"], r["objects"], r["status_s"], r["report_s"], r["resume_s"], r["read_s"], r["parse_s"])
            for r in medians(rows)]
    requests = [(r["variant"], r["events"], *(r["per_event"].get(m, 0.0) for m in ("PUT", "GET", "HEAD", "DELETE", "POST")),
                 r["per_event"]["total"]) for r in rows if r["kind"] == "requests"]
    return (
        (__doc__ or "").split("\n\n", 1)[1].strip() + "\n\nMedians (seconds):\n\n"
        + table(["store", "events", "objects", "status", "report", "resume", "ledger read", "of it, parsing"], body)
        + "\n\nRequests per event written on the S3 server:\n\n"
        + table(["writer", "events", "PUT", "GET", "HEAD", "DELETE", "POST", "total"], requests)
    )


def explain(rows: list[dict[str, Any]]) -> str:
    by = {(r["store"], r["events"]): r for r in medians(rows)}
    small, large = min(n for _, n in by), max(n for _, n in by)
    if any((store, n) not in by for store in STORES for n in (small, large)):
        return ""
    lo, hi, s3_lo, s3_hi = by["local", small], by["local", large], by["s3", small], by["s3", large]
    return (
        f"Why: what the {large:,} events add is CPU, whatever the store: `Ledger.read` of the long run takes "
        f"{hi['read_s']:.3f} s on local disk ({hi['parse_s']:.3f} s of it building records from decoded JSON, the rest "
        f"reading and decoding its {hi['objects']} objects), the driver's replay {hi['resume_s'] - hi['read_s']:.3f} s "
        f"more, and `status` and `report` replay every event again to account for it. The {small}-event run costs "
        f"{lo['status_s']:.3f} s (`status`) on local disk and {s3_lo['status_s']:.3f} s on the S3 server, mostly request "
        f"latency there, so the same CPU cost is {hi['status_s'] / lo['status_s']:.1f}x on local disk and "
        f"{s3_hi['status_s'] / s3_lo['status_s']:.1f}x on the S3 server (medians)."
    )


def profile(ctx: Any) -> str:
    """Where `status` spends its time on the longest run, on local disk (cProfile, cumulative, spotfallback's frames)."""
    import cProfile
    import io
    import pstats

    root = tempfile.mkdtemp(prefix="bench-ledger-profile-")
    try:
        write_run(resolve_run(root, "run"), max(SIZES))
        status(f"{root}/run")
        prof = cProfile.Profile()
        prof.runcall(status, f"{root}/run")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats("spotfallback", 20)
        return out.getvalue().split("\n\n", 1)[-1].replace(root, "RUN").replace(f"{REPO}/", "")
    finally:
        shutil.rmtree(root, ignore_errors=True)


MEASUREMENT = Measurement(
    name="ledger", items=(10,), title="Reading a long run: 20,000 events vs 100", run=run, figures=figures,
    describe=describe, cluster=False, explain=explain,
)


if __name__ == "__main__":
    main()
