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


class _Job:
    def __init__(self, hex_id: str):
        self._hex = hex_id

    def hex(self) -> str:
        return self._hex


class _Gcs:
    """The job table as ``InnerGcsClient.get_all_job_info`` returns it."""

    def __init__(self, jobs: dict[str, bool]):
        self.jobs, self.calls = jobs, []

    def get_all_job_info(self, **kwargs):
        self.calls.append(kwargs)
        return {_Job(j): type("JobTableData", (), {"is_dead": dead})() for j, dead in self.jobs.items()}


def test_a_dead_drivers_job_is_read_from_the_job_table_cheaply():
    from spotfallback.runtime.hooks import job_is_dead

    gcs = _Gcs({"01000000": True, "02000000": False})
    assert job_is_dead(gcs, "01000000") and not job_is_dead(gcs, "02000000") and not job_is_dead(gcs, "03000000")
    assert gcs.calls[0] == {"job_or_submission_id": "01000000", "skip_submission_job_info_field": True,
                            "skip_is_running_tasks_field": True, "timeout": 5}


def test_workers_that_die_with_a_killed_driver_are_not_recorded_as_a_lost_node(monkeypatch):
    """The job is being torn down: the failure policy stops without touching the ledger (no runtime is even built)."""
    from ray.train.v2._internal.execution.failure_handling import FailureDecision
    from ray.train.v2.api.config import FailureConfig

    from spotfallback.runtime import hooks

    def no_runtime(spec):
        raise AssertionError("the teardown of a dead driver's job must record nothing")

    monkeypatch.setattr(hooks, "runtime_for", no_runtime)
    monkeypatch.setattr(hooks, "_driver_gone", lambda: True)
    died = WorkerHealthCheckFailedError("worker died", ActorDiedError())
    policy = hooks.TierFailurePolicy(FailureConfig(), spec=None)  # type: ignore[arg-type]
    assert policy.make_decision(wg(r0=died, r1=died)) == FailureDecision.RAISE
