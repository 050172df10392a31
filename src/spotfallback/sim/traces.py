"""Spot capacity traces: SkyPilot JSON availability traces and node add/remove CSV traces.

Parsing only; the simulator turns these into capacity and preemption processes and the local
cluster replayer drives real nodes from them. Malformed input raises ``TraceError`` whose
message names the file and the line or field, so a CLI can print it as one line.

The JSON files are read as "available instances per tick" (the project's convention in
DESIGN.md). Upstream SkyPilot's generator wrote its 1-node traces as a per-tick *preempted*
flag; ``spotfallback.sim.world.complement_trace`` flips a trace read that way.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeGuard

import numpy as np

from spotfallback.errors import TraceError

__all__ = ["NodeEvent", "NodeTrace", "SpotTrace", "load_node_trace", "load_spot_trace"]


# The longest tick a spot trace may have: one that hides a week of preemptions says nothing of them
# (recorded traces tick every minute to every ten), and far longer ones overflow the trace's hours.
MAX_GAP_S = 7 * 24 * 3600.0
# The shortest: the simulator expands a trace into its ticks over the hours a run may take (the
# hindsight optimum lays out every tick up to the deadline, per start), so its cost grows as one over
# the tick: a second keeps a 1,000 h horizon at 3.6 million ticks, while a 0.1 s tick already took half
# a minute to plan a 10 h job, and 1e-9 s asked for hundreds of TiB. Recorded traces tick every 30 s
# to 10 min (SkyPilot's), and cloud APIs report capacity every few seconds at best.
MIN_GAP_S = 1.0


def _gap_error(where: str, gap: Any) -> str | None:
    """Why ``gap`` is no tick of a spot trace (``where`` names the file and field), or None."""
    if not _is_number(gap) or not math.isfinite(gap) or gap <= 0 or gap > MAX_GAP_S:
        return f"{where} must be a positive number of seconds, at most {MAX_GAP_S:g} (a week), got {_quoted(gap)}"
    if gap < MIN_GAP_S:
        return (f"{where} is {gap:g} s, shorter than the shortest tick accepted, {MIN_GAP_S:g} s (the simulator "
                f"lays out every tick of the hours a run may take); resample the trace to ticks of {MIN_GAP_S:g} s "
                "or more, keeping the least capacity of the ticks each new one covers")
    return None


@dataclass(frozen=True)
class SpotTrace:
    """Available spot instances per tick of ``gap_seconds``, starting at tick 0."""

    name: str
    gap_seconds: float
    available: np.ndarray  # int64, read-only

    def __post_init__(self) -> None:
        # A trace built in Python gets the loader's rules: a zero gap never advances the simulated
        # clock, and a negative one runs it backwards.
        where = f"SpotTrace {self.name!r}"
        gap_error = _gap_error(f"{where}: gap_seconds", self.gap_seconds)
        if gap_error is not None:
            raise TraceError(gap_error)
        raw = np.asarray(self.available)
        if raw.ndim != 1 or not len(raw):
            raise TraceError(f"{where}: available must be a non-empty list of available instances per tick")
        if raw.dtype.kind not in "iuf" or not bool(np.all(np.isfinite(raw))) or bool(np.any(raw < 0)) \
                or bool(np.any(raw != np.round(raw))) or bool(np.any(raw > 2**53)):
            raise TraceError(f"{where}: available must hold non-negative whole numbers of instances, up to 2**53")
        if raw.dtype != np.int64 or raw.flags.writeable:
            available = raw.astype(np.int64)  # a copy: the caller's array stays theirs to change
            available.flags.writeable = False
            object.__setattr__(self, "available", available)

    @property
    def duration_s(self) -> float:
        return self.gap_seconds * len(self.available)

    @property
    def capacity(self) -> int:
        """Most instances ever available: the gang size the trace was recorded for."""
        return int(self.available.max()) if len(self.available) else 0


@dataclass(frozen=True)
class NodeEvent:
    """A node joined (``add``) or left (``remove``) the cluster at ``t_s`` seconds."""

    t_s: float
    action: Literal["add", "remove"]
    node: str


# A first time past this (about 3.2 years, in ms) is a clock's, not an offset from the trace's
# start: Unix-epoch milliseconds (1.7e12 in 2023) as a cluster's own log writes them.
EPOCH_MS = 1e11
# The longest span a node trace may cover: the simulator lays it out a minute a tick (a million ticks).
MAX_NODE_TRACE_S = 2 * 365 * 86400.0


@dataclass(frozen=True)
class NodeTrace:
    """Node arrivals and departures in time order, as recorded on a real spot cluster."""

    name: str
    events: tuple[NodeEvent, ...]

    def __post_init__(self) -> None:
        """The loader's rules, for a trace built in Python: times that never decrease, a node
        removed only while present and added only while absent, and some time spanned."""
        live: set[str] = set()
        last = 0.0
        for i, ev in enumerate(self.events):
            where = f"NodeTrace {self.name!r}: events[{i}]"
            if not isinstance(ev, NodeEvent):
                raise TraceError(f"{where}: expected a NodeEvent(t_s, action, node), got {_quoted(ev)}")
            if not _is_number(ev.t_s) or not last <= ev.t_s < math.inf:
                raise TraceError(f"{where}: t_s must be a number of seconds, not before the previous event's "
                                 f"{last:g}, got {_quoted(ev.t_s)}")
            if ev.action not in ("add", "remove") or not ev.node:
                raise TraceError(f"{where}: expected action 'add' or 'remove' and a node name, got {_quoted(ev)}")
            if (ev.node in live) == (ev.action == "add"):
                raise TraceError(f"{where}: node {ev.node!r} "
                                 f"{'added while already present' if ev.action == 'add' else 'removed but not present'}")
            (live.add if ev.action == "add" else live.remove)(ev.node)
            last = ev.t_s
        if last <= 0:
            raise TraceError(f"NodeTrace {self.name!r}: the events span no time; a trace needs events over the hours it records")
        if self.events[0].t_s * 1000.0 >= EPOCH_MS:
            raise TraceError(f"NodeTrace {self.name!r}: events[0] is at {self.events[0].t_s:g} s, a clock's time; t_s "
                             "counts seconds from the trace's start: subtract the first event's time from each")

    @property
    def duration_s(self) -> float:
        return self.events[-1].t_s if self.events else 0.0

    @property
    def peak(self) -> int:
        """Most nodes present at once: the largest gang the trace can hold."""
        peak = live = 0
        for ev in self.events:
            live += 1 if ev.action == "add" else -1
            peak = max(peak, live)
        return peak


# A node trace's header line.
_HEADER = ("time_ms", "action", "node")

# The first bytes of the packed files a downloaded trace often comes in, and what each is.
_ARCHIVES = ((b"\x1f\x8b", "gzip-compressed (gunzip)"), (b"PK\x03\x04", "a zip archive (unzip)"),
             (b"BZh", "bzip2-compressed (bunzip2)"), (b"\xfd7zXZ\x00", "xz-compressed (unxz)"),
             (b"\x28\xb5\x2f\xfd", "zstd-compressed (unzstd)"))


def _read_text(path: Path) -> str:
    """The file's text; a UTF-8 byte order mark (as some Windows editors and spreadsheet exports
    write) is dropped, so neither the JSON parser nor the CSV header sees it."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a trace file") from None
    except UnicodeDecodeError as e:
        packed = next((kind for magic, kind in _ARCHIVES if e.object[:len(magic)] == magic), None)
        fix = f"; it is {packed}: unpack it first" if packed else ""
        raise TraceError(f"{path}: not UTF-8 text (byte {e.start}){fix}") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from None


