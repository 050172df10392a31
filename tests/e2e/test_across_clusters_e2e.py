"""A ladder across two Ray clusters: the run moved between them through each one's Ray Jobs API.

What is real: two local Ray clusters side by side (separate heads, ports and temp dirs, each
with its dashboard's Jobs API), the run's storage on a local S3 server (moto), every part of
the run a Ray job that the moving driver submits (`spotfallback run --on-cluster NAME`), and
the moving driver itself, in this process (the Python API) or as `spotfallback run` in a
subprocess that is SIGKILLed. Faults: cluster A's spot node preempted with no room left for
a replacement; every process of cluster A killed at once (a region outage).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("aiohttp", reason="the Jobs API needs ray[default] (the clusters extra)")

from tests.support.helpers_e2e import (  # noqa: E402
    SLOW_UNDER_LOAD,
    at_full_speed,
    checkpoints_since,
    module_env,
    preempt_then_kill_the_driver,
    unique_name,
    wait_for,
)
from tests.support.s3server import S3Server  # noqa: E402

pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent
CONFIG = {"total_steps": 16, "checkpoint_every": 4, "step_delay_s": 0.4, "seed": 7}
UNREACHABLE_S = 8.0  # the outage test's: short, so that it is quick
# Every other test's: a freshly started head's Jobs API can be silent for seconds on a loaded
# machine, which must not read as a lost cluster where the test is about something else.
PATIENT_S = 60.0


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="module")
def env(s3: S3Server) -> Iterator[dict[str, str]]:
    """The e2e environment, S3 credentials and the venv's `spotfallback` on PATH: the clusters'
    raylets, hence the Ray jobs' drivers, inherit it."""
    extra = {**s3.env(), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "SPOTFALLBACK_LEASE_TTL_S": "6"}
    with module_env(extra, ("SPOTFALLBACK_RAY_ADDRESS", "RAY_ADDRESS"), True):
        yield {**os.environ}


def start_cluster(markets: list[str]) -> Any:
    from spotfallback.local import LocalSpotCluster, NodeGroup

    return LocalSpotCluster([NodeGroup(m, count=1) for m in markets], jobs_api=True).start()


@pytest.fixture(scope="module")
def cluster_b(env: dict[str, str]) -> Iterator[Any]:
    cluster = start_cluster(["spot", "on-demand"])
    try:
        yield cluster
    finally:
        cluster.shutdown()


def weights_of_a_run_without_faults(cluster: Any, config: dict[str, Any], tmp: Path) -> str:
    """Final weights of the job run on one cluster with no fault at all."""
    import ray.train

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.examples.ddp_digits import train_fn

    with cluster.driver():
        trainer = FallbackTrainer(train_fn, train_loop_config=at_full_speed(config), tiers=[Tier.on_demand(1)],
                                  run_config=ray.train.RunConfig(storage_path=str(tmp), name=unique_name("ref")))
        result = trainer.fit()
    return str(result.metrics["weights_sha256"])


