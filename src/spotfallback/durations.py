"""Durations and ages in words: "1m05s", "12s ago", "3.2s ahead of this machine's clock".

Pure and in the core because the storage shell words its own errors (a driver lease "renewed
12s ago") and the views word every status line: both say an age the same way, and the store
may not import a view.
"""

from __future__ import annotations

import math


def duration(s: float | None) -> str:
    """``s`` seconds as "4.2s", "12s", "3m05s" or "2h07m"; "-" when unknown, 0 when negative."""
    if s is None or not math.isfinite(s):
        return "-"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


# How far ahead of this machine's clock a record may be dated and still read as "0.0s ago".
# Machines kept in time by NTP differ by milliseconds, and a record read the moment it was
# written is a few of them "ahead": shown to a tenth of a second that is noise, not news.
# Beyond it the writer's clock (or this one) is off, and every age read from it is wrong.
CLOCK_TOLERANCE_S = 1.0


def ago(s: float | None) -> str:
    """``s`` seconds since a record was written (``now - t``), as "12s ago".

    A record written on another machine (a driver's lease, a notice agent's health record) is
    dated by that machine's clock: one dated ahead of this machine's clock, by more than
    ``CLOCK_TOLERANCE_S``, reads "3.2s ahead of this machine's clock" (not "0.0s ago" for as
    long as the difference lasts, nor a negative age).
    """
    if s is not None and s < -CLOCK_TOLERANCE_S:
        return f"{duration(-s)} ahead of this machine's clock"
    return f"{duration(s)} ago"
