"""Azure Blob and GCS as run storage, for real: the storage suite's core on Azurite and on a GCS emulator.

One local cluster for the module (head, two spot and two on-demand one-CPU nodes), one Azurite
blob service and one GCS emulator, both on loopback; each test runs once per backend. The
cluster's processes get what a user's nodes would have: Azurite's connection string and
``STORAGE_EMULATOR_HOST``, so the same ``abfs://`` / ``gs://`` URI works in the job file, in the
Ray processes and in ``status`` / ``report``. The core, as the S3 tests do it
(``test_reliability_storage.py``): a job file's run preempted, its driver SIGKILLed and launched
again; the endpoint going away the instant a checkpoint file's upload is sent (4 s, under the
8 s limit: the run only pauses); a truncated newest checkpoint (the resume falls back to the one
before and keeps the damaged one). Azurite, like an account without a hierarchical namespace,
cannot rename: the ledger's whole-object writes go through a server-side copy there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

from tests.support.helpers_e2e import (  # noqa: E402
    REPO,
    SLOW_UNDER_LOAD,
    Background,
    local_cluster,
    preempt_then_kill_the_driver,
    restoring_injector,
    unique_name,
)
from tests.support.reliability import (  # noqa: E402
    RUN_CONFIG,
    check_run,
    committed_not_in_snapshot,
    final_result,
    reference_hash,
    snapshot_names,
    steps_redone,
)

pytestmark = pytest.mark.ray

RETRY_S = 8.0
OUTAGE_S = 4.0  # longer than the storage clients' own first retries, shorter than the limit
CONFIG = RUN_CONFIG
SPOT_THEN_ON_DEMAND = [
    {"name": "spot", "market": "spot", "num_workers": 2, "max_preemptions": 0, "capacity_timeout_s": 60},
    {"name": "on-demand", "market": "on-demand", "num_workers": 2, "capacity_timeout_s": 120},
]
BACKENDS = ("azure", "gcs")


@pytest.fixture(scope="module")
def servers():
    from tests.support.azurite import AzuriteServer
    from tests.support.gcsserver import GcsServer

    with AzuriteServer() as azure, GcsServer() as gcs:
        yield {"azure": azure, "gcs": gcs}


@pytest.fixture(scope="module")
def cluster(servers):
    # Drivers, controllers and workers reach both emulators through their URIs and this environment.
    env = {**servers["azure"].env(), **servers["gcs"].env(), "SPOTFALLBACK_STORAGE_RETRY_S": str(RETRY_S)}
    with local_cluster(env=env) as c:
        yield c


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    return reference_hash(tmp_path_factory.mktemp("ref"), CONFIG)


@pytest.fixture(params=BACKENDS)
def store(request, servers):
    """The backend under test: ``uri(path)``, ``filesystem(endpoint)`` (the product's own), ``endpoint``."""
    return servers[request.param]


def trainer_for(storage_path: str, name: str, config: dict, *, fs, tiers=None, **kw):
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


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spotfallback.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@SLOW_UNDER_LOAD
def test_job_file_run_survives_a_preemption_and_a_driver_restart_and_status_reads_it(cluster, store, reference, tmp_path):
    from pyarrow.fs import FileSelector

    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import resolve_run

    name = unique_name("store")
    job = {
        "name": name,
        "storage_path": store.uri("runs"),
        "entrypoint": "spotfallback.examples.ddp_digits:train_fn",
        "train_loop_config": {**CONFIG, "step_log": str(tmp_path / "steps.jsonl")},
        "ray_address": cluster.address,
        "tiers": SPOT_THEN_ON_DEMAND,
    }
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    location = resolve_run(store.uri("runs"), name)  # the URI, as status and report read it
    ledger = Ledger(location)

    command = [sys.executable, "-m", "spotfallback.cli", "run", str(job_file)]
    with restoring_injector(cluster) as injector:
        log = preempt_then_kill_the_driver(command, ledger, injector, tmp_path)
    assert final_result(log)["metrics"]["weights_sha256"] == reference

    records, problems, lost, dupes = check_run(location)
    assert problems == [] and lost == [] and dupes == 0
    kinds = [r.event.kind for r in records if r.event.kind != "checkpoint_committed"]
    errors = [f"{r.event.error_type}: {r.event.message}" for r in records if r.event.kind == "application_failed"]
    assert kinds == ["run_started", "workers_acquired", "preempted", "workers_acquired", "run_started", "workers_acquired",
                     "finished"], (errors, log[-3000:])
    assert len(snapshot_names(location)) == sum(r.event.kind == "checkpoint_committed" for r in records) == 6
    # Everything is in the container / bucket.
    keys = [i.path for i in store.filesystem().get_file_info(FileSelector(location.run_dir, recursive=True))]
    assert any(k.endswith("/checkpoint_manager_snapshot.json") for k in keys)
    assert any(k.endswith("/_spotfallback/run.json") for k in keys)
    # Object stores cannot rename: a write is a temporary object, a copy and a delete, so the
    # SIGKILLed driver (and the Train controller that died with it) may leave a temporary
    # object of a record it was writing; readers skip those (``check_run`` found every event
    # whole above). None may be left among the checkpoints, which Ray writes itself.
    left = [k for k in keys if "/.tmp-" in k]
    assert all("/_spotfallback/" in k for k in left), left
    status = cli("status", store.uri(f"runs/{name}"), "--json")
    assert status.returncode == 0 and '"finished"' in status.stdout, status.stderr
    report = cli("report", store.uri(f"runs/{name}"), "--out", str(tmp_path / "report.png"))
    assert report.returncode == 0 and "on-demand" in report.stdout, report.stderr


def test_outage_in_the_middle_of_a_checkpoint_upload_only_pauses_the_run(cluster, store, reference, tmp_path):
    from spotfallback.store.location import resolve_run
    from tests.support.s3server import OutageProxy

    name = unique_name("outage")
    step_log = tmp_path / "steps.jsonl"
    with OutageProxy(store.endpoint) as outage:
        trainer = trainer_for("runs/outages", name, {**CONFIG, "step_log": str(step_log)}, fs=store.filesystem(outage.endpoint))
        # The step-5 checkpoint's second file: model.pt is stored, optimizer.pt is in flight.
        outage.cut_on("optimizer.pt", duration_s=OUTAGE_S)
        driver = Background(trainer.fit)
        result = driver.join(300)
        assert driver.error is None, driver.error
        assert outage.outages == 1 and outage.refused > 0, outage.log  # clients were turned away meanwhile
    assert result.metrics["weights_sha256"] == reference
    location = resolve_run("runs/outages", name, store.filesystem())  # read past the proxy
    records, problems, lost, dupes = check_run(location)
    assert problems == [] and lost == [] and dupes == 0
    # Not one restart: the run waited for storage instead of failing.
    assert [r.event.kind for r in records if r.event.kind != "checkpoint_committed"] == ["run_started", "workers_acquired", "finished"]
    assert steps_redone(step_log, CONFIG["total_steps"]) == 0
    assert len(snapshot_names(location)) == 6 and committed_not_in_snapshot(location, records) == set()


@SLOW_UNDER_LOAD
def test_damaged_newest_checkpoint_resumes_from_the_newest_whole_one(cluster, store, reference, tmp_path):
    from pyarrow.fs import FileSelector, FileType

    from spotfallback.store.checkpoints import DAMAGED_DIR

    fs = store.filesystem()
    name = unique_name("damaged")
    config = {**CONFIG, "raise_at_step": 18, "raise_marker": str(tmp_path / "raised"), "step_log": str(tmp_path / "steps.jsonl")}
    no_retries = [{"name": "on-demand", "market": "on-demand", "num_workers": 2, "max_failures": 0}]
    with pytest.raises(ValueError, match="injected application error at step 18"):
        trainer_for("runs/damaged", name, config, fs=fs, tiers=no_retries).fit()
    run_dir = f"runs/damaged/{name}"
    checkpoints = sorted(
        i.path for i in fs.get_file_info(FileSelector(run_dir)) if i.type == FileType.Directory and i.base_name.startswith("checkpoint_2")
    )
    assert len(checkpoints) == 3, checkpoints  # steps 5, 10, 15
    newest, previous = checkpoints[-1], checkpoints[-2].rsplit("/", 1)[1]
    with fs.open_input_stream(f"{newest}/model.pt") as f:
        head = f.read(64)
    with fs.open_output_stream(f"{newest}/model.pt") as f:  # truncated in place
        f.write(head)

    trainer = trainer_for("runs/damaged", name, config, fs=fs, retry_failed=True)
    result = trainer.fit()
    assert result.metrics["weights_sha256"] == reference
    records, problems, lost, dupes = check_run(trainer.location)
    assert problems == [] and lost == [] and dupes == 0
    repair = [r.info["checkpoint_repair"] for r in records if "checkpoint_repair" in r.info]
    assert len(repair) == 1 and repair[0]["resumed_from"] == previous
    kept = [i.path for i in fs.get_file_info(FileSelector(f"{run_dir}/{DAMAGED_DIR}", recursive=True, allow_not_found=True))]
    assert any(Path(k).name == "model.pt" for k in kept)  # set aside, never deleted
    assert steps_redone(Path(config["step_log"]), CONFIG["total_steps"]) == 7  # steps 11-17 again, from step 10
