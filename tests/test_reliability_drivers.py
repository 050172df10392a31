"""Driver processes dying and racing: `kill -9` at ten moments of one run, two drivers at once.

Every driver is a real `spotfallback run job.yaml` subprocess joined to the module's cluster
(head, two spot and two on-demand one-CPU nodes), so a SIGKILL takes the driver, its Train
controller and its workers down exactly as a crashed launcher would, and the relaunch is the
same command. A dead driver's lease on the same host is taken over at once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

from helpers_e2e import REPO, apply_env, unique_name  # noqa: E402
from reliability import (  # noqa: E402
    RUN_CONFIG,
    Outcome,
    check_run,
    committed_not_in_snapshot,
    not_plain_data,
    record,
    reference_hash,
    steps_redone,
)

pytestmark = pytest.mark.ray

CONFIG = RUN_CONFIG
# The kill loop needs room: ten launches each take a few steps, and the last must still train.
KILL_CONFIG = {**RUN_CONFIG, "total_steps": 50}
TIERS = [
    {"name": "spot", "market": "spot", "num_workers": 2, "max_preemptions": 0, "capacity_timeout_s": 90},
    {"name": "on-demand", "market": "on-demand", "num_workers": 2, "capacity_timeout_s": 180},
]


@pytest.fixture(scope="module")
def s3():
    from s3server import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture(scope="module")
def cluster(s3):
    apply_env()
    os.environ.update(s3.env())  # drivers, controllers and workers reach the bucket by URI
    from spotfallback.local import LocalSpotCluster, NodeGroup

    c = LocalSpotCluster([NodeGroup("spot", count=2), NodeGroup("on-demand", count=2)], connect=True)
    c.start()
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    return reference_hash(tmp_path_factory.mktemp("ref"), KILL_CONFIG)


@pytest.fixture()
def injector(cluster):
    from spotfallback.local import Injector

    inj = Injector(cluster)
    try:
        yield inj
    finally:
        for market in ("spot", "on-demand"):
            inj.give_back(market)
            inj.replenish(market)
        inj.close()


class Driver:
    """`spotfallback run job.yaml` as a subprocess; ``launches`` counts every start."""

    def __init__(self, job: dict, workdir: Path):
        self.workdir = workdir
        self.job_file = workdir / "job.yaml"
        self.job_file.write_text(yaml.safe_dump(job))
        self.command = [sys.executable, "-m", "spotfallback.cli", "run", str(self.job_file)]
        self.launches = 0

    def start(self) -> subprocess.Popen:
        self.launches += 1
        out = open(self.workdir / f"driver-{self.launches}.log", "w")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(self.command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)

    def log(self, n: int) -> str:
        return (self.workdir / f"driver-{n}.log").read_text()


def wait_until(predicate: Callable[[], bool], timeout: float, proc: subprocess.Popen | None = None, poll: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the driver exited with {proc.returncode} before the moment came")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the moment did not come within {timeout}s")
        time.sleep(poll)


def sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)


def test_two_drivers_started_at_the_same_instant_exactly_one_runs(cluster, s3, tmp_path):
    """On object storage (no exclusive create): one driver trains, the other exits 5 and says why."""
    from spotfallback.ledger import Ledger
    from spotfallback.storage import resolve_run

    t0 = time.monotonic()
    name = unique_name("twins")
    job = {
        "name": name,
        "storage_path": s3.uri("runs"),
        "entrypoint": "examples.ddp_digits:train_fn",
        "train_loop_config": {**CONFIG, "total_steps": 10},
        "ray_address": cluster.address,
        "tiers": [TIERS[1]],
    }
    driver = Driver(job, tmp_path)
    procs = [driver.start(), driver.start()]
    try:
        codes = sorted(p.wait(300) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [driver.log(1), driver.log(2)]
    assert codes == [0, 5], logs
    loser = logs[[p.returncode for p in procs].index(5)]
    assert "another driver is running this run" in loser or "lost the race for the driver lease" in loser
    assert "Traceback" not in loser
    records, problems, lost, dupes = check_run(resolve_run(s3.uri("runs"), name))
    assert problems == [] and lost == [] and dupes == 0
    assert sum(r.event.kind == "run_started" for r in Ledger(resolve_run(s3.uri("runs"), name)).read()) == 1
    record(
        Outcome(
            "two drivers at the same instant (S3 lease)",
            injected=1,
            runs_completed=1,
            runs=1,
            steps_redone=0,
            events_lost=len(problems),
            checkpoints_lost=len(lost),
            duplicated_events=dupes,
            seconds=time.monotonic() - t0,
            notes="the second driver exited 5 with a clear message",
        )
    )


def test_sigkill_the_driver_at_ten_moments_of_one_run(cluster, injector, reference, tmp_path):
    """Ten SIGKILLs, each followed by the same command; same weights, every event once, in order."""
    from spotfallback.ledger import Ledger
    from spotfallback.storage import resolve_run

    t0 = time.monotonic()
    rng = random.Random(5)
    name = unique_name("kills")
    step_log = tmp_path / "steps.jsonl"
    job = {
        "name": name,
        "storage_path": str(tmp_path / "runs"),
        "entrypoint": "examples.ddp_digits:train_fn",
        "train_loop_config": {**KILL_CONFIG, "step_log": str(step_log)},
        "ray_address": cluster.address,
        "tiers": TIERS,
    }
    driver = Driver(job, tmp_path)
    location = resolve_run(str(tmp_path / "runs"), name)
    ledger = Ledger(location)
    moments: list[str] = []

    def steps() -> list[int]:
        if not step_log.exists():
            return []
        return [json.loads(x)["step"] for x in step_log.read_text().splitlines() if x.strip()]

    def records_since(n: int) -> list:
        return ledger.read()[n:]

    def kill_when(moment: str, predicate: Callable[[int, int], bool], timeout: float = 240, jitter: float = 0.0) -> None:
        """Launch the driver, wait until ``predicate(steps_before, records_before)``, SIGKILL it."""
        n_steps, n_records = len(steps()), len(ledger.read())
        proc = driver.start()
        try:
            wait_until(lambda: predicate(n_steps, n_records), timeout, proc)
            if jitter:
                time.sleep(rng.uniform(0, jitter))
            sigkill(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
        moments.append(moment)

    def new_steps(n: int) -> list[int]:
        return steps()[n:]

    def kinds_since(n: int) -> list[str]:
        """What the run did since record ``n`` (not the commits a relaunched driver catches up on)."""
        return [r.event.kind for r in records_since(n) if r.info.get("recorded_by") != "driver"]

    # 1. The run has started training but no checkpoint exists yet.
    kill_when("before the first checkpoint", lambda s, r: len(new_steps(s)) >= 2)
    # 2. Rank 0 finished the step it checkpoints: the checkpoint is being written and uploaded.
    kill_when("during a checkpoint write", lambda s, r: any(x % 5 == 0 for x in new_steps(s)))
    # 3. The relaunched driver replayed the ledger and Ray is starting the workers again.
    kill_when("while the workers start", lambda s, r: "workers_acquired" in kinds_since(r))
    # 4. Somewhere inside a step between two checkpoints.
    kill_when("mid-step", lambda s, r: len(new_steps(s)) >= 3 and new_steps(s)[-1] % 5 in (2, 3), jitter=0.15)

    # 5. A preemption moves the run to on-demand: the driver dies inside the switch.
    n_records = len(ledger.read())
    proc = driver.start()
    try:
        wait_until(lambda: "checkpoint_committed" in kinds_since(n_records), 240, proc)
        injector.preempt_one("spot", notice_s=1.0)
        wait_until(lambda: any(r.decision and r.decision.get("action") == "switch_tier" for r in records_since(n_records)), 120, proc)
        sigkill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    moments.append("during a tier switch")

    # 6. No on-demand capacity: the driver dies while the run waits for it.
    injector.take_capacity("on-demand", notice_s=None)
    kill_when("during a capacity wait", lambda s, r: "run_started" in kinds_since(r), jitter=2.0)
    injector.give_back("on-demand")
    # 7. The same checkpoint moment, now on the on-demand tier.
    kill_when("during a checkpoint write (on-demand)", lambda s, r: any(x % 5 == 0 for x in new_steps(s)))
    # 8. Right after the new driver recorded its start, before Ray has done anything.
    kill_when("right after the driver's start was recorded", lambda s, r: "run_started" in kinds_since(r))
    # 9. Mid-step again, at a random point inside the step.
    kill_when("mid-step (random)", lambda s, r: len(new_steps(s)) >= 3 and new_steps(s)[-1] % 5 in (1, 2), jitter=0.15)
    # 10. Just after a checkpoint was committed.
    kill_when("right after a checkpoint commit", lambda s, r: "checkpoint_committed" in kinds_since(r))
    assert len(moments) == 10

    final = driver.start()
    try:
        assert final.wait(300) == 0, driver.log(driver.launches)[-3000:]
    finally:
        if final.poll() is None:
            final.kill()
    result = json.loads(driver.log(driver.launches).strip().splitlines()[-1])
    assert result["status"] == "finished"
    assert result["metrics"]["weights_sha256"] == reference

    records, problems, lost, dupes = check_run(location)
    assert problems == [], problems
    assert lost == [] and dupes == 0
    kinds = [r.event.kind for r in records]
    assert kinds.count("run_started") == driver.launches == 11  # every launch once
    assert kinds.count("preempted") == 1 and kinds.count("finished") == 1
    assert [r.tier for r in records if r.event.kind == "workers_acquired"][-1] == 1
    assert committed_not_in_snapshot(location, records) == set()
    assert not_plain_data(location, _user_files()) == []
    redone = steps_redone(step_log, KILL_CONFIG["total_steps"])
    record(
        Outcome(
            "driver SIGKILL (10 moments of one run)",
            injected=len(moments),
            runs_completed=1,
            runs=1,
            steps_redone=redone,
            events_lost=len(problems),
            checkpoints_lost=len(lost),
            duplicated_events=dupes,
            seconds=time.monotonic() - t0,
            notes="; ".join(moments),
        )
    )


def _user_files() -> tuple[str, ...]:
    from examples.ddp_digits import CHECKPOINT_FILES

    return CHECKPOINT_FILES
