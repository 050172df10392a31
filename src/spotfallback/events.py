"""Typed events fed to the policy and typed decisions it returns.

Events carry the time they happened (seconds, any epoch): the policy has no clock, so the
live runner passes wall time and the simulator passes simulated time. Every event and
decision round-trips through plain JSON for the ledger, and ``LedgerRecord`` is how one event
is stored there: the replay (``accounting``), the views and the simulator read records
without touching storage.
"""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal

# The version of every JSON object spotfallback stores: ledger records, run metadata, heartbeat.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Event:
    """Something that happened to the run at time ``t``."""

    kind: ClassVar[str] = "event"
    t: float

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class RunStarted(Event):
    """A driver (re)started the run; the current tier starts waiting for capacity."""

    kind: ClassVar[str] = "run_started"
    driver: str = ""
    previous_seen: float | None = None  # last sign of life of the driver before this one
    reset: bool = False  # a failed run started again on a fresh ladder (retry_failed=True)


@dataclass(frozen=True)
class WorkersAcquired(Event):
    """All workers of the current tier were placed and started."""

    kind: ClassVar[str] = "workers_acquired"
    num_workers: int = 0


@dataclass(frozen=True)
class CheckpointCommitted(Event):
    """A checkpoint was persisted to storage; progress up to it survives anything."""

    kind: ClassVar[str] = "checkpoint_committed"
    path: str = ""
    step: int | None = None
    # Wall seconds the gang still needs from this checkpoint, uninterrupted (the training
    # function's `remaining_work_s` metric); None = not reported. Deadline guards read it.
    remaining_work_s: float | None = None


@dataclass(frozen=True)
class Preempted(Event):
    """A node of the gang was reclaimed by the cloud (announced or flagged as preemption)."""

    kind: ClassVar[str] = "preempted"
    detail: str = ""


@dataclass(frozen=True)
class NodeFailed(Event):
    """A node or worker process was lost without a preemption notice."""

    kind: ClassVar[str] = "node_failed"
    detail: str = ""


@dataclass(frozen=True)
class ApplicationFailed(Event):
    """The training function raised on a healthy node: a bug, not the infrastructure."""

    kind: ClassVar[str] = "application_failed"
    error_type: str = ""
    message: str = ""


@dataclass(frozen=True)
class CapacityTimedOut(Event):
    """The current tier's workers could not be acquired within its capacity timeout."""

    kind: ClassVar[str] = "capacity_timed_out"
    waited_s: float = 0.0


@dataclass(frozen=True)
class ClusterUnreachable(Event):
    """The Ray cluster of the current tier stopped answering for its ``unreachable_timeout_s``.

    Written by the driver that moves a run between clusters: the run's gang there, if any,
    is out of reach, so its tiers are left as a whole, for the next tier on another cluster.
    """

    kind: ClassVar[str] = "cluster_unreachable"
    cluster: str = ""
    waited_s: float = 0.0


@dataclass(frozen=True)
class Fatal(Event):
    """An error retrying cannot fix (bad configuration, no access)."""

    kind: ClassVar[str] = "fatal"
    message: str = ""


@dataclass(frozen=True)
class Finished(Event):
    """The training function returned on every worker."""

    kind: ClassVar[str] = "finished"


@dataclass(frozen=True)
class InfoEvent(Event):
    """Recorded for the run's timeline only: the policy answers ``Continue()`` and keeps its state."""

    kind: ClassVar[str] = "info"


# A notice is at most this far ahead of its node's end: past it, a deadline is no spot notice, and
# maintenance announced further ahead (Azure's, days ahead) is recorded, then drained within it.
NOTICE_HORIZON_S = 3600.0
# The action of a record that an earlier notice was taken back (an Azure event cancelled before its time).
CANCELLED = "cancelled"


