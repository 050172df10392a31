"""``FallbackTrainer``: a drop-in next to ``TorchTrainer`` that runs on a ladder of tiers.

The driver's part is small: take the run's lease, replay the ledger to learn where the run
stands (tier, counts, spend), and start one Ray Train run whose failure policy, scaling
policy and label selector are spotfallback's (see ``runtime.hooks``). Ray restores the
latest checkpoint itself because the run keeps the same ``RunConfig(storage_path, name)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ray.train import Result, RunConfig, ScalingConfig
from ray.train.v2._internal.util import ObjectRefWrapper
from ray.train.v2.api.exceptions import TrainingFailedError, WorkerGroupError

from spotfallback.config import (
    JobConfig,
    Ladder,
    PlanPrediction,
    Tier,
    format_validation_error,
    make_ladder,
)
from spotfallback.errors import (
    ConfigError,
    DriverLeaseLostError,
    LadderExhaustedError,
    RunAlreadyFinishedError,
    RunFailedError,
    RunFatalError,
    RunOnOtherClusterError,
)
from spotfallback.events import Complete, Finished, RunStarted
from spotfallback.policy import FallbackPolicy, PolicyState
from spotfallback.runtime.autoscaler_version import cluster_autoscaler
from spotfallback.runtime.classify import unwrap_user_error, user_exceptions, user_traceback
from spotfallback.runtime.hooks import LedgerCallback, TierFailurePolicy, TierScalingPolicy
from spotfallback.runtime.ladder import RunSpec
from spotfallback.store.checkpoints import prepare_resume
from spotfallback.store.heartbeat import heartbeat_interval_s
from spotfallback.store.lease import DriverLease, LeaseInfo
from spotfallback.store.lease import lease_ttl_s as check_lease_ttl_s
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import RunLocation, resolve_run
from spotfallback.store.retry import ray_run_config, storage_failure

logger = logging.getLogger("spotfallback")

BACKENDS = ("torch", "tensorflow", "none")


def _fence_off(in_main_thread: bool) -> Callable[[LeaseInfo], None]:
    """What a driver does when another took its lease (it was cut off from the storage past its TTL):
    stop training at once, or two drivers train and write one run. In the main thread (``spotfallback
    run``), SIGINT: Ray Train's own handler aborts the controller and its workers, as Ctrl-C does."""

    def stop(holder: LeaseInfo) -> None:
        if in_main_thread:
            os.kill(os.getpid(), signal.SIGINT)
        else:
            logger.error("[spotfallback] another driver (host %s, pid %s) now runs this run, and fit() runs outside "
                         "the main thread, where it cannot be interrupted: stop this process", holder.host, holder.pid)

    return stop


def _lease_lost(location: RunLocation, holder: LeaseInfo) -> DriverLeaseLostError:
    return DriverLeaseLostError(
        f"this driver lost run {location.uri()} to another (host {holder.host}, pid {holder.pid}), which took the "
        "driver lease while this one could not renew it (the storage out of reach past the lease's TTL): "
        "training stopped here, and the run goes on there"
    )


def _ladder_trainer_class(base: type) -> type:
    """A subclass of ``base`` whose ``fit`` hands Ray's controller spotfallback's policies."""

    class LadderTrainer(base):
        _spotfallback_spec: RunSpec

        def fit(self) -> Result:
            spec = self._spotfallback_spec
            train_fn_ref = ObjectRefWrapper(self._get_train_func())  # ray.put: connects this driver to Ray if not yet
            autoscaler = cluster_autoscaler()  # read once per driver; warns where v1 makes the climb's requests unsafe
            result = self._initialize_and_run_controller(
                train_fn_ref=train_fn_ref,
                scaling_policy=TierScalingPolicy(self.scaling_config, spec, autoscaler=autoscaler),
                failure_policy=TierFailurePolicy(self.run_config.failure_config, spec),
                train_run_context=self.train_run_context,
                callbacks=[*self._create_default_callbacks(), LedgerCallback(spec)],
                validation_config=self.validation_config,
            )
            if result.error:
                raise result.error
            return result

    LadderTrainer.__name__ = f"Ladder{base.__name__}"
    return LadderTrainer


