"""A ladder of GPU pools in every deployment file: each tier's pods land on its own pool only.

The ladder: A100 spot -> T4 spot (same zone, another GPU) -> A100 on-demand. Per Kubernetes
cloud the RayJob / RayCluster (checked against the vendored KubeRay CRDs when rendered) must give
each tier a node selection no other tier's nodes satisfy, GPU pods must tolerate GPU pool taints,
and on Karpenter each tier must have a NodePool that makes exactly its machines.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from spotfallback.config import JobConfig, Tier
from spotfallback.deploy import K8sCloud, KubeRayOptions, kuberay_manifest
from spotfallback.deploy.clouds import AGENT_CLOUD, VmCloud
from spotfallback.deploy.kuberay import Kind, render_kuberay
from spotfallback.deploy.launcher import (
    LauncherOptions,
    cluster_launcher_config,
    render_cluster_launcher,
)
from spotfallback.deploy.machines import Machine, family, machine, node_keeps_mib, sized
from spotfallback.deploy.nodepools import (
    KarpenterCloud,
    NodePoolOptions,
    nodepool_findings,
    nodepools_for,
)
from spotfallback.deploy.pools import (
    GKE_ACCELERATOR_KEY,
    GPU_NODE_TAINT,
    GPUS,
    INSTANCE_TYPE_KEY,
    KARPENTER_GPU_NAME_KEY,
    k8s_pool,
    vm_pool,
)
from spotfallback.deploy.validate import validate_document
from spotfallback.errors import ConfigError

# Clouds whose nodes carry no GPU-type label: the job names each pool's machines.
INSTANCE_TYPES: dict[K8sCloud, dict[str, str]] = {
    K8sCloud.EKS_MANAGED: {"A100": "p4d.24xlarge", "T4": "g4dn.12xlarge"},
    K8sCloud.AKS: {"A100": "Standard_NC24ads_A100_v4", "T4": "Standard_NC16as_T4_v3"},
    K8sCloud.AKS_NAP: {"A100": "Standard_NC24ads_A100_v4", "T4": "Standard_NC16as_T4_v3"},
}


def gpu_tier(name: str, market: str, gpu: str, workers: int, cloud: K8sCloud | None = None) -> dict[str, Any]:
    tier: dict[str, Any] = {
        "name": name,
        "market": market,
        "num_workers": workers,
        "use_gpu": True,
        "resources_per_worker": {"CPU": 8, "GPU": 1},
        "label_selector": {"ray.io/market-type": market, "ray.io/accelerator-type": gpu},
    }
    if cloud in INSTANCE_TYPES:
        tier["placement"] = {"instance_type": INSTANCE_TYPES[cloud][gpu]}
    return tier


def gpu_ladder(cloud: K8sCloud | None = None) -> JobConfig:
    tiers = [
        gpu_tier("a100-spot", "spot", "A100", 4, cloud),
        gpu_tier("t4-spot", "spot", "T4", 8, cloud),
        gpu_tier("a100-on-demand", "on-demand", "A100", 4, cloud),
    ]
    return JobConfig.model_validate(
        {"name": "llm-ft", "storage_path": "s3://ml-runs/spotfallback", "entrypoint": "ft.train:train_func", "tiers": tiers}
    )


def pod_specs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest["spec"]
    return [g["template"]["spec"] for g in spec.get("rayClusterSpec", spec)["workerGroupSpecs"]]


def required_pairs(pod: dict[str, Any]) -> set[tuple[str, str]]:
    return set(pod.get("nodeSelector", {}).items())


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_each_gpu_tier_selects_its_own_pool_and_tolerates_gpu_taints(cloud: K8sCloud, kind: Kind) -> None:
    job = gpu_ladder(cloud)
    text = render_kuberay(job, KubeRayOptions(cloud=cloud, kind=kind, image="ghcr.io/acme/train:1"))  # validated
    pods = pod_specs(yaml.safe_load(text))
    selections = [required_pairs(p) for p in pods]
    # The two spot tiers (same market, same zone) differ by the GPU type or the machines.
    assert selections[0] != selections[1] and selections[0] - selections[1] and selections[1] - selections[0]
    pin = {K8sCloud.GKE: GKE_ACCELERATOR_KEY, K8sCloud.EKS_KARPENTER: KARPENTER_GPU_NAME_KEY}.get(cloud, INSTANCE_TYPE_KEY)
    assert [dict(s).get(pin) is not None for s in selections] == [True, True, True]
    assert dict(selections[0])[pin] == dict(selections[2])[pin]  # A100 spot and on-demand: one machine, two markets
    for pod in pods:
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_validate_refuses_two_groups_kubernetes_cannot_tell_apart(cloud: K8sCloud) -> None:
    manifest = kuberay_manifest(gpu_ladder(cloud), KubeRayOptions(cloud=cloud, image="ghcr.io/acme/train:1"))
    _, findings = validate_document(manifest)
    assert not [f for f in findings if not f.warning]
    broken = copy.deepcopy(manifest)
    pods = pod_specs(broken)
    pods[1]["nodeSelector"] = dict(pods[0]["nodeSelector"])  # the T4 tier's pods now fit the A100 pool
    _, findings = validate_document(broken)
    errors = [f for f in findings if not f.warning]
    assert len(errors) == 1 and "workerGroupSpecs[1]" in errors[0].path
    assert "same nodes as workerGroupSpecs[0] ('a100-spot')" in errors[0].message


@pytest.mark.parametrize("cloud", [K8sCloud.EKS_MANAGED, K8sCloud.AKS, K8sCloud.AKS_NAP])
def test_a_gpu_type_without_a_node_label_needs_the_pool_named(cloud: K8sCloud) -> None:
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.placement: .* placement\.instance_type"):
        kuberay_manifest(gpu_ladder(None), KubeRayOptions(cloud=cloud, image="ghcr.io/acme/train:1"))


@pytest.mark.parametrize(
    ("cloud", "foreign"),
    [(K8sCloud.GKE, "p4d.24xlarge"), (K8sCloud.AKS, "a2-highgpu-8g"), (K8sCloud.AKS_NAP, "p4d.24xlarge"),
     (K8sCloud.EKS_MANAGED, "Standard_ND96asr_v4"), (K8sCloud.EKS_KARPENTER, "a2-highgpu-8g")],
)
def test_a_machine_type_of_another_cloud_is_refused(cloud: K8sCloud, foreign: str) -> None:
    """It would pin the tier's pods to node.kubernetes.io/instance-type values no node of this cloud has."""
    tier = Tier.model_validate({**gpu_tier("x", "spot", "A100", 1), "placement": {"instance_type": foreign}})
    with pytest.raises(ConfigError, match=rf"^tiers\[0\]\.placement\.instance_type: '{foreign}' is not an? .* so no "):
        k8s_pool(cloud, tier, 0)
    provider = {"aws": "p4d.24xlarge", "gcp": "a2-highgpu-8g", "azure": "Standard_ND96asr_v4"}[AGENT_CLOUD[cloud]]
    own = Tier.model_validate({**gpu_tier("x", "spot", "A100", 1), "placement": {"instance_type": provider}})
    assert k8s_pool(cloud, own, 0).node_selector["node.kubernetes.io/instance-type"] == provider


