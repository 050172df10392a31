"""The generated RayJob's entrypoint, executed as KubeRay's submitter runs it, trains on the ladder.

What is real: the file comes from the installed `spotfallback manifest kuberay`; its
`spec.entrypoint` runs verbatim under `bash -c`, in the environment a RayJob's submitter gives
an entrypoint (RAY_ADDRESS = the cluster's GCS, `spotfallback` on PATH); the local spot
cluster's node groups carry exactly the labels, sizes and counts of the manifest's worker
groups, beside a head with no CPUs like the manifest's head. A spot node is preempted after the
first checkpoint, so the run has to find the on-demand group through the labels the manifest
gave it. What differs from Kubernetes: the nodes are local raylets, the storage is a local
directory (a PVC in the manifest), and PYTHONPATH carries the repository so that the workers
import `spotfallback.examples.ddp_digits` (an image would have it installed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")

from tests.support.helpers_e2e import (  # noqa: E402
    E2E_ENV,
    SLOW_UNDER_LOAD,
    apply_env,
    checkpoints_since,
    unique_name,
    wait_for,
)

pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent
CORE = ("run_started", "workers_acquired", "preempted", "node_failed", "application_failed", "capacity_timed_out", "finished")
# 6 s of training after the first checkpoint: the preemption lands well before the end.
JOB = """\
name: {name}
storage_path: {storage}
entrypoint: spotfallback.examples.ddp_digits:train_fn
train_loop_config: {{total_steps: 16, checkpoint_every: 4, step_delay_s: 0.5, seed: 7}}
tiers:
  - {{name: spot, market: spot, num_workers: 1, max_preemptions: 0, capacity_timeout_s: 60}}
  - {{name: on-demand, market: on-demand, num_workers: 1, capacity_timeout_s: 60}}
"""


def node_groups(manifest: dict[str, Any]) -> list[Any]:
    """One local node group per worker group of the manifest, labelled and sized as it says."""
    from spotfallback.local import NodeGroup

    spec = manifest["spec"]["rayClusterSpec"]
    assert spec["headGroupSpec"]["resources"] == {"CPU": "0"}  # like the local head: no workers there
    groups = []
    for group in spec["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        labels = group["labels"]
        groups.append(
            NodeGroup(labels["ray.io/market-type"], count=group["maxReplicas"], cpus=float(limits["cpu"]),
                      name=group["groupName"], labels=labels)
        )
    return groups


@SLOW_UNDER_LOAD
def test_generated_rayjob_entrypoint_trains_on_the_ladder(tmp_path: Path) -> None:
    apply_env()  # before the cluster starts: raylets inherit it
    from spotfallback.local import Injector, LocalSpotCluster
    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import resolve_run

    name, storage = unique_name("rayjob"), tmp_path / "runs"
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB.format(name=name, storage=storage))
    rayjob = tmp_path / "rayjob.yaml"
    made = subprocess.run(
        [str(BIN / "spotfallback"), "manifest", "kuberay", "--cloud", "eks-karpenter", "--job", str(job_file),
         "--storage-pvc", "runs", "--out", str(rayjob)],
        capture_output=True, text=True, timeout=60,
    )
    assert made.returncode == 0, made.stderr
    manifest = yaml.safe_load(rayjob.read_text())
    entrypoint = manifest["spec"]["entrypoint"]

    with LocalSpotCluster(node_groups(manifest)) as cluster, Injector(cluster) as injector:
        env = {**os.environ, **E2E_ENV, "RAY_ADDRESS": cluster.address, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        env.pop("SPOTFALLBACK_RAY_ADDRESS", None)
        stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"  # files: a full pipe would stall the driver
        with stdout.open("w") as out_f, stderr.open("w") as err_f:
            driver = subprocess.Popen(["bash", "-c", entrypoint], cwd=tmp_path, env=env, stdout=out_f, stderr=err_f)
        try:
            ledger = Ledger(resolve_run(str(storage), name))
            wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 90)
            assert injector.preempt_one("spot", notice_s=1.0) is not None
            driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
        assert driver.returncode == 0, stderr.read_text()[-3000:]
        out = stdout.read_text()

    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "finished" and result["metrics"]["step"] == 16, result
    records = ledger.read()
    # Started on the spot group, preempted there, resumed on the on-demand group, finished.
    assert [r.event.kind for r in records if r.event.kind in CORE] == [
        "run_started", "workers_acquired", "preempted", "workers_acquired", "finished",
    ]
    assert [r.tier for r in records if r.event.kind == "workers_acquired"] == [0, 1]
