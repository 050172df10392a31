"""KubeRay RayJob/RayCluster generation.

Golden files: tests/golden/kuberay-<cloud>.yaml, one per cloud, reviewed by eye once (the
worker groups' nodeSelector/tolerations/affinity must be exactly the cloud's documented keys).
Regenerate after an intended change with:  UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_deploy_kuberay.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from spotfallback import __version__
from spotfallback.config import JobConfig, run_name_error
from spotfallback.deploy import (
    K8sCloud,
    Kind,
    KubeRayOptions,
    kuberay_manifest,
    rayjob_entrypoint,
    render_kuberay,
    unique_run_name,
    validate_text,
)
from spotfallback.deploy.common import k8s_name
from spotfallback.deploy.kuberay import MIN_KUBERAY_VERSION
from spotfallback.deploy.pools import HEAD_TOLERATION
from spotfallback.deploy.validate import (
    KUBERAY_SINCE,
    MIN_KUBERAY_ANNOTATION,
    kuberay_needs,
    parse_version,
)
from spotfallback.errors import ConfigError

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

SPOT_A = {"name": "spot-a", "market": "spot", "num_workers": 2, "max_preemptions": 3, "resources_per_worker": {"CPU": 4}}
SPOT_B = {
    "name": "spot-b",
    "market": "spot",
    "num_workers": 2,
    "resources_per_worker": {"CPU": 4},
    "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-zone": "us-east-1b"},
}
ON_DEMAND = {"name": "on-demand", "market": "on-demand", "num_workers": 2, "resources_per_worker": {"CPU": 4}}
LADDERS = {1: [SPOT_A], 2: [SPOT_A, ON_DEMAND], 3: [SPOT_A, SPOT_B, ON_DEMAND]}


def make_job(tiers: list[dict[str, Any]], **extra: Any) -> JobConfig:
    data = {
        "name": "churn-model",
        "storage_path": "s3://ml-runs/spotfallback",
        "entrypoint": "churn.train:train_func",
        "train_loop_config": {"epochs": 20, "lr": 0.001},
        "tiers": tiers,
    }
    return JobConfig.model_validate({**data, **extra})


def groups(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest["spec"]
    return spec.get("rayClusterSpec", spec)["workerGroupSpecs"]


def cluster(manifest: dict[str, Any]) -> dict[str, Any]:
    spec = manifest["spec"]
    return spec.get("rayClusterSpec", spec)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_every_cloud_kind_and_ladder_validates(cloud: K8sCloud, kind: Kind, n: int) -> None:
    job = make_job(LADDERS[n])
    text = render_kuberay(job, KubeRayOptions(cloud=cloud, kind=kind, storage_secret="ml-runs-creds"))
    report = validate_text(text)
    assert report.ok and not report.warnings, [str(f) for f in report.findings]
    manifest = yaml.safe_load(text)
    assert manifest["kind"] == ("RayJob" if kind is Kind.RAYJOB else "RayCluster")
    assert [g["groupName"] for g in groups(manifest)] == [t["name"] for t in LADDERS[n]]


# The documented keys, per cloud: (spot pod fields, on-demand pod fields).
AKS_KEY, GKE_KEY = "kubernetes.azure.com/scalesetpriority", "cloud.google.com/gke-spot"


def _not_in(*pairs: tuple[str, str]) -> dict[str, Any]:
    exprs = [{"key": key, "operator": "NotIn", "values": [value]} for key, value in pairs]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}}


EXPECTED = {
    K8sCloud.EKS_KARPENTER: (
        {"nodeSelector": {"karpenter.sh/capacity-type": "spot"}},
        {"nodeSelector": {"karpenter.sh/capacity-type": "on-demand"}},
    ),
    K8sCloud.EKS_MANAGED: (
        {"nodeSelector": {"eks.amazonaws.com/capacityType": "SPOT"}},
        {"nodeSelector": {"eks.amazonaws.com/capacityType": "ON_DEMAND"}},
    ),
    K8sCloud.AKS: (
        {
            "nodeSelector": {AKS_KEY: "spot"},
            "tolerations": [{"key": AKS_KEY, "operator": "Equal", "value": "spot", "effect": "NoSchedule"}],
        },
        {"affinity": _not_in((AKS_KEY, "spot"))},
    ),
    # Karpenter on AKS: its capacity-type label, and AKS's spot taint (the NodePools we write set it).
    K8sCloud.AKS_NAP: (
        {
            "nodeSelector": {"karpenter.sh/capacity-type": "spot"},
            "tolerations": [{"key": AKS_KEY, "operator": "Equal", "value": "spot", "effect": "NoSchedule"}],
        },
        {"nodeSelector": {"karpenter.sh/capacity-type": "on-demand"}},
    ),
    K8sCloud.GKE: (
        {
            "nodeSelector": {GKE_KEY: "true"},
            "tolerations": [{"key": GKE_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        },
        # Legacy preemptible VMs are labelled apart from Spot VMs and not tainted: keep off both.
        {"affinity": _not_in((GKE_KEY, "true"), ("cloud.google.com/gke-preemptible", "true"))},
    ),
}
PLACEMENT_KEYS = ("nodeSelector", "tolerations", "affinity")


def _placement(pod: dict[str, Any]) -> dict[str, Any]:
    return {k: pod[k] for k in PLACEMENT_KEYS if k in pod}


@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_node_selection_is_exactly_the_clouds_documented_keys(cloud: K8sCloud) -> None:
    manifest = kuberay_manifest(make_job(LADDERS[2]), KubeRayOptions(cloud=cloud))
    spot, on_demand = EXPECTED[cloud]
    spot_group, od_group = groups(manifest)
    assert _placement(spot_group["template"]["spec"]) == spot
    assert _placement(od_group["template"]["spec"]) == on_demand
    # The head: on-demand by the same keys, labelled so, and never a home for training workers.
    head = cluster(manifest)["headGroupSpec"]
    # On Karpenter the head has a NodePool of its own (manifest nodepools), tainted for it alone.
    own_pool = {"tolerations": [HEAD_TOLERATION]} if cloud in (K8sCloud.EKS_KARPENTER, K8sCloud.AKS_NAP) else {}
    assert _placement(head["template"]["spec"]) == {**on_demand, **own_pool}
    assert head["labels"] == {"ray.io/market-type": "on-demand"}
    assert head["resources"] == {"CPU": "0"}


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_the_stated_minimum_kuberay_is_what_the_file_uses(cloud: K8sCloud, kind: Kind) -> None:
    """Header and annotation name the oldest operator that keeps every field the file uses:
    an older one would drop group labels (no ray.io/market-type on any node) without a word, or not
    scale a tier's group for its label selector."""
    text = render_kuberay(make_job(LADDERS[3]), KubeRayOptions(cloud=cloud, kind=kind, image="registry.example.com/t:1"))
    manifest = yaml.safe_load(text)
    needed = max((KUBERAY_SINCE[what] for _, what in kuberay_needs(manifest, manifest["kind"])), key=parse_version)
    assert parse_version(needed) == parse_version(MIN_KUBERAY_VERSION) == (1, 5, 1)
    assert manifest["metadata"]["annotations"][MIN_KUBERAY_ANNOTATION] == MIN_KUBERAY_VERSION
    assert f"Needs KubeRay >= {MIN_KUBERAY_VERSION}" in text


