"""Which Ray Train failures are infrastructure and which are the user's bug (no cluster needed)."""

from __future__ import annotations

from ray.exceptions import ActorDiedError
from ray.train.v2._internal.exceptions import (
    InsufficientClusterResourcesError,
    UserExceptionWithTraceback,
    WorkerGroupStartupFailedError,
    WorkerGroupStartupTimeoutError,
    WorkerHealthCheckFailedError,
)
from ray.train.v2.api.exceptions import ControllerError, PreemptionError, WorkerGroupError

from spotfallback.errors import GangMovedError
from spotfallback.runtime.classify import classify, looks_collateral, unwrap_user_error


def wg(**failures):
    return WorkerGroupError("workers failed", {int(k[1:]): v for k, v in failures.items()})


def test_user_exception_on_healthy_nodes_is_an_application_failure():
    bug = ValueError("bad step")
    failure = classify(wg(r0=bug, r1=ValueError("bad step")))
    assert failure.kind == "application" and failure.user_error is bug
    assert failure.detail == "ValueError: bad step"
    wrapped = UserExceptionWithTraceback(KeyError("k"), "Traceback ...\nKeyError: 'k'")
    assert unwrap_user_error(wrapped).args == ("k",)
    assert classify(wg(r0=wrapped)).user_traceback.endswith("KeyError: 'k'")


def test_user_exception_next_to_a_lost_node_is_infrastructure():
    died = WorkerHealthCheckFailedError("worker died", ActorDiedError())
    assert classify(wg(r0=died, r1=RuntimeError("Gloo connection closed by peer"))).kind == "node_failed"
    # Only collateral errors so far, but the GCS knows the node is gone or draining.
    gloo = wg(r0=RuntimeError("[gloo] Connection closed by peer"))
    assert classify(gloo, lambda: {"dead"}).kind == "node_failed"
    assert classify(gloo, lambda: {"draining"}).kind == "preempted"
    assert looks_collateral(classify(gloo))
    assert not looks_collateral(classify(wg(r0=ValueError("bad step"))))


def test_preemptions_capacity_and_fatal_errors():
    assert classify(PreemptionError.__new__(PreemptionError)).kind == "preempted"
    timeout = ControllerError(WorkerGroupStartupTimeoutError(num_workers=2))
    assert classify(timeout).kind == "capacity"
    assert classify(ControllerError(InsufficientClusterResourcesError("no GPUs"))).kind == "no_capacity"
    assert classify(ControllerError(WorkerGroupStartupFailedError("node died during start"))).kind == "node_failed"
    assert classify(ControllerError(ActorDiedError())).kind == "node_failed"
    fatal = classify(ControllerError(PermissionError("no access to bucket")))
    assert fatal.kind == "fatal" and "PermissionError" in fatal.detail


def test_a_gang_that_left_a_draining_node_on_purpose_is_a_preemption_not_a_bug():
    moved = GangMovedError("the just-in-time checkpoint of step 12 is committed: restarting now")
    wrapped = UserExceptionWithTraceback(moved, "Traceback ...\nGangMovedError: ...")
    for failure in (classify(wg(r0=moved)), classify(wg(r0=wrapped), lambda: set())):
        assert failure.kind == "preempted" and failure.user_error is None
        assert "moved off the draining node(s) early" in failure.detail
