"""How the mover reads a job's end on a cluster: Ray's reason for a failed job, and a climb's wait
for the stopped job to end and for its driver's lease to be free, without Ray.

Ray's ``JobDetails`` is the real one (its field names are the contract); the clusters are the
scripted ``FakeJobs`` of ``test_ladder_across_clusters``, and the run's lease is a real one on
local storage.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotfallback.clusters.jobs import GONE, ClusterJobs, RunJob
from spotfallback.config import ClusterRef, JobConfig, Tier
from spotfallback.errors import ClusterUnreachableError
from spotfallback.events import (
    CapacityObserved,
    CheckpointCommitted,
    ClusterUnreachable,
    RunStarted,
    WorkersAcquired,
)
from tests.unit.test_ladder_across_clusters import FakeJobs, _fake_mover, _mover_job

RUNTIME_ENV = ("runtime_env setup failed: Failed to set up runtime environment.\n"
               "Traceback (most recent call last):\n  File \"pip.py\", line 1\n"
               "ModuleNotFoundError: No module named 'torch'")
ENTRYPOINT = ("Job entrypoint command failed with exit code 2, last available logs (truncated to 20,000 chars):\n"
              "[spotfallback] joining Ray\nerror: ray_address: cannot connect to Ray at 'auto'")


def _details(**fields: object) -> object:
    from ray.dashboard.modules.job.pydantic_models import JobDetails

    base = {"type": "SUBMISSION", "submission_id": "sub-1", "status": "FAILED", "entrypoint": "spotfallback run",
            "start_time": 1_000_000, "end_time": 1_005_000, "metadata": {"spotfallback_run": "s3://b/runs/r"}}
    return JobDetails(**{**base, **fields})


# -- Ray's reason for a job's end ---------------------------------------------------------------


def test_a_jobs_details_carry_rays_reason_and_a_forgotten_job_is_gone() -> None:
    class Client:
        def get_job_info(self, submission_id: str) -> object:
            if submission_id != "sub-1":
                raise RuntimeError("Request failed with status code 404: Job sub-2 does not exist.")
            return _details(message=RUNTIME_ENV, error_type="RUNTIME_ENV_SETUP_FAILURE")

        def list_jobs(self) -> list[object]:
            return [_details(message=ENTRYPOINT, error_type="JOB_ENTRYPOINT_COMMAND_ERROR", driver_exit_code=2)]

    jobs = ClusterJobs(ClusterRef(address="http://head-a:8265", name="a"))
    jobs._client = Client()
    job = jobs.job("sub-1")
    assert (job.status, job.error_type, job.exit_code, job.end_time) == ("FAILED", "RUNTIME_ENV_SETUP_FAILURE", None, 1005.0)
    assert job.why == ("runtime_env setup failed: Failed to set up runtime environment. ... ModuleNotFoundError: "
                       "No module named 'torch' [RUNTIME_ENV_SETUP_FAILURE]")
    assert jobs.status("sub-1") == "FAILED" and jobs.job("sub-2") == RunJob("sub-2", GONE, 0.0)
    [listed] = jobs.jobs_of("s3://b/runs/r")
    assert listed.exit_code == 2 and listed.why.endswith(
        "error: ray_address: cannot connect to Ray at 'auto' [JOB_ENTRYPOINT_COMMAND_ERROR, exit code 2]")
    long = RunJob("x", "FAILED", 0.0, message="x" * 500)
    assert len(long.why) == 200 and long.why.endswith("...") and RunJob("x", "SUCCEEDED", 0.0).why == ""


@pytest.mark.parametrize(("message", "error_type", "exit_code", "said"), [
    (RUNTIME_ENV, "RUNTIME_ENV_SETUP_FAILURE", None, "No module named 'torch' [RUNTIME_ENV_SETUP_FAILURE]"),
    (ENTRYPOINT, "JOB_ENTRYPOINT_COMMAND_ERROR", 2, "cannot connect to Ray at 'auto' [JOB_ENTRYPOINT_COMMAND_ERROR, exit code 2]"),
    ("Job supervisor actor died: The actor died unexpectedly", "JOB_SUPERVISOR_ACTOR_DIED", None,
     "Job supervisor actor died: The actor died unexpectedly [JOB_SUPERVISOR_ACTOR_DIED]"),
])
def test_a_failed_job_says_rays_reason_and_so_does_the_movers_last_word(
        tmp_path: Path, message: str, error_type: str, exit_code: int | None, said: str) -> None:
    """Each job's end is said with Ray's reason; three that move nothing end the mover with the last one's."""
    lines: list[str] = []
    mover, fakes = _fake_mover(_mover_job(tmp_path), lines)
    submit = fakes["a"].submit

    def failing(submission_id: str, *args: object, **kwargs: object) -> str:
        submit(submission_id, *args, **kwargs)  # type: ignore[arg-type]
        fakes["a"].jobs[submission_id] = RunJob(submission_id, "FAILED", time.time(), time.time(), message=message,
                                                error_type=error_type, exit_code=exit_code)
        return submission_id

    fakes["a"].submit = failing  # type: ignore[method-assign]
    outcome = mover.run()  # type: ignore[attr-defined]
    assert outcome.exit_code == 1 and f"the last one's status: FAILED ({message.splitlines()[0]}" in outcome.message
    assert said in outcome.message, outcome.message
    ended = [line for line in lines if ": FAILED: " in line]
    assert len(ended) == 3 and all(said in line for line in ended), lines