def _plan_prediction(plan: Any) -> PlanPrediction | None:
    """The plan's prediction as the run records it; a mapping (a job file's ``plan:``) is read as one."""
    if plan is None or isinstance(plan, PlanPrediction):
        return plan
    if not isinstance(plan, Mapping):
        raise ConfigError(f"plan: expected a PlanPrediction (or its mapping, as a job file's plan: holds), got {type(plan).__name__}")
    try:
        return PlanPrediction.model_validate(plan)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "plan")) from None


def resolve_backend(backend: str | None, train_fn: Callable[..., Any]) -> str:
    """The argument, else the function's module's ``SPOTFALLBACK_BACKEND``, else ``torch``.

    Declared, never guessed from imports: a Torch job that also imports TensorFlow must not
    end up with TF_CONFIG workers. An argument that contradicts the declaration is an error.
    """
    from spotfallback.runtime.entrypoint import declared_backend

    declared = declared_backend(train_fn)
    chosen = backend or declared or "torch"
    if chosen not in BACKENDS:
        source = "the argument" if backend else f"{getattr(train_fn, '__module__', '?')}.SPOTFALLBACK_BACKEND"
        raise ConfigError(f"backend: {chosen!r} ({source}) is not supported; use one of {', '.join(BACKENDS)}")
    if backend and declared and backend != declared:
        raise ConfigError(
            f"backend: {backend!r} was asked for, but {train_fn.__module__}.SPOTFALLBACK_BACKEND "
            f"declares {declared!r} for {getattr(train_fn, '__qualname__', train_fn)!r}"
        )
    return chosen


def check_on_cluster(ladder: Ladder, on_cluster: str | None) -> str | None:
    """The cluster a driver of a ladder across clusters runs on: one of the ladder's, and only for such a ladder."""
    if on_cluster is None:
        if ladder.across_clusters:
            raise ConfigError(
                "tiers: this ladder runs across Ray clusters (its tiers name a cluster); run it with "
                "`spotfallback run` or spotfallback.clusters.run_across_clusters, which submit each part to its cluster"
            )
        return None
    if not ladder.across_clusters:
        raise ConfigError(f"on_cluster: {on_cluster!r} names a cluster, but no tier of this ladder does (it runs on one "
                          "Ray cluster, the one the run joins); leave it out")
    if on_cluster not in ladder.clusters:
        raise ConfigError(f"on_cluster: {on_cluster!r} is not a cluster of this ladder; its clusters are {sorted(ladder.clusters)}")
    return on_cluster