@pytest.fixture(scope="module")
def reference(cluster_b: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    return weights_of_a_run_without_faults(cluster_b, CONFIG, tmp_path_factory.mktemp("ref"))


def job_config(s3: S3Server, name: str, a: str, b: str, tmp: Path, spot_timeout_s: float = 180,
               config: dict[str, Any] = CONFIG, climb_back: bool = False,
               unreachable_s: float = PATIENT_S) -> tuple[Any, Path]:
    """Spot on cluster A (no preemption tolerated; ``climb_back``: priced below on-demand, and the run
    returns to it), then on-demand on cluster B; the job file too."""
    from spotfallback.config import JobConfig

    climb = {"climb_back": True, "min_dwell_s": 0, "price_per_worker_hour": 0.3} if climb_back else {}
    data = {
        "name": name,
        "storage_path": s3.uri("runs"),
        "entrypoint": "spotfallback.examples.ddp_digits:train_fn",
        "train_loop_config": config,
        "tiers": [
            {"name": "spot-a", "market": "spot", "num_workers": 1, "max_preemptions": 0, "capacity_timeout_s": spot_timeout_s,
             "cluster": {"address": a, "name": "a", "region": "us-east-1", "unreachable_timeout_s": unreachable_s}, **climb},
            {"name": "on-demand-b", "market": "on-demand", "num_workers": 1, "capacity_timeout_s": 180,
             "price_per_worker_hour": 1.0,
             "cluster": {"address": b, "name": "b", "region": "us-west-2", "unreachable_timeout_s": unreachable_s}},
        ],
    }
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return JobConfig.model_validate(data), path


def ledger_of(job: Any) -> Any:
    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import resolve_run

    return Ledger(resolve_run(job.storage_path, job.name))


def jobs_of(cluster: Any, job: Any) -> list[Any]:
    """The run's Ray jobs on ``cluster``, as the Jobs API lists them (oldest first)."""
    from spotfallback.clusters.jobs import ClusterJobs
    from spotfallback.config import ClusterRef

    return ClusterJobs(ClusterRef(address=cluster.jobs_address)).jobs_of(ledger_of(job).location.uri())


def assert_never_two_at_once(jobs: list[Any]) -> None:
    """No job of the run started before the previous one ended, on whichever cluster."""
    spans = sorted((d.start_time, d.end_time or float("inf"), d.submission_id) for d in jobs)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        assert start >= end, f"{second} started before {first} ended"


def workers_tiers(records: list[Any]) -> list[int]:
    return [r.tier for r in records if r.event.kind == "workers_acquired"]


@SLOW_UNDER_LOAD
def test_spot_gone_on_cluster_a_the_run_finishes_on_cluster_b(s3: S3Server, cluster_b: Any, reference: str,
                                                               tmp_path: Path) -> None:
    from spotfallback.clusters import ClusterMover
    from spotfallback.local import Injector
    from tests.support.helpers_e2e import Background

    a = start_cluster(["spot"])
    try:
        job, _ = job_config(s3, unique_name("across"), a.jobs_address, cluster_b.jobs_address, tmp_path)
        mover = ClusterMover(job, poll_s=0.5)
        run = Background(mover.run)
        ledger = ledger_of(job)
        wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 120, run)
        with Injector(a) as injector:
            assert injector.preempt_one("spot", notice_s=1.0) is not None  # and no spot node comes back
            outcome = run.join(240)
        assert outcome.exit_code == 0, outcome.message
        assert outcome.result is not None and outcome.result["metrics"]["weights_sha256"] == reference
        records = ledger.read()
        assert workers_tiers(records) == [0, 1]
        switch = next(r for r in records if r.event.kind == "preempted")
        assert switch.decision["action"] == "switch_tier" and switch.decision["to_tier"] == 1
        assert_never_two_at_once(jobs_of(a, job) + jobs_of(cluster_b, job))
        assert [d.status for d in jobs_of(a, job)] == ["FAILED"]  # exit 8: moved to cluster b
        # `status` and `report` say where each tier ran.
        uri = ledger.location.uri()
        status = subprocess.run([str(BIN / "spotfallback"), "status", uri], capture_output=True, text=True, timeout=60)
        assert "on-demand-b (on-demand on cluster b, us-west-2" in " ".join(status.stdout.split()), status.stdout
        report = subprocess.run([str(BIN / "spotfallback"), "report", uri, "--out", str(tmp_path / "t.png")],
                                capture_output=True, text=True, timeout=120)
        assert report.returncode == 0 and "spot on cluster a, us-east-1" in report.stdout, report.stdout + report.stderr
    finally:
        a.shutdown()


@SLOW_UNDER_LOAD
def test_no_spot_capacity_on_cluster_a_the_capacity_timeout_moves_the_run_to_b(
    s3: S3Server, cluster_b: Any, reference: str, tmp_path: Path
) -> None:
    from spotfallback.clusters import ClusterMover

    a = start_cluster([])  # a head and no worker node: spot never comes
    try:
        job, _ = job_config(s3, unique_name("nospot"), a.jobs_address, cluster_b.jobs_address, tmp_path, spot_timeout_s=8)
        outcome = ClusterMover(job, poll_s=0.5).run()
        assert outcome.exit_code == 0, outcome.message
        assert outcome.result is not None and outcome.result["metrics"]["weights_sha256"] == reference
        records = ledger_of(job).read()
        timeout = next(r for r in records if r.event.kind == "capacity_timed_out")
        assert timeout.tier == 0 and timeout.decision["action"] == "switch_tier" and timeout.decision["to_tier"] == 1
        # The timeout, to a poll and a loaded machine's Train controller start (the precision is the benchmark's).
        assert 7.5 <= timeout.event.waited_s < 8 + 30 and workers_tiers(records) == [1]
        assert [d.status for d in jobs_of(a, job)] == ["FAILED"]  # exit 8: moved to cluster b
    finally:
        a.shutdown()