@dataclass(frozen=True)
class PreemptionNotice(InfoEvent):
    """The cloud announced that a node will be reclaimed (``spotfallback notice-agent``).

    ``deadline_s``: when the node goes (seconds since the epoch; None: not announced).
    ``source``: aws, aws-rebalance, gcp, azure, k8s, or injector (the local cluster's
    ``Injector``). ``drained``: whether the Ray node was drained for it (a rebalance
    recommendation is only recorded unless asked otherwise).
    """

    kind: ClassVar[str] = "preemption_notice"
    node_id: str = ""
    deadline_s: float | None = None
    source: str = ""
    action: str = ""
    drained: bool = False

    @property
    def taken_back(self) -> bool:
        """A record that an earlier notice was cancelled, not a notice."""
        return self.action == CANCELLED

    @property
    def announced_ahead(self) -> bool:
        """Maintenance announced further ahead than it is drained: its drain, if it comes, is another record."""
        return not self.drained and self.deadline_s is not None and self.deadline_s - self.t > NOTICE_HORIZON_S

    @property
    def counts(self) -> bool:
        """Whether it warns of a node going now (counted, and marked on the timeline)."""
        return not self.taken_back and not self.announced_ahead


@dataclass(frozen=True)
class JitCheckpoint(InfoEvent):
    """A just-in-time checkpoint taken on a preemption notice: ``started``, ``reported`` or ``missed``.

    ``missed`` is written by the next attempt when no checkpoint of ``step`` was committed:
    the notice was shorter than the checkpoint write and the run resumed from an older one.
    """

    kind: ClassVar[str] = "jit_checkpoint"
    outcome: str = "started"
    step: int | None = None
    deadline_s: float | None = None
    attempt: str = ""
    detail: str = ""


@dataclass(frozen=True)
class CapacityObserved(Event):
    """The shell saw ``available_workers`` placeable on ``tier`` while the run is running.

    Fed for higher tiers that allow a climb back and for the current tier when it is elastic.
    The policy has no clock and no model of the run, so the shell passes its estimates: the
    work left (seconds on the current gang; None = unknown), what one restart costs (from the
    run's own measured restarts) and the checkpoint interval (work lost to a preemption is
    half of it on average), and the slack before a deadline, if the run has one. Observations
    that change nothing are not written to the ledger.
    """

    kind: ClassVar[str] = "capacity_observed"
    tier: int = 0
    available_workers: int = 0
    remaining_work_s: float | None = None
    restart_s: float = 0.0
    checkpoint_interval_s: float = 0.0
    slack_s: float | None = None  # time to the deadline beyond the remaining work; None = no deadline


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        RunStarted,
        WorkersAcquired,
        CheckpointCommitted,
        Preempted,
        NodeFailed,
        ApplicationFailed,
        CapacityTimedOut,
        ClusterUnreachable,
        Fatal,
        Finished,
        CapacityObserved,
        PreemptionNotice,
        JitCheckpoint,
    )
}


def event_from_json(data: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_json``; raises ValueError naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"event must be an object, got {type(data).__name__}")
    kind = data.get("kind")
    cls = EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {sorted(EVENT_TYPES)} (a newer spotfallback's "
                         "kind? upgrade spotfallback to read this run)")
    allowed, hints = _schema(cls)
    extra = set(data) - allowed - {"kind"}
    if extra:
        raise ValueError(f"{kind}: unexpected field(s) {sorted(extra)}")
    t = data.get("t")
    if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
        raise ValueError(f"{kind}: field 't' must be a non-negative number of seconds, got {t!r}")
    for name, value in data.items():
        if name != "kind" and not _has_type(value, hints[name]):
            raise ValueError(f"{kind}: field {name!r} must be {_type_name(hints[name])}, got {value!r}")
        if name not in _SIGNED and not isinstance(value, bool) and isinstance(value, int | float) and value < 0:
            raise ValueError(f"{kind}: field {name!r} must not be negative, got {value!r}")
    return cls(**{k: v for k, v in data.items() if k != "kind"})


# The one number an event may hold below 0: the time to the deadline, once it has passed.
# Every other is a count, a step, a tier, a duration or a time.
_SIGNED = frozenset({"slack_s"})

_SCHEMAS: dict[type[Event], tuple[frozenset[str], dict[str, Any]]] = {}