def test_worker_labels_satisfy_the_tier_selectors_and_pin_the_zone() -> None:
    manifest = kuberay_manifest(make_job(LADDERS[3]), KubeRayOptions(cloud=K8sCloud.EKS_KARPENTER))
    spot_a, spot_b, od = groups(manifest)
    assert spot_a["labels"] == {"ray.io/market-type": "spot"}
    assert spot_b["labels"] == {"ray.io/market-type": "spot", "ray.io/availability-zone": "us-east-1b"}
    assert od["labels"] == {"ray.io/market-type": "on-demand"}
    assert spot_b["template"]["spec"]["nodeSelector"] == {
        "karpenter.sh/capacity-type": "spot",
        "topology.kubernetes.io/zone": "us-east-1b",
    }
    assert all(g["rayStartParams"] == {} for g in groups(manifest))


def test_autoscaler_v2_and_fallback_tiers_cost_nothing_until_needed() -> None:
    manifest = kuberay_manifest(make_job(LADDERS[3]), KubeRayOptions(cloud=K8sCloud.GKE))
    spec = cluster(manifest)
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["version"] == "v2"
    # Every group starts empty: the cluster is Ready (and a RayJob past Initializing) with the head
    # alone, and the runner's request scales the tier it runs on.
    assert [(g["replicas"], g["minReplicas"], g["maxReplicas"]) for g in groups(manifest)] == [(0, 0, 2), (0, 0, 2), (0, 0, 2)]
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in groups(manifest)]
    assert {p["restartPolicy"] for p in pods} == {"Never"}


