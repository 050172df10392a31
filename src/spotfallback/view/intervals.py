"""Where a run's time went, interval by interval: waiting for workers, work redone, holds.

``accounting.summarize`` adds these up per tier; the cost report splits its lost hours into
redone work and the hold after a just-in-time checkpoint with them, and the timeline draws
them. Replayed from the ledger with the same rules as ``accounting`` (a test holds the sums
equal), so the picture and the bill never disagree. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from spotfallback.accounting import RESTART_TIER
from spotfallback.events import LedgerRecord

# A gang lost without meaning to (with its cluster, for a cluster that stopped answering).
INTERRUPTIONS = ("preempted", "node_failed", "application_failed", "cluster_unreachable")
_MOVES = ("climb_back", "resize")  # decisions that stop the gang on purpose and restart it elsewhere
_ENDS = ("give_up", "complete")  # decisions after which nothing waits until a driver starts the run again

Interval = tuple[int, float, float]  # (tier, start, end)


def _moved_to(rec: LedgerRecord, default: int) -> int:
    """The tier the run is on after ``rec``: a switch's or a climb's target, else ``default``."""
    decision = rec.decision or {}
    if decision.get("action") in ("switch_tier", "climb_back"):
        return int(decision.get("to_tier", default))
    return default


def run_intervals(records: Sequence[LedgerRecord], end: float) -> tuple[list[Interval], list[Interval], list[Interval]]:
    """(waiting, redone, held) intervals per tier, replaying the same rules as ``accounting``.

    The time from the last checkpoint to an interruption is lost (billed, not useful work).
    It is *redone* work unless that checkpoint was a just-in-time one taken on the
    interruption's notice: then the workers only *held* until the node went, and nothing is
    redone.
    """
    waiting: list[Interval] = []
    redone: list[Interval] = []
    held: list[Interval] = []
    wait: tuple[int, float] | None = None
    run: tuple[int, float] | None = None
    last_ckpt = -math.inf
    jit_started = math.inf  # when this attempt's just-in-time checkpoint began (inf: none)
    for i, rec in enumerate(records):
        kind, t = rec.event.kind, rec.t
        nxt = _moved_to(rec, records[i + 1].tier if i + 1 < len(records) else rec.tier)
        action = (rec.decision or {}).get("action")
        if kind == "run_started":
            reset = getattr(rec.event, "reset", False)
            if wait and not reset:  # a reset starts a failed run again: it waited for nothing (as accounting)
                waiting.append((wait[0], wait[1], t))
            # A failed run's restart is recorded on the tier it failed on; it waits for the first.
            wait, run, jit_started = (RESTART_TIER if reset else rec.tier, t), None, math.inf
        elif kind == "workers_acquired":
            if wait:
                waiting.append((wait[0], wait[1], t))
            wait, run, jit_started = None, (rec.tier, t), math.inf
        elif kind == "checkpoint_committed":
            last_ckpt = t
        elif kind == "jit_checkpoint" and getattr(rec.event, "outcome", "") == "started" and run:
            jit_started = min(jit_started, t)
        elif kind == "capacity_observed" and action in _MOVES:
            # A climb back or a resize stops the gang right after a checkpoint: nothing redone,
            # then a wait for the new gang (as accounting charges it).
            if wait:
                waiting.append((wait[0], wait[1], t))
            run, wait = None, (nxt, t)
        elif kind in INTERRUPTIONS or kind == "capacity_timed_out":
            if run and kind != "capacity_timed_out":
                (held if last_ckpt >= jit_started else redone).append((run[0], max(run[1], last_ckpt), t))
            if wait:
                waiting.append((wait[0], wait[1], t))
            run = None
            wait = None if action in _ENDS else (nxt, t)
        elif kind in ("finished", "fatal"):
            if wait:
                waiting.append((wait[0], wait[1], t))
            wait = run = None
    if wait:
        waiting.append((wait[0], wait[1], end))
    return waiting, [r for r in redone if r[2] > r[1]], [h for h in held if h[2] > h[1]]


@dataclass(frozen=True)
class AnnouncedEviction:
    """One eviction with a just-in-time checkpoint, from the gang's side.

    ``held_s``: from the checkpoint reported to the attempt's end (the gang kept, idle);
    ``idle_s``: from the checkpoint reported to the next gang's start (None: none started);
    ``moved``: the gang left before its node went instead of holding to the deadline.
    """

    tier: int
    reported_t: float
    held_s: float
    idle_s: float | None
    moved: bool


def announced_evictions(records: Sequence[LedgerRecord]) -> list[AnnouncedEviction]:
    """Every just-in-time checkpoint reported, with what the gang did until it trained again."""
    out: list[AnnouncedEviction] = []
    for i, rec in enumerate(records):
        if rec.event.kind != "jit_checkpoint" or getattr(rec.event, "outcome", "") != "reported":
            continue
        attempt = getattr(rec.event, "attempt", "")
        moved, ended, started = False, None, None
        for later in records[i + 1 :]:
            kind = later.event.kind
            if kind == "jit_checkpoint" and getattr(later.event, "outcome", "") == "moved":
                moved = moved or getattr(later.event, "attempt", "") == attempt
            elif ended is None and (kind in INTERRUPTIONS or kind in ("finished", "fatal")):
                ended = later.t
            elif ended is not None and kind == "workers_acquired":
                started = later.t
                break
        if ended is None:
            continue  # the attempt is still going: nothing to count yet
        out.append(AnnouncedEviction(rec.tier, rec.t, max(0.0, ended - rec.t),
                                     None if started is None else max(0.0, started - rec.t), moved))
    return out


def mean_or_none(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
