"""Typed events fed to the policy and typed decisions it returns.

Events carry the time they happened (seconds, any epoch): the policy has no clock, so the
live runner passes wall time and the simulator passes simulated time. Every event and
decision round-trips through plain JSON for the ledger.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal


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
class Fatal(Event):
    """An error retrying cannot fix (bad configuration, no access)."""

    kind: ClassVar[str] = "fatal"
    message: str = ""


@dataclass(frozen=True)
class Finished(Event):
    """The training function returned on every worker."""

    kind: ClassVar[str] = "finished"


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
        Fatal,
        Finished,
    )
}


def event_from_json(data: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_json``; raises ValueError naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"event must be an object, got {type(data).__name__}")
    kind = data.get("kind")
    cls = EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {sorted(EVENT_TYPES)}")
    allowed = {f.name for f in fields(cls)}
    extra = set(data) - allowed - {"kind"}
    if extra:
        raise ValueError(f"{kind}: unexpected field(s) {sorted(extra)}")
    if not isinstance(data.get("t"), int | float) or isinstance(data.get("t"), bool):
        raise ValueError(f"{kind}: field 't' must be a number")
    return cls(**{k: v for k, v in data.items() if k != "kind"})


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