def test_worker_pod_size_follows_the_tier() -> None:
    tiers = [
        {"name": "gpu-spot", "market": "spot", "num_workers": 1, "use_gpu": True, "resources_per_worker": {"CPU": 8, "GPU": 1, "memory": 32 * 2**30, "slot": 2}}
    ]
    manifest = kuberay_manifest(make_job(tiers), KubeRayOptions(cloud=K8sCloud.AKS))
    (group,) = groups(manifest)
    container = group["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "8", "memory": str(32 * 2**30), "nvidia.com/gpu": "1"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["image"].endswith("-gpu")
    assert group["resources"] == {"slot": "2"}  # custom Ray resources: top-level field only
    half = make_job([{"name": "half", "market": "spot", "num_workers": 1, "resources_per_worker": {"CPU": 0.5}}])
    (small,) = groups(kuberay_manifest(half, KubeRayOptions(cloud=K8sCloud.AKS)))
    assert small["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "500m", "memory": "4Gi"}


def test_rayjob_fields_and_options() -> None:
    opts = KubeRayOptions(
        cloud=K8sCloud.EKS_MANAGED, backoff_limit=7, active_deadline_seconds=3600, ttl_seconds_after_finished=60,
        namespace="ml", service_account="trainer", pip=("churn==1.2",),
    )
    manifest = kuberay_manifest(make_job(LADDERS[2]), opts)
    spec = manifest["spec"]
    assert manifest["metadata"]["namespace"] == "ml"
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (7, 3600, 60)
    assert spec["shutdownAfterJobFinishes"] is True and spec["submissionMode"] == "SidecarMode"
    # The stock image has no spotfallback for the entrypoint: the job installs this version with the packages.
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"pip": [f"spotfallback=={__version__}", "churn==1.2"]}
    assert {g["template"]["spec"]["serviceAccountName"] for g in groups(manifest)} == {"trainer"}
    with pytest.raises(ConfigError, match="^backoff_limit"):
        KubeRayOptions(cloud=K8sCloud.GKE, backoff_limit=-1)
    with pytest.raises(ConfigError, match="^pip"):
        kuberay_manifest(make_job(LADDERS[1]), KubeRayOptions(cloud=K8sCloud.GKE, kind=Kind.RAYCLUSTER, pip=("x",)))


def pod_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [cluster(manifest)["headGroupSpec"]["template"], *(g["template"] for g in groups(manifest))]


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_labels_and_priority_class_reach_the_object_and_every_pod(cloud: K8sCloud, kind: Kind) -> None:
    labels = {"team": "forecasting", "example.com/cost-center": "1234", "empty": ""}
    opts = KubeRayOptions(cloud=cloud, kind=kind, image="registry.example.com/ml/churn:1", labels=labels,
                          priority_class="training-high")
    job = make_job(LADDERS[3], name="Churn_Model.v1=final")  # not a label value as it is: the label holds k8s_name's form
    text = render_kuberay(job, opts)
    assert validate_text(text).ok
    manifest = yaml.safe_load(text)
    run = {"spotfallback/run": k8s_name("Churn_Model.v1=final", 63)}
    assert manifest["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "spotfallback", **run, **labels}
    templates = pod_templates(manifest)
    assert len(templates) == 4
    assert all(t["metadata"]["labels"] == {**run, **labels} for t in templates)
    assert all(t["spec"]["priorityClassName"] == "training-high" for t in templates)
    # The header says how to list the run's pods, by the label every pod carries.
    assert f"kubectl get pods -l spotfallback/run={run['spotfallback/run']}" in text
    plain = kuberay_manifest(make_job(LADDERS[2]), KubeRayOptions(cloud=cloud, kind=kind))
    assert all(t["metadata"]["labels"] == {"spotfallback/run": "churn-model"} and "priorityClassName" not in t["spec"]
               for t in pod_templates(plain))


@pytest.mark.parametrize(("labels", "priority_class", "message"), [
    ({"ray.io/node-type": "worker"}, None, "labels: 'ray.io/node-type' is a key the file, KubeRay or Kubernetes sets itself"),
    ({"spotfallback/run": "other"}, None, "labels: 'spotfallback/run' is a key"),
    ({"app.kubernetes.io/managed-by": "helm"}, None, "labels: 'app.kubernetes.io/managed-by' is a key"),
    ({"kubernetes.io/arch": "amd64"}, None, "labels: 'kubernetes.io/arch' is a key"),
    ({"Example.com/team": "a"}, None, "labels: Example.com/team=a: invalid label key"),
    ({"team": "a b"}, None, "labels: team=a b: invalid label value"),
    ({"team": "x" * 64}, None, f"labels: team={'x' * 64}: invalid label value"),
    ({}, "system-cluster-critical", "priority_class: 'system-cluster-critical': system-... classes are for the cluster's own pods"),
    ({}, "High_Priority", "priority_class: 'High_Priority' is not a Kubernetes object name"),
])
def test_labels_and_priority_classes_the_api_server_or_the_file_would_refuse(labels, priority_class, message) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        KubeRayOptions(cloud=K8sCloud.GKE, labels=labels, priority_class=priority_class)
    # The recommended app.kubernetes.io/ labels other than managed-by are the user's to set.
    assert KubeRayOptions(cloud=K8sCloud.GKE, labels={"app.kubernetes.io/part-of": "forecasting"}).labels


@pytest.mark.parametrize(("image", "pip", "installed", "agent"), [
    (None, (), [f"spotfallback=={__version__}"], False),
    ("rayproject/ray:2.60.0-py311-gpu", (), [f"spotfallback=={__version__}"], False),
    ("docker.io/rayproject/ray:2.60.0-py311", ("spotfallback[s3]==0.1.0",), ["spotfallback[s3]==0.1.0"], False),
    ("registry.example.com/team/train:1", (), None, True),
    ("rayproject/ray-ml:2.9.0", (), None, True),  # not Ray's stock image: the user's own, as far as we know
])
def test_the_stock_ray_image_gets_spotfallback_from_pypi_and_no_agent(image, pip, installed, agent) -> None:
    """Ray's own image has no `spotfallback` for the entrypoint or the agent, whether defaulted or named."""
    opts = KubeRayOptions(cloud=K8sCloud.GKE, image=image, pip=pip)
    spec = kuberay_manifest(make_job(LADDERS[1]), opts)["spec"]
    assert (yaml.safe_load(spec["runtimeEnvYAML"])["pip"] if "runtimeEnvYAML" in spec else None) == installed
    assert opts.with_notice_agent is agent
    if not agent:
        with pytest.raises(ConfigError, match="^notice_agent: the sidecar runs `spotfallback notice-agent` from the image"):
            KubeRayOptions(cloud=K8sCloud.GKE, image=image, notice_agent=True)


@pytest.mark.parametrize("image", ["rayproject/ray:2.9.0", "docker.io/rayproject/ray:2.59.0-py311-gpu"])
def test_rays_own_image_of_another_release_than_ray_version_is_refused(image) -> None:
    with pytest.raises(ConfigError, match=rf"^image: '{image}' carries Ray 2\.\d+\.0, but the files pin Ray 2\.60\.0"):
        kuberay_manifest(make_job(LADDERS[1]), KubeRayOptions(cloud=K8sCloud.GKE, image=image))
    own = "registry.example.com/team/train:2.9.0"  # a tag of the user's own image says nothing of its Ray
    assert kuberay_manifest(make_job(LADDERS[1]), KubeRayOptions(cloud=K8sCloud.GKE, image=own))["spec"]


def test_entrypoint_runs_the_driver_with_the_job_as_json() -> None:
    job = make_job(LADDERS[3], ray_address="local")
    argv = shlex.split(rayjob_entrypoint(job))
    assert argv[:3] == ["spotfallback", "run", "--job-json"] and argv[4:] == ["--ray-address", "auto"]
    assert JobConfig.model_validate_json(argv[3]) == job.model_copy(update={"ray_address": "auto"})
    manifest = kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.GKE))
    assert manifest["spec"]["entrypoint"] == rayjob_entrypoint(job)
    raycluster = kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.GKE, kind=Kind.RAYCLUSTER))
    assert raycluster["metadata"]["annotations"]["spotfallback/entrypoint"] == rayjob_entrypoint(job)


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=0, max_size=40))
def test_entrypoint_quoting_survives_any_config_text(text: str) -> None:
    job = make_job(LADDERS[1], train_loop_config={"note": text, text: 1})
    argv = shlex.split(rayjob_entrypoint(job, ray_address="10.0.0.1:6379"))
    assert len(argv) == 6 and argv[-1] == "10.0.0.1:6379"
    assert json.loads(argv[3])["train_loop_config"] == {"note": text, text: 1}


