"""Invariants every fault test checks, and the results file the reliability table is made from.

The invariants, stated once: the ledger replays (every record parses, ids are unique, one
object per record), its sequence is one a live run can produce (no workers acquired twice
without a failure between, one ``finished``, last; each driver session's writers stay in
that session), every committed checkpoint is still whole or was set aside on record, and
nothing under the run directory is a pickle of spotfallback's making.

The table: each fault test ends with ``record(Outcome(...))``; at the end of the pytest session
(``tests/conftest.py``) ``publish`` merges this session's rows into ``docs/reliability.json``
(kept rows of tests not run this time stay, rows of tests that failed this time are marked
so) and renders ``docs/reliability.md`` from it, with the date, machine and command of every
session a row comes from. The long soak (``python -m tests.support.soak``) publishes its own row.
"""

from __future__ import annotations

import json
import os
import platform
import posixpath
import re
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from spotfallback.events import LedgerRecord
from spotfallback.store.checkpoints import DAMAGED_DIR, MANIFEST_NAME, SNAPSHOT_NAME, verify
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import RunLocation, list_dir

REPO = Path(__file__).resolve().parents[2]
# Where reliability.json (the rows) and reliability.md (the table) live; tests of the
# publisher itself point it elsewhere.
DOCS_DIR = Path(os.environ.get("SPOTFALLBACK_RELIABILITY_DIR", REPO / "docs"))

# The example job as every fault test runs it: 30 steps, a checkpoint every 5, and metrics only
# with checkpoints (each report waits for the controller's poll; per-step reports cost ~0.25 s
# a step here). One config, so one uninterrupted reference run per session serves all tests.
RUN_CONFIG: dict[str, Any] = {"total_steps": 30, "checkpoint_every": 5, "step_delay_s": 0.15, "seed": 7, "report_every": 5}

FAILURES = {"preempted", "node_failed", "application_failed"}
RESTARTS = {"retry", "switch_tier", "climb_back", "resize"}
# Timeline-only records (notices, just-in-time checkpoints, capacity seen): no place in the grammar.
TIMELINE_ONLY = {"preemption_notice", "jit_checkpoint", "capacity_observed", "info"}


def ledger_problems(records: Sequence[LedgerRecord]) -> list[str]:
    """Why this sequence of records cannot be what one run did; empty when it is consistent."""
    problems: list[str] = []
    if not records:
        return ["the ledger is empty"]
    if records[0].event.kind != "run_started":
        problems.append(f"the first record is {records[0].event.kind}, not run_started")
    session_of: dict[str, int] = {}
    session = -1
    state = "waiting"
    finished = 0
    for i, r in enumerate(records):
        kind = r.event.kind
        where = f"record {i} ({kind}, writer {r.writer})"
        catching_up = r.info.get("recorded_by") == "driver"  # a relaunched driver, just before its run_started
        if kind == "run_started":
            session += 1
            state = "waiting"
        if session_of.setdefault(r.writer, session + catching_up) != session + catching_up:
            problems.append(f"{where}: written by a driver session that had already ended")
        if kind in TIMELINE_ONLY or kind == "run_started":
            continue
        action = (r.decision or {}).get("action")
        if kind == "workers_acquired":
            if state != "waiting":
                problems.append(f"{where}: workers acquired again with no failure or restart recorded between")
            state = "running"
        elif kind == "checkpoint_committed":
            if state != "running" and r.info.get("recorded_by") != "driver":
                problems.append(f"{where}: a checkpoint committed while no workers were running")
        elif kind in FAILURES:
            state = "waiting" if action in RESTARTS else "stopped"
        elif kind == "capacity_timed_out":
            if state != "waiting":
                problems.append(f"{where}: a capacity timeout while workers were running")
            state = "waiting" if action in RESTARTS else "stopped"
        elif kind == "finished":
            finished += 1
            if state != "running":
                problems.append(f"{where}: finished while no workers were running")
            if i != len(records) - 1:
                problems.append(f"{where}: records follow the finish")
        elif kind == "fatal":
            state = "stopped"
        if action in RESTARTS and kind not in FAILURES | {"capacity_timed_out"}:
            state = "waiting"
    if finished > 1:
        problems.append(f"finished recorded {finished} times")
    return problems


