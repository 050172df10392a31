"""Invariants every fault test checks, and the results file the reliability table is made from.

The invariants, stated once: the ledger replays (every record parses, ids are unique, one
object per record), its sequence is one a live run can produce (no workers acquired twice
without a failure between, one ``finished``, last; each driver session's writers stay in
that session), every committed checkpoint is still whole or was set aside on record, and
nothing under the run directory is a pickle of spotfallback's making.

Results: ``record(kind, ...)`` writes ``build/reliability/<kind>.json``;
``scripts/reliability_table.py`` renders them into ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from spotfallback.checkpoints import DAMAGED_DIR, MANIFEST_NAME, SNAPSHOT_NAME, verify
from spotfallback.ledger import Ledger, LedgerRecord
from spotfallback.storage import RunLocation, list_dir

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(os.environ.get("SPOTFALLBACK_RELIABILITY_DIR", REPO / "build" / "reliability"))

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


def check_run(location: RunLocation, *, expect_finished: bool = True) -> tuple[list[LedgerRecord], list[str], list[str], int]:
    """(records, ledger problems, lost checkpoints, duplicated events) of a run."""
    records = Ledger(location).read()
    problems = ledger_problems(records)
    if expect_finished and (not records or records[-1].event.kind != "finished"):
        problems.append("the run did not finish")
    return records, problems, lost_checkpoints(location, records), duplicated_events(location)


def record(outcome: Outcome) -> Path:
    """Write one result for the table (``scripts/reliability_table.py`` renders them)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    slug = "-".join("".join(c if c.isalnum() else " " for c in outcome.kind.lower()).split())
    path = RESULTS_DIR / f"{slug}.json"
    path.write_text(json.dumps(asdict(outcome), indent=1, sort_keys=True))
    return path


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
        from examples.ddp_digits import train_fn

        from spotfallback import FallbackTrainer, Tier

        trainer = FallbackTrainer(
            train_fn,
            train_loop_config=config,
            tiers=[Tier.on_demand(2)],
            run_config=ray.train.RunConfig(storage_path=str(storage), name=f"ref-{uuid.uuid4().hex[:8]}"),
        )
        result = trainer.fit()
        assert result.metrics["step"] == config["total_steps"]
        _REFERENCE[key] = result.metrics["weights_sha256"]
    return _REFERENCE[key]
