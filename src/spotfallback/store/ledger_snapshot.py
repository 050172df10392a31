"""The ledger's snapshot: a run's replay so far, stored, so a reader of a long run reads only what came after.

A run that checkpoints every two minutes writes 10,000 events in two weeks. Segments
(``store.segments``) make reading them a few requests, but every reader still decoded and
replayed each event: ``status`` and the driver's resume cost the length of the run in CPU.
After each compaction the compacting writer stores one object, ``ledger/snapshot/snapshot.json``
(written whole, ``write_atomically``): the accounting's carry (``accounting.Carry``: the policy
state and the hours and spend so far) over a prefix of the ledger, which segments that prefix is,
the name of its last event, and what readers need of the records without reading them all
(the latest ones, the latest of each kind, the latest progress report, the latest committed
checkpoints, the digest `report` replays and a sample of the checkpoints it draws).

A reader (``Ledger.read_view``) trusts it only when it fits the ledger it lists: the same format
and ladder, every segment it covers still there, and every event it does not cover named after
its last event. Anything else (a late event from an agent whose clock is behind, loose events left
by a compaction that crashed before deleting them, a snapshot of another ladder) and the reader
reads the whole ledger, as a ledger without a snapshot reads; the next compaction stores a
snapshot that fits again. A crash while writing it leaves a temporary object readers skip, or
the older snapshot, which still fits.

Pure: the format and how a snapshot advances over new records; ``store.ledger`` does the I/O.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotfallback.accounting import Carry, fold
from spotfallback.config import Ladder
from spotfallback.events import CheckpointCommitted, LedgerRecord
from spotfallback.policy import PolicyState
from spotfallback.store.heartbeat import PROGRESS_KEYS

SNAPSHOT_DIR = "snapshot"
SNAPSHOT_OBJECT = "snapshot.json"
SNAPSHOT_FORMAT = 2  # 1 had no digest: read as no snapshot, replaced at the next compaction
RECENT = 50  # latest records kept: `status --events` up to this many reads no other record
KEEP_COMMITTED = 64  # latest committed checkpoints kept by name: more than Ray keeps by default
KEEP_CHECKPOINTS = 64  # latest (t, step, path) the carry keeps; its count stays whole
SAMPLE = 256  # checkpoints the timeline draws from the snapshot: between SAMPLE and 2 x SAMPLE, evenly by count


def ladder_hash(ladder: Ladder) -> str:
    """The ladder a carry was replayed with: another ladder replays the same events differently."""
    tiers = [t.model_dump(mode="json") for t in ladder.tiers]
    return hashlib.sha256(json.dumps(tiers, sort_keys=True).encode()).hexdigest()[:16]


def has_progress(record: LedgerRecord) -> bool:
    """Whether a committed checkpoint reports a progress metric (as ``view.snapshot.find_progress`` reads it)."""
    if not isinstance(record.event, CheckpointCommitted):
        return False
    metrics = dict(record.info.get("metrics") or {})
    if record.event.step is not None:
        metrics.setdefault("step", record.event.step)
    return any(isinstance(metrics.get(k), int | float) and not isinstance(metrics.get(k), bool) for k in PROGRESS_KEYS)


def committed_name(record: LedgerRecord) -> str | None:
    """A committed checkpoint's directory name, as Ray's snapshot names it."""
    if not isinstance(record.event, CheckpointCommitted):
        return None
    return posixpath.basename(str(record.event.path).rstrip("/"))


@dataclass(frozen=True)
class LedgerSnapshot:
    """The ledger up to the event named ``last``: every event of ``segments`` and none other."""

    last: str
    segments: frozenset[str]  # base names of the segment objects it covers
    carry: Carry
    recent: tuple[LedgerRecord, ...] = ()  # the latest RECENT records, in order
    latest: Mapping[str, LedgerRecord] = field(default_factory=dict)  # the latest record of each kind
    latest_t: Mapping[str, float] = field(default_factory=dict)  # the greatest time of each kind
    progress: LedgerRecord | None = None  # the checkpoint reporting progress with the greatest time (the first of ties)
    digest: tuple[LedgerRecord, ...] = ()  # every record but a checkpoint followed by another (``digest``)
    committed: tuple[str, ...] = ()  # the latest KEEP_COMMITTED committed checkpoints' names
    sample: tuple[tuple[int, LedgerRecord], ...] = ()  # (ordinal, checkpoint) for each ordinal divisible by ``stride``
    stride: int = 1
    counted: int = 0  # checkpoints committed in the events it covers: the sample's ordinals

    @property
    def events(self) -> int:
        return self.carry.events

    def to_json(self, ladder: Ladder) -> dict[str, Any]:
        return {
            "v": SNAPSHOT_FORMAT, "ladder": ladder_hash(ladder), "last": self.last, "segments": sorted(self.segments),
            "carry": self.carry.to_json(KEEP_CHECKPOINTS), "recent": [r.to_json() for r in self.recent],
            "latest": {k: r.to_json() for k, r in self.latest.items()}, "latest_t": dict(self.latest_t),
            "progress": None if self.progress is None else self.progress.to_json(),
            "digest": [r.to_json() for r in self.digest], "committed": list(self.committed),
            "sample": [[n, r.to_json()] for n, r in self.sample], "stride": self.stride,
            "counted": self.counted,
        }


def encode_snapshot(snapshot: LedgerSnapshot, ladder: Ladder) -> bytes:
    return json.dumps(snapshot.to_json(ladder), sort_keys=True).encode()


def decode_snapshot(raw: bytes, ladder: Ladder) -> LedgerSnapshot | None:
    """The stored snapshot, or None when it is not one of this format and ladder (the reader reads everything)."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("v") != SNAPSHOT_FORMAT or data.get("ladder") != ladder_hash(ladder):
            return None
        records = LedgerRecord.from_json
        progress = data["progress"]
        return LedgerSnapshot(
            last=str(data["last"]), segments=frozenset(str(s) for s in data["segments"]),
            carry=Carry.from_json(data["carry"]), recent=tuple(records(r) for r in data["recent"]),
            latest={str(k): records(r) for k, r in data["latest"].items()},
            latest_t={str(k): float(t) for k, t in data["latest_t"].items()},
            progress=None if progress is None else records(progress),
            digest=tuple(records(r) for r in data["digest"]), committed=tuple(str(n) for n in data["committed"]),
            sample=tuple((int(n), records(r)) for n, r in data["sample"]), stride=int(data["stride"]),
            counted=int(data["counted"]),
        )
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError):
        return None


