"""End to end: what a spot pod of a generated KubeRay file gets from Ray itself on SIGTERM.

KubeRay runs ``ray start --block`` as the Ray container's main process, and the kubelet sends it
SIGTERM when the node is drained or shut down. Ray 2.60 (``ray/_private/node.py``,
``Node._register_shutdown_hooks`` -> ``Node._drain_node_before_shutdown``) then drains its own
node, reason PREEMPTION, deadline ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` ahead, keeps it up
while it is busy, and stops. This runs the real ``ray start`` with the drain window and grace
period the generator writes for a GKE spot group (the shortest of the clouds), SIGTERMs it as
the kubelet would, and reads back from Ray's GCS what the drain was.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from spotfallback.config import JobConfig
from spotfallback.deploy import K8sCloud, KubeRayOptions, kuberay_manifest
from spotfallback.deploy.clouds import RAY_DRAIN_TIMEOUT_ENV
from tests.support.ray_procs import (
    clean_env,
    head_args,
    ray_node,
    vendored_psutil,
    worker_args,
)

pytestmark = pytest.mark.ray

# A driver whose actor takes the worker's only CPU, as Ray Train's workers do while they hold
# after a just-in-time checkpoint: a busy node stays draining until its deadline.
HOLDER = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote(num_cpus=1)
class Holder:
    def node(self):
        return ray.get_runtime_context().get_node_id()

h = Holder.remote()
print(ray.get(h.node.remote()), flush=True)
time.sleep(600)
"""


def spot_pod_timing(cloud: K8sCloud) -> tuple[float, int]:
    """(Ray's SIGTERM drain window, the pod's grace period) of a generated spot worker group."""
    job = JobConfig.model_validate(
        {
            "name": "sigterm-drain",
            "storage_path": "s3://runs/spotfallback",
            "entrypoint": "train:f",
            "tiers": [{"name": "spot", "market": "spot", "num_workers": 1}, {"name": "od", "market": "on-demand", "num_workers": 1}],
        }
    )
    spec = kuberay_manifest(job, KubeRayOptions(cloud=cloud))["spec"]["rayClusterSpec"]
    pod = spec["workerGroupSpecs"][0]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    return float(env[RAY_DRAIN_TIMEOUT_ENV]), int(pod["terminationGracePeriodSeconds"])


def node_table(client: Any) -> dict[str, Any]:
    """Every node Ray's GCS knows, by hex id (alive and dead)."""
    return {nid.hex(): info for nid, info in client.get_all_node_info(timeout=10).items()}


def test_sigterm_drains_a_generated_spot_pod_for_its_window_and_ends_inside_its_grace(tmp_path: Path) -> None:
    from ray._raylet import GcsClient
    from ray.core.generated import gcs_pb2

    psutil = vendored_psutil()
    window_s, grace_s = spot_pod_timing(K8sCloud.GKE)
    assert 0 < window_s < grace_s
    snapshot_states = gcs_pb2.GcsNodeInfo.DESCRIPTOR.fields_by_name["state_snapshot"].message_type.enum_types_by_name["State"]
    death_reasons = gcs_pb2.GcsNodeInfo.DESCRIPTOR.fields_by_name["death_info"].message_type.enum_types_by_name["Reason"]

    # Short paths: Ray's socket paths live under the temp dir and must stay under 108 bytes.
    head_tmp, pod_tmp = tempfile.mkdtemp(prefix="sfh-"), tempfile.mkdtemp(prefix="sfp-")
    try:
        with ray_node(lambda: head_args(head_tmp), head_tmp, log=tmp_path / "head.log") as (_, gcs):
            pod_env = {RAY_DRAIN_TIMEOUT_ENV: f"{window_s:g}"}  # as the generated container sets it
            with ray_node(lambda: worker_args(gcs, pod_tmp), pod_tmp, log=tmp_path / "worker.log", env=pod_env) as (worker, _):
                holder = subprocess.Popen(
                    [sys.executable, "-c", HOLDER, gcs],
                    env=clean_env(RAY_AUTH_MODE="disabled"),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                try:
                    assert holder.stdout is not None
                    worker_id = holder.stdout.readline().strip()
                    assert len(worker_id) == 56, worker_id
                    client = GcsClient(address=gcs)
                    pod_processes = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]

                    sigterm_at = time.time()
                    worker.send_signal(signal.SIGTERM)  # what the kubelet sends the Ray container
                    draining: dict[str, int] = {}
                    while worker_id not in draining and time.time() < sigterm_at + 10:
                        draining = {k.hex() if isinstance(k, bytes) else k: v for k, v in client.get_draining_nodes().items()}
                        time.sleep(0.1)
                    assert worker_id in draining, f"Ray did not drain its node on SIGTERM:\n{(tmp_path / 'worker.log').read_text()[-3000:]}"
                    # The deadline Ray Train tears the workers down at: the window, from the SIGTERM.
                    assert draining[worker_id] / 1000 == pytest.approx(sigterm_at + window_s, abs=2.0)
                    state = node_table(client)[worker_id].state_snapshot.state
                    assert snapshot_states.values_by_number[state].name == "DRAINING"

                    worker.wait(grace_s + 30)
                    ended_s = time.time() - sigterm_at
                    # Kept up for the window (the workers' last checkpoint), gone before the grace
                    # ends: the kubelet's SIGKILL is never needed.
                    print(f"\nSIGTERM -> drained for {window_s:g}s, ray start ended after {ended_s:.1f}s (grace {grace_s}s)")
                    assert window_s - 1 <= ended_s <= grace_s, f"ray start ended {ended_s:.1f}s after SIGTERM"
                    _, left = psutil.wait_procs(pod_processes, timeout=5)
                    for proc in left:
                        proc.kill()
                    assert not left, f"Ray left {[p.name() for p in left]} running"  # the raylet, agents: all gone

                    # The raylet records a drain-preempted death when the SIGTERM from `ray start` reaches it
                    # after the drain's deadline, else an expected termination: `ray start` ends its wait on
                    # a monotonic clock that can close a few milliseconds before the deadline it sent the GCS
                    # on the wall clock. Either way an expected end on SIGTERM, never a crash.
                    info = node_table(client)[worker_id]
                    reason = death_reasons.values_by_number[info.death_info.reason].name
                    assert reason in ("AUTOSCALER_DRAIN_PREEMPTED", "EXPECTED_TERMINATION"), reason
                    assert "SIGTERM" in info.death_info.reason_message
                finally:
                    holder.kill()
                    holder.wait(10)
    finally:
        shutil.rmtree(head_tmp, ignore_errors=True)
        shutil.rmtree(pod_tmp, ignore_errors=True)
