"""The run ledger: an append-only record of every event, one JSON object per event.

Object stores (S3, GCS) cannot append, so each event is its own object, named so that a
lexical sort is the order of events (``{time_ns}-{writer}-{kind}.json``). Each object is
written under a temporary name and moved into place, so a crash never leaves a torn event
that replay would read. Replaying the events through the pure policy rebuilds the run's
state exactly; ``accounting.summarize`` turns them into hours and spend.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow.fs as pafs

from spotfallback.config import Ladder
from spotfallback.events import Event, event_from_json
from spotfallback.store.location import RunLocation, list_dir

logger = logging.getLogger(__name__)

LEDGER_DIR = "ledger"
RUN_META = "run.json"
FORMAT_VERSION = 1

T = TypeVar("T")


class LedgerError(RuntimeError):
    """The ledger cannot be read or written; the message names the object."""


class StorageUnavailableError(LedgerError):
    """Storage stayed unreachable past ``SPOTFALLBACK_STORAGE_RETRY_S``; what was written is intact."""


def with_storage_retry(fn: Callable[[], T], what: str, limit_s: float | None = None) -> T:
    """Run a storage call, retrying transient errors with a bounded, logged back-off.

    The limit (``SPOTFALLBACK_STORAGE_RETRY_S``, default 120 s) bounds how long a run waits
    for storage to come back before it stops with a clear error; nothing written is touched.
    """
    limit = float(os.environ.get("SPOTFALLBACK_STORAGE_RETRY_S", "120")) if limit_s is None else limit_s
    deadline = time.monotonic() + limit
    delay = 0.2
    while True:
        try:
            return fn()
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise LedgerError(f"storage error while trying to {what}: {e}") from e
            if time.monotonic() + delay > deadline:
                raise StorageUnavailableError(
                    f"storage unavailable for {limit:g}s (SPOTFALLBACK_STORAGE_RETRY_S) while trying to {what}: {e}. "
                    "Everything written before is intact; run the same command again once storage is back."
                ) from e
            logger.warning("storage error while trying to %s (%s); retrying in %.1fs", what, e, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


@dataclass(frozen=True)
class LedgerRecord:
    """One event as stored: the event, the tier it happened on and what the policy decided."""

    id: str
    writer: str
    tier: int
    event: Event
    decision: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def t(self) -> float:
        return self.event.t

    def to_json(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "id": self.id,
            "writer": self.writer,
            "tier": self.tier,
            "event": self.event.to_json(),
            "decision": self.decision,
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> LedgerRecord:
        try:
            if not isinstance(data, dict):
                raise ValueError("a ledger record must be a JSON object")
            if data.get("v") != FORMAT_VERSION:
                raise ValueError(f"unsupported ledger format version {data.get('v')!r}")
            tier = data["tier"]
            if not isinstance(tier, int) or isinstance(tier, bool) or tier < 0:
                raise ValueError("field 'tier' must be a non-negative integer")
            for key in ("id", "writer"):
                if not isinstance(data[key], str):
                    raise ValueError(f"field {key!r} must be a string")
            info = data.get("info") or {}
            if not isinstance(info, dict):
                raise ValueError("field 'info' must be an object")
            decision = data.get("decision")
            if decision is not None and not isinstance(decision, dict):
                raise ValueError("field 'decision' must be an object or null")
            return cls(
                id=str(data["id"]),
                writer=str(data["writer"]),
                tier=tier,
                event=event_from_json(data["event"]),
                decision=decision,
                info=info,
            )
        except KeyError as e:
            raise LedgerError(f"{source}: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise LedgerError(f"{source}: {e}") from None


def _write_atomic(fs: pafs.FileSystem, path: str, payload: bytes) -> None:
    directory, _, base = path.rpartition("/")
    tmp = f"{directory}/.tmp-{uuid.uuid4().hex}-{base}"
    with fs.open_output_stream(tmp) as out:
        out.write(payload)
    fs.move(tmp, path)


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
        with_storage_retry(lambda: self.location.fs.create_dir(self.directory, recursive=True), "create the ledger directory")

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
        with_storage_retry(lambda: _write_atomic(self.location.fs, path, payload), f"write ledger event {name}")
        return record

    def read(self) -> list[LedgerRecord]:
        """All records in order. Duplicates (same id) are dropped; damaged objects are errors."""
        fs = self.location.fs

        def listing() -> list[pafs.FileInfo]:
            return list_dir(fs, self.directory)

        infos = with_storage_retry(listing, "list the ledger")
        names = sorted(
            i.path for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith(".tmp-")
        )
        records: list[LedgerRecord] = []
        seen: set[str] = set()
        for path in names:
            if not path.endswith(".json"):
                raise LedgerError(f"{path}: unexpected object in the ledger directory (only *.json events belong there)")
            raw = with_storage_retry(lambda p=path: fs.open_input_stream(p).readall(), f"read {path}")
            try:
                data = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise LedgerError(f"{path}: not valid JSON ({e})") from None
            record = LedgerRecord.from_json(data, path)
            if record.id in seen:
                continue
            seen.add(record.id)
            records.append(record)
        return records

    # -- run metadata -------------------------------------------------------------------

    def write_meta(self, ladder: Ladder, extra: dict[str, Any] | None = None) -> None:
        meta = {"v": FORMAT_VERSION, "tiers": [t.model_dump(mode="json") for t in ladder.tiers], **(extra or {})}
        payload = json.dumps(meta, sort_keys=True, indent=1).encode()
        with_storage_retry(lambda: _write_atomic(self.location.fs, self.location.path(RUN_META), payload), "write run metadata")

    def read_meta(self) -> dict[str, Any] | None:
        path = self.location.path(RUN_META)
        fs = self.location.fs

        def load() -> bytes | None:
            if fs.get_file_info(path).type != pafs.FileType.File:
                return None
            return fs.open_input_stream(path).readall()

        raw = with_storage_retry(load, "read run metadata")
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
