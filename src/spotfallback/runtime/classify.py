"""Sort Ray Train failures into the policy's events.

The distinction that saves money: a bug in the training function (an exception raised on a
healthy node) is an ``ApplicationFailed`` and never moves the run to pricier capacity; a
node reclaimed by the cloud is ``Preempted``; a node or worker lost without notice is
``NodeFailed``; workers that cannot be placed are a capacity wait. Ray 2.60 reports these as
``PreemptionError``, ``WorkerGroupError.worker_failures`` and ``ControllerError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ray.exceptions import RayActorError
from ray.train.v2._internal.exceptions import (
    InsufficientClusterResourcesError,
    UserExceptionWithTraceback,
    WorkerGroupStartupFailedError,
    WorkerGroupStartupTimeoutError,
    WorkerHealthCheckFailedError,
    WorkerHealthCheckTimeoutError,
)
from ray.train.v2._internal.execution.worker_group.poll import _is_preempted_actor
from ray.train.v2.api.exceptions import (
    ControllerError,
    PreemptionError,
    TrainingFailedError,
    WorkerGroupError,
)

from spotfallback.errors import GangMovedError

# Surviving ranks of a gang fail with errors like these when a peer's node disappears.
_COLLATERAL = re.compile(
    r"gloo|nccl|connection (closed|reset)|broken pipe|socket|timed out|ProcessGroup|collective",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Failure:
    """What a Ray failure means for the ladder.

    kind: ``preempted``, ``node_failed``, ``application``, ``capacity`` (workers could not be
    placed in time), ``no_capacity`` (the cluster can never fit this tier) or ``fatal``.
    """

    kind: str
    detail: str
    user_error: BaseException | None = None
    user_traceback: str = ""


def user_exceptions(error: WorkerGroupError) -> list[BaseException]:
    """The exceptions the training function raised, one per failed rank (not node losses)."""
    return [e for e in error.worker_failures.values() if not _is_infrastructure(e)]


def unwrap_user_error(error: BaseException) -> BaseException:
    """The user's own exception object (Ray 2.60 already unwraps it in ``worker_failures``)."""
    return error._base_exc if isinstance(error, UserExceptionWithTraceback) else error


def user_traceback(error: WorkerGroupError, user_error: BaseException) -> str:
    """The worker-side traceback: Ray keeps it in the error's message, not on the exception."""
    if isinstance(user_error, UserExceptionWithTraceback):
        return str(user_error)
    return str(error)


def _is_infrastructure(error: BaseException) -> bool:
    return isinstance(error, WorkerHealthCheckFailedError | WorkerHealthCheckTimeoutError | RayActorError)


def _first_line(text: str, limit: int = 300) -> str:
    text = str(text).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines else text
    return line[:limit]


def classify(
    error: TrainingFailedError,
    dead_or_draining: Callable[[], Iterable[str]] = lambda: (),
) -> Failure:
    """Classify ``error``. ``dead_or_draining`` lists the kinds of trouble ('dead',
    'draining') on the nodes that hosted the workers, consulted only when every worker
    failure is a user exception, to tell a genuine bug from collateral damage of a lost node.
    """
    if isinstance(error, PreemptionError):
        return Failure("preempted", _first_line(str(error)))
    if isinstance(error, ControllerError):
        cause = error.controller_failure
        if isinstance(cause, WorkerGroupStartupTimeoutError):
            return Failure("capacity", _first_line(str(cause)))
        if isinstance(cause, InsufficientClusterResourcesError):
            return Failure("no_capacity", _first_line(str(cause)))
        if isinstance(cause, WorkerGroupStartupFailedError):
            return Failure("node_failed", _first_line(str(cause)))
        if isinstance(cause, RayActorError):
            # One of Ray Train's own helper actors (e.g. its preemption watcher) lived on a
            # node that went away: infrastructure, not a reason to stop the run.
            kind = "preempted" if cause.preempted else "node_failed"
            return Failure(kind, f"a Ray Train actor died with its node: {_first_line(str(cause))}")
        return Failure("fatal", f"{type(cause).__name__}: {_first_line(str(cause))}")
    if isinstance(error, WorkerGroupError):
        failures = list(error.worker_failures.values())
        if any(_is_preempted_actor(e) for e in failures):
            return Failure("preempted", "a worker's node was preempted")
        infra = [e for e in failures if _is_infrastructure(e)]
        if infra:
            return Failure("node_failed", _first_line(str(infra[0])))
        users = user_exceptions(error)
        moved = [unwrap_user_error(e) for e in users if isinstance(unwrap_user_error(e), GangMovedError)]
        if moved:  # left a draining node on purpose, after its just-in-time checkpoint
            return Failure("preempted", f"moved off the draining node(s) early: {_first_line(str(moved[0]))}")
        if users:
            troubles = set(dead_or_draining())
            first = users[0]
            detail = f"{type(unwrap_user_error(first)).__name__}: {_first_line(str(unwrap_user_error(first)))}"
            if "draining" in troubles:
                return Failure("preempted", f"a worker's node is draining; collateral error: {detail}")
            if "dead" in troubles:
                return Failure("node_failed", f"a worker's node died; collateral error: {detail}")
            base = unwrap_user_error(first)
            return Failure("application", detail, user_error=base, user_traceback=user_traceback(error, first))
        return Failure("node_failed", _first_line(str(error)))
    return Failure("fatal", f"{type(error).__name__}: {_first_line(str(error))}")


def looks_collateral(failure: Failure) -> bool:
    """Whether an application failure's text looks like a lost peer rather than a bug."""
    return failure.kind == "application" and bool(_COLLATERAL.search(f"{failure.detail}\n{failure.user_traceback}"))