def test_a_look_that_fails_says_rays_reason(caplog: pytest.LogCaptureFixture) -> None:
    from spotfallback.clusters.looks import CapacityLooks

    class Jobs:
        def submit(self, submission_id: str, *args: object, **kwargs: object) -> str:
            return submission_id

        def job(self, submission_id: str) -> RunJob:
            return RunJob(submission_id, "FAILED", 0.0, message=RUNTIME_ENV, error_type="RUNTIME_ENV_SETUP_FAILURE")

        def logs(self, submission_id: str) -> str:
            return ""

    looks = CapacityLooks({"a": Jobs()}, "s3://b/runs/r", "r")  # type: ignore[dict-item]
    tier = Tier.spot(1, name="spot-1", cluster={"address": "http://head-a:8265", "name": "a"})
    looks.start(0, tier, "a", now=0.0)
    with caplog.at_level(logging.WARNING, logger="spotfallback"):
        assert looks.collect(tier) == 0
    [warned] = [r.getMessage() for r in caplog.records if "without a result" in r.getMessage()]
    assert "ended FAILED (runtime_env setup failed" in warned and "No module named 'torch'" in warned


# -- a climb's wait for the stopped job and its driver's lease ------------------------------------


class StoppingJobs(FakeJobs):
    """A cluster whose ``stop`` takes effect after ``polls`` more status reads (Ray stops a job asynchronously),
    and then makes the cluster silent for ``silent`` calls (an outage in the middle of a climb)."""

    def __init__(self, ref: object, polls: int = 0, silent: int = 0) -> None:
        super().__init__(ref)
        self.polls, self.silent, self.stops = polls, silent, 0
        self.stopping: str | None = None

    def _answer(self) -> None:
        if self.silent:
            self.silent -= 1
            raise ClusterUnreachableError(f"cluster {self.name!r}: cannot answer: down")
        super()._answer()

    def stop(self, submission_id: str) -> None:
        self.stops += 1
        self.stopping = submission_id
        if not self.polls:
            self._stopped()

    def status(self, submission_id: str) -> str:
        self._answer()
        if self.stopping == submission_id and self.polls:
            self.polls -= 1
            if not self.polls:
                self._stopped()
        return self.jobs[submission_id].status

    def _stopped(self) -> None:
        assert self.stopping is not None
        self.jobs[self.stopping] = replace(self.jobs[self.stopping], status="STOPPED", end_time=time.time())