def test_run_name_override_and_object_names() -> None:
    job = make_job(LADDERS[1])
    manifest = kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.GKE, run_name="Churn_Model.v2"))
    name = manifest["metadata"]["name"]
    assert name.startswith("churn-model-v2-") and len(name) <= 47
    assert manifest["metadata"]["annotations"]["spotfallback/run-name"] == "Churn_Model.v2"
    assert json.loads(shlex.split(manifest["spec"]["entrypoint"])[3])["name"] == "Churn_Model.v2"
    # Distinct run names never share an object name, however they are mangled or truncated.
    names = ["a_b", "a.b", "A-b", "x" * 60 + "1", "x" * 60 + "2", "9lives"]
    mangled = [k8s_name(n, 47) for n in names]
    assert len(set(mangled)) == len(names)
    assert all(len(m) <= 47 and m[0].isalpha() for m in mangled)
    assert k8s_name("churn-model", 47) == "churn-model"
    with pytest.raises(ConfigError, match="^name:"):
        kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.GKE, run_name="../escape"))


def test_unique_run_name_is_a_valid_fresh_name() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert unique_run_name("churn", now=now, token="beef") == "churn-20260102-030405-beef"
    long = unique_run_name("x" * 200, now=now, token="beef")
    assert len(long) == 128 and run_name_error(long) is None
    assert unique_run_name("churn") != unique_run_name("churn")


