"""The run ledger: an append-only record of every event, one JSON object per event.

Object stores (S3, GCS) cannot append, so each event is its own object, named so that a
lexical sort is the order of events (``{time_ns}-{writer}-{kind}.json``). Each object is
written under a temporary name and moved into place, so a crash never leaves a torn event
that replay would read. Replaying the events through the pure policy rebuilds the run's
state exactly; ``accounting.summarize`` turns them into hours and spend. ``Ledger.read`` reads
it whole (the driver, the controller); ``LedgerTail`` reads only what is new at each poll (a
watcher on a growing run).

Every storage call goes through ``store.retry.call_with_retry``: an outage shorter than the
limit only pauses, and an error no wait can fix is a ``LedgerError`` naming what was tried.
"""

from __future__ import annotations

import json
import logging
import uuid
from functools import partial
from typing import Any

import pyarrow.fs as pafs

from spotfallback.config import Ladder
from spotfallback.errors import LedgerError
from spotfallback.events import FORMAT_VERSION, Event, LedgerRecord
from spotfallback.store.location import TMP_PREFIX, RunLocation, list_dir, write_atomically
from spotfallback.store.retry import call_with_retry

logger = logging.getLogger(__name__)

LEDGER_DIR = "ledger"
RUN_META = "run.json"


def _read_all(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as stream:
        return stream.readall()


def parse_record(raw: bytes, path: str) -> LedgerRecord:
    """One stored ledger object, or a ``LedgerError`` naming it and what is wrong."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LedgerError(f"{path}: not valid JSON ({e})") from None
    try:
        return LedgerRecord.from_json(data)
    except (TypeError, ValueError) as e:
        raise LedgerError(f"{path}: {e}") from None


class Ledger:
    """Reads and appends a run's ledger. Safe to use from the driver and the Train controller."""

    def __init__(self, location: RunLocation, writer: str | None = None):
        self.location = location
        self.writer = writer or uuid.uuid4().hex[:8]
        self._last_ns = 0

    @property
    def directory(self) -> str:
        return self.location.path(LEDGER_DIR)

    def ensure_dirs(self) -> None:
        call_with_retry(
            lambda: self.location.fs.create_dir(self.directory, recursive=True), "create the ledger directory",
            permanent=LedgerError,
        )

    def append(
        self,
        event: Event,
        tier: int,
        decision: dict[str, Any] | None = None,
        info: dict[str, Any] | None = None,
    ) -> LedgerRecord:
        record = LedgerRecord(
            id=uuid.uuid4().hex, writer=self.writer, tier=tier, event=event, decision=decision, info=info or {}
        )
        # Names sort in event order; nanoseconds are forced strictly increasing per writer.
        ns = max(int(event.t * 1e9), self._last_ns + 1)
        self._last_ns = ns
        name = f"{ns:020d}-{self.writer}-{event.kind}.json"
        payload = json.dumps(record.to_json(), sort_keys=True).encode()
        path = f"{self.directory}/{name}"
        call_with_retry(
            lambda: write_atomically(self.location.fs, path, payload), f"write ledger event {name}", permanent=LedgerError
        )
        return record

    def read(self) -> list[LedgerRecord]:
        """All records in order. Duplicates (same id) are dropped; damaged objects are errors."""
        fs = self.location.fs

        def listing() -> list[pafs.FileInfo]:
            return list_dir(fs, self.directory)

        infos = call_with_retry(listing, "list the ledger", permanent=LedgerError)
        names = sorted(
            i.path for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith(TMP_PREFIX)
        )
        records: list[LedgerRecord] = []
        seen: set[str] = set()
        for path in names:
            if not path.endswith(".json"):
                raise LedgerError(f"{path}: unexpected object in the ledger directory (only *.json events belong there)")
            raw = call_with_retry(partial(_read_all, fs, path), f"read {path}", permanent=LedgerError)
            record = parse_record(raw, path)
            if record.id in seen:
                continue
            seen.add(record.id)
            records.append(record)
        return records

    # -- run metadata -------------------------------------------------------------------

    def write_meta(self, ladder: Ladder, extra: dict[str, Any] | None = None) -> None:
        meta = {"v": FORMAT_VERSION, "tiers": [t.model_dump(mode="json") for t in ladder.tiers], **(extra or {})}
        payload = json.dumps(meta, sort_keys=True, indent=1).encode()
        call_with_retry(
            lambda: write_atomically(self.location.fs, self.location.path(RUN_META), payload), "write run metadata",
            permanent=LedgerError,
        )

    def read_meta(self) -> dict[str, Any] | None:
        path = self.location.path(RUN_META)
        fs = self.location.fs

        def load() -> bytes | None:
            if fs.get_file_info(path).type != pafs.FileType.File:
                return None
            return fs.open_input_stream(path).readall()

        raw = call_with_retry(load, "read run metadata", permanent=LedgerError)
        if raw is None:
            return None
        try:
            meta = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LedgerError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("tiers"), list):
            raise LedgerError(f"{path}: expected an object with a 'tiers' list")
        return meta

    def read_ladder(self) -> Ladder | None:
        meta = self.read_meta()
        if meta is None:
            return None
        from pydantic import ValidationError

        from spotfallback.config import format_validation_error

        try:
            return Ladder.model_validate({"tiers": meta["tiers"]})
        except ValidationError as e:
            raise LedgerError(f"{self.location.path(RUN_META)}: {format_validation_error(e)}") from None


class LedgerTail:
    """Reads a ledger incrementally: each poll lists the directory and reads only new objects.

    Unlike ``Ledger.read`` it does not wait out an outage (a watcher polls again anyway, and
    says so), and it skips objects that are not events rather than refusing them.
    """

    def __init__(self, location: RunLocation):
        self.location = location
        self._records: dict[str, LedgerRecord] = {}

    def poll(self) -> list[LedgerRecord]:
        fs = self.location.fs
        for info in sorted(list_dir(fs, self.location.path(LEDGER_DIR)), key=lambda i: i.path):
            name = info.base_name
            if info.type != pafs.FileType.File or name.startswith(TMP_PREFIX) or not name.endswith(".json"):
                continue
            if info.path in self._records:
                continue
            try:
                raw = fs.open_input_stream(info.path).readall()
            except OSError as e:
                raise LedgerError(f"{info.path}: cannot read ledger event ({e})") from None
            self._records[info.path] = parse_record(raw, info.path)
        out: list[LedgerRecord] = []
        seen: set[str] = set()
        for path in sorted(self._records):
            rec = self._records[path]
            if rec.id not in seen:
                seen.add(rec.id)
                out.append(rec)
        return out
