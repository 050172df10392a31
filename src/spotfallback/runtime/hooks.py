"""Hooks that put the pure policy in charge of one Ray Train run, from inside its controller.

Ray Train V2's controller already restarts worker groups; it asks a ``FailurePolicy`` what to
do after each failure and a ``ScalingPolicy`` how large the next worker group is, and lets a
``ControllerCallback`` choose each new worker group's label selector. spotfallback plugs into
exactly those three places, so moving to the next tier costs the same as Ray's own restart:
no new trainer, no new controller. The scaling policy also words the resource request Ray
sends the autoscaler: the current tier's gang on the tier's own nodes. The policy's state
lives in the controller process; every event is written to the ledger before the decision is
acted on, so a crashed driver resumes where the ledger says.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray
from ray.train.v2._internal.constants import (
    WORKER_GROUP_START_TIMEOUT_S_ENV_VAR,
)
from ray.train.v2._internal.execution.callback import (
    ControllerCallback,
    ReportCallback,
    WorkerGroupCallback,
)
from ray.train.v2._internal.execution.failure_handling import FailureDecision, FailurePolicy
from ray.train.v2._internal.execution.scaling_policy import (
    FixedScalingPolicy,
    NoopDecision,
    ResizeDecision,
    ScalingDecision,
)
from ray.train.v2.api.config import FailureConfig, ScalingConfig
from ray.train.v2.api.exceptions import TrainingFailedError

from spotfallback.events import (
    ApplicationFailed,
    CapacityTimedOut,
    CheckpointCommitted,
    Event,
    Fatal,
    GiveUp,
    NodeFailed,
    Preempted,
    WorkersAcquired,
    finite_number,
)
from spotfallback.notices.drain import gcs_client
from spotfallback.notices.placement import withdraw_replacement
from spotfallback.runtime.autoscaler_version import AutoscalerKind, climb_requests_allowed
from spotfallback.runtime.capacity import start_size
from spotfallback.runtime.classify import classify, looks_collateral
from spotfallback.runtime.hold import ClimbHold
from spotfallback.runtime.ladder import LadderRuntime, RunSpec, runtime_for
from spotfallback.runtime.probe import CapacityProbe, gang_scaling_config
from spotfallback.store.heartbeat import scalar_metrics, write_heartbeat
from spotfallback.store.retry import storage_failure

logger = logging.getLogger("spotfallback")


def _node_troubles(node_ids: list[str]) -> set[str]:
    """'dead' / 'draining' for the given nodes, from the GCS."""
    troubles: set[str] = set()
    try:
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if any(n not in alive for n in node_ids):
            troubles.add("dead")
        gcs = gcs_client()
        draining = gcs.get_draining_nodes()
        if any(n in draining for n in node_ids):
            troubles.add("draining")
    except Exception:  # the check is a refinement; never let it break failure handling
        logger.debug("could not query node state", exc_info=True)
    return troubles


def job_is_dead(gcs: Any, job_id: str) -> bool:
    """Whether the GCS has marked job ``job_id`` (hex) finished: its driver exited or was killed."""
    infos = gcs.get_all_job_info(job_or_submission_id=job_id, skip_submission_job_info_field=True,
                                 skip_is_running_tasks_field=True, timeout=5)
    return any(j.hex() == job_id and info.is_dead for j, info in infos.items())


def _driver_gone() -> bool:
    """Whether this run's driver is gone, so the failure at hand is the job being torn down.

    When a driver exits or is killed, the GCS marks its job finished first and then destroys
    the job's actors in no particular order: the controller (an actor on the driver's node)
    may still see its workers die and would record a node loss that never happened, charged
    to the tier's budget. Checked against the GCS, which has the job dead by then.
    """
    try:
        return job_is_dead(gcs_client(), ray.get_runtime_context().get_job_id())
    except Exception:  # the check is a refinement; never let it break failure handling
        logger.debug("could not read the job table", exc_info=True)
        return False


def _error_types(error: BaseException) -> list[str]:
    """The failure's shape for the ledger: the error type and each worker's error type."""
    types = [type(error).__name__]
    for rank, e in sorted(getattr(error, "worker_failures", {}).items()):
        inner = getattr(e, "_base_exc", None) or getattr(e, "health_check_failure", None)
        types.append(f"rank {rank}: {type(e).__name__}" + (f"({type(inner).__name__})" if inner is not None else ""))
    cause = getattr(error, "controller_failure", None)
    if cause is not None:
        types.append(type(cause).__name__)
    return types


class TierFailurePolicy(FailurePolicy):
    """Ray's failure policy, replaced: each failure becomes an event for the pure policy."""

    def __init__(self, failure_config: FailureConfig, spec: RunSpec):
        super().__init__(failure_config)
        self.spec = spec

    def make_decision(self, training_failed_error: TrainingFailedError) -> FailureDecision:
        storage = storage_failure(training_failed_error)
        if storage is not None:  # storage is gone: stop, record nothing, resume when it is back
            logger.error("[spotfallback] stopping the run: %s", storage)
            return FailureDecision.RAISE
        if _driver_gone():  # the job is being torn down: its workers died with the driver, not with a node
            logger.info("[spotfallback] the run's driver is gone; its workers ended with it: nothing recorded")
            return FailureDecision.RAISE
        rt = runtime_for(self.spec)
        if rt.climbing is not None:
            # The policy has already moved the run up; the gang it was stopping ended on its own.
            logger.info("[spotfallback] the gang ended while saving the checkpoint asked for the climb to %r: "
                        "starting there from the latest checkpoint", rt.climbing.tier.name)
            rt.end_climb()
            return FailureDecision.RETRY
        failure = classify(training_failed_error, lambda: _node_troubles(rt.worker_nodes))
        if looks_collateral(failure):
            # A peer's node may still be dying; give the GCS a moment before blaming the code.
            for _ in range(5):
                time.sleep(1.0)
                failure = classify(training_failed_error, lambda: _node_troubles(rt.worker_nodes))
                if failure.kind != "application":
                    break
        now = time.time()
        info: dict[str, Any] = {"detail": failure.detail, "error": _error_types(training_failed_error)}
        event: Event | None
        if failure.kind == "capacity":
            deadline = rt.policy.capacity_deadline(rt.state)
            if deadline is None or now < deadline - 0.25:
                logger.info("[spotfallback] still waiting for capacity on tier %r", rt.tier.name)
                return FailureDecision.RETRY
            waited = now - (rt.state.waiting_since or now)
            event = CapacityTimedOut(t=now, waited_s=waited)
        elif failure.kind == "no_capacity":
            event = CapacityTimedOut(t=now, waited_s=now - (rt.state.waiting_since or now))
        elif failure.kind == "preempted":
            event = Preempted(t=now, detail=failure.detail)
        elif failure.kind == "node_failed":
            event = NodeFailed(t=now, detail=failure.detail)
        elif failure.kind == "application":
            err = failure.user_error
            event = ApplicationFailed(
                t=now, error_type=type(err).__name__ if err else "Exception", message=str(err)[:500] if err else failure.detail
            )
            info["traceback"] = failure.user_traceback[-4000:]
        else:
            event = Fatal(t=now, message=failure.detail)
        tier_name = rt.tier.name
        decision = rt.apply(event, info)
        logger.info("[spotfallback] %s on tier %r -> %s", event.kind, tier_name, decision.to_json())
        if isinstance(decision, GiveUp):
            return FailureDecision.RAISE
        if rt.off_cluster():  # the next tier is on another Ray cluster: the moving driver takes the run there
            logger.info("[spotfallback] tier %r is on cluster %r: stopping here", rt.tier.name, rt.policy.ladder.cluster_key(rt.state.tier))
            return FailureDecision.RAISE
        return FailureDecision.RETRY