def _containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = cluster(manifest)
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    return [c for p in pods for c in p["containers"]]


def test_storage_credentials_are_secret_references_only() -> None:
    manifest = kuberay_manifest(make_job(LADDERS[2]), KubeRayOptions(cloud=K8sCloud.EKS_KARPENTER, storage_secret="ml-runs-creds"))
    settings = {"RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"}  # Ray's, not secrets
    for container in _containers(manifest):
        env = {e["name"]: e for e in container["env"] if e["name"] not in settings}
        assert set(env) >= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        for entry in env.values():
            assert "value" not in entry
            assert entry["valueFrom"]["secretKeyRef"]["name"] == "ml-runs-creds"
    gcs = kuberay_manifest(make_job(LADDERS[1], storage_path="gs://bkt/runs"), KubeRayOptions(cloud=K8sCloud.GKE, storage_secret="gcs-key"))
    head = cluster(gcs)["headGroupSpec"]["template"]["spec"]
    assert head["volumes"] == [{"name": "storage-credentials", "secret": {"secretName": "gcs-key"}}]
    assert head["containers"][0]["env"][0]["value"].endswith("/key.json")
    plain = kuberay_manifest(make_job(LADDERS[1]), KubeRayOptions(cloud=K8sCloud.GKE))
    assert all("valueFrom" not in e for c in _containers(plain) for e in c.get("env", []))  # workload identity