def test_an_unknown_gpu_type_names_the_field_and_ray_names() -> None:
    tier = Tier.model_validate(gpu_tier("x", "spot", "A1000", 1))
    with pytest.raises(ConfigError, match=r"tiers\[2\]\.label_selector\.ray\.io/accelerator-type: 'A1000' .* A100, A100-80G"):
        k8s_pool(K8sCloud.GKE, tier, 2)


def test_placement_node_selector_and_tolerations_reach_the_pods_and_contradictions_are_refused() -> None:
    tier = Tier.model_validate(
        {
            **gpu_tier("a100-spot", "spot", "A100", 2),
            "placement": {
                "node_selector": {"cloud.google.com/gke-nodepool": "a100-spot"},
                "tolerations": [{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            },
        }
    )
    pool = k8s_pool(K8sCloud.GKE, tier, 0)
    assert pool.node_selector == {GKE_ACCELERATOR_KEY: "nvidia-tesla-a100", "cloud.google.com/gke-nodepool": "a100-spot"}
    assert {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pool.tolerations
    clash = tier.model_copy(update={"placement": tier.placement.model_copy(update={"node_selector": {GKE_ACCELERATOR_KEY: "nvidia-l4"}})})
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.placement\.node_selector\.cloud\.google\.com/gke-accelerator"):
        k8s_pool(K8sCloud.GKE, clash, 0)


@pytest.mark.parametrize(
    ("toleration", "field"),
    [({"key": "a", "operator": "Exists", "value": "x"}, "value"), ({"key": "a", "operator": "Equal"}, "value"), ({"key": ""}, "key")],
)
def test_a_malformed_toleration_is_refused_naming_the_field(toleration: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Tier.model_validate({**gpu_tier("a", "spot", "A100", 1), "placement": {"tolerations": [toleration]}})


@pytest.mark.parametrize("cloud", list(KarpenterCloud))
def test_nodepools_one_per_gpu_pool_each_making_only_its_tiers_machines(cloud: KarpenterCloud) -> None:
    k8s = K8sCloud(cloud.value)
    job = gpu_ladder(k8s)
    *pools, head = nodepools_for(job, NodePoolOptions(cloud=cloud))
    assert list(nodepool_findings([*pools, head], job, cloud)) == []  # the vendored CRD schema, and every tier served
    assert [p["metadata"]["name"] for p in [*pools, head]] == ["llm-ft-a100-spot", "llm-ft-t4-spot", "llm-ft-on-demand", "llm-ft-head"]
    for pool in pools:
        assert GPU_NODE_TAINT in pool["spec"]["template"]["spec"]["taints"]
    pods = pod_specs(kuberay_manifest(job, KubeRayOptions(cloud=k8s, image="ghcr.io/acme/train:1")))

    def makes(pool: dict[str, Any], pod: dict[str, Any]) -> bool:
        reqs = {r["key"]: r for r in pool["spec"]["template"]["spec"]["requirements"]}
        return all(k not in reqs or reqs[k]["operator"] != "In" or v in reqs[k]["values"] for k, v in required_pairs(pod))

    for i, pod in enumerate(pods):
        assert [makes(pool, pod) for pool in pools] == [j == i for j in range(3)], f"tier {i}"
    # A pool that no longer makes a tier's machines is caught.
    broken = copy.deepcopy(pools)
    broken[1]["spec"]["template"]["spec"]["requirements"] = [
        r for r in broken[1]["spec"]["template"]["spec"]["requirements"] if r["key"] not in (KARPENTER_GPU_NAME_KEY, INSTANCE_TYPE_KEY)
    ] + [{"key": INSTANCE_TYPE_KEY if cloud is KarpenterCloud.AKS_NAP else KARPENTER_GPU_NAME_KEY, "operator": "In", "values": ["other"]}]
    assert any("tiers[1] ('t4-spot'): no NodePool allows nodes labelled" in f for f in nodepool_findings([*broken, head], job, cloud))


@pytest.mark.parametrize(
    ("cloud", "where", "types"),
    [
        (VmCloud.AWS, {"region": "us-east-1"}, ["p4d.24xlarge", "g4dn.2xlarge", "p4d.24xlarge"]),
        (VmCloud.GCP, {"zone": "us-central1-a", "project_id": "ml-project", "source_image": "img"}, ["a2-highgpu-1g", "n1-standard-8", "a2-highgpu-1g"]),
    ],
)
def test_ray_up_node_types_are_the_gpu_types_machines(cloud: VmCloud, where: dict[str, str], types: list[str]) -> None:
    job = gpu_ladder()
    opts = LauncherOptions(cloud=cloud, **where)  # type: ignore[arg-type]
    render_cluster_launcher(job, opts)  # validated against Ray's launcher schema
    node_types = cluster_launcher_config(job, opts)["available_node_types"]
    configs = [node_types[t.name]["node_config"] for t in job.tiers]
    key = "InstanceType" if cloud is VmCloud.AWS else "machineType"
    assert [c[key] for c in configs] == types
    if cloud is VmCloud.GCP:  # a T4 is attached to an N1 VM; A100 machine types come with theirs
        assert configs[1]["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]
        assert "guestAccelerators" not in configs[0]
    own = "p4de.24xlarge" if cloud is VmCloud.AWS else "a2-ultragpu-1g"
    pinned = JobConfig.model_validate(
        {**job.model_dump(), "tiers": [{**job.tiers[0].model_dump(), "placement": {"instance_type": own}}]}
    )
    assert cluster_launcher_config(pinned, opts)["available_node_types"]["a100-spot"]["node_config"][key] == own


def _pinned(machine: str, cpu: float, gpus: int) -> Tier:
    return Tier.model_validate({**gpu_tier("a100-spot", "spot", "A100", 8), "resources_per_worker": {"CPU": cpu, "GPU": gpus},
                                "placement": {"instance_type": machine}})


def test_a_machine_smaller_than_one_worker_is_refused_naming_one_that_holds_it() -> None:
    """The 64-GPU job's workers (8 GPUs each) pinned to a 1-GPU machine would pend forever."""
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.placement\.instance_type: 'p3\.2xlarge' has 8 vCPUs and 1 GPU, "
                                          r"and one worker asks for 8 CPUs and 8 GPUs .*such as 'p3\.16xlarge'\), or give each worker fewer CPUs "
                                          r"than its 8 \(the kubelet keeps part of every node\) and at most 1 GPU$"):
        k8s_pool(K8sCloud.EKS_MANAGED, _pinned("p3.2xlarge", 8, 8), 0)
    with pytest.raises(ConfigError, match=r"'a2-highgpu-4g' has 48 vCPUs and 4 GPUs.*such as 'a2-highgpu-8g'"):
        vm_pool(VmCloud.GCP, _pinned("a2-highgpu-4g", 8, 8), 0, 8, 8)
    assert k8s_pool(K8sCloud.EKS_MANAGED, _pinned("p4d.24xlarge", 8, 8), 0).node_selector[INSTANCE_TYPE_KEY] == "p4d.24xlarge"


def test_a_pod_cannot_ask_for_every_cpu_of_its_node_but_a_ray_up_worker_can() -> None:
    """The kubelet keeps part of each node's CPU, so a pod asking for all 96 of a p4d never schedules."""
    whole = _pinned("p4d.24xlarge", 96, 8)
    with pytest.raises(ConfigError, match=r"give each worker fewer CPUs than its 96 \(the kubelet keeps part of every node\)"):
        k8s_pool(K8sCloud.EKS_MANAGED, whole, 0)
    assert vm_pool(VmCloud.AWS, whole, 0, 96, 8)[0] == "p4d.24xlarge"
    assert k8s_pool(K8sCloud.EKS_MANAGED, _pinned("p4d.24xlarge", 90, 8), 0).node_selector[INSTANCE_TYPE_KEY] == "p4d.24xlarge"


def test_machines_outside_the_catalog_are_not_checked_and_a_known_one_in_other_case_is_refused() -> None:
    assert machine("p5en.48xlarge") is None
    assert k8s_pool(K8sCloud.EKS_MANAGED, _pinned("p5en.48xlarge", 8, 8), 0).node_selector[INSTANCE_TYPE_KEY] == "p5en.48xlarge"
    assert machine("Standard_ND96asr_v4") == Machine("azure", 96, 8, 900)
    with pytest.raises(ConfigError, match=r"'Standard_NC6s_v3' has 6 vCPUs and 1 GPU"):
        k8s_pool(K8sCloud.AKS, _pinned("Standard_NC6s_v3", 4, 2), 0)
    # node.kubernetes.io/instance-type carries Azure's spelling; a selector in other case matches no node.
    with pytest.raises(ConfigError, match=r"'Standard_nd96asr_v4' is spelt 'Standard_ND96asr_v4' on the nodes' labels"):
        k8s_pool(K8sCloud.AKS, _pinned("Standard_nd96asr_v4", 8, 8), 0)


def _one_tier_job(tier: Tier) -> JobConfig:
    return JobConfig.model_validate({"name": "ft", "storage_path": "s3://ml-runs/sf", "entrypoint": "ft.train:train_func",
                                     "tiers": [tier.model_dump(exclude_defaults=True)]})


def test_a_worker_asking_more_memory_than_its_node_can_give_is_refused() -> None:
    """Memory defaults to 4 GiB per CPU: 31 CPUs of an n2-standard-32 ask for 124 GiB, more than GKE leaves of 128."""
    cpu_tier = Tier.model_validate({"name": "cpu-spot", "market": "spot", "num_workers": 4, "resources_per_worker": {"CPU": 31},
                                    "placement": {"instance_type": "n2-standard-32"}})
    gke = KubeRayOptions(cloud=K8sCloud.GKE, image="ghcr.io/acme/train:1")
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.resources_per_worker: one worker asks for 124\.2 GiB of memory \(4 GiB per "
                                          r"CPU from KubeRayOptions\.memory_per_cpu_gib, as resources_per_worker names no memory; the notice agent's 256Mi included\), and 'n2-standard-32' has 128 GiB, "
                                          r"of which a gke node keeps at least 9\.3 GiB .*give each worker at most 118 GiB "
                                          r"\(resources_per_worker\.memory, in bytes: 126701535232\), or name a larger type "
                                          r"\(such as 'n2-standard-48'\)$"):
        kuberay_manifest(_one_tier_job(cpu_tier), gke)
    fits = cpu_tier.model_copy(update={"resources_per_worker": {"CPU": 31, "memory": 118 * 2**30}})
    pod = pod_specs(kuberay_manifest(_one_tier_job(fits), gke))[0]
    assert pod["containers"][0]["resources"]["requests"]["memory"] == str(118 * 2**30)
    # Karpenter never counts on 7.5% of an instance's memory: 1100 GiB fits a p4d node of a managed group, not Karpenter's.
    big = _pinned("p4d.24xlarge", 90, 8).model_copy(update={"resources_per_worker": {"CPU": 90, "GPU": 8, "memory": 1100 * 2**30}})
    kuberay_manifest(_one_tier_job(big), KubeRayOptions(cloud=K8sCloud.EKS_MANAGED, image="ghcr.io/acme/train:1"))
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.resources_per_worker\.memory: one worker asks for 1100 GiB of memory \(the "
                                          r"notice agent's 256Mi included\), and 'p4d\.24xlarge' has 1152 GiB, of which an eks-karpenter "
                                          r"node keeps at least 87 GiB .* at most 1065 GiB"):
        kuberay_manifest(_one_tier_job(big), KubeRayOptions(cloud=K8sCloud.EKS_KARPENTER, image="ghcr.io/acme/train:1"))


def test_the_notice_agents_cpu_counts_against_a_pinned_node_as_manifest_validate_counts_it() -> None:
    """A native sidecar's requests add to the pod's, so 31.95 CPUs and the agent's 100m never fit 32 vCPUs."""
    tier = Tier.model_validate({"name": "cpu-spot", "market": "spot", "num_workers": 2, "placement": {"instance_type": "n2-standard-32"},
                                "resources_per_worker": {"CPU": 31.95, "memory": 100 * 2**30}})
    gke = KubeRayOptions(cloud=K8sCloud.GKE, image="ghcr.io/acme/train:1")
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.resources_per_worker: 'n2-standard-32' has 32 vCPUs and 0 GPUs, and one "
                                          r"worker asks for 31\.95 CPUs and 0 GPUs \(resources_per_worker\) beside the notice agent's 100m, so no worker "
                                          r"would ever run there; name a larger type \(such as 'n2-standard-48'\), or give each worker "
                                          r"fewer CPUs than 31\.9 \(its 32 less the notice agent's 100m; the kubelet keeps part of every node\)$"):
        kuberay_manifest(_one_tier_job(tier), gke)
    alone = kuberay_manifest(_one_tier_job(tier), KubeRayOptions(cloud=K8sCloud.GKE, image="ghcr.io/acme/train:1",
                                                                 notice_agent=False))
    assert pod_specs(alone)[0]["containers"][0]["resources"]["requests"]["cpu"] == "31950m"
    fits = tier.model_copy(update={"resources_per_worker": {"CPU": 31.85, "memory": 100 * 2**30}})
    doc = kuberay_manifest(_one_tier_job(fits), gke)
    assert validate_document(doc)[1] == []  # what the generator lets through, manifest validate passes


def test_what_a_node_keeps_is_a_lower_bound_of_each_clouds_documented_allocatable() -> None:
    # Karpenter's own table gives an m5.xlarge (16 GiB, 58 pods) 14162 MiB allocatable: 7.5%, 11 MiB x 58 + 255, 100.
    assert node_keeps_mib(K8sCloud.EKS_KARPENTER, 16) + 11 * 58 == 16384 - 14162
    # GKE's bands read with GB as 1000 MiB, as the cluster autoscaler predicts them: at most 2% under the GiB reading.
    gib_reading = 0.25 * 4096 + 0.2 * 4096 + 0.1 * 8192 + 0.06 * 114688 + 100
    assert 0.98 * gib_reading <= node_keeps_mib(K8sCloud.GKE, 128) <= gib_reading
    # AKS (1.29 and later): an 8 GB node with 30 pods keeps 650 MB and the 100 Mi eviction threshold.
    assert node_keeps_mib(K8sCloud.AKS, 8) == pytest.approx(650e6 / 2**20 + 100)
    assert node_keeps_mib(K8sCloud.AKS, 1) == pytest.approx(0.25 * 1024 + 100)  # 25% of a small node at most


def test_default_fit_tables_come_from_the_catalog_smallest_first() -> None:
    """``ray up``'s default fits choose from the one machine table, so a size is written once."""
    g5 = family("g5.", without=("16xlarge",))
    assert [name for name, _, _ in g5] == [f"g5.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "24xlarge", "48xlarge")]
    assert g5 == sized(*(name for name, _, _ in g5)) and GPUS["A10G"].aws == g5
    assert [n for n, _, _ in family("p3.")] == ["p3.2xlarge", "p3.8xlarge", "p3.16xlarge"]  # not p3dn.24xlarge
    with pytest.raises(KeyError, match="no known machine type starts with 'p9.'"):
        family("p9.")


def test_a_launcher_instance_type_smaller_than_a_worker_is_refused() -> None:
    job = gpu_ladder()
    opts = LauncherOptions(cloud=VmCloud.AWS, region="us-east-1", instance_types={"a100-spot": "g5.xlarge"})
    with pytest.raises(ConfigError, match=r"^instance_type: a100-spot: 'g5\.xlarge' has 4 vCPUs and 1 GPU, and one worker "
                                          r"asks for 8 CPUs and 1 GPU .*such as 'g5\.2xlarge'\), or give each worker at most 4 CPUs$"):
        cluster_launcher_config(job, opts)




@pytest.mark.parametrize(("cloud", "largest"), [(K8sCloud.EKS_KARPENTER, "p5.48xlarge"), (K8sCloud.GKE, "a3-highgpu-8g")])
def test_a_worker_no_machine_of_its_gpu_type_holds_is_refused_where_the_gpu_type_picks_the_nodes(
        cloud: K8sCloud, largest: str) -> None:
    """On Karpenter and GKE the GPU type alone picks the machines: 9 H100s, or more memory than a
    p5.48xlarge or a3-highgpu-8g has, is no worker any of them holds, as ``ray up`` already says."""
    opts = KubeRayOptions(cloud=cloud, image="ghcr.io/acme/train:1")
    with pytest.raises(ConfigError, match=rf"^tiers\[0\]\.resources_per_worker: '{largest}' has \d+ vCPUs and 8 GPUs, and one "
                                          rf"worker asks for 8 CPUs and 9 GPUs .*at most 8 GPUs \(on {cloud.value}, "
                                          rf"ray\.io/accelerator-type: H100 puts the tier's pods on {largest} nodes\)$"):
        kuberay_manifest(_shaped("H100", 8, 9), opts)
    huge = _shaped("H100", 8, 1).tiers[0].resources_per_worker | {"memory": 3000 * 2**30}
    with pytest.raises(ConfigError, match=rf"^tiers\[0\]\.resources_per_worker\.memory: one worker asks for 3000 GiB of memory.* "
                                          rf"'{largest}' has .*puts the tier's pods on {largest} nodes\)$"):
        kuberay_manifest(_shaped("H100", 8, 1, resources_per_worker=huge), opts)
    # Of several machine types (L4: g6.xlarge ... g6.48xlarge), one that holds the worker is enough.
    l4 = _shaped("L4", 8, 1, resources_per_worker={"CPU": 8, "GPU": 1, "memory": 300 * 2**30})
    assert kuberay_manifest(l4, opts)
    l4 = _shaped("L4", 8, 1, resources_per_worker={"CPU": 8, "GPU": 1, "memory": 2000 * 2**30})
    with pytest.raises(ConfigError, match=r"puts the tier's pods on g6\.xlarge or .* nodes, the largest of which is 'g6\.48xlarge'\)$"
                       if cloud is K8sCloud.EKS_KARPENTER else r"g2-standard-96"):
        kuberay_manifest(l4, opts)


@pytest.mark.parametrize("cloud", list(VmCloud))
def test_a_ray_up_worker_gets_a_machine_with_its_memory_and_more_than_any_has_is_refused(cloud: VmCloud) -> None:
    """A node type advertises its workers' memory to Ray as written, so a worker asking for more
    than the machine has would be placed there and run out of memory."""
    opts = LauncherOptions(cloud=cloud, **({"region": "us-east-1"} if cloud is VmCloud.AWS else GCP))
    roomy = _shaped("A100", 8, 1, resources_per_worker={"CPU": 8, "GPU": 1, "memory": 600 * 2**30})
    node = cluster_launcher_config(roomy, opts)["available_node_types"]["a100-spot"]
    assert node["node_config"].get("InstanceType", node["node_config"].get("machineType")) == (
        "p4d.24xlarge" if cloud is VmCloud.AWS else "a2-highgpu-8g")  # not the 1-GPU type the CPUs and GPUs alone fit
    huge = _shaped("A100", 8, 1, resources_per_worker={"CPU": 8, "GPU": 1, "memory": 3000 * 2**30})
    with pytest.raises(ConfigError, match=rf"^tiers\[0\]\.placement\.instance_type: no {cloud.value} machine with A100 GPUs "
                                          r"fits 8 CPUs, 3000 GiB of memory and 1 GPUs per worker; name one$"):
        cluster_launcher_config(huge, opts)
    pinned = _shaped("A100", 8, 1, resources_per_worker={"CPU": 8, "GPU": 1, "memory": 100 * 2**30},
                     placement={"instance_type": "p4d.24xlarge" if cloud is VmCloud.AWS else "a2-highgpu-1g"})
    if cloud is VmCloud.GCP:  # an a2-highgpu-1g has 85 GiB
        with pytest.raises(ConfigError, match=r"^tiers\[0\]\.placement\.instance_type: one worker asks for 100 GiB of memory, "
                                              r"and 'a2-highgpu-1g' has 85 GiB, .*at most 85 GiB .*such as 'a2-highgpu-2g'\)$"):
            cluster_launcher_config(pinned, opts)
    else:
        assert cluster_launcher_config(pinned, opts)
    cpu_only = JobConfig.model_validate({"name": "cpu", "storage_path": "s3://ml-runs/x", "entrypoint": "m:f", "tiers": [
        {"name": "spot", "market": "spot", "num_workers": 2, "resources_per_worker": {"CPU": 4, "memory": 60 * 2**30}}]})
    types = cluster_launcher_config(cpu_only, opts)["available_node_types"]["spot"]["node_config"]
    assert machine(types.get("InstanceType", types.get("machineType"))).memory_gib >= 60  # type: ignore[union-attr]


def _shaped(gpu: str, cpu: float, gpus: int, **extra: Any) -> JobConfig:
    """One GPU type's spot and on-demand tiers, `cpu` CPUs and `gpus` GPUs a worker."""
    tiers = [{**gpu_tier(f"{gpu.lower()}-{m}", m, gpu, 2), "resources_per_worker": {"CPU": cpu, "GPU": gpus}, **extra}
             for m in ("spot", "on-demand")]
    return JobConfig.model_validate({"name": "shaped", "storage_path": "s3://ml-runs/x", "entrypoint": "m:f", "tiers": tiers})


GCP = {"zone": "us-central1-a", "project_id": "ml-project", "source_image": "img"}


@pytest.mark.parametrize(("gpu", "cpu", "gpus", "machine_type", "attached"), [
    ("T4", 8, 1, "n1-standard-8", 1), ("T4", 30, 3, "n1-standard-32", 4), ("T4", 90, 4, "n1-standard-96", 4),
    ("V100", 8, 1, "n1-standard-8", 1), ("V100", 30, 3, "n1-standard-32", 4), ("V100", 90, 8, "n1-standard-96", 8),
    ("V100", 16, 1, "n1-standard-16", 2),  # one V100 allows at most 12 vCPUs
])
def test_n1_vms_get_gpus_only_in_the_counts_compute_engine_attaches(gpu: str, cpu: float, gpus: int, machine_type: str,
                                                                     attached: int) -> None:
    """N1 takes 1, 2 or 4 T4s and 1, 2, 4 or 8 V100s, each count with a vCPU cap: 3 GPUs, or 8 T4s, fail at creation."""
    node = cluster_launcher_config(_shaped(gpu, cpu, gpus), LauncherOptions(cloud=VmCloud.GCP, **GCP))
    config = node["available_node_types"][f"{gpu.lower()}-spot"]["node_config"]
    assert config["machineType"] == machine_type
    assert config["guestAccelerators"] == [{"acceleratorType": GPUS[gpu].gcp_guest, "acceleratorCount": attached}]


def test_more_gpus_than_an_n1_vm_takes_is_refused_on_gce_and_gke() -> None:
    """The 64-GPU job's 8-GPU workers on T4: no N1 VM (so no GKE T4 node) has 8 T4s."""
    job = _shaped("T4", 90, 8)
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.resources_per_worker: N1 VMs take T4 GPUs only 1 \(up to "
                                          r"n1-standard-32\), 2 \(up to n1-standard-32\), 4 \(up to n1-standard-96\), and "
                                          "one worker asks for 90 CPUs and 8 GPUs; give each worker fewer"):
        cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.GCP, **GCP))
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.resources_per_worker: N1 VMs take T4 GPUs only .*GKE's T4 nodes "
                                          r"are N1 VMs\), and one worker asks for 8, so its pods would never schedule"):
        kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.GKE))
    assert kuberay_manifest(_shaped("V100", 90, 8), KubeRayOptions(cloud=K8sCloud.GKE))  # 8 V100s do fit one N1


