"""One Ray cluster's Jobs API, as the driver that moves a run between clusters uses it.

Why the Jobs API: it is Ray's supported way to run work on a remote cluster (KubeRay's
RayJob submits through it too), it runs the entrypoint on the cluster's head, beside the
GCS, so a run there is an ordinary `spotfallback run` with `RAY_ADDRESS` set, and it keeps
each job's status, metadata and logs on the cluster. A run's jobs are found by their
metadata (``spotfallback_run``: the run's storage URI), so a restarted mover finds the job
a killed one submitted. Every request has a timeout: a cluster whose region is down must
read as unreachable, not hang the mover; one that refuses the request (authentication, TLS)
is a configuration to fix, not an outage to wait out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from spotfallback.config import ClusterRef
from spotfallback.errors import ClusterUnreachableError, ConfigError

logger = logging.getLogger("spotfallback")

RUN_KEY = "spotfallback_run"  # the job metadata naming the run a job belongs to
ACTIVE = ("PENDING", "RUNNING")
# GONE: the cluster no longer knows the job (its head restarted without GCS fault tolerance), so
# no driver of it runs there any more.
GONE = "GONE"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED", GONE)
REQUEST_TIMEOUT_S = 10.0
# Ray's client takes these over the address it is given (as ray.init does); see ``_own_address``.
ADDRESS_OVERRIDES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_ENV_LOCK = threading.Lock()


# How much of Ray's message about a job is shown (its first and last lines, each cut to this).
WHY_CHARS = 200


@dataclass(frozen=True)
class RunJob:
    """One Ray job of a run on one cluster.

    ``message``, ``error_type`` and ``exit_code`` are what Ray says of why it ended (a runtime
    environment that failed to set up, a supervisor actor that died or could not be scheduled,
    an entrypoint that exited non-zero). Only the last two are structured: Ray documents no
    wording for its message, so it is shown to people and never parsed.
    """

    submission_id: str
    status: str  # PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED (or GONE)
    start_time: float  # seconds since the epoch (0 if unknown)
    end_time: float | None = None  # seconds since the epoch; None while it runs
    message: str = ""  # Ray's message about the status (for an entrypoint's failure, with its log's end)
    error_type: str | None = None  # Ray's JobErrorType (a stable public enum), e.g. RUNTIME_ENV_SETUP_FAILURE
    exit_code: int | None = None  # the entrypoint's exit code (Ray's driver_exit_code); None unless it exited

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def why(self) -> str:
        """Ray's reason in one line: its message's first and last lines (a traceback's or a log's last line
        is the error), the error type and exit code; empty when Ray gave none."""
        lines = [ln.strip() for ln in self.message.splitlines() if ln.strip()]
        parts = [_cut(lines[0])] if lines else []
        if len(lines) > 1:
            parts.append(_cut(lines[-1]))
        said = " ... ".join(parts)
        tags = [t for t in (self.error_type, None if self.exit_code is None else f"exit code {self.exit_code}") if t]
        return f"{said} [{', '.join(tags)}]" if tags and said else said or ", ".join(tags)


def _cut(line: str) -> str:
    return line if len(line) <= WHY_CHARS else line[:WHY_CHARS - 3] + "..."


def _run_job(d: Any, submission_id: str) -> RunJob:
    """A ``RunJob`` of Ray's ``JobDetails`` (what ``list_jobs`` and ``get_job_info`` answer)."""
    error_type = getattr(d, "error_type", None)
    exit_code = getattr(d, "driver_exit_code", None)
    return RunJob(
        submission_id, str(getattr(d.status, "value", d.status)), (d.start_time or 0) / 1000.0,
        None if d.end_time is None else d.end_time / 1000.0,
        message=str(getattr(d, "message", None) or ""),
        error_type=None if error_type is None else str(getattr(error_type, "value", error_type)),
        exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
    )


@contextlib.contextmanager
def _own_address() -> Iterator[None]:
    """Ray's client without ``RAY_ADDRESS`` / ``RAY_API_SERVER_ADDRESS``, which it takes over the address given.

    The mover reaches several clusters by their own addresses: a ``RAY_ADDRESS`` exported for
    ``ray job submit``, or the one Ray sets where the mover itself runs as a Ray job, would send
    every cluster's requests to that one cluster (and a restarted mover would stop the run's own
    job there as "another cluster's"). Ray reads them only while a client is made.
    """
    with _ENV_LOCK:
        saved = {k: os.environ.pop(k) for k in ADDRESS_OVERRIDES if k in os.environ}
        try:
            yield
        finally:
            os.environ.update(saved)


def _timed_client(ref: ClusterRef, timeout_s: float) -> Any:
    """Ray's ``JobSubmissionClient`` for ``ref`` with a timeout on every request (it sets none itself)."""
    from ray.job_submission import JobSubmissionClient

    class TimedClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", timeout_s)
            return super()._do_request(method, endpoint, **kwargs)

    headers = None
    if ref.token_env is not None:
        token = os.environ.get(ref.token_env, "").strip()
        if not token:
            raise ConfigError(f"cluster {ref.key!r}: token_env: the environment variable {ref.token_env} that "
                              "holds the cluster's Ray authentication token is not set; export it and run again")
        headers = {"Authorization": f"Bearer {token}"}
    with _own_address():
        return TimedClient(ref.address, headers=headers)