def _climbing(tmp_path: Path, lines: list[str], **stopping: int) -> tuple[object, StoppingJobs, CapacityObserved]:
    """A mover of a run that left spot on cluster a and trains on on-demand on cluster b (job ``y``),
    and the capacity a look saw on a: the policy climbs back on it."""
    from spotfallback.clusters import ClusterMover

    clusters = [{"address": f"http://head-{n}:8265", "name": n} for n in ("a", "b")]
    job = JobConfig.model_validate({"name": "climb", "storage_path": str(tmp_path), "entrypoint": "m:f", "tiers": [
        {"name": "spot", "market": "spot", "num_workers": 1, "cluster": clusters[0], "climb_back": True,
         "min_dwell_s": 0, "price_per_worker_hour": 0.3},
        {"name": "on-demand", "market": "on-demand", "num_workers": 1, "cluster": clusters[1], "price_per_worker_hour": 1.0},
    ]})
    mover = ClusterMover(job, poll_s=0.05, lease_ttl_s=3, say=lines.append)
    b = StoppingJobs(mover.clusters["b"].ref, **stopping)
    mover.clusters.update({"a": FakeJobs(mover.clusters["a"].ref), "b": b})  # type: ignore[dict-item]
    b.jobs["y"] = RunJob("y", "RUNNING", time.time())
    mover.ledger.ensure_dirs()
    t0, state = time.time() - 3600, mover.policy.initial_state()
    for e in (RunStarted(t0), WorkersAcquired(t0 + 1), ClusterUnreachable(t=t0 + 100, cluster="a", waited_s=30),
              WorkersAcquired(t0 + 200), CheckpointCommitted(t0 + 800, remaining_work_s=20000),
              CheckpointCommitted(t0 + 1400, remaining_work_s=19400)):
        step = mover.policy.decide(state, e)
        mover.ledger.append(e, state.tier, step.decision.to_json())
        state = step.state
    seen = CapacityObserved(t=time.time(), tier=0, available_workers=1, remaining_work_s=19400, restart_s=100.0,
                            checkpoint_interval_s=600.0)
    return mover, b, seen


def _hold_lease(mover: object, expires_in_s: float, renewed_at: float | None = None) -> None:
    """The run's driver lease as the stopped job's driver left it on its cluster's head (another host)."""
    now = time.time()
    info = {"token": "job-y", "host": "head-b", "pid": 4242, "renewed_at": now if renewed_at is None else renewed_at,
            "expires_at": now + expires_in_s}
    Path(mover.location.path("lease.json")).write_text(json.dumps(info))  # type: ignore[attr-defined]


def _climbs(mover: object) -> list[object]:
    return [r for r in mover.ledger.read() if r.event.kind == "capacity_observed"]  # type: ignore[attr-defined]


