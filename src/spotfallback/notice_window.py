"""How a gang spends a preemption notice: train on, then save just in time. Pure.

A notice is minutes of a whole gang's time (two on AWS). Saving at once and then waiting for
the node to go (or for a replacement to come up) bills all of it idle. So the gang trains on
and takes its just-in-time checkpoint as late as is safe: once a replacement can take the
next gang (then there is nothing to wait for: save and move), or when what is left of the
notice is down to the save's *lead*, whichever comes first.

The lead is the expected write scaled by ``SAVE_SAFETY_FACTOR`` (a write under load, a
slower storage request) plus a margin: Ray Train's controller collects a reported checkpoint
only when it next polls the workers (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``), and a worker gone
before that poll takes its report with it; and nodes' clocks differ. The runtime
(``notices.jit.PreemptionWatch``, with the poll interval it runs under) and the simulator (the
work a preemption keeps, with Ray's default) use these same numbers.
"""

from __future__ import annotations

SAVE_SAFETY_FACTOR = 1.5  # a write under load takes longer than the one measured
RAY_TRAIN_POLL_S = 2.0  # Ray Train's default RAY_TRAIN_HEALTH_CHECK_INTERVAL_S
CLOCK_SKEW_S = 1.0  # between the node that saves and the cloud's deadline (NTP keeps VMs far closer)


def commit_margin_s(poll_s: float = RAY_TRAIN_POLL_S) -> float:
    """The lead's fixed part: one controller poll after the report, and the clock skew."""
    return max(0.0, poll_s) + CLOCK_SKEW_S


SAVE_MARGIN_S = commit_margin_s()


def save_lead_s(save_s: float, margin_s: float = SAVE_MARGIN_S) -> float:
    """How long before the deadline a just-in-time save of ``save_s`` seconds must begin."""
    return SAVE_SAFETY_FACTOR * max(0.0, save_s) + max(0.0, margin_s)


def trained_on_s(notice_s: float, save_s: float, margin_s: float = SAVE_MARGIN_S) -> float:
    """Seconds of the notice the gang trains through when nothing moves it sooner.

    Zero when the notice is shorter than the lead: then the save begins at once (and is still
    worth trying as long as the notice covers the write itself).
    """
    return max(0.0, notice_s - save_lead_s(save_s, margin_s))


def save_due(
    now: float,
    deadline: float | None,
    save_s: float | None,
    *,
    next_look_s: float,
    replacement_ready: bool,
    margin_s: float = SAVE_MARGIN_S,
) -> bool:
    """Whether the just-in-time save must begin now rather than after one more look.

    ``next_look_s``: how long until the gang can decide again (the steps until the next look).
    Save now when the deadline is unknown, the write time is unknown (no estimate: nothing
    to plan with), a replacement can take the next gang, or waiting for the next look would
    leave less than the lead.
    """
    if deadline is None or save_s is None or replacement_ready:
        return True
    return now + max(0.0, next_look_s) + save_lead_s(save_s, margin_s) >= deadline