@SLOW_UNDER_LOAD
def test_spot_back_on_cluster_a_the_run_climbs_back_from_b_just_after_a_checkpoint(
    s3: S3Server, cluster_b: Any, tmp_path: Path
) -> None:
    """No spot on cluster a at first: the capacity timeout sends the run to on-demand on b. Once a spot
    node joins a, the moving driver's look (a Ray job on a) sees it, the policy says the climb pays,
    and the mover stops b's job just after a commit: the run finishes on a with the weights of a
    run without any move."""
    from spotfallback.clusters import ClusterMover
    from spotfallback.clusters.looks import LOOK_KEY
    from spotfallback.local import NodeGroup
    from tests.support.helpers_e2e import Background

    config = {**CONFIG, "total_steps": 80}  # long enough on b for a node to join a and be looked at
    expected = weights_of_a_run_without_faults(cluster_b, config, tmp_path / "ref")
    a = start_cluster([])
    try:
        # The capacity timeout also bounds the climb's start on a, from its decision on: the move's
        # job start included, 20 s and more on a loaded machine.
        job, _ = job_config(s3, unique_name("climb"), a.jobs_address, cluster_b.jobs_address, tmp_path, spot_timeout_s=45,
                            config=config, climb_back=True)
        ledger = ledger_of(job)
        run = Background(ClusterMover(job, poll_s=0.5, look_every_s=1.0, look_wait_s=2.0).run)
        wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=1) >= 1, 180, run)
        a.add_node(NodeGroup("spot", count=1))
        outcome = run.join(300)
        assert outcome.exit_code == 0, outcome.message
        assert outcome.result is not None and outcome.result["metrics"]["weights_sha256"] == expected
        records = ledger.read()
        assert workers_tiers(records) == [1, 0]
        climb = next(r for r in records if r.event.kind == "capacity_observed")
        assert climb.decision is not None and climb.decision["action"] == "climb_back" and climb.decision["to_tier"] == 0
        assert climb.tier == 1 and climb.event.available_workers == 1 and climb.info["cluster"] == "a"
        # Decided just after one of b's commits (as a driver within its cluster decides a climb).
        commits = [r.event.t for r in records if r.event.kind == "checkpoint_committed" and r.tier == 1]
        assert commits and max(t for t in commits if t <= climb.event.t) >= climb.event.t - 30 - 60  # + the stop
        assert_never_two_at_once(jobs_of(a, job) + jobs_of(cluster_b, job))
        assert [d.status for d in jobs_of(cluster_b, job)] == ["STOPPED"]
        assert [d.status for d in jobs_of(a, job)] == ["FAILED", "SUCCEEDED"]  # exit 8 to b, then the climb's
        from ray.job_submission import JobSubmissionClient

        looks = [d for d in JobSubmissionClient(a.jobs_address).list_jobs()
                 if (d.metadata or {}).get(LOOK_KEY) == ledger.location.uri()]
        assert looks and all(str(getattr(d.status, "value", d.status)) in ("SUCCEEDED", "STOPPED") for d in looks)
    finally:
        a.shutdown()


@SLOW_UNDER_LOAD
def test_cluster_a_lost_the_run_moves_to_b_within_its_timeout(s3: S3Server, cluster_b: Any, reference: str,
                                                              tmp_path: Path) -> None:
    from spotfallback.clusters import ClusterMover
    from tests.support.helpers_e2e import Background

    a = start_cluster(["spot"])
    try:
        job, _ = job_config(s3, unique_name("outage"), a.jobs_address, cluster_b.jobs_address, tmp_path,
                            unreachable_s=UNREACHABLE_S)
        run = Background(ClusterMover(job, poll_s=0.5).run)
        ledger = ledger_of(job)
        wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 120, run)
        killed_at = time.time()
        a.kill_all()
        outcome = run.join(240)
        assert outcome.exit_code == 0, outcome.message
        assert outcome.result is not None and outcome.result["metrics"]["weights_sha256"] == reference
        records = ledger.read()
        lost = next(r for r in records if r.event.kind == "cluster_unreachable")
        assert lost.event.cluster == "a" and lost.decision["action"] == "switch_tier"
        # Declared lost once the Jobs API had not answered for the cluster's timeout, and not much later.
        assert UNREACHABLE_S <= lost.event.t - killed_at <= UNREACHABLE_S + 30, lost.event.t - killed_at
        assert workers_tiers(records) == [0, 1]
        assert [r.tier for r in records if r.event.kind == "workers_acquired"][-1] == 1
    finally:
        a.shutdown()


