"""The run ledger: an append-only record of every event, one JSON object per event, compacted.

Object stores (S3, GCS) cannot append, so each event is first its own object, named so that a
lexical sort is the order of events (``{time_ns}-{writer}-{kind}.json``). Each object is
written whole (on S3 one create-if-absent PUT, ``store.objects``; elsewhere under a temporary
name, then moved into place), so a crash never leaves a torn event that replay would read. Replaying the events through the pure policy rebuilds the run's
state exactly; ``accounting.summarize`` turns them into hours and spend. ``Ledger.read`` reads
it whole (the driver, the controller); ``LedgerTail`` reads only what is new at each poll (a
watcher on a growing run).

A run lasts weeks, so the writer compacts as it goes: every ``compact_every`` loose events it
knows of, full chunks of them move into segments (``store.segments``: the segment is written
whole first, the loose objects deleted after). A read then lists two short directories and
fetches the segments and the loose tail in parallel (``store.reads``), however long the run;
a ledger written before segments existed is all loose events, and reads as it always did.
After each compaction the writer also stores the ledger's snapshot (``store.ledger_snapshot``:
the replay and accounting of every whole segment so far); ``read_view`` returns it and only the
records after it, so `status`, `report`, the progress display and the driver's resume cost the
same on a long run as on a short one; ``read`` still returns every record.

Every storage call goes through ``store.retry.call_with_retry``: an outage shorter than the
limit only pauses, and an error no wait can fix is a ``LedgerError`` naming what was tried.
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow.fs as pafs

from spotfallback.config import Ladder
from spotfallback.errors import LedgerError
from spotfallback.events import FORMAT_VERSION, Event, LedgerRecord
from spotfallback.policy import PolicyState
from spotfallback.store.ledger_snapshot import (
    SNAPSHOT_DIR,
    SNAPSHOT_OBJECT,
    LedgerSnapshot,
    advance,
    covered_prefix,
    decode_snapshot,
    encode_snapshot,
    latest_records,
    start_state,
)
from spotfallback.store.location import TMP_PREFIX, RunLocation, list_dir, write_atomically
from spotfallback.store.objects import s3_objects
from spotfallback.store.reads import delete_objects, read_objects
from spotfallback.store.retry import call_with_retry
from spotfallback.store.segments import (
    SEGMENTS_DIR,
    chunks_to_compact,
    decode_segment,
    encode_segment,
    segment_name,
)

logger = logging.getLogger(__name__)

LEDGER_DIR = "ledger"
RUN_META = "run.json"
# Loose events per segment: a 20,000-event run reads 40 segments, and a loose tail under 500.
COMPACT_EVERY = 500
# A read whose loose events keep moving into segments under it lists again, this many times.
_READ_ATTEMPTS = 5


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


def _json_object(raw: bytes, path: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LedgerError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise LedgerError(f"{path}: a ledger record must be a JSON object")
    return data


def _write_new(fs: pafs.FileSystem, path: str, payload: bytes) -> None:
    """Create ``path`` whole: on S3 one create-if-absent PUT (``store.objects``), else a temporary name moved into place.

    Create-if-absent because event and segment names are unique per writer: finding another
    object there means a second writer under the same name, which must not be overwritten.
    """
    s3 = s3_objects(fs)
    if s3 is None:
        write_atomically(fs, path, payload)
    else:
        s3.create(path, payload)


def _write_whole(fs: pafs.FileSystem, path: str, payload: bytes) -> None:
    """Replace ``path`` whole: on S3 one PUT (atomic by itself), else a temporary name moved into place."""
    s3 = s3_objects(fs)
    if s3 is None:
        write_atomically(fs, path, payload)
    else:
        s3.put(path, payload)


def _delete_compacted(fs: pafs.FileSystem, paths: list[str]) -> None:
    """Delete loose events a segment now holds: on S3 up to 1,000 per request, else one by one on threads."""
    s3 = s3_objects(fs)
    if s3 is None:
        delete_objects(fs, paths)
    else:
        call_with_retry(partial(s3.delete, paths), f"delete {len(paths)} compacted ledger events", permanent=LedgerError)


def _files(infos: Iterable[pafs.FileInfo]) -> list[pafs.FileInfo]:
    """The files of a ledger listing that may be events: not hidden (our own ``TMP_PREFIX`` objects
    of a crash mid-write, a desktop's ``.DS_Store``, rsync's ``.name.json.XXXXXX``), nor a copy
    tool's partial object (gsutil's ``*.gstmp``), any of which a run synced down may hold."""
    return sorted((i for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith((".", TMP_PREFIX))
                   and not i.base_name.endswith(".gstmp")), key=lambda i: i.path)


@dataclass(frozen=True)
class LedgerView:
    """A ledger read from its snapshot: the snapshot (None: none fits) and every record after it, in order."""

    snapshot: LedgerSnapshot | None
    tail: list[LedgerRecord]

    @property
    def events(self) -> int:
        return (self.snapshot.events if self.snapshot else 0) + len(self.tail)

    @property
    def start_state(self) -> PolicyState | None:
        """The policy's state before ``tail`` (None: the run's start): replaying ``tail`` from it is the whole replay."""
        return start_state(self.snapshot)

    @property
    def latest(self) -> list[LedgerRecord]:
        """The latest records, ending as the whole ledger ends."""
        return latest_records(self.snapshot, self.tail)


def _sourced_in_order(by_name: dict[str, tuple[LedgerRecord, str | None]]) -> list[tuple[str, LedgerRecord, str | None]]:
    """(name, record, segment) in event order (their object names), each record id once."""
    out: list[tuple[str, LedgerRecord, str | None]] = []
    seen: set[str] = set()
    for name in sorted(by_name):
        record, segment = by_name[name]
        if record.id not in seen:
            seen.add(record.id)
            out.append((name, record, segment))
    return out


def _in_order(by_name: dict[str, LedgerRecord]) -> list[LedgerRecord]:
    """Records in event order, each id once (``_sourced_in_order`` without the names and segments)."""
    return [record for _, record, _ in _sourced_in_order({name: (record, None) for name, record in by_name.items()})]


class Ledger:
    """Reads and appends a run's ledger. Safe to use from the driver and the Train controller.

    ``compact_every`` (0: never) is how many loose events this writer lets gather before it
    compacts them, counted from its own reads and appends; compaction runs after an append,
    once the event is durable, and a failed one is logged and tried again later.
    """

    def __init__(self, location: RunLocation, writer: str | None = None, *, compact_every: int = COMPACT_EVERY):
        if compact_every < 0:
            raise ValueError(f"compact_every must be 0 (never) or more, got {compact_every}")
        self.location = location
        self.writer = writer or uuid.uuid4().hex[:8]
        self.compact_every = compact_every
        self._last_ns = 0
        # Loose events this instance has read or written, by object path: compaction need not fetch them again.
        self._loose: dict[str, bytes] = {}
        self._loose_count = 0
        self._ladder: Ladder | None = None

    @property
    def directory(self) -> str:
        return self.location.path(LEDGER_DIR)

    @property
    def segments_directory(self) -> str:
        return self.location.path(LEDGER_DIR, SEGMENTS_DIR)

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
            lambda: _write_new(self.location.fs, path, payload), f"write ledger event {name}", permanent=LedgerError
        )
        self._loose[path] = payload
        self._loose_count += 1
        if self.compact_every and self._loose_count >= self.compact_every:
            try:
                self.compact()
            except LedgerError as e:  # the event is durable; the loose tail only grows until the next try
                logger.warning("could not compact the ledger (tried again after %d more events): %s", self.compact_every, e)
                self._loose_count = 0
        return record

    # -- reading ------------------------------------------------------------------------

    def _list(self, *, strict: bool, limit_s: float | None = None) -> tuple[list[str], list[str]]:
        """(loose event paths, segment paths), sorted. Loose events are listed first: an event
        compacted after that listing is in a segment the second listing sees."""
        fs = self.location.fs
        loose = _files(call_with_retry(partial(list_dir, fs, self.directory), "list the ledger", limit_s,
                                       permanent=LedgerError))
        segments = _files(call_with_retry(partial(list_dir, fs, self.segments_directory), "list the ledger segments",
                                          limit_s, permanent=LedgerError))
        if strict:
            for info in (*loose, *segments):
                if not info.path.endswith(".json"):
                    raise LedgerError(
                        f"{info.path}: unexpected object in the ledger directory (only *.json events belong there)"
                    )
        else:
            loose = [i for i in loose if i.path.endswith(".json")]
            segments = [i for i in segments if i.path.endswith(".json")]
        return [i.path for i in loose], [i.path for i in segments]

    def _read_sourced(self, covered: frozenset[str] = frozenset()) -> dict[str, tuple[LedgerRecord, str | None]] | None:
        """Every record by its event object name, with the segment holding it (None: loose), read
        from one consistent listing; the events of the segments named in ``covered`` are left out
        (None: one of those is not listed)."""
        fs = self.location.fs
        for _ in range(_READ_ATTEMPTS):
            loose, segments = self._list(strict=True)
            if covered - {posixpath.basename(s) for s in segments}:
                return None
            segments = [s for s in segments if posixpath.basename(s) not in covered]
            unknown = [p for p in loose if p not in self._loose]
            raws = read_objects(fs, segments + unknown)
            if any(raw is None for raw in raws):
                continue  # compacted (or merged) while it was read: list again
            by_name: dict[str, tuple[LedgerRecord, str | None]] = {}
            for path, raw in zip(segments, raws, strict=False):
                assert raw is not None
                for name, record in decode_segment(raw, path):
                    by_name.setdefault(name, (record, path))
            fetched = dict(zip(unknown, raws[len(segments) :], strict=True))
            known = self._loose
            self._loose = {}
            for path in loose:
                raw = known.get(path) or fetched[path]
                assert raw is not None
                by_name.setdefault(posixpath.basename(path), (parse_record(raw, path), None))
                self._loose[path] = raw
            self._loose_count = len(loose)
            return by_name
        raise LedgerError(f"{self.directory}: the ledger kept changing while it was read ({_READ_ATTEMPTS} tries)")

    def read(self, ladder: Ladder | None = None) -> list[LedgerRecord]:
        """All records in order. Duplicates (same id) are dropped; damaged objects are errors, and
        so, given the run's ``ladder``, is a record of a tier it does not have."""
        by_name = self._read_sourced()
        assert by_name is not None  # nothing is covered
        items = _sourced_in_order(by_name)
        return [r for _, r, _ in (items if ladder is None else self._on_ladder(items, ladder))]

    def read_snapshot(self, ladder: Ladder) -> LedgerSnapshot | None:
        """The stored snapshot if it is one of this format and ladder (whether it fits the ledger is ``read_view``'s to check)."""
        path = self.snapshot_path
        fs = self.location.fs
        [raw] = read_objects(fs, [path])
        return None if raw is None else decode_snapshot(raw, ladder)

    def read_view(self, ladder: Ladder) -> LedgerView:
        """The stored snapshot where it fits the ledger, and the records after it, in order.

        Without a fitting snapshot: no snapshot and every record, as ``read`` returns them. Either
        way ``summarize(view.tail, start=view.snapshot.carry)`` is the replay of the whole ledger.
        """
        view, _ = self._read_view(ladder)
        return view

    def _read_view(self, ladder: Ladder) -> tuple[LedgerView, list[tuple[str, LedgerRecord, str | None]]]:
        snapshot = self.read_snapshot(ladder)
        if snapshot is not None:
            by_name = self._read_sourced(snapshot.segments)
            if by_name is not None and (not by_name or min(by_name) > snapshot.last):
                items = self._on_ladder(_sourced_in_order(by_name), ladder)
                return LedgerView(snapshot, [r for _, r, _ in items]), items
            logger.debug("the ledger snapshot does not fit the ledger (a segment it covers is gone, or an event "
                         "it does not cover is named before its last): reading everything")
        whole = self._read_sourced()
        assert whole is not None  # nothing is covered
        items = self._on_ladder(_sourced_in_order(whole), ladder)
        return LedgerView(None, [r for _, r, _ in items]), items

    def _on_ladder(
        self, items: list[tuple[str, LedgerRecord, str | None]], ladder: Ladder
    ) -> list[tuple[str, LedgerRecord, str | None]]:
        """``items``, once each names only tiers of ``ladder``: a record of another tier would be
        billed and drawn as no tier of the run (another run's ledger copied in, or a damaged one)."""
        n = len(ladder.tiers)
        for name, record, segment in items:
            top: Any = max(record.tier, getattr(record.event, "tier", 0))
            to = (record.decision or {}).get("to_tier")  # where a fall back, climb or move went
            bad_to = to is not None and (isinstance(to, bool) or not isinstance(to, int) or not 0 <= to < n)
            if bad_to or top >= n:
                top = to if bad_to and top < n else top
                where = f"{segment}: event {name}" if segment else posixpath.join(self.directory, name)
                raise LedgerError(f"{where}: tier {top!r} is not a tier of the run's ladder (its {n} tiers are "
                                  f"0-{n - 1}); this ledger is not the run's ({self.location.path(RUN_META)}), or is damaged")
        return items

    @property
    def snapshot_path(self) -> str:
        return self.location.path(LEDGER_DIR, SNAPSHOT_DIR, SNAPSHOT_OBJECT)

    def write_snapshot(self) -> bool:
        """Store a snapshot covering every whole segment it can (see ``store.ledger_snapshot``); whether one was written.

        Nothing without the run's ladder (``run.json``): a carry is a replay with one ladder.
        """
        ladder = self._ladder or self.read_ladder()
        if ladder is None:
            return False
        self._ladder = ladder
        view, items = self._read_view(ladder)
        cut = covered_prefix(items)
        if cut == 0:
            return False
        covered = items[:cut]
        segments = sorted({s for _, _, s in covered if s is not None})
        snapshot = advance(ladder, view.snapshot, [(n, r) for n, r, _ in covered], segments)
        if s3_objects(self.location.fs) is None:  # S3 has no directories to make: a key is written as it is
            call_with_retry(partial(self.location.fs.create_dir, posixpath.dirname(self.snapshot_path), recursive=True),
                            "create the ledger snapshot directory", permanent=LedgerError)
        call_with_retry(partial(_write_whole, self.location.fs, self.snapshot_path, encode_snapshot(snapshot, ladder)),
                        "write the ledger snapshot", permanent=LedgerError)
        return True

    # -- compaction ---------------------------------------------------------------------

    def compact(self) -> int:
        """Move full chunks of loose events into segments now; how many events were moved.

        Chunks are ``compact_every`` events long (with 0: all loose events, into one segment).

        Safe beside other writers and readers: the segment is durable before any loose event
        is deleted, and a chunk another compactor already moved is left alone.
        """
        fs = self.location.fs
        loose, _ = self._list(strict=False)
        listed = set(loose)
        self._loose = {p: raw for p, raw in self._loose.items() if p in listed}  # others moved the rest
        moved = 0
        chunks = chunks_to_compact(loose, self.compact_every or len(loose) or 1)
        if chunks and s3_objects(fs) is None:  # S3 has no directories to make: a key is written as it is
            call_with_retry(partial(fs.create_dir, self.segments_directory, recursive=True),
                            "create the ledger segments directory", permanent=LedgerError)
        for chunk in chunks:
            unknown = [p for p in chunk if p not in self._loose]
            fetched = dict(zip(unknown, read_objects(fs, unknown), strict=True))
            if any(raw is None for raw in fetched.values()):
                break  # another compactor is moving these: its segment holds them
            entries: list[tuple[str, dict[str, Any]]] = []
            for path in chunk:
                raw = self._loose.get(path) or fetched[path]
                assert raw is not None
                # Moved as stored (a reader checks each record as it always did), so compacting
                # costs the writer no parsing beyond JSON's.
                entries.append((posixpath.basename(path), _json_object(raw, path)))
            target = f"{self.segments_directory}/{segment_name(entries, f'{self.writer}-{uuid.uuid4().hex[:6]}')}"
            call_with_retry(partial(_write_new, fs, target, encode_segment(entries)),
                            f"write ledger segment {target}", permanent=LedgerError)
            _delete_compacted(fs, chunk)
            for path in chunk:
                self._loose.pop(path, None)
            moved += len(chunk)
        self._loose_count = len(loose) - moved
        if moved:
            try:
                self.write_snapshot()
            except LedgerError as e:  # readers read everything meanwhile, as they did before snapshots
                logger.warning("could not write the ledger snapshot (tried again at the next compaction): %s", e)
        return moved

    # -- run metadata -------------------------------------------------------------------

    def write_meta(self, ladder: Ladder, extra: dict[str, Any] | None = None) -> None:
        meta = {"v": FORMAT_VERSION, "tiers": [t.model_dump(mode="json") for t in ladder.tiers], **(extra or {})}
        payload = json.dumps(meta, sort_keys=True, indent=1).encode()
        call_with_retry(
            lambda: _write_whole(self.location.fs, self.location.path(RUN_META), payload), "write run metadata",
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

    def has_events(self) -> bool:
        """Whether any event is stored (loose or in a segment): a run without its ``run.json`` is
        still a run, and says so."""
        loose, segments = self._list(strict=False)
        return bool(loose or segments)

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
    """Reads a ledger incrementally: each poll lists it and reads only new segments and events.

    Unlike ``Ledger.read`` it does not wait out an outage (a watcher polls again anyway, and
    says so), and it skips objects that are not events rather than refusing them. An event
    compacted between listing and reading is skipped: its segment is read at the next poll.

    Given the run's ``ladder`` it starts from the ledger's stored snapshot (``base``) and keeps
    only the records after it, moving on to a newer snapshot at a compaction once more than
    ``rebase_after`` records have gathered, so a watcher of a run of weeks reads and replays what
    a new run's does.
    """

    def __init__(self, location: RunLocation, ladder: Ladder | None = None, *, rebase_after: int = 2 * COMPACT_EVERY):
        self.location = location
        self.ladder = ladder
        self.rebase_after = rebase_after
        self.base: LedgerSnapshot | None = None
        self.fresh: list[LedgerRecord] = []  # the records the latest poll saw first, in order
        self._ledger = Ledger(location, compact_every=0)
        self._by_name: dict[str, LedgerRecord] = {}
        self._segments_read: set[str] = set()  # base names, those ``base`` covers included
        self._started = False

    def _start(self) -> dict[str, LedgerRecord]:
        """Start (again) from the stored snapshot; the records it has not seen before, by name."""
        assert self.ladder is not None
        view, items = self._ledger._read_view(self.ladder)
        unseen = {name: r for name, r, _ in items if name not in self._by_name}
        self.base = view.snapshot
        self._by_name = {name: r for name, r, _ in items}
        self._segments_read = {posixpath.basename(seg) for _, _, seg in items if seg is not None}
        self._segments_read |= view.snapshot.segments if view.snapshot is not None else frozenset()
        self._started = True
        return unseen

    def poll(self) -> list[LedgerRecord]:
        """Every record after ``base`` (every record without a ladder), in order; ``fresh``: those new since the last poll."""
        if self.ladder is not None and not self._started:  # the snapshot and what came after it, nothing older
            new = self._start()
        else:
            loose, segments = self._ledger._list(strict=False, limit_s=0)
            new_segments = [p for p in segments if posixpath.basename(p) not in self._segments_read]
            new_loose = [p for p in loose if posixpath.basename(p) not in self._by_name]
            new = {}
            raws = read_objects(self.location.fs, new_segments + new_loose, limit_s=0)
            for path, raw in zip(new_segments, raws, strict=False):
                if raw is None:
                    continue
                for name, record in decode_segment(raw, path):
                    if name not in self._by_name:
                        new.setdefault(name, record)
                self._segments_read.add(posixpath.basename(path))
            for path, raw in zip(new_loose, raws[len(new_segments) :], strict=True):
                if raw is not None:
                    new.setdefault(posixpath.basename(path), parse_record(raw, path))
            self._by_name.update(new)
            if self.ladder is not None and new_segments and len(self._by_name) > self.rebase_after:
                new.update(self._start())  # compacted since: a newer snapshot carries the records before it
        self.fresh = _in_order(new)
        return _in_order(self._by_name)