# The most of a bad value an error quotes: a one-line JSON trace read as a node trace is megabytes.
_QUOTE_CHARS = 80


def _quoted(value: object) -> str:
    """``repr(value)`` as an error quotes it, cut to ``_QUOTE_CHARS`` characters."""
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else f"{text[:_QUOTE_CHARS]}... ({len(text):,} characters)"


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def load_spot_trace(path: str | Path) -> SpotTrace:
    """Read a SkyPilot JSON trace ``{"metadata": {"gap_seconds": N}, "data": [...]}``.

    Extra top-level keys (``prices``) are ignored; ``data`` must be non-negative integers.
    """
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise TraceError(f"{path}: the file is empty; expected a JSON object "
                         "{\"metadata\": {\"gap_seconds\": N}, \"data\": [...]}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        hint = "; it looks like a node add/remove CSV trace: name it .csv or give it with --node-trace" if _node_csv(text) else ""
        raise TraceError(f"{path}: line {e.lineno}, column {e.colno}: not valid JSON: {e.msg}{hint}") from None
    if not isinstance(doc, dict):
        raise TraceError(f"{path}: expected a JSON object with 'metadata' and 'data', got {type(doc).__name__}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: field 'metadata' is missing or not an object; expected {{\"gap_seconds\": N}}")
    gap = meta.get("gap_seconds")
    gap_error = _gap_error(f"{path}: field 'metadata.gap_seconds'", gap)
    if gap_error is not None or not _is_number(gap):  # the second only narrows: _gap_error refuses non-numbers
        raise TraceError(gap_error or f"{path}: field 'metadata.gap_seconds' must be a number, got {_quoted(gap)}")
    data = doc.get("data")
    if not isinstance(data, list):
        raise TraceError(f"{path}: field 'data' is missing or not a list of available instances per tick")
    if not data:
        raise TraceError(f"{path}: field 'data' is empty; a trace needs at least one tick")
    for i, v in enumerate(data):
        if _is_number(v) and v > 2**53:  # no pool is that big, and int64 would overflow
            raise TraceError(f"{path}: field 'data[{i}]' must be a non-negative integer up to 2**53, got {_quoted(v)}")
        if not (isinstance(v, int) and not isinstance(v, bool)) or v < 0:
            if isinstance(v, float) and v.is_integer() and v >= 0:
                continue
            raise TraceError(f"{path}: field 'data[{i}]' must be a non-negative integer, got {_quoted(v)}")
    available = np.asarray(data, dtype=np.int64)
    available.flags.writeable = False
    return SpotTrace(name=path.stem, gap_seconds=float(gap), available=available)


def _node_csv(text: str) -> bool:
    """Whether the text's first event line has a node trace's shape (``time_ms,add|remove,node``)."""
    first = next(_data_lines(text), None)
    return first is not None and len(first[2]) == 3 and first[2][0].isdigit() and first[2][1].lower() in ("add", "remove")


def _data_lines(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """A node trace's lines with an event (no blank line, comment or header): number, text, fields."""
    # Lines as an editor counts them: only '\n' ends one (str.splitlines also splits on
    # form feeds and other separators, which would number the lines after them wrong).
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = _fields(line)
        if lineno == 1 and tuple(f.lower() for f in fields) == _HEADER:
            continue
        yield lineno, line, fields


def _fields(line: str) -> list[str]:
    """A CSV line's fields, as the ``csv`` module reads them: a spreadsheet's export quotes its fields
    (``"time_ms","action","node"``), and a quoted node name may hold a comma."""
    try:
        return [f.strip() for f in next(csv.reader([line]), [])]
    except csv.Error:
        return [f.strip() for f in line.split(",")]


def _back_in_time(text: str) -> int | None:
    """The first line whose time is before an earlier line's, among the lines with a number for one."""
    last = -math.inf
    for lineno, _, fields in _data_lines(text):
        try:
            t = float(fields[0])
        except ValueError:
            continue
        if t < last:
            return lineno
        last = max(last, t)
    return None


def load_node_trace(path: str | Path) -> NodeTrace:
    """Read a node trace CSV of lines ``time_ms,add|remove,nodeN`` (an optional header is skipped).

    Times count from the trace's start; where the first is a clock's (``EPOCH_MS`` or later,
    e.g. Unix-epoch milliseconds) they count from the first line instead, so that a log's own
    times need no rewriting. Times must not decrease; a node may only be removed while present
    and added while absent.
    """
    path = Path(path)
    text = _read_text(path)
    events: list[NodeEvent] = []
    live: set[str] = set()
    last_ms = -math.inf
    for lineno, line, fields in _data_lines(text):
        where = f"{path}: line {lineno}"
        if len(fields) != 3:
            named = "give it with --trace" if path.suffix.lower() == ".json" else "name it .json and give it with --trace"
            hint = f"; it looks like a SkyPilot JSON trace: {named}" if line.startswith(("{", "[")) else ""
            raise TraceError(f"{where}: expected 3 fields 'time_ms,add|remove,node', got {len(fields)}: "
                             f"{_quoted(line)}{hint}")
        t_raw, action, node = fields
        try:
            t_ms = float(t_raw)
        except ValueError:
            header = f"; a header line must read '{','.join(_HEADER)}'" if lineno == 1 else ""
            raise TraceError(f"{where}: time_ms {_quoted(t_raw)} is not a number{header}") from None
        if not math.isfinite(t_ms) or t_ms < 0:
            raise TraceError(f"{where}: time_ms must be a non-negative number, got {_quoted(t_raw)}")
        if t_ms < last_ms:
            raise TraceError(f"{where}: time_ms {t_raw} goes back in time (previous line was at {last_ms:g}); "
                             "sort the lines by time")
        if events and events[0].t_s * 1000.0 < EPOCH_MS <= t_ms:
            raise TraceError(f"{where}: time_ms {t_raw} is a clock's time (milliseconds since 1970), but the first "
                             f"line's, {events[0].t_s * 1000.0:g}, counts from the trace's start; write every time "
                             "the same way (the nodes up at the start: added on lines with the first clock time)")
        start_ms = events[0].t_s * 1000.0 if events else t_ms
        if t_ms - start_ms > MAX_NODE_TRACE_S * 1000.0:
            raise TraceError(f"{where}: time_ms {t_raw} is {(t_ms - start_ms) / 86_400_000:,.0f} days after the first "
                             f"line; a node trace spans at most {MAX_NODE_TRACE_S / 86400:g} days (the simulator "
                             "lays out a tick a minute over it): cut it into shorter traces")
        if action not in ("add", "remove"):
            raise TraceError(f"{where}: action must be 'add' or 'remove', got {_quoted(action)}")
        if not node:
            raise TraceError(f"{where}: node name is empty")
        if (node in live) == (action == "add"):
            # A file out of order fails here first, often at its first line: its order is the cause to name.
            later = _back_in_time(text)
            fix = (f"; line {later} goes back in time: sort the lines by time" if later is not None else
                   "; remove it first, or name the new node otherwise" if action == "add" else
                   "; add it on an earlier line (nodes up when the trace begins are added at its first time)")
            state = "added while already present" if action == "add" else "removed but not present"
            raise TraceError(f"{where}: node {_quoted(node)} {state}{fix}")
        if action == "add":
            live.add(node)
        else:
            live.remove(node)
        last_ms = t_ms
        events.append(NodeEvent(t_s=t_ms / 1000.0, action=action, node=node))  # type: ignore[arg-type]
    if not events:
        raise TraceError(f"{path}: no events; expected lines 'time_ms,add|remove,node'")
    if events[0].t_s * 1000.0 >= EPOCH_MS:
        start = events[0].t_s
        events = [replace(ev, t_s=ev.t_s - start) for ev in events]
    if events[-1].t_s <= 0:
        raise TraceError(f"{path}: the trace spans no time (its last event is at 0 ms); a trace needs events "
                         "over the hours it records")
    return NodeTrace(name=path.stem, events=tuple(events))
