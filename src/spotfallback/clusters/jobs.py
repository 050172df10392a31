"""One Ray cluster's Jobs API, as the driver that moves a run between clusters uses it.

Why the Jobs API: it is Ray's supported way to run work on a remote cluster (KubeRay's
RayJob submits through it too), it runs the entrypoint on the cluster's head, beside the
GCS, so a run there is an ordinary `spotfallback run` with `RAY_ADDRESS` set, and it keeps
each job's status, metadata and logs on the cluster. A run's jobs are found by their
metadata (``spotfallback_run``: the run's storage URI), so a restarted mover finds the job
a killed one submitted. Every request has a timeout: a cluster whose region is down must
read as unreachable, not hang the mover.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from spotfallback.config import ClusterRef
from spotfallback.errors import ClusterUnreachableError

logger = logging.getLogger("spotfallback")

RUN_KEY = "spotfallback_run"  # the job metadata naming the run a job belongs to
ACTIVE = ("PENDING", "RUNNING")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RunJob:
    """One Ray job of a run on one cluster."""

    submission_id: str
    status: str  # PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    start_time: float  # seconds since the epoch (0 if unknown)
    end_time: float | None = None  # seconds since the epoch; None while it runs

    @property
    def active(self) -> bool:
        return self.status in ACTIVE


def _timed_client(address: str, timeout_s: float) -> Any:
    """Ray's ``JobSubmissionClient`` with a timeout on every request (it sets none itself)."""
    from ray.job_submission import JobSubmissionClient

    class TimedClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", timeout_s)
            return super()._do_request(method, endpoint, **kwargs)

    return TimedClient(address)


class ClusterJobs:
    """The Jobs API of the cluster ``ref`` names; every call raises ``ClusterUnreachableError`` when it cannot answer."""

    def __init__(self, ref: ClusterRef, request_timeout_s: float = REQUEST_TIMEOUT_S):
        self.ref = ref
        self.request_timeout_s = request_timeout_s
        self._client: Any = None

    @property
    def name(self) -> str:
        return self.ref.key

    def _call(self, what: str, fn: Any) -> Any:
        import requests

        try:
            if self._client is None:
                self._client = _timed_client(self.ref.address, self.request_timeout_s)
            return fn(self._client)
        except (ConnectionError, requests.exceptions.RequestException) as e:
            self._client = None  # reconnect (and re-check the version) next time
            raise ClusterUnreachableError(f"cluster {self.name!r} ({self.ref.address}): cannot {what}: {e}") from None
        except RuntimeError as e:  # Ray's client turns any HTTP error into a RuntimeError
            if "status code 5" in str(e):
                raise ClusterUnreachableError(f"cluster {self.name!r} ({self.ref.address}): cannot {what}: {e}") from None
            raise

    def jobs_of(self, run_uri: str) -> list[RunJob]:
        """This run's jobs on the cluster, oldest first."""
        details = self._call("list its jobs", lambda c: c.list_jobs())
        found = [
            RunJob(d.submission_id, str(getattr(d.status, "value", d.status)), (d.start_time or 0) / 1000.0,
                   None if d.end_time is None else d.end_time / 1000.0)
            for d in details
            if (d.metadata or {}).get(RUN_KEY) == run_uri and d.submission_id
        ]
        return sorted(found, key=lambda j: j.start_time)

    def active_job(self, run_uri: str) -> RunJob | None:
        """The run's job that is pending or running here, if any (the newest)."""
        active = [j for j in self.jobs_of(run_uri) if j.active]
        return active[-1] if active else None

    def submit(self, submission_id: str, entrypoint: str, run_uri: str, env: dict[str, str] | None = None,
               *, key: str = RUN_KEY) -> str:
        """Submit a job of the run ``run_uri``, named in its metadata under ``key`` (``RUN_KEY``: a part of the run)."""
        runtime_env = {"env_vars": env} if env else None
        return str(self._call("submit the run", lambda c: c.submit_job(
            entrypoint=entrypoint, submission_id=submission_id, metadata={key: run_uri}, runtime_env=runtime_env,
        )))

    def status(self, submission_id: str) -> str:
        return str(getattr(s := self._call("read the job's status", lambda c: c.get_job_status(submission_id)), "value", s))

    def stop(self, submission_id: str) -> None:
        self._call("stop the job", lambda c: c.stop_job(submission_id))

    def logs(self, submission_id: str) -> str:
        return str(self._call("read the job's logs", lambda c: c.get_job_logs(submission_id)))


__all__ = ["ACTIVE", "RUN_KEY", "TERMINAL", "ClusterJobs", "RunJob"]