@pytest.mark.parametrize(("cloud", "machine_type", "has"), [
    (K8sCloud.EKS_KARPENTER, "p4d.24xlarge", "A100"), (K8sCloud.GKE, "a2-highgpu-8g", "A100"),
    (K8sCloud.EKS_MANAGED, "g5.48xlarge", "A10G"),
])
def test_a_machine_of_another_gpu_type_than_the_label_selector_names_is_refused(cloud: K8sCloud, machine_type: str,
                                                                                  has: str) -> None:
    """H100 and a p4d: the node selector asks for both, which no node carries."""
    job = _shaped("H100", 90, 8, placement={"instance_type": machine_type})
    with pytest.raises(ConfigError, match=rf"^tiers\[0\]\.placement\.instance_type: '{machine_type}' has {has} GPUs, and the "
                                          r"tier's label_selector asks for ray\.io/accelerator-type: H100, so no node would "
                                          "match both"):
        kuberay_manifest(job, KubeRayOptions(cloud=cloud))


def test_instance_type_option_names_the_machine_the_fit_cannot_find_and_is_checked_against_the_gpu_type() -> None:
    """The fit's error says to name a type; --instance-type TIER=TYPE is where to name it, so it must be read first."""
    job = _shaped("V100", 90, 8)
    aws = {"region": "us-east-1"}
    with pytest.raises(ConfigError, match=r"no aws machine with V100 GPUs fits 90 CPUs and 8 GPUs per worker; name one"):
        cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.AWS, **aws))  # type: ignore[arg-type]
    chosen = {"v100-spot": "p3dn.24xlarge", "v100-on-demand": "p3dn.24xlarge"}
    types = cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.AWS, instance_types=chosen, **aws))["available_node_types"]  # type: ignore[arg-type]
    assert {types[name]["node_config"]["InstanceType"] for name in chosen} == {"p3dn.24xlarge"}
    with pytest.raises(ConfigError, match=r"^instance_type: v100-spot: 'p5\.48xlarge' has H100 GPUs, and the tier's "
                                          r"label_selector asks for ray\.io/accelerator-type: V100"):
        cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.AWS, instance_types={"v100-spot": "p5.48xlarge"}, **aws))  # type: ignore[arg-type]


def test_a_pinned_n1_vm_gets_the_fewest_gpus_it_takes_that_cover_the_worker() -> None:
    def attached(machine_type: str, gpus: int) -> list[dict[str, Any]]:
        job = _shaped("T4", 4, gpus, placement={"instance_type": machine_type})
        node = cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.GCP, **GCP))["available_node_types"]["t4-spot"]
        assert node["node_config"]["machineType"] == machine_type
        return node["node_config"]["guestAccelerators"]

    assert attached("n1-standard-96", 1) == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 4}]  # 96 vCPUs: 4 only
    assert attached("n1-highmem-8", 3) == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 4}]
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.placement\.instance_type: N1 VMs take T4 GPUs only .*asks for 4 CPUs "
                                          "and 8 GPUs"):
        attached("n1-highmem-8", 8)