def test_local_storage_needs_a_shared_volume() -> None:
    job = make_job(LADDERS[1], storage_path="/mnt/runs")
    with pytest.raises(ConfigError, match="^storage_path: '/mnt/runs' is a local path"):
        kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.AKS))
    with pytest.raises(ConfigError, match="^storage_secret"):
        kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.AKS, storage_secret="x", storage_pvc="runs"))
    manifest = kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.AKS, storage_pvc="runs"))
    assert all(c["volumeMounts"] == [{"name": "run-storage", "mountPath": "/mnt/runs"}] for c in _containers(manifest))
    with pytest.raises(ConfigError, match="^storage_pvc"):
        kuberay_manifest(make_job(LADDERS[1]), KubeRayOptions(cloud=K8sCloud.AKS, storage_pvc="runs"))


def test_notice_agent_switch_adds_a_sidecar_to_spot_workers_only() -> None:
    # The agent's pod details and its agreement with the agent's CLI: tests/unit/test_deploy_notice_agent.py.
    job = make_job(LADDERS[2])
    image = "registry.example.com/ml/churn-train:1.4"
    off = kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.GKE, image=image, notice_agent=False))
    assert all("initContainers" not in g["template"]["spec"] for g in groups(off))
    on = kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.GKE, image=image, notice_agent=True))
    spot, od = groups(on)
    assert [c["name"] for c in spot["template"]["spec"]["containers"]] == ["ray-worker"]
    (agent,) = spot["template"]["spec"]["initContainers"]
    assert agent["command"] == ["spotfallback", "notice-agent"] and agent["restartPolicy"] == "Always"
    assert "initContainers" not in od["template"]["spec"]
    assert validate_text(render_kuberay(job, KubeRayOptions(cloud=K8sCloud.GKE, image=image))).ok


@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_karpenter_never_disrupts_a_training_pod_of_its_own_accord(cloud: K8sCloud) -> None:
    """Consolidation or drift under a NodePool of the user's own would stop a 64-GPU gang (and the
    head's driver) mid-run; a spot interruption still comes, with its notice."""
    manifest = kuberay_manifest(make_job(LADDERS[2]), KubeRayOptions(cloud=cloud))
    templates = [cluster(manifest)["headGroupSpec"]["template"], *(g["template"] for g in groups(manifest))]
    karpenter = cloud in (K8sCloud.EKS_KARPENTER, K8sCloud.AKS_NAP)
    assert [t["metadata"].get("annotations") for t in templates] == [
        {"karpenter.sh/do-not-disrupt": "true"} if karpenter else None] * len(templates)


def test_entrypoint_writes_only_what_the_job_sets() -> None:
    # A default (backend: from the entrypoint's SPOTFALLBACK_BACKEND, which the generating
    # machine may not be able to import) is decided where the job runs, as `run job.yaml` would.
    job = make_job(LADDERS[1])
    payload = json.loads(shlex.split(rayjob_entrypoint(job))[3])
    assert "backend" not in payload and "plan" not in payload
    assert "backend" not in JobConfig.model_validate(payload).model_fields_set
    tf = make_job(LADDERS[1], backend="tensorflow")
    assert json.loads(shlex.split(rayjob_entrypoint(tf))[3])["backend"] == "tensorflow"
    # An explicit null is a setting ("wait forever"), not a default: it is kept.
    forever = make_job([{**SPOT_A, "capacity_timeout_s": None}])
    tiers = json.loads(shlex.split(rayjob_entrypoint(forever))[3])["tiers"]
    assert tiers[0]["capacity_timeout_s"] is None
    assert JobConfig.model_validate({**payload, "tiers": tiers}).tiers[0].capacity_timeout_s is None


@pytest.mark.parametrize(
    ("tier", "cloud", "message"),
    [
        ({"name": "r", "market": "reserved", "num_workers": 1}, K8sCloud.GKE, r"^tiers\[0\]\.market: 'reserved' has no node selection on gke"),
        ({"name": "z", "market": "spot", "num_workers": 1, "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-zone": "in(a,b)"}}, K8sCloud.AKS, r"^tiers\[0\]\.label_selector\.ray\.io/availability-zone"),
        ({"name": "g", "market": "spot", "num_workers": 1, "use_gpu": True, "resources_per_worker": {"GPU": 0.5}}, K8sCloud.AKS, r"^tiers\[0\]\.resources_per_worker\.GPU"),
    ],
)
def test_tiers_that_cannot_be_placed_are_errors_naming_the_field(tier: dict[str, Any], cloud: K8sCloud, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        kuberay_manifest(make_job([tier]), KubeRayOptions(cloud=cloud))


def test_reserved_capacity_on_karpenter() -> None:
    job = make_job([{"name": "odcr", "market": "reserved", "num_workers": 1}])
    (group,) = groups(kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.EKS_KARPENTER)))
    assert group["template"]["spec"]["nodeSelector"] == {"karpenter.sh/capacity-type": "reserved"}