def _missing(error: RuntimeError) -> bool:
    """Whether Ray's client error is the Jobs API's "no such job" (HTTP 404)."""
    return "status code 404" in str(error)


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
        from ray.exceptions import AuthenticationError

        where = f"cluster {self.name!r} ({self.ref.address})"
        try:
            if self._client is None:
                self._client = _timed_client(self.ref, self.request_timeout_s)
            return fn(self._client)
        except AuthenticationError as e:
            self._client = None
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"{where}: cannot {what}: the Jobs API refused the request ({first}); give the "
                              "cluster's Ray token (RAY_AUTH_TOKEN for every cluster, or the cluster's token_env)"
                              ) from None
        except requests.exceptions.SSLError as e:
            self._client = None
            raise ConfigError(f"{where}: cannot {what}: TLS: {e}; point REQUESTS_CA_BUNDLE at the CA that signed the "
                              "cluster's certificate, or use its http:// address") from None
        except (ConnectionError, requests.exceptions.RequestException) as e:
            self._client = None  # reconnect (and re-check the version) next time
            raise ClusterUnreachableError(f"cluster {self.name!r} ({self.ref.address}): cannot {what}: {e}") from None
        except RuntimeError as e:  # Ray's client turns any HTTP error into a RuntimeError
            if "status code 5" in str(e):
                raise ClusterUnreachableError(f"cluster {self.name!r} ({self.ref.address}): cannot {what}: {e}") from None
            raise

    def session(self) -> str | None:
        """The Ray session of the cluster's head (its Jobs API's ``/api/version``); None where it does not say.

        Two addresses that reach one cluster (a node's IP and a Service name, say) answer with one
        session: the mover tells them apart by it, not by the address.
        """
        def read(client: Any) -> str | None:
            answer = client._do_request("GET", "/api/version")
            if answer.status_code != 200:
                return None
            try:
                session = answer.json().get("session_name")
            except (ValueError, AttributeError):
                return None
            return session if isinstance(session, str) and session else None

        return self._call("read its version", read)

    def jobs_of(self, run_uri: str) -> list[RunJob]:
        """This run's jobs on the cluster, oldest first."""
        details = self._call("list its jobs", lambda c: c.list_jobs())
        found = [_run_job(d, d.submission_id) for d in details
                 if (d.metadata or {}).get(RUN_KEY) == run_uri and d.submission_id]
        return sorted(found, key=lambda j: j.start_time)

    def active_job(self, run_uri: str) -> RunJob | None:
        """The run's job that is pending or running here, if any (the newest)."""
        active = [j for j in self.jobs_of(run_uri) if j.active]
        return active[-1] if active else None

    def submit(self, submission_id: str, entrypoint: str, run_uri: str, env: dict[str, str] | None = None,
               *, key: str = RUN_KEY) -> str:
        """Submit a job of the run ``run_uri``, named in its metadata under ``key`` (``RUN_KEY``: a part of the run).

        Submitting an id again is safe: a retry whose first try reached the cluster before its
        answer was lost finds the job there (Ray answers that the id already exists) and
        returns its id rather than a second job.
        """
        runtime_env = {"env_vars": env} if env else None
        try:
            return str(self._call("submit the run", lambda c: c.submit_job(
                entrypoint=entrypoint, submission_id=submission_id, metadata={key: run_uri}, runtime_env=runtime_env,
            )))
        except (ClusterUnreachableError, RuntimeError) as e:
            if "already exists" in str(e):
                return submission_id
            raise

    def job(self, submission_id: str) -> RunJob:
        """The job as the cluster sees it, with Ray's reason when it ended; status ``GONE`` when the cluster no
        longer knows it. One request, as ``status`` (Ray's ``get_job_status`` reads the same job info)."""
        try:
            found = self._call("read the job's status", lambda c: c.get_job_info(submission_id))
        except RuntimeError as e:
            if _missing(e):
                return RunJob(submission_id, GONE, 0.0)
            raise
        return _run_job(found, submission_id)

    def status(self, submission_id: str) -> str:
        """The job's status; ``GONE`` when the cluster no longer knows it."""
        return self.job(submission_id).status

    def stop(self, submission_id: str) -> None:
        """Ask the cluster to stop the job (Ray stops it asynchronously); nothing to do when it is gone."""
        try:
            self._call("stop the job", lambda c: c.stop_job(submission_id))
        except RuntimeError as e:
            if not _missing(e):
                raise

    def logs(self, submission_id: str) -> str:
        """The job's log; empty when the cluster no longer knows the job."""
        try:
            return str(self._call("read the job's logs", lambda c: c.get_job_logs(submission_id)))
        except RuntimeError as e:
            if _missing(e):
                return ""
            raise


__all__ = ["ACTIVE", "ADDRESS_OVERRIDES", "GONE", "RUN_KEY", "TERMINAL", "ClusterJobs", "RunJob"]