class FallbackTrainer:
    """Run an ordinary Ray Train V2 training function on a ladder of capacity tiers.

    The run starts on ``tiers[0]`` and walks down the ladder when a tier spends its
    preemption or failure budget or cannot provide workers within its capacity timeout,
    resuming from the latest checkpoint each time. Errors raised by the training function
    itself are retried on the same tier (``max_failures``) and then raised from ``fit()``:
    a bug never moves the run to pricier capacity.

    ``RunConfig(storage_path, name)`` identifies the run: running the same code again after
    a driver crash resumes it on the tier the ledger records. ``FailureConfig``'s retry
    budgets are replaced by the tiers' own; its preemption settings still apply.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        tiers: Sequence[Tier] | Ladder,
        run_config: RunConfig,
        backend: str | None = None,
        backend_config: Any = None,
        datasets: dict[str, Any] | None = None,
        retry_failed: bool = False,
        lease_ttl_s: float | None = None,
        plan: PlanPrediction | Mapping[str, Any] | None = None,
        on_cluster: str | None = None,
    ):
        self.ladder = make_ladder(tiers)
        self.on_cluster = check_on_cluster(self.ladder, on_cluster)
        if not isinstance(run_config, RunConfig):
            raise ConfigError("run_config: pass ray.train.RunConfig(storage_path=..., name=...)")
        if not callable(train_loop_per_worker):
            raise ConfigError(f"train_loop_per_worker: expected the training function, got {type(train_loop_per_worker).__name__}")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise ConfigError(f"train_loop_config: expected a dict or None, got {type(train_loop_config).__name__}")
        if lease_ttl_s is not None:
            lease_ttl_s = check_lease_ttl_s(lease_ttl_s)
        self.heartbeat_interval_s = heartbeat_interval_s()  # refused here, before any cluster work
        name = run_config.name or ""  # RunConfig generates one when none is given
        if re.fullmatch(r"ray_train_run-\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}", name):
            logger.warning(
                "run_config.name was generated by Ray (%s): a restarted driver will not find this run. "
                "Pass a unique name chosen by whoever launches the job to make it resumable.",
                run_config.name,
            )
        backend = resolve_backend(backend, train_loop_per_worker)
        storage_path = run_config.storage_path or os.path.expanduser("~/ray_results")
        self.location: RunLocation = resolve_run(storage_path, name, run_config.storage_filesystem)
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        if run_config.storage_filesystem is None and "://" not in storage_path:
            # Ray's controller resolves a plain path with pyarrow, which rejects a relative one
            # ('./runs' from a job file); hand it the absolute path the ledger uses.
            run_config = dataclasses.replace(run_config, storage_path=self.location.storage_path)
        self.run_config = run_config
        self.backend = backend
        self.backend_config = backend_config
        self.datasets = datasets
        self.retry_failed = retry_failed
        self.lease_ttl_s = lease_ttl_s
        self.plan = _plan_prediction(plan)
        self.policy = FallbackPolicy(self.ladder)
        self.ledger = Ledger(self.location, writer=f"drv{uuid.uuid4().hex[:6]}")

    @classmethod
    def from_job(cls, job: JobConfig, **kwargs: Any) -> FallbackTrainer:
        """Build from a validated job file (``spotfallback run job.yaml`` uses this)."""
        from spotfallback.runtime.entrypoint import load_entrypoint

        return cls(
            load_entrypoint(job.entrypoint),
            train_loop_config=dict(job.train_loop_config),
            tiers=job.ladder,
            run_config=RunConfig(storage_path=job.storage_path, name=job.name),
            backend=job.backend if "backend" in job.model_fields_set else None,
            plan=job.plan,
            **kwargs,
        )

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **kwargs: Any) -> FallbackTrainer:
        """Build from a job file, the same one ``spotfallback run job.yaml`` takes.

        Uses its ``name``, ``storage_path``, ``entrypoint`` (imported here), ``train_loop_config``,
        ``backend``, ``tiers`` and ``plan``; ``ray_address`` is the caller's business in Python
        (``ray.init`` before ``fit()``, or none for Ray's default). ``kwargs`` go to the
        constructor (``retry_failed``, ``lease_ttl_s``, ...). Raises ``ConfigError`` naming the
        field for a bad file or an entrypoint that cannot be imported.
        """
        return cls.from_job(JobConfig.from_yaml(Path(path)), **kwargs)

    # -- the run ------------------------------------------------------------------------

    def meta_extra(self) -> dict[str, Any]:
        """What the run's metadata keeps beside the ladder, for ``status`` and ``report`` on any machine:
        the plan's prediction (if the ladder came from ``spotfallback plan``) and the progress
        totals of ``train_loop_config`` (``total_steps``, ``num_epochs``...) for the progress bar.
        """
        from spotfallback.store.heartbeat import progress_totals

        extra: dict[str, Any] = {"progress_totals": progress_totals(self.train_loop_config)}
        if self.plan is not None:
            extra["plan"] = self.plan.model_dump(mode="json")
        return extra

    def _check_stored_ladder(self) -> None:
        stored = self.ledger.read_ladder()
        if stored is None:
            self.ledger.write_meta(self.ladder, {"name": self.location.name, "created": time.time(), **self.meta_extra()})
            return
        self._refuse_other_ladder(stored)

    def _complete_meta(self) -> None:
        """Add what an accepted resume knows and the metadata lacks (a run started by an older
        version, or before its job file had a plan); nothing already recorded is replaced."""
        meta = self.ledger.read_meta() or {}
        missing = {k: v for k, v in self.meta_extra().items() if k not in meta}
        if missing:
            kept = {k: v for k, v in meta.items() if k not in ("v", "tiers")}
            self.ledger.write_meta(self.ledger.read_ladder() or self.ladder, {**kept, **missing})

    def _refuse_other_ladder(self, stored: Ladder) -> None:
        if [t.name for t in stored.tiers] != [t.name for t in self.ladder.tiers]:
            raise ConfigError(
                f"tiers: run {self.location.uri()!r} was started with tiers "
                f"{[t.name for t in stored.tiers]}, not {[t.name for t in self.ladder.tiers]}; "
                "resume it with the same tiers or start a run with a new name"
            )

    def preflight(self) -> None:
        """Refuse now what ``fit()`` would refuse, before any cluster is started or joined.

        Read-only: another live driver (``DriverAlreadyRunningError``), a finished run
        (``RunAlreadyFinishedError``), a run that gave up (``RunFailedError``, unless
        ``retry_failed``) or another ladder (``ConfigError``). ``fit()`` checks again under the lease.
        """
        DriverLease(self.location, ttl_s=self.lease_ttl_s).refuse_if_held()
        stored = self.ledger.read_ladder()
        if stored is None:
            return
        self._refuse_other_ladder(stored)
        state = self.policy.replay(r.event for r in self.ledger.read())
        self._refuse_if_ended(state)
        self._refuse_if_elsewhere(state)

    def _refuse_if_elsewhere(self, state: PolicyState) -> None:
        """On one cluster of a ladder across clusters: refuse a run whose current tier is on another."""
        if self.on_cluster is None:
            return
        key = self.ladder.cluster_key(state.tier)
        if key != self.on_cluster:
            raise RunOnOtherClusterError(
                f"run {self.location.uri()!r} is on tier {self.ladder[state.tier].name!r} of cluster {key!r}, "
                f"not on {self.on_cluster!r}: `spotfallback run` (without --on-cluster) submits it there"
            )

    def _refuse_if_ended(self, state: PolicyState) -> None:
        if state.status == "finished":
            raise RunAlreadyFinishedError(
                f"run {self.location.uri()!r} already finished; its result and checkpoints are kept. "
                "Use a new run name to train again."
            )
        if state.status == "failed" and not self.retry_failed:
            reason = state.give_up.reason if state.give_up else "unknown"
            raise RunFailedError(
                f"run {self.location.uri()!r} gave up earlier: {reason}\n"
                "Pass retry_failed=True (CLI: --retry-failed) to resume it from its latest checkpoint "
                "with fresh tier budgets, or use a new run name."
            )

    def _start_state(self, lease: DriverLease) -> PolicyState:
        # The stored snapshot and the events after it: a long run resumes without replaying every event.
        view = self.ledger.read_view(self.ladder)
        records = view.tail
        state = self.policy.replay((r.event for r in records), view.start_state)
        self._refuse_if_ended(state)
        self._refuse_if_elsewhere(state)
        resume = prepare_resume(self.location, self.ledger, records, state.tier, snapshot=view.snapshot)
        state = self.policy.replay(resume.recorded, state)
        event = RunStarted(
            t=time.time(),
            driver=f"{os.uname().nodename}:{os.getpid()}",
            previous_seen=lease.previous.renewed_at if lease.previous else None,
            reset=state.status == "failed",
        )
        step = self.policy.decide(state, event)
        self.ledger.append(event, state.tier, step.decision.to_json(), resume.info())
        if view.events:
            logger.info(
                "resuming run %s on tier %r (%d ledger events)",
                self.location.uri(),
                self.ladder[step.state.tier].name,
                view.events,
            )
        return step.state

    def _make_trainer(self, spec: RunSpec) -> Any:
        first = self.ladder[0]
        scaling = ScalingConfig(
            num_workers=first.num_workers,
            use_gpu=first.use_gpu,
            resources_per_worker=first.resources_per_worker,
        )
        if self.backend == "torch":
            from ray.train.torch import TorchTrainer

            base: type = TorchTrainer
        elif self.backend == "tensorflow":
            # The V2 class itself: LadderTrainer needs V2's controller whatever the env says.
            from ray.train.v2.tensorflow.tensorflow_trainer import TensorflowTrainer

            base = TensorflowTrainer
        else:
            from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

            base = DataParallelTrainer
        kwargs: dict[str, Any] = {
            "train_loop_config": self.train_loop_config,
            "scaling_config": scaling,
            "run_config": ray_run_config(self.run_config, self.location),
            "datasets": self.datasets,
        }
        if self.backend_config is not None:
            key = {"torch": "torch_config", "tensorflow": "tensorflow_config"}.get(self.backend, "backend_config")
            kwargs[key] = self.backend_config
        trainer = _ladder_trainer_class(base)(self.train_loop_per_worker, **kwargs)
        trainer._spotfallback_spec = spec
        return trainer

    def fit(self) -> Result:
        """Train to completion, walking down the ladder as needed; returns Ray's ``Result``."""
        lease = DriverLease(self.location, ttl_s=self.lease_ttl_s,
                            on_lost=_fence_off(threading.current_thread() is threading.main_thread()))
        self.ledger.ensure_dirs()
        lease.acquire()
        try:
            self._check_stored_ladder()
            state = self._start_state(lease)
            self._complete_meta()
            spec = RunSpec(
                key=uuid.uuid4().hex,
                tiers=tuple(t.model_dump(mode="json") for t in self.ladder.tiers),
                state=state,
                location=self.location,
                writer=f"ctl{uuid.uuid4().hex[:6]}",
                cluster=self.on_cluster,
                heartbeat_interval_s=self.heartbeat_interval_s,
            )
            trainer = self._make_trainer(spec)
            try:
                result = trainer.fit()
            except TrainingFailedError as error:
                if lease.lost is not None:
                    raise _lease_lost(self.location, lease.lost) from None
                raise (storage_failure(error) or self._translate(error)) from error
            except BaseException:  # Ray Train's own SIGINT handler ends an aborted fit with SystemExit
                if lease.lost is not None:
                    raise _lease_lost(self.location, lease.lost) from None
                raise
            if lease.lost is not None:  # aborted: not finished, whatever Ray's result says
                raise _lease_lost(self.location, lease.lost)
            final = self.state()
            self.ledger.append(Finished(t=time.time()), final.tier, Complete().to_json())
            return result
        finally:
            lease.release()

    def state(self) -> PolicyState:
        """Where the run stands now, replayed from the ledger."""
        return self.policy.replay(r.event for r in self.ledger.read())

    def _translate(self, error: TrainingFailedError) -> BaseException:
        state = self.state()
        give_up = state.give_up
        if give_up is None:
            if self.on_cluster is not None and self.ladder.cluster_key(state.tier) != self.on_cluster:
                tier = self.ladder[state.tier]
                left = state.tier_history[-2] if len(state.tier_history) > 1 else state.tier
                return RunOnOtherClusterError(
                    f"run {self.location.uri()!r} moved to tier {tier.name!r} on cluster "
                    f"{self.ladder.cluster_key(state.tier)!r}: {state.stats[left].left_reason or 'the policy moved it'}"
                )
            return error
        if give_up.cause == "application" and isinstance(error, WorkerGroupError):
            users = user_exceptions(error)
            if users:
                user_error = unwrap_user_error(users[0])
                if isinstance(user_error, BaseException):
                    with contextlib.suppress(Exception):
                        user_error.add_note(
                            f"spotfallback: {give_up.reason}\nOn the worker:\n{user_traceback(error, users[0])}"
                        )
                    return user_error
        if give_up.cause == "exhausted":
            return LadderExhaustedError(
                f"run {self.location.uri()!r} stopped: {give_up.reason}\n"
                "Checkpoints are kept; run again with retry_failed=True (CLI: --retry-failed) to resume from the latest one."
            )
        return RunFatalError(f"run {self.location.uri()!r} stopped: {give_up.reason}")


__all__ = ["FallbackTrainer"]