def test_bad_image_is_an_error_naming_image() -> None:
    with pytest.raises(ConfigError, match="^image: 'ray project/ray'"):
        kuberay_manifest(make_job(LADDERS[1]), KubeRayOptions(cloud=K8sCloud.GKE, image="ray project/ray"))


# Per cloud: (storage_path, zone of the second spot tier), so each golden reads like that cloud.
GOLDEN_SETUP = {
    K8sCloud.EKS_KARPENTER: ("s3://ml-runs/spotfallback", "us-east-1b"),
    K8sCloud.EKS_MANAGED: ("s3://ml-runs/spotfallback", "us-east-1b"),
    K8sCloud.AKS: ("abfs://runs@mlaccount.dfs.core.windows.net/spotfallback", "eastus-2"),
    K8sCloud.AKS_NAP: ("abfs://runs@mlaccount.dfs.core.windows.net/spotfallback", "westeurope-1"),
    K8sCloud.GKE: ("gs://ml-runs/spotfallback", "us-central1-b"),
}


@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_golden(cloud: K8sCloud) -> None:
    storage, zone = GOLDEN_SETUP[cloud]
    spot_b = {**SPOT_B, "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-zone": zone}}
    job = make_job([SPOT_A, spot_b, ON_DEMAND], storage_path=storage)
    # An image of one's own (with spotfallback), so the spot pods show the notice agent.
    opts = KubeRayOptions(cloud=cloud, storage_secret="ml-runs-creds", image="registry.example.com/ml/churn-train:1.4")
    text = render_kuberay(job, opts)
    path = GOLDEN / f"kuberay-{cloud.value}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed; review, then regenerate with UPDATE_GOLDEN=1"


# -- a ladder across clusters: one RayCluster per cluster ----------------------------------------

EAST = {"address": "http://head-east:8265", "name": "east", "region": "us-east-1"}
WEST = {"address": "http://head-west:8265", "name": "west", "region": "us-west-2"}


def across_job(**extra: Any) -> JobConfig:
    return make_job([{**SPOT_A, "cluster": EAST}, {**SPOT_B, "cluster": WEST}, {**ON_DEMAND, "cluster": EAST}], **extra)


@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_a_ladder_across_clusters_gives_one_valid_raycluster_per_cluster(cloud: K8sCloud) -> None:
    job = across_job()
    text = render_kuberay(job, KubeRayOptions(cloud=cloud, kind=Kind.RAYCLUSTER))
    assert validate_text(text).ok
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["RayCluster", "RayCluster"]
    assert [d["metadata"]["labels"]["spotfallback/cluster"] for d in docs] == ["east", "west"]
    # Every pod says its run and its cluster too.
    assert [{t["metadata"]["labels"]["spotfallback/cluster"] for t in pod_templates(d)} for d in docs] == [{"east"}, {"west"}]
    # Each cluster holds its own tiers, every group empty until the run asks for it.
    assert [[(g["groupName"], g["replicas"]) for g in groups(d)] for d in docs] == [
        [("spot-a", 0), ("on-demand", 0)], [("spot-b", 0)]]
    # The annotation is the moving driver's command: the whole job, ladder and clusters included.
    command = shlex.split(docs[0]["metadata"]["annotations"]["spotfallback/entrypoint"])
    assert command[:3] == ["spotfallback", "run", "--job-json"] and "--on-cluster" not in command
    assert JobConfig.model_validate(json.loads(command[3])) == job
    header = text.split("---")[1]
    assert "http://head-west:8265" in header and "churn-model-west-head-svc is headless" in header
    assert "selecting\n# ray.io/cluster=churn-model-west and ray.io/node-type=head." in header
    assert "# The stock Ray image has no spotfallback, which the run's jobs run on every cluster" in header
    own = render_kuberay(job, KubeRayOptions(cloud=cloud, kind=Kind.RAYCLUSTER, image="registry.example.com/ml/train:1"))
    assert "The stock Ray image" not in own