def test_a_climb_waits_out_a_lease_its_stopped_driver_did_not_let_go_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray SIGKILLs a stopped driver: its lease, no longer renewed, expires at its own time, and the climb waits for it.

    (A fixed wait shorter than the lease's TTL gave up the climb with the job already stopped.)
    """
    from spotfallback.clusters import mover as mover_module

    # Mover versions with a fixed wait (LEASE_WAIT_S, 120 s) for the lease: shortened here, so that a lease
    # that outlasts it takes seconds to test; none is left to shorten now.
    monkeypatch.setattr(mover_module, "LEASE_WAIT_S", 0.3, raising=False)
    lines: list[str] = []
    mover, b, seen = _climbing(tmp_path, lines)
    _hold_lease(mover, expires_in_s=1.5)
    t0 = time.monotonic()
    assert mover._climb("b", b, "y", seen) is True  # type: ignore[attr-defined]
    assert time.monotonic() - t0 >= 1.0
    [climb] = _climbs(mover)
    assert climb.decision["action"] == "climb_back" and climb.info["cluster"] == "a"  # type: ignore[attr-defined]
    assert any("ended STOPPED, but its driver (host head-b, pid 4242) did not let go of the run's lease: waiting for it "
               "to expire in" in line for line in lines), lines
    assert any(line.startswith("climbing back to 'spot' on cluster 'a'") for line in lines), lines


def test_a_climb_waits_for_a_slow_stop_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No climb is written while the stopped job still runs, even with the lease free; the stop is asked again."""
    from spotfallback.clusters import mover as mover_module

    monkeypatch.setattr(mover_module, "STOP_AGAIN_S", 0.1, raising=False)
    lines: list[str] = []
    mover, b, seen = _climbing(tmp_path, lines, polls=8)
    written: list[str] = []
    append = mover.ledger.append  # type: ignore[attr-defined]

    def checked(*args: object, **kwargs: object) -> object:
        written.append(b.jobs["y"].status)
        return append(*args, **kwargs)

    mover.ledger.append = checked  # type: ignore[attr-defined]
    assert mover._climb("b", b, "y", seen) is True  # type: ignore[attr-defined]
    assert written == ["STOPPED"] and b.stops >= 2 and len(_climbs(mover)) == 1
    assert "waiting for job y on cluster 'b' to stop (it is RUNNING)" in lines, lines


def test_a_lease_renewed_after_the_job_ended_means_no_climb(tmp_path: Path) -> None:
    """Another driver of the run holds its lease: nothing is written, and the mover says why it does not climb."""
    from spotfallback.store.lease import DriverLease

    lines: list[str] = []
    mover, b, seen = _climbing(tmp_path, lines)
    other = DriverLease(mover.location, ttl_s=3)  # type: ignore[attr-defined]
    other.acquire()  # live on this host, renewed every second
    try:
        assert mover._climb("b", b, "y", seen) is True  # type: ignore[attr-defined]
    finally:
        other.release()
    assert _climbs(mover) == [] and b.jobs["y"].status == "STOPPED"
    assert any("the run's lease was renewed after job y ended" in line and "another driver of the run holds it" in line
               for line in lines), lines
    assert any(line.startswith("no climb to 'spot': the run goes on where its ledger says") for line in lines), lines


def test_a_job_the_mover_stopped_for_a_climb_is_not_taken_for_an_operators_stop(tmp_path: Path) -> None:
    """The cluster falls silent in the middle of a climb and answers again with the job STOPPED: the mover's own stop."""
    lines: list[str] = []
    mover, b, seen = _climbing(tmp_path, lines)
    climbed: list[bool] = []

    def climb_once(key: str, jobs: object, submission_id: str) -> bool:
        if climbed:
            return False
        climbed.append(True)
        b.silent = 3  # once the stop is sent
        return mover._climb(key, jobs, submission_id, seen)  # type: ignore[attr-defined, no-any-return]

    mover._climb_across = climb_once  # type: ignore[attr-defined]
    outcome, _ = mover._run_on("b", retry=False)  # type: ignore[attr-defined]
    assert outcome == "climbed" and b.submitted == [] and _climbs(mover) == [], lines
    assert "job y on cluster 'b': STOPPED by this mover for a climb it could not finish; the run goes on where its " \
           "ledger says" in lines


def test_the_wait_for_a_held_lease_is_said_once_per_holder(tmp_path: Path) -> None:
    lines: list[str] = []
    mover, _ = _fake_mover(_mover_job(tmp_path), lines)
    mover.ledger.ensure_dirs()  # type: ignore[attr-defined]
    _hold_lease(mover, expires_in_s=30)
    assert not mover._driver_lease_free() and not mover._driver_lease_free()  # type: ignore[attr-defined]
    said = [line for line in lines if "to let go of its lease before the next job is submitted" in line]
    assert len(said) == 1 and "host head-b, pid 4242" in said[0] and "expires in 30s" in said[0], lines
