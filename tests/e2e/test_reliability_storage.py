"""Storage under a real run: S3 (moto), the S3 server going away mid-upload, damaged checkpoints.

One local cluster for the module (head, two spot and two on-demand one-CPU nodes) and one
moto S3 server. An outage is the S3 endpoint going away: the run reaches moto only through
``s3server.OutageProxy``, which resets and refuses every connection from the instant a chosen
checkpoint file's upload is sent until it is told to come back. The outage limit is 8 s per
storage call for the whole module (``SPOTFALLBACK_STORAGE_RETRY_S``, set before the cluster
starts so the controller and worker processes have it too).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.helpers_e2e import (  # noqa: E402
    SLOW_UNDER_LOAD,
    Background,
    checkpoints_since,
    local_cluster,
    preempt_then_kill_the_driver,
    restoring_injector,
    unique_name,
    wait_for,
)
from tests.support.reliability import (  # noqa: E402
    RUN_CONFIG,
    Outcome,
    check_run,
    committed_not_in_snapshot,
    final_result,
    not_plain_data,
    record,
    reference_hash,
    snapshot_names,
    steps_redone,
)

pytestmark = pytest.mark.ray

RETRY_S = 8.0
OUTAGE_S = 4.0  # longer than the S3 client's own retries (~2 s), shorter than the limit
CONFIG = RUN_CONFIG
SPOT_THEN_ON_DEMAND = [
    {"name": "spot", "market": "spot", "num_workers": 2, "max_preemptions": 0, "capacity_timeout_s": 60},
    {"name": "on-demand", "market": "on-demand", "num_workers": 2, "capacity_timeout_s": 120},
]


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(env={"SPOTFALLBACK_STORAGE_RETRY_S": str(RETRY_S)}) as c:
        yield c


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    return reference_hash(tmp_path_factory.mktemp("ref"), CONFIG)


@pytest.fixture()
def injector(cluster):
    with restoring_injector(cluster) as inj:
        yield inj


def trainer_for(storage_path: str, name: str, config: dict, *, fs=None, tiers=None, **kw):
    import ray.train

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.examples.ddp_digits import train_fn

    return FallbackTrainer(
        train_fn,
        train_loop_config=config,
        tiers=[Tier(**t) for t in tiers] if tiers else [Tier.on_demand(2, max_failures=2)],
        run_config=ray.train.RunConfig(storage_path=storage_path, name=name, storage_filesystem=fs),
        **kw,
    )


def worker_logs(cluster, text: str) -> int:
    """How many lines of the cluster's worker logs contain ``text`` (the back-off is logged there)."""
    count = 0
    for path in Path(cluster.temp_dir).glob("session_*/logs/worker-*"):
        try:
            count += sum(text in line for line in path.read_text(errors="replace").splitlines())
        except OSError:
            continue
    return count


# -- S3 ------------------------------------------------------------------------------------