def test_a_ladder_across_clusters_is_not_a_rayjob_nor_on_a_volume() -> None:
    with pytest.raises(ConfigError, match="one RayCluster per cluster"):
        render_kuberay(across_job(), KubeRayOptions(cloud=K8sCloud.GKE, kind=Kind.RAYJOB))
    with pytest.raises(ConfigError, match="needs object storage every cluster reaches"):
        render_kuberay(across_job(storage_path="/mnt/runs"), KubeRayOptions(cloud=K8sCloud.GKE, kind=Kind.RAYCLUSTER))


def test_options_built_in_python_take_a_choice_as_its_string_and_refuse_a_misspelt_one():
    """A misspelt kind passed for the default (a RayCluster), and a cloud's string failed with a KeyError."""
    opts = KubeRayOptions(cloud="gke", kind="raycluster")  # type: ignore[arg-type]
    assert (opts.cloud, opts.kind) == (K8sCloud.GKE, Kind.RAYCLUSTER)
    assert kuberay_manifest(make_job(LADDERS[2]), opts)["kind"] == "RayCluster"
    with pytest.raises(ConfigError, match=r"^kind: 'rayjbo' is not one of: rayjob, raycluster"):
        KubeRayOptions(cloud=K8sCloud.GKE, kind="rayjbo")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^cloud: 'eks' is not one of: "):
        KubeRayOptions(cloud="eks")  # type: ignore[arg-type]


def test_one_pip_string_is_one_package_and_a_bad_one_is_refused_by_name():
    """A string is a sequence of letters: 'torch' was installed as t, o, r, c, h."""
    spec = kuberay_manifest(make_job(LADDERS[2]), KubeRayOptions(cloud=K8sCloud.GKE, pip="churn==1.2"))["spec"]  # type: ignore[arg-type]
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"pip": [f"spotfallback=={__version__}", "churn==1.2"]}
    for bad, message in (("", "an empty package"), ("--index-url x", "is a pip option"), ("torch>=", "is not a pip requirement")):
        with pytest.raises(ConfigError, match=rf"^pip: .*{message}"):
            KubeRayOptions(cloud=K8sCloud.GKE, pip=(bad,))


def test_a_gang_across_nodes_built_for_a_gpu_fabric_is_told_its_pods_ask_for_none() -> None:
    from spotfallback.deploy.kuberay import pod_fabric_notes

    def notes(cloud: K8sCloud, workers: int, gpu: str | None = "H100", **placement: Any) -> list[str]:
        tier = {"name": "gpu", "market": "spot", "num_workers": workers, "use_gpu": True,
                "resources_per_worker": {"CPU": 8, "GPU": 1}, "placement": placement}
        if gpu:
            tier["label_selector"] = {"ray.io/accelerator-type": gpu}
        return pod_fabric_notes(make_job([tier]), KubeRayOptions(cloud=cloud))

    (efa,) = notes(K8sCloud.EKS_KARPENTER, 64)
    assert efa.startswith("tiers[0] (gpu): its gang spans 8 p5.48xlarge nodes") and "vpc.amazonaws.com/efa" in efa
    (tcpx,) = notes(K8sCloud.GKE, 16)
    assert "2 a3-highgpu-8g nodes" in tcpx and "no GPUDirect-TCPX" in tcpx
    (tcpxo,) = notes(K8sCloud.GKE, 16, node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"})
    assert "2 a3-megagpu-8g nodes" in tcpxo and "no GPUDirect-TCPXO" in tcpxo
    (pinned,) = notes(K8sCloud.EKS_MANAGED, 9, gpu=None, instance_type="p4d.24xlarge")
    assert "2 p4d.24xlarge nodes" in pinned
    assert notes(K8sCloud.EKS_KARPENTER, 8) == []  # one node holds the gang
    assert notes(K8sCloud.GKE, 16, gpu="A100") == []  # A2: no fabric to set up
    assert notes(K8sCloud.EKS_MANAGED, 16, gpu=None, instance_type="g5.12xlarge") == []