def _schema(cls: type[Event]) -> tuple[frozenset[str], dict[str, Any]]:
    """An event class's field names and resolved annotations, resolved once: that costs far more
    than checking one record, and a long run's ledger holds tens of thousands."""
    if cls not in _SCHEMAS:
        _SCHEMAS[cls] = frozenset(f.name for f in fields(cls)), typing.get_type_hints(cls)
    return _SCHEMAS[cls]


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None: not a number (a bool is none), NaN, an infinity, or an
    integer past the float range (JSON reads ``1e999`` as infinity and ``10**400`` as an int)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _has_type(value: Any, annotation: Any) -> bool:
    """JSON value against a field annotation; bools are not numbers, numbers must be finite."""
    if annotation is float:
        return finite_number(value) is not None
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation in (str, bool):
        return type(value) is annotation
    if annotation is type(None):
        return value is None
    if typing.get_origin(annotation) is Literal:
        return value in typing.get_args(annotation)
    args = typing.get_args(annotation)
    return any(_has_type(value, a) for a in args) if args else True


def _type_name(annotation: Any) -> str:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return " or ".join(repr(a) for a in args)
    if args:
        return " or ".join(_type_name(a) for a in args)
    return {float: "a finite number", int: "an integer", str: "a string", bool: "true or false", type(None): "null"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )



@dataclass(frozen=True)
class LedgerRecord:
    """One event as stored in the ledger: the event, the tier it happened on and what the policy decided."""

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
    def from_json(cls, data: Any) -> LedgerRecord:
        """Inverse of ``to_json``; raises ValueError naming what is wrong (the reader names the object)."""
        if not isinstance(data, dict):
            raise ValueError("a ledger record must be a JSON object")
        if data.get("v") != FORMAT_VERSION:
            v = data.get("v")
            newer = isinstance(v, int) and not isinstance(v, bool) and v > FORMAT_VERSION
            raise ValueError(f"unsupported ledger format version {v!r}" + (
                f" (this spotfallback reads version {FORMAT_VERSION}; a newer one wrote it: upgrade spotfallback)" if newer else ""))
        missing = [k for k in ("id", "writer", "tier", "event") if k not in data]
        if missing:
            raise ValueError(f"missing field {missing[0]!r}")
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
            id=data["id"], writer=data["writer"], tier=tier, event=event_from_json(data["event"]),
            decision=decision, info=info,
        )

@dataclass(frozen=True)
class Decision:
    """What the shell must do next."""

    action: ClassVar[str] = "decision"

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, **asdict(self)}


@dataclass(frozen=True)
class Continue(Decision):
    """Nothing to change: keep running (or keep waiting)."""

    action: ClassVar[str] = "continue"


@dataclass(frozen=True)
class Retry(Decision):
    """Restart the workers on the same tier from the latest checkpoint."""

    action: ClassVar[str] = "retry"
    tier: int = 0


@dataclass(frozen=True)
class SwitchTier(Decision):
    """Leave ``from_tier`` and resume on ``to_tier`` from the latest checkpoint."""

    action: ClassVar[str] = "switch_tier"
    from_tier: int = 0
    to_tier: int = 0
    reason: str = ""


@dataclass(frozen=True)
class ClimbBack(Decision):
    """Checkpoint, stop the workers and resume on the higher (cheaper) ``to_tier``."""

    action: ClassVar[str] = "climb_back"
    from_tier: int = 0
    to_tier: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Resize(Decision):
    """Restart the elastic tier's gang with ``num_workers`` workers (capacity grew back)."""

    action: ClassVar[str] = "resize"
    tier: int = 0
    num_workers: int = 0


GiveUpCause = Literal["application", "exhausted", "fatal"]


@dataclass(frozen=True)
class GiveUp(Decision):
    """Stop the run: the user's code keeps failing, every tier was left, or it cannot work."""

    action: ClassVar[str] = "give_up"
    cause: GiveUpCause = "exhausted"
    reason: str = ""


@dataclass(frozen=True)
class Complete(Decision):
    """Training finished."""

    action: ClassVar[str] = "complete"
