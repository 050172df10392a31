"""Ledger segments: many events held exactly in one object, so reading a long run stays cheap.

A run that checkpoints every two minutes writes 10,000 events in two weeks; one object per event
makes every read (resume, ``status``, ``report``, the progress watcher) list and fetch them all.
Compaction (``Ledger.compact``) moves full chunks of loose events into one segment each:

1. the segment is written whole (``write_atomically``) under ``ledger/segments/``;
2. only then are the chunk's loose objects deleted.

A crash before step 1 ends leaves the loose events (and at most a temporary object readers
skip); a crash in step 2 leaves some events both loose and in the segment, and readers key
events by their object name, so each is read once. Each entry keeps the event's object name,
which is its place in the ledger's order: a late event from another writer (a notice agent
whose clock is behind) lands in a later segment and still sorts where it belongs.

Pure: the format and the choice of chunks; ``store.ledger`` does the I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from spotfallback.errors import LedgerError
from spotfallback.events import LedgerRecord

SEGMENTS_DIR = "segments"
SEGMENT_FORMAT = 1
# A ledger event's object name (``Ledger.append``): it sorts in event order.
EVENT_NAME = re.compile(r"[^/.][^/]*\.json")


def segment_name(entries: Sequence[tuple[str, Any]], tag: str) -> str:
    """``{first event}--{last event}-{tag}.json``: readable, and unique per compacting writer."""
    first, last = entries[0][0].split("-", 1)[0], entries[-1][0].split("-", 1)[0]
    return f"{first}--{last}-{tag}.json"


def encode_segment(entries: Sequence[tuple[str, dict[str, Any]]]) -> bytes:
    """(event object name, record JSON) pairs, in order, as one object."""
    return json.dumps({"v": SEGMENT_FORMAT, "events": [[n, r] for n, r in entries]}, sort_keys=True).encode()


def decode_segment(raw: bytes, path: str) -> list[tuple[str, LedgerRecord]]:
    """The (event name, record) pairs of a stored segment, or a ``LedgerError`` naming what is wrong."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LedgerError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("v") != SEGMENT_FORMAT or not isinstance(data.get("events"), list):
        raise LedgerError(f"{path}: not a ledger segment (expected {{'v': {SEGMENT_FORMAT}, 'events': [...]}})")
    out: list[tuple[str, LedgerRecord]] = []
    for i, entry in enumerate(data["events"]):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and EVENT_NAME.fullmatch(entry[0])):
            raise LedgerError(f"{path}: entry {i} is not [event object name, record]")
        try:
            out.append((entry[0], LedgerRecord.from_json(entry[1])))
        except (TypeError, ValueError) as e:
            raise LedgerError(f"{path}: {entry[0]}: {e}") from None
    return out


def chunks_to_compact(names: Sequence[str], every: int) -> list[list[str]]:
    """The loose events (sorted names) to move, in full chunks of ``every``; the rest stay loose.

    Only full chunks: a segment per compaction of a few events would make reads grow with the
    number of compactions instead of the number of events.
    """
    if every <= 0:
        return []
    ordered = sorted(names)
    full = len(ordered) - len(ordered) % every
    return [ordered[i : i + every] for i in range(0, full, every)]