def raw_ledger_objects(location: RunLocation) -> list[dict[str, Any]]:
    """Every ledger object as stored (no de-duplication), to count what ``Ledger.read`` would hide."""
    fs = location.fs
    directory = location.path("ledger")
    infos = list_dir(fs, directory)
    out = []
    for info in sorted(infos, key=lambda i: i.path):
        if info.type == pafs.FileType.File and not info.base_name.startswith(".tmp-"):
            out.append(json.loads(fs.open_input_stream(info.path).readall()))
    return out


def final_result(log: str) -> dict[str, Any]:
    """The driver's result line (the last line that is a JSON object): Ray may log after it."""
    for line in reversed(log.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise AssertionError(f"no result line in the driver's output: {log[-2000:]}")


def duplicated_events(location: RunLocation) -> int:
    ids = [o["id"] for o in raw_ledger_objects(location)]
    return len(ids) - len(set(ids))


def snapshot_names(location: RunLocation) -> list[str]:
    path = posixpath.join(location.run_dir, SNAPSHOT_NAME)
    if location.fs.get_file_info(path).type != pafs.FileType.File:
        return []
    snap = json.loads(location.fs.open_input_stream(path).readall())
    return [r["checkpoint_dir_name"] for r in snap["checkpoint_results"]]


def lost_checkpoints(location: RunLocation, records: Sequence[LedgerRecord]) -> list[str]:
    """Committed checkpoints that are neither whole where they were nor set aside on record."""
    set_aside = {
        d["checkpoint"]
        for r in records
        for d in (r.info.get("checkpoint_repair") or {}).get("damaged", [])
    }
    lost = []
    for r in records:
        if r.event.kind != "checkpoint_committed":
            continue
        name = posixpath.basename(str(r.event.path).rstrip("/"))
        if name in set_aside:
            continue
        check = verify(posixpath.join(location.run_dir, name), location.fs)
        if not check.ok:
            lost.append(f"{name}: {'; '.join(check.problems)}")
    return lost


def committed_not_in_snapshot(location: RunLocation, records: Sequence[LedgerRecord]) -> set[str]:
    committed = {posixpath.basename(str(r.event.path).rstrip("/")) for r in records if r.event.kind == "checkpoint_committed"}
    set_aside = {d["checkpoint"] for r in records for d in (r.info.get("checkpoint_repair") or {}).get("damaged", [])}
    return committed - set(snapshot_names(location)) - set_aside


def not_plain_data(location: RunLocation, user_files: Sequence[str]) -> list[str]:
    """Files under the run directory that are neither JSON, nor a user checkpoint file, nor Ray's empty marker.

    ``user_files``: the names the training function writes into its checkpoints (its own
    format, e.g. torch's); everything spotfallback and Ray write must parse as JSON.
    """
    fs = location.fs
    offenders = []
    for info in fs.get_file_info(pafs.FileSelector(location.run_dir, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        rel = posixpath.relpath(info.path, location.run_dir)
        parts = rel.split("/")
        in_checkpoint = (parts[0].startswith("checkpoint_") and len(parts) > 1) or (parts[0] == DAMAGED_DIR and len(parts) > 2)
        if in_checkpoint and parts[-1] in user_files and parts[-1] != MANIFEST_NAME:
            continue  # the training function's own file format
        if info.size == 0 and parts[-1].startswith(".validate"):
            continue  # Ray's storage marker: empty
        raw = fs.open_input_stream(info.path).readall()
        try:
            json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            offenders.append(f"{rel} ({raw[:12]!r}...)")
    return offenders


def steps_redone(step_log: Path, total_steps: int) -> int:
    """Steps computed more than once: every completed step is one line of rank 0's step log."""
    lines = [json.loads(x) for x in step_log.read_text().splitlines() if x.strip()] if step_log.exists() else []
    steps = [line["step"] for line in lines]
    assert set(steps) >= set(range(1, total_steps + 1)), "some step never ran"
    return len(steps) - total_steps


@dataclass
class Outcome:
    """One row of the reliability table."""

    kind: str
    injected: int
    runs_completed: int
    runs: int
    steps_redone: int
    events_lost: int
    checkpoints_lost: int
    duplicated_events: int = 0
    notes: str = ""
    seconds: float = 0.0
    recorded_at: float = field(default_factory=time.time)
    load_avg: float = field(default_factory=lambda: round(os.getloadavg()[0], 1))  # the machine is shared
    test: str = field(default_factory=lambda: current_test())  # the test that produced the row
    machine: str = field(default_factory=lambda: machine())
    command: str = ""  # filled in by ``publish``
    status: str = "passed"  # ``publish`` sets "failed" when the row's test failed in a later session


def current_test() -> str:
    """The running test's node id (pytest sets PYTEST_CURRENT_TEST), or the running script."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit(" (", 1)[0] if current else Path(sys.argv[0]).name


def machine() -> str:
    """CPU model, cores, OS, Python and Ray version: enough to tell two tables' machines apart."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    try:
        import ray

        ray_version = f", Ray {ray.__version__}"
    except ImportError:
        ray_version = ""
    return f"{os.cpu_count()} cores {model or platform.machine()}, {platform.system()}, Python {platform.python_version()}{ray_version}"


RECORDED: list[Outcome] = []  # rows recorded in this process, published at the end of the session


def check_run(location: RunLocation, *, expect_finished: bool = True) -> tuple[list[LedgerRecord], list[str], list[str], int]:
    """(records, ledger problems, lost checkpoints, duplicated events) of a run."""
    records = Ledger(location).read()
    problems = ledger_problems(records)
    if expect_finished and (not records or records[-1].event.kind != "finished"):
        problems.append("the run did not finish")
    return records, problems, lost_checkpoints(location, records), duplicated_events(location)


def record(outcome: Outcome) -> Outcome:
    """Keep one result for the table; ``publish`` (at the end of the session) writes it out."""
    RECORDED.append(outcome)
    return outcome


# -- the table in docs/reliability.md --------------------------------------------------------


def _test_exists(test: str) -> bool:
    """Whether the test (``path::function[param]``) that made a kept row still exists."""
    path, _, name = test.partition("::")
    function = name.split("[", 1)[0]
    file = REPO / path
    if not function or not file.is_file():
        return False
    return re.search(rf"^def {re.escape(function)}\(", file.read_text(), re.M) is not None


def publish(
    rows: Sequence[Outcome], *, command: str, failed_tests: Collection[str] = (), docs_dir: Path | None = None
) -> Path | None:
    """Merge ``rows`` into ``reliability.json`` and render ``reliability.md`` from it.

    A row replaces the kept row its test made before (one row per test); kept rows whose test no longer exists
    are dropped; kept rows of ``failed_tests`` (node ids that failed in this session) are
    marked failed, so the table never shows an old success for a test that fails now.
    Returns the page, or None when there was nothing to change (no row, no failed row's test).
    """
    docs_dir = docs_dir or DOCS_DIR
    store = docs_dir / "reliability.json"
    kept: dict[str, dict[str, Any]] = {}
    if store.exists():
        kept = {r["test"]: r for r in json.loads(store.read_text())["rows"]}
    kept = {k: r for k, r in kept.items() if _test_exists(r.get("test", ""))}
    now = time.time()
    failed_rows = [r for r in kept.values() if r.get("test") in failed_tests]
    if not rows and not failed_rows:
        return None
    for r in failed_rows:
        r["status"] = f"failed at {_stamp(now)}"
    for outcome in rows:
        row = asdict(outcome)
        row["command"] = row["command"] or command
        kept[row["test"]] = row
    ordered = sorted(kept.values(), key=lambda r: (r["test"].split("::")[0], r["kind"]))
    docs_dir.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps({"rows": ordered}, indent=1, sort_keys=True) + "\n")
    doc = docs_dir / "reliability.md"
    doc.write_text(render(ordered))
    return doc


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


HEADER = """# Reliability: what breaks, how often the suite breaks it, and what is lost

Written by the fault suite itself: every row comes from a test that injected the fault into a
real run of the example job (`spotfallback/examples/ddp_digits.py`, 2 DDP workers on a local Ray cluster
whose nodes are labelled spot / on-demand) and then checked the same invariants, and the
pytest session that ran it rewrote this page at its end (`tests/conftest.py`; the rows are
kept in `docs/reliability.json`, so a session that runs some of the tests updates only
their rows). Columns:

- **runs completed**: the run finished, with final weights bit-identical to a run that was
  never interrupted;
- **steps redone**: training steps computed more than once (rank 0 logs every completed
  step), i.e. the work the faults cost;
- **events lost**: places where the replayed ledger is not a sequence a live run can produce
  (workers acquired twice with no failure between, a record from a driver session that had
  ended, a missing or repeated `finished`); **duplicated**: ledger objects sharing an id;
- **checkpoints lost**: committed checkpoints that are neither whole (manifest sizes and
  SHA-256) where they were nor set aside under `_damaged/` on record.

To regenerate every row: `make reliability` (it runs the fault suite with
`SPOTFALLBACK_PUBLISH_RELIABILITY=1`; the CI suite runs the same tests without rewriting this
page); the long soak, `python -m tests.support.soak --minutes 10`, adds its own row. Times are wall
seconds on a shared machine; the load average when each row was recorded is given because
other jobs ran beside the suite.

"""


def render(rows: list[dict[str, Any]]) -> str:
    sessions: list[tuple[str, str]] = []  # (machine, command), numbered in order of appearance
    lines = [
        "| Fault | Injected | Runs completed | Steps redone | Events lost | Duplicated | Checkpoints lost | Time (s) | Load | Recorded | Notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        key = (r.get("machine", ""), r.get("command", ""))
        if key not in sessions:
            sessions.append(key)
        status = r.get("status", "passed")
        recorded = f"{_stamp(r['recorded_at'])} [{sessions.index(key) + 1}]"
        if status != "passed":
            recorded += f"; **test {status}**"
        lines.append(
            f"| {r['kind']} | {r['injected']} | {r['runs_completed']}/{r['runs']} | {r['steps_redone']} | "
            f"{r['events_lost']} | {r.get('duplicated_events', 0)} | {r['checkpoints_lost']} | {r['seconds']:.0f} | "
            f"{r.get('load_avg', '')} | {recorded} | {r.get('notes', '')} |"
        )
    total = {k: sum(r[k] for r in rows) for k in ("injected", "events_lost", "checkpoints_lost", "runs_completed", "runs")}
    total["duplicated_events"] = sum(r.get("duplicated_events", 0) for r in rows)
    lines.append(
        f"| **all** | **{total['injected']}** | **{total['runs_completed']}/{total['runs']}** | | "
        f"**{total['events_lost']}** | **{total['duplicated_events']}** | **{total['checkpoints_lost']}** | | | | |"
    )
    failing = [r["kind"] for r in rows if r.get("status", "passed") != "passed"]
    footer = ["", "Sessions the rows come from:", ""]
    footer += [f"{i}. `{command}` on {machine_}" for i, (machine_, command) in enumerate(sessions, 1)]
    if failing:
        footer += ["", f"**Failing now:** {', '.join(failing)} (the row shows the last passing run)."]
    return HEADER + "\n".join(lines) + "\n" + "\n".join(footer) + "\n"


def ledger_dir_files(location: RunLocation) -> list[str]:
    return sorted(
        i.base_name
        for i in list_dir(location.fs, location.path("ledger"))
    )



_REFERENCE: dict[str, str] = {}


def reference_hash(storage: Path, config: dict[str, Any]) -> str:
    """Final weights of the example job run with no fault at all (2 on-demand workers), cached per config.

    Needs a connected cluster with two free on-demand CPUs. Only the keys that shape the
    training math belong in ``config``.
    """
    key = json.dumps(config, sort_keys=True)
    if key not in _REFERENCE:
        import uuid

        import ray.train

        from spotfallback import FallbackTrainer, Tier
        from spotfallback.examples.ddp_digits import train_fn
        from tests.support.helpers_e2e import at_full_speed

        trainer = FallbackTrainer(
            train_fn,
            train_loop_config=at_full_speed(config),
            tiers=[Tier.on_demand(2)],
            run_config=ray.train.RunConfig(storage_path=str(storage), name=f"ref-{uuid.uuid4().hex[:8]}"),
        )
        result = trainer.fit()
        assert result.metrics["step"] == config["total_steps"]
        _REFERENCE[key] = result.metrics["weights_sha256"]
    return _REFERENCE[key]