class TierScalingPolicy(FixedScalingPolicy):
    """Sizes each new worker group for the current tier and bounds its capacity wait.

    While the run is below a tier it could climb back to, it also keeps the climb-back probe:
    a second resource request, for that tier's gang, so an autoscaled pool that has scaled to
    zero gets nodes again when its capacity returns (see ``runtime/probe.py``). From a climb until
    a gang runs again, a third request keeps the nodes of the gang it left (``runtime/hold.py``).
    Neither is sent where the driver found autoscaler v1 (``autoscaler``; see
    ``runtime/autoscaler_version.py``): v1 would launch any node type for them.
    """

    def __init__(self, scaling_config: ScalingConfig, spec: RunSpec, *, autoscaler: AutoscalerKind = "unknown"):
        super().__init__(scaling_config)
        self.spec = spec
        self._requested_tier: int | None = None
        inert = not climb_requests_allowed(autoscaler)
        self._probe = CapacityProbe(inert=inert)
        self._hold = ClimbHold(inert=inert)
        self._starting: tuple[int, int] | None = None  # the tier and size of the gang being started

    def _runtime(self) -> LadderRuntime:
        return runtime_for(self.spec)

    def _get_num_workers_for_resource_request(self) -> int:
        return self._runtime().tier.num_workers

    def tier_scaling_config(self) -> ScalingConfig:
        """The current tier's gang as the autoscaler should see it: size, resources, label selector."""
        return gang_scaling_config(self._runtime().tier)

    def _send_resource_request(self) -> None:
        """Ask the autoscaler (through Ray's coordinator) for the current tier's gang on its nodes.

        Ray would send the trainer's one ScalingConfig: the first tier's size with no label
        selector, which after a move keeps capacity requested for the tier the run left, on
        whatever nodes fit, and never asks for the nodes an elastic tier could grow onto.
        """
        assert self._coordinator_client is not None
        self._coordinator_client.send_resource_request(self.tier_scaling_config(), self._runtime().tier.num_workers)
        self._requested_tier = self._runtime().state.tier

    def _maybe_send_resource_request(self) -> None:
        assert self._coordinator_client is not None
        if self._runtime().state.tier != self._requested_tier:
            self._send_resource_request()  # the run moved: replace the request at once
            return
        self._coordinator_client.maybe_send_resource_request(self.tier_scaling_config(), self._runtime().tier.num_workers)

    def make_decision_for_non_running_worker_group(self) -> ScalingDecision:
        rt = self._runtime()
        # The worker group reads its placement timeout from the environment each time it is
        # created; ending the wait at the tier's capacity deadline makes the timeout precise.
        os.environ[WORKER_GROUP_START_TIMEOUT_S_ENV_VAR] = f"{rt.start_timeout_s(time.time()):.3f}"
        # Withdrawn before the run's own request moves onto the held tier: the two together would launch a second gang.
        self._hold.follow(rt.state.tier, rt.tier, self._coordinator_client)
        self._maybe_send_resource_request()
        self._probe.follow(rt, self._coordinator_client)  # climbed or lost its gang: withdrawn
        tier = rt.tier
        if tier.is_elastic:  # wait in short rounds: each recounts what the tier can hold now
            os.environ[WORKER_GROUP_START_TIMEOUT_S_ENV_VAR] = f"{min(rt.start_timeout_s(time.time()), 15.0):.3f}"
        return ResizeDecision(num_workers=start_size(tier), resources_per_worker=tier.worker_resources())

    def make_decision_for_running_worker_group(self, worker_group_state: Any, worker_group_status: Any) -> ScalingDecision:
        """Climb back or grow an elastic gang when the pure policy says it pays."""
        rt = self._runtime()
        if self._starting is not None:  # the gang started is running: the one a climb would leave
            index, num_workers = self._starting
            self._hold.gang_running(index, rt.policy.tiers[index], num_workers)
            self._starting = None
        self._maybe_send_resource_request()  # the request expires unless renewed, as Ray's policies do
        self._probe.follow(rt, self._coordinator_client)
        move = rt.decide_while_running()
        if move is None:
            return NoopDecision()
        tier, num_workers = move
        self._hold.follow(rt.state.tier, rt.tier, self._coordinator_client)  # a climb: keep the gang it leaves
        os.environ[WORKER_GROUP_START_TIMEOUT_S_ENV_VAR] = f"{self._runtime().start_timeout_s(time.time()):.3f}"
        return ResizeDecision(num_workers=num_workers, resources_per_worker=tier.worker_resources())

    def on_controller_start_worker_group(self, *, scaling_config: ScalingConfig, num_workers: int) -> dict[str, str] | None:
        withdraw_replacement(self._coordinator_client, self.spec.location.name)  # the run's own request covers it now
        rt = self._runtime()
        rt.end_climb()
        rt.requests.new_gang()  # an old request is not for this gang; it says itself whether it answers
        self._starting = (rt.state.tier, num_workers)
        return dict(rt.tier.label_selector) or None

    async def before_controller_shutdown(self) -> None:
        self._probe.cancel()
        self._hold.cancel()
        await super().before_controller_shutdown()

    def before_controller_abort(self) -> None:
        self._probe.cancel()
        self._hold.cancel()
        super().before_controller_abort()


