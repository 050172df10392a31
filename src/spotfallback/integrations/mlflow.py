"""Log a run's tier switches, interruptions and spend to MLflow, from the driver's progress watcher.

Why a watcher sink and not a Ray Train callback: tier switches and spend exist only in the
ledger, and the watcher already reads it on the driver. The MLflow run is found by the tag
``spotfallback.run_name`` (the spotfallback run name), so a driver restarted after a crash
logs into the same MLflow run, and events logged before the crash are not logged twice.

The sink is built only once the run is accepted (``spotfallback run`` refuses a live, finished
or failed run first), so a refused run creates no MLflow run; a tracking server that cannot be
reached is one clear error (exit 2) before any cluster starts. MLflow's own HTTP client retries
a while first (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``).

Use: ``spotfallback run job.yaml --mlflow``, or in Python::

    watcher = RunWatcher(ladder, [MlflowSink(ladder, run_name=name)])
    with watcher.watch(trainer.location):
        trainer.fit()
"""

from __future__ import annotations

import logging
import os
from typing import Any

from spotfallback.config import Ladder
from spotfallback.errors import ConfigError
from spotfallback.events import LedgerRecord
from spotfallback.view.snapshot import Snapshot

logger = logging.getLogger("spotfallback")

RUN_NAME_TAG = "spotfallback.run_name"
LOGGED_TAG = "spotfallback.events_logged"
_FAULTS = {"preempted": "preemptions", "node_failed": "node_failures", "application_failed": "training_errors",
           "capacity_timed_out": "capacity_timeouts"}


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise ConfigError("--mlflow: mlflow is not installed; pip install mlflow-skinny (or mlflow)") from None
    return mlflow


class MlflowSink:
    """A ``view.watcher.ProgressSink`` that mirrors the ledger into one MLflow run.

    If an MLflow run is active in the thread that builds the sink, that run is used (and left
    open); otherwise the run tagged with ``run_name`` in ``experiment`` (default: the
    ``MLFLOW_EXPERIMENT_NAME`` environment variable, else MLflow's default experiment) is
    resumed, or created with ``run_name`` as its MLflow run name, and closed at the end.
    """

    def __init__(self, ladder: Ladder, run_name: str, *, experiment: str | None = None, client: Any = None):
        mlflow = _mlflow()
        self.ladder = ladder
        self.owns_run = False
        self.seen = 0
        self.counts: dict[str, int] = {}
        self._last_spend_t = 0.0
        try:  # everything that talks to the tracking server, so a bad one is one clear error
            self.client = client or mlflow.MlflowClient()
            active = mlflow.active_run()
            if active is not None:
                self.run_id = active.info.run_id
            else:
                self.run_id, self.owns_run = self._find_or_create(
                    run_name, experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME"))
            run = self.client.get_run(self.run_id)
            self.skip = int(run.data.tags.get(LOGGED_TAG, "0") or 0)  # events an earlier driver logged
            self.client.set_tag(self.run_id, RUN_NAME_TAG, run_name)
            self.client.set_tag(self.run_id, "spotfallback.ladder", " -> ".join(
                f"{t.name}({t.num_workers}x{t.price_per_worker_hour:g}/h)" for t in ladder.tiers))
        except Exception as e:
            uri = os.environ.get("MLFLOW_TRACKING_URI") or "the default ./mlruns"
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ConfigError(
                f"--mlflow: cannot use the MLflow tracking server ({uri}): {type(e).__name__}: {first[:300]}; "
                "check MLFLOW_TRACKING_URI, or run without --mlflow"
            ) from None

    def _find_or_create(self, run_name: str, experiment: str | None) -> tuple[str, bool]:
        if experiment:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        else:
            experiment_id = "0"
        runs = self.client.search_runs([experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'", max_results=1)
        if runs:
            return runs[0].info.run_id, True
        run = self.client.create_run(experiment_id, run_name=run_name, tags={RUN_NAME_TAG: run_name})
        return run.info.run_id, True

    def _metrics(self, values: dict[str, float], t: float, step: int) -> None:
        for key, value in values.items():
            self.client.log_metric(self.run_id, f"spotfallback.{key}", float(value), timestamp=int(t * 1000), step=step)

    def on_event(self, record: LedgerRecord, snapshot: Snapshot, t0: float) -> None:
        step = self.seen
        self.seen += 1
        kind = record.event.kind
        if kind in _FAULTS:
            self.counts[_FAULTS[kind]] = self.counts.get(_FAULTS[kind], 0) + 1
        decision = record.decision or {}
        if decision.get("action") == "switch_tier":
            self.counts["tier_switches"] = self.counts.get("tier_switches", 0) + 1
        if step < self.skip or kind == "checkpoint_committed":
            return
        tier = record.tier
        if decision.get("action") == "switch_tier":
            tier = int(decision.get("to_tier", tier))
            self.client.set_tag(self.run_id, "spotfallback.tier", self.ladder[tier].name)
        elif kind == "workers_acquired":
            self.client.set_tag(self.run_id, "spotfallback.tier", self.ladder[tier].name)
        spend = {"spend": snapshot.spend, "on_demand_spend": snapshot.on_demand_spend}
        self._metrics({"tier": tier, **self.counts, **spend}, record.t, step)
        self.client.set_tag(self.run_id, LOGGED_TAG, str(self.seen))

    def on_snapshot(self, snapshot: Snapshot) -> None:
        # Spend between events too, once a minute, so a long quiet stretch still shows cost.
        if snapshot.now - self._last_spend_t >= 60:
            self._last_spend_t = snapshot.now
            self._metrics({"spend": snapshot.spend, "on_demand_spend": snapshot.on_demand_spend}, snapshot.now, self.seen)

    def close(self, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            return
        values = {"spend": snapshot.spend, "on_demand_spend": snapshot.on_demand_spend,
                  "running_hours": snapshot.running_s / 3600, "redone_hours": snapshot.lost_s / 3600}
        if snapshot.on_demand_spend > 0:
            values["savings"] = 1 - snapshot.spend / snapshot.on_demand_spend
        self._metrics(values, snapshot.now, self.seen)
        self.client.set_tag(self.run_id, LOGGED_TAG, str(self.seen))
        self.client.set_tag(self.run_id, "spotfallback.status", snapshot.status)
        if self.owns_run and snapshot.status in ("finished", "failed"):
            self.client.set_terminated(self.run_id, "FINISHED" if snapshot.status == "finished" else "FAILED")