@SLOW_UNDER_LOAD
def test_s3_run_survives_a_preemption_and_a_driver_restart(cluster, s3, injector, reference, tmp_path):
    """Checkpoints and ledger in the bucket; the relaunched driver resumes there, bit for bit."""
    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import resolve_run

    t0 = time.monotonic()
    name = unique_name("s3")
    step_log = tmp_path / "steps.jsonl"
    spec = {
        "address": cluster.address,
        "s3_endpoint": s3.endpoint,
        "storage_path": f"{s3.bucket}/runs",
        "name": name,
        "config": {**CONFIG, "step_log": str(step_log)},
        "tiers": SPOT_THEN_ON_DEMAND,
    }
    location = resolve_run(f"{s3.bucket}/runs", name, s3.filesystem())
    ledger = Ledger(location)
    command = [sys.executable, "-m", "tests.support.api_driver", json.dumps(spec)]

    final = final_result(preempt_then_kill_the_driver(command, ledger, injector, tmp_path))
    assert final["metrics"]["weights_sha256"] == reference

    records, problems, lost, dupes = check_run(location)
    assert problems == [] and lost == [] and dupes == 0
    kinds = [r.event.kind for r in records if r.event.kind != "checkpoint_committed"]
    assert kinds == ["run_started", "workers_acquired", "preempted", "workers_acquired", "run_started", "workers_acquired", "finished"]
    assert records[-1].tier == 1
    # Everything lives in the bucket: Ray's checkpoints and snapshot, spotfallback's ledger.
    fs = s3.filesystem()
    from pyarrow.fs import FileSelector

    keys = [i.path for i in fs.get_file_info(FileSelector(f"{s3.bucket}/runs/{name}", recursive=True))]
    assert any(k.endswith("/checkpoint_manager_snapshot.json") for k in keys)
    assert any("/_spotfallback/ledger/" in k for k in keys) and any(k.endswith("/_spotfallback/run.json") for k in keys)
    assert len(snapshot_names(location)) == sum(r.event.kind == "checkpoint_committed" for r in records) == 6
    assert not_plain_data(location, _user_files()) == []
    record(
        Outcome(
            "object storage (S3 via moto): preemption + driver SIGKILL",
            injected=2,
            runs_completed=1,
            runs=1,
            steps_redone=steps_redone(step_log, CONFIG["total_steps"]),
            events_lost=len(problems),
            checkpoints_lost=len(lost),
            duplicated_events=dupes,
            seconds=time.monotonic() - t0,
        )
    )


def _user_files() -> tuple[str, ...]:
    from spotfallback.examples.ddp_digits import CHECKPOINT_FILES

    return CHECKPOINT_FILES


# -- storage outages (the S3 server goes away and comes back) -------------------------------


@pytest.fixture()
def outage(s3):
    """A proxy in front of the module's S3 server: the run's only way to its storage."""
    from tests.support.s3server import OutageProxy

    with OutageProxy(s3.endpoint) as proxy:
        yield proxy


def test_s3_outage_in_the_middle_of_a_checkpoint_upload_only_pauses_the_run(cluster, s3, outage, reference, tmp_path):
    """The storage endpoint goes away the instant a checkpoint file's upload is sent, for 4 s."""
    from spotfallback.store.location import resolve_run

    t0 = time.monotonic()
    name = unique_name("outage")
    step_log = tmp_path / "steps.jsonl"
    trainer = trainer_for(f"{s3.bucket}/outages", name, {**CONFIG, "step_log": str(step_log)}, fs=s3.filesystem(outage.endpoint))
    before = worker_logs(cluster, "storage error while trying to write")
    # The step-5 checkpoint's second file: model.pt is stored, optimizer.pt is in flight.
    outage.cut_on("optimizer.pt", duration_s=OUTAGE_S)
    driver = Background(trainer.fit)
    result = driver.join(300)
    assert driver.error is None, driver.error
    assert outage.outages == 1 and outage.refused > 0, outage.log  # clients were turned away meanwhile
    assert result.metrics["weights_sha256"] == reference

    location = resolve_run(f"{s3.bucket}/outages", name, s3.filesystem())  # read past the proxy
    records, problems, lost, dupes = check_run(location)
    assert problems == [] and lost == [] and dupes == 0
    # Not one restart: the run waited for storage instead of failing.
    assert [r.event.kind for r in records if r.event.kind != "checkpoint_committed"] == [
        "run_started", "workers_acquired", "finished",
    ]
    assert steps_redone(step_log, CONFIG["total_steps"]) == 0
    assert len(snapshot_names(location)) == 6 and committed_not_in_snapshot(location, records) == set()
    assert worker_logs(cluster, "storage error while trying to write") > before  # the back-off is logged
    record(
        Outcome(
            "S3 outage shorter than the limit (server gone mid-upload)",
            injected=outage.outages,
            runs_completed=1,
            runs=1,
            steps_redone=0,
            events_lost=len(problems),
            checkpoints_lost=len(lost),
            duplicated_events=dupes,
            seconds=time.monotonic() - t0,
            notes=f"{OUTAGE_S:g} s outage (limit {RETRY_S:g} s) cut a checkpoint upload; {outage.refused} connections refused; 0 restarts",
        )
    )