def advance(ladder: Ladder, snapshot: LedgerSnapshot | None, records: Sequence[tuple[str, LedgerRecord]],
            segments: Sequence[str]) -> LedgerSnapshot:
    """``snapshot`` (None: an empty ledger) carried over ``records`` (name, record), in order: all the events of ``segments``."""
    prev = snapshot
    recs = [r for _, r in records]
    latest = dict(prev.latest) if prev else {}
    latest_t = dict(prev.latest_t) if prev else {}
    progress = prev.progress if prev else None
    committed = list(prev.committed) if prev else []
    for r in recs:
        kind = r.event.kind
        latest[kind] = r
        latest_t[kind] = max(latest_t.get(kind, r.t), r.t)
        if has_progress(r) and (progress is None or r.t > progress.t):
            progress = r
        name = committed_name(r)
        if name is not None:
            committed.append(name)
    counted = (prev.counted if prev else 0) + sum(isinstance(r.event, CheckpointCommitted) for r in recs)
    sample, stride = sample_checkpoints(prev.sample if prev else (), prev.stride if prev else 1,
                                        prev.counted if prev else 0, recs)
    return LedgerSnapshot(
        last=records[-1][0] if records else (prev.last if prev else ""),
        segments=(prev.segments if prev else frozenset()) | {posixpath.basename(s) for s in segments},
        carry=fold(ladder, recs, prev.carry if prev else None),
        recent=((prev.recent if prev else ()) + tuple(recs))[-RECENT:],
        latest=latest, latest_t=latest_t, progress=progress, digest=digest(prev.digest if prev else (), recs),
        committed=tuple(committed[-KEEP_COMMITTED:]), sample=sample, stride=stride,
        counted=counted,
    )


def start_state(base: LedgerSnapshot | None) -> PolicyState | None:
    """The policy's state after the events ``base`` covers (None: the run's start), to replay the rest from."""
    return base.carry.summary.state if base is not None else None


def latest_records(base: LedgerSnapshot | None, records: Sequence[LedgerRecord]) -> list[LedgerRecord]:
    """The latest records of the whole ledger: ``base``'s kept ones, then ``records`` (those after it)."""
    return [*base.recent, *records] if base is not None else list(records)


def digest_records(base: LedgerSnapshot | None, records: Sequence[LedgerRecord]) -> list[LedgerRecord]:
    """What replays as the whole ledger for `report`'s intervals and counts: ``base``'s digest, then ``records``."""
    return [*base.digest, *records] if base is not None else list(records)


def digest(done: Sequence[LedgerRecord], records: Sequence[LedgerRecord]) -> tuple[LedgerRecord, ...]:
    """``done`` (a digest) extended by ``records``: every record but a checkpoint followed by another.

    Why: a long run is mostly committed checkpoints, and of a run of them what `report` replays
    (``view.intervals``: waiting, redone and held time, announced evictions, every count but the
    checkpoints') depends only on the last one: the time work was last saved. The records around
    them, and so the tier each record hands on to the next, are all kept. Bounded by the run's
    faults, moves and notices, not by its length.
    """
    out = list(done)
    for r in records:
        if isinstance(r.event, CheckpointCommitted) and out and isinstance(out[-1].event, CheckpointCommitted) \
                and out[-1].tier == r.tier:
            out[-1] = r
        else:
            out.append(r)
    return tuple(out)


def sample_checkpoints(sample: Sequence[tuple[int, LedgerRecord]], stride: int, count: int,
                       records: Sequence[LedgerRecord]) -> tuple[tuple[tuple[int, LedgerRecord], ...], int]:
    """(sample, stride) after ``records``, ``count`` checkpoints having come before them.

    The timeline's ticks and progress line need a few hundred checkpoints spread over the run,
    not all 20,000: every ``stride``-th by count, the stride doubling whenever the sample
    passes 2 x SAMPLE, so it stays evenly spread however long the run gets.
    """
    out = list(sample)
    for r in records:
        if not isinstance(r.event, CheckpointCommitted):
            continue
        count += 1
        if count % stride == 0:
            out.append((count, r))
        if len(out) > 2 * SAMPLE:
            stride *= 2
            out = [(n, c) for n, c in out if n % stride == 0]
    return tuple(out), stride


def covered_prefix(items: Sequence[tuple[str, LedgerRecord, str | None]]) -> int:
    """How many of ``items`` (name, record, segment path or None for a loose event), sorted by name,
    a new snapshot may cover: the longest prefix made of whole segments and no loose event."""
    left: dict[str, int] = {}
    for _, _, segment in items:
        if segment is not None:
            left[segment] = left.get(segment, 0) + 1
    open_segments: set[str] = set()
    cut = 0
    for i, (_, _, segment) in enumerate(items):
        if segment is None:
            break
        left[segment] -= 1
        open_segments.add(segment)
        if left[segment] == 0:
            open_segments.discard(segment)
        if not open_segments:
            cut = i + 1
    return cut