@SLOW_UNDER_LOAD
def test_mover_killed_mid_move_the_same_command_finishes_on_the_right_cluster(
    s3: S3Server, cluster_b: Any, reference: str, env: dict[str, str], tmp_path: Path
) -> None:
    from spotfallback.local import Injector

    a = start_cluster(["spot"])
    try:
        job, path = job_config(s3, unique_name("moverkill"), a.jobs_address, cluster_b.jobs_address, tmp_path)
        ledger = ledger_of(job)
        with Injector(a) as injector:
            # SIGKILLed once the policy has moved the run to cluster b, as the mover goes there.
            log = preempt_then_kill_the_driver([str(BIN / "spotfallback"), "run", str(path)], ledger, injector, tmp_path,
                                               kill_when=lambda rs: any(r.event.kind == "preempted" for r in rs), env=env)
        result = json.loads(log.strip().splitlines()[-1])
        assert result["status"] == "finished" and result["metrics"]["weights_sha256"] == reference
        records = ledger.read()
        assert workers_tiers(records) == [0, 1]
        assert_never_two_at_once(jobs_of(a, job) + jobs_of(cluster_b, job))
        assert [d.status for d in jobs_of(cluster_b, job)] == ["SUCCEEDED"]
    finally:
        a.shutdown()


def test_a_second_mover_is_refused(s3: S3Server, cluster_b: Any, env: dict[str, str], tmp_path: Path) -> None:
    from spotfallback.clusters.mover import MOVER_LEASE_FILE
    from spotfallback.store.lease import DriverLease

    # Cluster a is never contacted: the lease refuses first.
    job, path = job_config(s3, unique_name("second"), "http://127.0.0.1:9", cluster_b.jobs_address, tmp_path)
    held = DriverLease(ledger_of(job).location, file=MOVER_LEASE_FILE, ttl_s=60)
    held.acquire()
    try:
        done = subprocess.run([str(BIN / "spotfallback"), "run", str(path)], env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        held.release()
    assert done.returncode == 5, done.stderr[-2000:]
    assert "another driver is running this run" in done.stderr


def test_the_jobs_api_answers_for_its_own_cluster_whatever_ray_address_says(cluster_b: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a real Jobs API: an exported RAY_ADDRESS does not redirect a named cluster's requests
    (Ray's client takes it over the address given); a job the cluster does not know is gone, not an
    error; a submission sent again under its id is the one job."""
    import uuid

    from spotfallback.clusters.jobs import GONE, ClusterJobs
    from spotfallback.config import ClusterRef
    from tests.support.s3server import free_port

    monkeypatch.setenv("RAY_ADDRESS", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    jobs = ClusterJobs(ClusterRef(address=cluster_b.jobs_address, name="b"))
    run_uri = f"s3://nowhere/runs/{uuid.uuid4().hex}"
    assert jobs.jobs_of(run_uri) == []
    assert os.environ["RAY_ADDRESS"].startswith("http://127.0.0.1:")  # put back as it was
    assert jobs.status("spotfallback-no-such-job") == GONE
    jobs.stop("spotfallback-no-such-job")
    assert jobs.logs("spotfallback-no-such-job") == ""
    submission_id = f"spotfallback-twice-{uuid.uuid4().hex[:8]}"
    assert jobs.submit(submission_id, "true", run_uri) == submission_id
    assert jobs.submit(submission_id, "true", run_uri) == submission_id  # its first answer lost: sent again
    assert [j.submission_id for j in jobs.jobs_of(run_uri)] == [submission_id]


def test_one_cluster_under_two_addresses_is_refused_before_any_job(s3: S3Server, cluster_b: Any, env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    """Two addresses of one cluster (its IP and a name) look like two clusters; Ray's session says they
    are one. The mover would stop the run's own job as another cluster's: it refuses, naming both."""
    from spotfallback.clusters.jobs import ClusterJobs
    from spotfallback.config import ClusterRef

    b = cluster_b.jobs_address
    assert "127.0.0.1" in b
    same = b.replace("127.0.0.1", "localhost")
    session = ClusterJobs(ClusterRef(address=b, name="b")).session()
    assert session is not None and session.startswith("session_")
    assert ClusterJobs(ClusterRef(address=same, name="a")).session() == session
    job, path = job_config(s3, unique_name("twice"), same, b, tmp_path)
    done = subprocess.run([str(BIN / "spotfallback"), "run", str(path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"clusters 'a' ({same}) and 'b' ({b}) are one Ray cluster (session {session})" in done.stderr
    assert "Traceback" not in done.stderr
    assert jobs_of(cluster_b, job) == []