def test_s3_outage_past_the_limit_stops_clearly_keeps_everything_and_resumes(cluster, s3, outage, reference, tmp_path):
    from spotfallback.errors import StorageUnavailableError
    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import resolve_run

    t0 = time.monotonic()
    name = unique_name("gone")
    step_log = tmp_path / "steps.jsonl"
    config = {**CONFIG, "step_log": str(step_log)}
    storage = f"{s3.bucket}/outages"
    # A short lease: this driver cannot delete its lease while storage is gone, and the resume
    # below runs in this same (live) process, so it waits for the lease to expire.
    trainer = trainer_for(storage, name, config, fs=s3.filesystem(outage.endpoint), lease_ttl_s=3)
    location = resolve_run(storage, name, s3.filesystem())  # the test reads past the proxy
    driver = Background(trainer.fit)
    wait_for(Ledger(location), lambda rs: checkpoints_since(rs, "workers_acquired") >= 2, 180, driver)
    outage.cut_on("optimizer.pt", duration_s=None)  # the next checkpoint's upload: storage is gone for good
    driver.join(180)
    assert outage.down and outage.cut_at is not None
    stopped_after = time.monotonic() - outage.cut_at
    assert isinstance(driver.error, StorageUnavailableError), repr(driver.error)
    message = str(driver.error)
    assert "storage unavailable" in message and "SPOTFALLBACK_STORAGE_RETRY_S" in message and "intact" in message
    assert stopped_after < 10 * RETRY_S, f"the back-off is bounded: stopped {stopped_after:.0f}s after the cut"

    # Everything written before the outage is intact (read while the endpoint is still away):
    # the ledger replays, each commit is whole, the upload cut short is recorded nowhere.
    records, problems, lost, dupes = check_run(location, expect_finished=False)
    assert problems == [] and lost == [] and dupes == 0
    committed = [r for r in records if r.event.kind == "checkpoint_committed"]
    assert len(committed) == len(snapshot_names(location)) >= 2
    partial = [d for d in checkpoint_dirs(location) if d not in snapshot_names(location)]
    assert partial, "the interrupted upload left a partial checkpoint prefix (and nothing refers to it)"

    # Storage is back: the same run resumes from the last whole checkpoint and ends bit for bit.
    # (The stopped driver could not delete its lease; a new process would take it over at once
    # since its pid is gone, but this test resumes in the same process, so the lease must expire.)
    outage.restore()
    from spotfallback.store.lease import DriverLease

    stale = DriverLease(location).read()
    if stale is not None:
        time.sleep(max(0.0, stale.expires_at - time.time()) + 0.5)
    resumed = trainer_for(storage, name, config, fs=s3.filesystem(outage.endpoint))
    result = resumed.fit()
    assert result.metrics["weights_sha256"] == reference
    records, problems, lost, dupes = check_run(location)
    assert problems == [] and lost == [] and dupes == 0
    record(
        Outcome(
            "S3 gone past the limit (stop, then resume)",
            injected=outage.outages,
            runs_completed=1,
            runs=1,
            steps_redone=steps_redone(step_log, CONFIG["total_steps"]),
            events_lost=len(problems),
            checkpoints_lost=len(lost),
            duplicated_events=dupes,
            seconds=time.monotonic() - t0,
            notes=f"StorageUnavailableError {stopped_after:.0f} s after the cut (limit {RETRY_S:g} s per call); "
            "resumed by running again once the server was back",
        )
    )