class LedgerCallback(WorkerGroupCallback, ReportCallback, ControllerCallback):
    """Records workers acquired and checkpoints committed."""

    def __init__(self, spec: RunSpec):
        self.spec = spec

    def after_worker_group_start(self, worker_group: Any) -> None:
        rt = runtime_for(self.spec)
        workers = worker_group.get_workers()
        rt.worker_nodes = [w.metadata.node_id for w in workers]
        rt.apply(
            WorkersAcquired(t=time.time(), num_workers=len(workers)),
            {"tier": rt.tier.name, "nodes": sorted(set(rt.worker_nodes))},
        )

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        rt = runtime_for(self.spec)
        first = metrics[0] if metrics and isinstance(metrics[0], dict) else {}
        if rt.heartbeat.due():
            write_heartbeat(rt.ledger.location, rt.state.tier, first)
        checkpoint = getattr(training_report, "checkpoint", None)
        if checkpoint is None:
            rt.reported(time.time(), remaining_work(first))
            return
        step = None
        for m in metrics:
            if isinstance(m, dict) and isinstance(m.get("step"), int):
                step = m["step"]
                break
        rt.apply(
            CheckpointCommitted(
                t=time.time(), path=str(checkpoint.path), step=step, remaining_work_s=remaining_work(first)
            ),
            {"metrics": scalar_metrics(first)},
        )


def remaining_work(metrics: dict[str, Any]) -> float | None:
    """The training function's ``remaining_work_s`` metric, if it reported a usable one.

    The policy weighs climbs, resizes, deadline guards and the expected-cost exit with it;
    anything but a finite number >= 0 counts as not reported.
    """
    value = finite_number(metrics.get("remaining_work_s"))
    return None if value is None or value < 0 else value