def checkpoint_dirs(location) -> list[str]:
    from pyarrow.fs import FileType

    from spotfallback.store.location import list_dir

    return sorted(
        i.base_name for i in list_dir(location.fs, location.run_dir) if i.type == FileType.Directory and i.base_name.startswith("checkpoint_")
    )


# -- damaged checkpoints ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def failed_run(cluster, tmp_path_factory):
    """A run that stopped at step 18 (an application error, no retries) after checkpoints 5, 10, 15."""
    from spotfallback.errors import RunFailedError  # noqa: F401 - documents the state it leaves

    root = tmp_path_factory.mktemp("damaged")
    name = unique_name("base")
    config = {**CONFIG, "raise_at_step": 18, "raise_marker": str(root / "raised")}
    no_retries = [{"name": "on-demand", "market": "on-demand", "num_workers": 2, "max_failures": 0}]
    trainer = trainer_for(str(root / "runs"), name, {**config, "step_log": str(root / "base-steps.jsonl")}, tiers=no_retries)
    with pytest.raises(ValueError, match="injected application error at step 18"):
        trainer.fit()
    assert len(snapshot_names(trainer.location)) == 3
    return root, name, config


@pytest.mark.parametrize(
    "damage",
    ["truncated", "file_missing", "dir_gone"],
)
def test_damaged_newest_checkpoint_resumes_from_the_newest_whole_one(failed_run, reference, damage, tmp_path, caplog):
    from spotfallback.store.checkpoints import DAMAGED_DIR

    t0 = time.monotonic()
    root, base, config = failed_run
    name = unique_name(f"damaged-{damage}")
    run_dir = root / "runs" / name
    shutil.copytree(root / "runs" / base, run_dir)
    shutil.copy(root / "base-steps.jsonl", tmp_path / "steps.jsonl")
    newest = sorted(p for p in run_dir.glob("checkpoint_2*"))[-1]
    previous = sorted(p for p in run_dir.glob("checkpoint_2*"))[-2].name
    if damage == "truncated":
        (newest / "model.pt").write_bytes((newest / "model.pt").read_bytes()[:64])
    elif damage == "file_missing":
        (newest / "optimizer.pt").unlink()
    else:
        shutil.rmtree(newest)

    trainer = trainer_for(str(root / "runs"), name, {**config, "step_log": str(tmp_path / "steps.jsonl")}, retry_failed=True)
    with caplog.at_level("WARNING", logger="spotfallback"):
        result = trainer.fit()
    assert result.metrics["weights_sha256"] == reference

    records, problems, lost, dupes = check_run(trainer.location)
    assert problems == [] and lost == [] and dupes == 0
    repair = [r.info["checkpoint_repair"] for r in records if "checkpoint_repair" in r.info]
    assert len(repair) == 1 and repair[0]["resumed_from"] == previous
    assert [d["checkpoint"] for d in repair[0]["damaged"]] == [newest.name]
    assert f"checkpoint {newest.name} is damaged" in caplog.text and previous in caplog.text
    kept = list((run_dir / DAMAGED_DIR).glob(f"{newest.name}.*"))
    assert (len(kept) == 1) == (damage != "dir_gone")  # set aside, never deleted
    # Resumed from step 10: steps 11-17 ran twice (the failed attempt had reached step 17).
    redone = steps_redone(tmp_path / "steps.jsonl", CONFIG["total_steps"])
    assert redone == 7
    record(
        Outcome(
            f"damaged newest checkpoint ({damage.replace('_', ' ')})",
            injected=1,
            runs_completed=1,
            runs=1,
            steps_redone=redone,
            events_lost=len(problems),
            checkpoints_lost=len(lost),
            duplicated_events=dupes,
            seconds=time.monotonic() - t0,
            notes=f"resumed from {previous[:11]}… (step 10); damaged one kept under _damaged/"
            if damage != "dir_gone"
            else "directory gone: Ray alone fails with CheckpointManagerInitializationError",
        )
    )
