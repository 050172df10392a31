"""Offline validation: the shipped strict schemas plus the KubeRay operator's own rules.

The upstream samples are copied to tests/fixtures/kuberay/ so these tests need no ../shared;
where ../shared is present, a test checks the copies and the shipped schema still match it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotfallback.deploy import validate_document, validate_file, validate_text
from spotfallback.deploy.schema import KUBERAY_FILES, extract_crd_schema, kuberay_validator
from tests.support.yaml_texts import alias_bomb, nested_too_deep

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kuberay"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "kuberay"
JOB_SAMPLE = "ray-job.sample.yaml"
CLUSTER_SAMPLE = "ray-cluster-label-selector.yaml"
DATA = Path(__file__).resolve().parents[2] / "src" / "spotfallback" / "data"


def sample(name: str) -> dict[str, Any]:
    """The first document (the RayJob/RayCluster) of an upstream sample."""
    return next(yaml.safe_load_all((FIXTURES / name).read_text()))


def errors(doc: Any) -> list[str]:
    _, findings = validate_document(doc)
    return [str(f) for f in findings if not f.warning]


@pytest.mark.parametrize("name", [JOB_SAMPLE, CLUSTER_SAMPLE])
def test_upstream_samples_pass(name: str) -> None:
    report = validate_file(FIXTURES / name)
    assert report.ok, [str(f) for f in report.errors]
    assert report.kinds[1] == "ConfigMap (not checked)"


def test_upstream_label_sample_gets_a_market_warning() -> None:
    # Its accelerator group is labelled on-demand but selects GKE spot nodes: legal, but Ray
    # would charge that group's preemptions to the wrong market.
    # Its spot group keeps Kubernetes' 30 s grace and Ray's 30 s SIGTERM drain: the kubelet
    # kills the node just as the drain window closes.
    report = validate_file(FIXTURES / CLUSTER_SAMPLE)
    assert [str(w) for w in report.warnings] == [
        "spec.workerGroupSpecs[1].labels[\"ray.io/market-type\"]: says 'on-demand', but the pods select cloud.google.com/gke-spot=true",
        "spec.workerGroupSpecs[2].template.spec.containers[0].env: Ray drains a node on SIGTERM for 30 s by default, "
        "which does not end before the pod's 30 s grace; set RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S a few seconds "
        "below terminationGracePeriodSeconds (30 s)",
    ]


Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return apply


def _drop_group_name(doc: dict[str, Any]) -> None:
    del doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]


def _resources_twice(doc: dict[str, Any]) -> None:
    group = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    group["rayStartParams"] = {"num-cpus": "2", "resources": '{"x": 1}'}
    group["resources"] = {"x": "1"}


BROKEN_JOBS: list[tuple[str, Mutation, str]] = [
    ("misspelt field", _set("spec.backofLimit", 3), "spec.backofLimit: unknown field; did you mean 'backoffLimit'?"),
    ("wrong type", _set("spec.rayClusterSpec.workerGroupSpecs.0.replicas", "one"), "spec.rayClusterSpec.workerGroupSpecs[0].replicas: expected integer, got string 'one'"),
    ("labels in rayStartParams", _set("spec.rayClusterSpec.workerGroupSpecs.0.rayStartParams", {"labels": "a=b"}), "spec.rayClusterSpec.workerGroupSpecs[0].rayStartParams.labels: not supported since KubeRay 1.5"),
    ("missing groupName", _drop_group_name, "spec.rayClusterSpec.workerGroupSpecs[0].groupName: required field is missing"),
    ("metadata typo", _set("metadata.lables", {"a": "b"}), "metadata.lables: unknown field; did you mean 'labels'?"),
    ("float quantity", _set("spec.rayClusterSpec.workerGroupSpecs.0.template.spec.containers.0.resources.limits.cpu", 0.5), "...resources.limits.cpu: expected an integer or a string"),
    ("int32 overflow", _set("spec.backoffLimit", 2**31), "spec.backoffLimit: 2147483648 is out of range for int32"),
    ("resources twice", _resources_twice, "spec.rayClusterSpec.workerGroupSpecs[0].resources: resources are also set in rayStartParams (num-cpus, resources)"),
    ("name too long", _set("metadata.name", "r" * 48), "metadata.name: 'rrrr"),
    ("submission mode typo", _set("spec.submissionMode", "SideCarMode"), "spec.submissionMode: 'SideCarMode' is not one of"),
    ("ttl without shutdown", _set("spec.ttlSecondsAfterFinished", 60), "spec.ttlSecondsAfterFinished: has no effect unless shutdownAfterJobFinishes"),
    ("runtime env not a mapping", _set("spec.runtimeEnvYAML", "- pip"), "spec.runtimeEnvYAML: must be a YAML mapping"),
]


@pytest.mark.parametrize(("what", "mutate", "expected"), BROKEN_JOBS, ids=[b[0] for b in BROKEN_JOBS])
def test_broken_copies_fail_naming_the_field(what: str, mutate: Mutation, expected: str) -> None:
    doc = sample(JOB_SAMPLE)
    assert errors(doc) == []
    mutate(doc)
    found = errors(doc)
    # "...x" means: some path ending in ".x" -- the message must still name the field.
    head, _, tail = expected.partition("...")
    assert any(e.startswith(head) and tail in e for e in found), found


def test_a_required_field_with_a_default_may_be_left_out_as_the_api_server_defaults_it() -> None:
    """minReplicas/maxReplicas are required in the CRD but defaulted (0, 2^31-1); KubeRay's own samples omit them."""
    doc = sample(JOB_SAMPLE)
    group = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    del group["minReplicas"], group["maxReplicas"]
    assert errors(doc) == []
    del group["groupName"]  # required, no default: still missing
    assert errors(doc) == ["spec.rayClusterSpec.workerGroupSpecs[0].groupName: required field is missing"]


def _drop_cluster_group_name(doc: dict[str, Any]) -> None:
    del doc["spec"]["workerGroupSpecs"][1]["groupName"]


BROKEN_CLUSTERS: list[tuple[str, Mutation, str]] = [
    ("misspelt field", _set("spec.enableInTreeAutoscalling", True), "spec.enableInTreeAutoscalling: unknown field; did you mean 'enableInTreeAutoscaling'?"),
    ("misspelt group field", _set("spec.workerGroupSpecs.0.maxReplica", 3), "spec.workerGroupSpecs[0].maxReplica: unknown field; did you mean 'maxReplicas'?"),
    ("wrong type", _set("spec.workerGroupSpecs.1.minReplicas", "0"), "spec.workerGroupSpecs[1].minReplicas: expected integer, got string '0'"),
    ("labels in rayStartParams", _set("spec.workerGroupSpecs.0.rayStartParams", {"labels": "ray.io/market-type=spot"}), "spec.workerGroupSpecs[0].rayStartParams.labels: not supported since KubeRay 1.5"),
    ("missing groupName", _drop_cluster_group_name, "spec.workerGroupSpecs[1].groupName: required field is missing"),
]


@pytest.mark.parametrize(("what", "mutate", "expected"), BROKEN_CLUSTERS, ids=[b[0] for b in BROKEN_CLUSTERS])
def test_broken_raycluster_copies_fail_naming_the_field(what: str, mutate: Mutation, expected: str) -> None:
    doc = sample(CLUSTER_SAMPLE)
    assert errors(doc) == []
    mutate(doc)
    found = errors(doc)
    assert any(e.startswith(expected) for e in found), found


def test_strictness_is_what_catches_the_typo() -> None:
    doc = sample(JOB_SAMPLE)
    doc["spec"]["backofLimit"] = 3
    assert list(kuberay_validator("RayJob", strict=False).iter_errors(doc)) == []
    assert len(list(kuberay_validator("RayJob").iter_errors(doc))) == 1


def test_group_names_must_be_unique_and_non_empty() -> None:
    doc = sample(CLUSTER_SAMPLE)
    doc["spec"]["workerGroupSpecs"][2]["groupName"] = "large-cpu-group"
    doc["spec"]["workerGroupSpecs"][1]["groupName"] = ""
    assert errors(doc) == [
        "spec.workerGroupSpecs[1].groupName: must not be empty",
        "spec.workerGroupSpecs[2].groupName: 'large-cpu-group' is already the name of workerGroupSpecs[0]",
    ]


def test_list_map_keys_must_be_unique() -> None:
    doc = sample(CLUSTER_SAMPLE)
    ports = _head_pod(doc)["containers"][0]["ports"]
    ports[1]["containerPort"] = 6379
    assert errors(doc) == [
        "spec.headGroupSpec.template.spec.containers[0].ports[1]: duplicate entry (containerPort=6379, protocol='TCP'); entry [0] already has it"
    ]


def _head_pod(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["headGroupSpec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["spec"]["headGroupSpec"]["labels"].update({"ray.io/market-type": "spot"}), 'spec.headGroupSpec.labels["ray.io/market-type"]'),
        (lambda d: _head_pod(d).update(nodeSelector={"karpenter.sh/capacity-type": "spot"}), 'spec.headGroupSpec.template.spec.nodeSelector["karpenter.sh/capacity-type"]'),
        (lambda d: _head_pod(d).update(tolerations=[{"key": "kubernetes.azure.com/scalesetpriority", "operator": "Exists"}]), "spec.headGroupSpec.template.spec.tolerations[0]"),
    ],
)
def test_head_on_spot_is_an_error(mutate: Callable[[dict[str, Any]], None], path: str) -> None:
    doc = sample(CLUSTER_SAMPLE)
    mutate(doc)
    found = errors(doc)
    assert len(found) == 1 and found[0].startswith(path + ":") and "on-demand" in found[0], found


def _ray_container(doc: dict[str, Any]) -> dict[str, Any]:
    return _head_pod(doc)["containers"][0]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: _ray_container(d).update(name="Ray_Head"),
         "spec.headGroupSpec.template.spec.containers[0].name: 'Ray_Head' must be 1-63 lowercase letters"),
        (lambda d: _ray_container(d)["resources"].update(requests={"cpu": "90"}, limits={"cpu": "80"}),
         "spec.headGroupSpec.template.spec.containers[0].resources.requests.cpu: '90' is more than limits.cpu '80'"),
        (lambda d: _ray_container(d)["resources"].update(requests={"nvidia.com/gpu": 1}, limits={"nvidia.com/gpu": 2}),
         "spec.headGroupSpec.template.spec.containers[0].resources.requests[\"nvidia.com/gpu\"]: 1 differs from limits"),
        (lambda d: _ray_container(d)["resources"].update(requests={"nvidia.com/gpu": 1}, limits={}),
         "spec.headGroupSpec.template.spec.containers[0].resources.limits[\"nvidia.com/gpu\"]: missing"),
        (lambda d: _head_pod(d).update(tolerations=[{"key": "k", "operator": "Equal", "value": "v", "effect": "NoScheduled"}]),
         "spec.headGroupSpec.template.spec.tolerations[0].effect: 'NoScheduled' is not a taint effect"),
        (lambda d: _head_pod(d).update(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]),
         "spec.headGroupSpec.template.spec.tolerations[0].value: must be empty when operator is 'Exists'"),
        (lambda d: _head_pod(d).update(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]),
         "spec.headGroupSpec.template.spec.tolerations[0].tolerationSeconds: only a NoExecute toleration"),
        (lambda d: _head_pod(d).update(nodeSelector={"pool": "a b"}),
         "spec.headGroupSpec.template.spec.nodeSelector.pool: invalid label value 'a b'"),
        (lambda d: d["spec"]["headGroupSpec"]["template"].update(metadata={"labels": {"team": "ml", "cost center": "1"}}),
         'spec.headGroupSpec.template.metadata.labels["cost center"]: invalid label key \'cost center\''),
        (lambda d: d["spec"]["workerGroupSpecs"][0]["template"].update(metadata={"labels": {"team": "-ml"}}),
         "spec.workerGroupSpecs[0].template.metadata.labels.team: invalid label value '-ml'"),
        (lambda d: _head_pod(d).update(priorityClassName="High"),
         "spec.headGroupSpec.template.spec.priorityClassName: 'High' is not a Kubernetes object name"),
    ],
)
def test_a_pod_template_the_api_server_would_refuse_is_named(mutate: Callable[[dict[str, Any]], None], message: str) -> None:
    """The RayCluster is accepted; every pod the operator then creates for the group is not, so it never starts."""
    doc = sample(CLUSTER_SAMPLE)
    mutate(doc)
    found = errors(doc)
    assert len(found) == 1 and found[0].startswith(message), found


def _submitter(doc: dict[str, Any]) -> dict[str, Any]:
    doc["spec"]["submitterPodTemplate"] = {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "submitter", "image": "rayproject/ray:2.52.0"}]}}
    return doc["spec"]["submitterPodTemplate"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("name", "mutate", "path"),
    [
        (CLUSTER_SAMPLE, lambda d: _ray_container(d).pop("image"), "spec.headGroupSpec.template.spec.containers[0].image"),
        (CLUSTER_SAMPLE, lambda d: _ray_container(d).update(image=""), "spec.headGroupSpec.template.spec.containers[0].image"),
        (CLUSTER_SAMPLE, lambda d: _ray_container(d).update(image=None), "spec.headGroupSpec.template.spec.containers[0].image"),
        (CLUSTER_SAMPLE, lambda d: d["spec"]["workerGroupSpecs"][1]["template"]["spec"].update(initContainers=[{"name": "setup"}]),
         "spec.workerGroupSpecs[1].template.spec.initContainers[0].image"),
        (JOB_SAMPLE, lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].pop("image"),
         "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].image"),
        (JOB_SAMPLE, lambda d: _submitter(d).pop("image"), "spec.submitterPodTemplate.spec.containers[0].image"),
    ],
)
def test_a_container_without_an_image_is_refused(name: str, mutate: Mutation, path: str) -> None:
    """The CRD leaves a container's image optional; the API server's pod validation requires one, so every pod of
    the group (or the RayJob's submitter) would be refused."""
    doc = sample(name)
    mutate(doc)
    assert errors(doc) == [f"{path}: required; name the container's image"]


def test_a_submitter_pod_template_gets_the_api_servers_pod_checks() -> None:
    doc = sample(JOB_SAMPLE)
    _submitter(doc)
    assert errors(doc) == []
    _submitter(doc).update(name="Submitter")
    assert [e.split(":")[0] for e in errors(doc)] == ["spec.submitterPodTemplate.spec.containers[0].name"]



def test_a_rayjob_edited_away_from_the_ladder_its_entrypoint_carries_is_refused() -> None:
    """`manifest kuberay` writes one group per tier, one pod per worker; a hand edit that drops a
    group, shrinks one below its gang or takes its GPUs away would leave that tier waiting for
    nodes until its capacity timeout, every time the run reaches it."""
    from spotfallback.config import JobConfig
    from spotfallback.deploy import K8sCloud, KubeRayOptions, kuberay_manifest

    job = JobConfig.model_validate({"name": "ft", "storage_path": "s3://ml-runs/sf", "entrypoint": "ft.train:train_func",
                                    "tiers": [{"name": n, "market": m, "num_workers": 8, "use_gpu": True,
                                               "resources_per_worker": {"CPU": 8, "GPU": 1},
                                               "label_selector": {"ray.io/accelerator-type": "A100"}}
                                              for n, m in (("spot-a", "spot"), ("spot-b", "spot"), ("on-demand", "on-demand"))]})
    doc = kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud.EKS_KARPENTER, image="ghcr.io/acme/train:1"))
    assert errors(doc) == []
    groups = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    del groups[1]
    groups[0]["maxReplicas"] = 4
    for asked in groups[1]["template"]["spec"]["containers"][0]["resources"].values():
        asked.pop("nvidia.com/gpu")
    at = "spec.rayClusterSpec.workerGroupSpecs"
    assert errors(doc) == [
        f"{at}[0].maxReplicas: 4, fewer than the 8 workers of tiers[0] (spot-a) of the job in spec.entrypoint (one pod "
        "each): its gang would never start",
        f"{at}: has no group 'spot-b' for tiers[1] (spot-b) of the job in spec.entrypoint: its workers would never get a "
        "node; add one (spotfallback manifest kuberay writes a group per tier)",
        f"{at}[1].template.spec.containers[0].resources: asks for 0 GPUs (nvidia.com/gpu), and a worker of tiers[2] "
        "(on-demand) of the job in spec.entrypoint needs 1: Ray would never place one on these pods",
    ]
    doc["spec"]["entrypoint"] = doc["spec"]["entrypoint"].replace('"num_workers":8', '"num_workers":0', 1)
    assert [e for e in errors(doc) if e.startswith("spec.entrypoint")] == [
        "spec.entrypoint: carries --job-json that is no job spotfallback runs (tiers.0.num_workers: Input should be "
        "greater than 0)"]
    assert errors(sample(JOB_SAMPLE)) == []  # an entrypoint of another program is not read

def test_object_labels_the_api_server_would_refuse_are_named() -> None:
    doc = sample(CLUSTER_SAMPLE)
    doc["metadata"]["labels"] = {"team": "ml", "Example.com/owner": "me"}
    assert errors(doc) == ['metadata.labels["Example.com/owner"]: invalid label key \'Example.com/owner\': an optional DNS '
                           "prefix and '/', then 1-63 alphanumerics, '-', '_' or '.'"]


def _gke_not_spot_only(pod: dict[str, Any]) -> None:
    """The node affinity our GKE files had: off Spot VMs, but not off legacy preemptible VMs."""
    expr = {"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]}
    terms = [{"matchExpressions": [expr]}]
    pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


@pytest.mark.parametrize("group", ["head", "on-demand worker"])
def test_keeping_off_gke_spot_but_not_gke_preemptible_is_an_error(group: str) -> None:
    doc = sample(CLUSTER_SAMPLE)
    if group == "head":
        pod, at = _head_pod(doc), "spec.headGroupSpec"
    else:
        worker = doc["spec"]["workerGroupSpecs"][0]
        worker["labels"]["ray.io/market-type"] = "on-demand"
        pod, at = worker["template"]["spec"], "spec.workerGroupSpecs[0]"
    _gke_not_spot_only(pod)
    found = errors(doc)
    assert len(found) == 1, found
    assert found[0].startswith(f"{at}.template.spec.affinity.nodeAffinity:")
    assert "cloud.google.com/gke-preemptible NotIn ['true']" in found[0]
    exprs = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    exprs.append({"key": "cloud.google.com/gke-preemptible", "operator": "NotIn", "values": ["true"]})
    assert errors(doc) == []


def test_autoscaler_v2_needs_restart_policy_never() -> None:
    doc = sample(CLUSTER_SAMPLE)
    doc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["restartPolicy"] = "Always"
    assert errors(doc) == ["spec.workerGroupSpecs[0].template.spec.restartPolicy: must be Never or unset with autoscaler v2 (got 'Always')"]


def test_min_replicas_above_max_and_bad_label() -> None:
    doc = sample(CLUSTER_SAMPLE)
    group = doc["spec"]["workerGroupSpecs"][0]
    group["minReplicas"], group["maxReplicas"] = 5, 2
    group["labels"]["bad key!"] = "x"
    found = errors(doc)
    assert "spec.workerGroupSpecs[0].minReplicas: 5 is more than maxReplicas 2" in found
    assert any(f.startswith('spec.workerGroupSpecs[0].labels["bad key!"]: invalid label key') for f in found)


def test_yaml_problems_name_the_line() -> None:
    text = (FIXTURES / JOB_SAMPLE).read_text().replace("  entrypoint: python", "  suspend: false\n  suspend: true\n  entrypoint: python", 1)
    report = validate_text(text)
    assert not report.ok and report.errors[0].message.startswith("line 11, column 3: not valid YAML: 'suspend' is given twice in one mapping; keep one")
    assert not validate_text("a: [1, 2").ok
    assert [str(f) for f in validate_text("").errors] == ["(top level): the file holds no YAML document"]
    assert [str(f) for f in validate_text("- 1\n").errors] == ["(top level): expected a mapping, got array"]
    assert not validate_text("hello: world\n").ok
    assert validate_file(FIXTURES / "missing.yaml").errors[0].message.startswith("cannot read")


def test_aliases_that_loop_or_expand_without_bound_are_refused_and_a_deep_file_read_or_refused() -> None:
    [loop] = validate_text("a: &a [*a]\n").errors
    assert loop.message.startswith("line 1, column 4: not valid YAML: an alias refers to a node that holds it")
    [bomb] = validate_text(alias_bomb(9)).errors  # a billion values: refused before any is built
    assert "its aliases expand this document to more than 100,000 values" in bomb.message
    doc = sample(CLUSTER_SAMPLE)  # aliases as people use them: one group's template shared by two groups
    groups = doc["spec"]["workerGroupSpecs"]
    groups.append({**groups[0], "groupName": "second"})
    text = yaml.safe_dump(doc)
    assert "*id001" in text and errors(doc) == [str(f) for f in validate_text(text).errors] == []
    [deep] = validate_text(nested_too_deep()).errors
    assert deep.message == "not readable YAML: its values nest deeper than the YAML reader can follow"


@pytest.mark.parametrize(
    ("head", "message"),
    [
        ("apiVersion: ray.io/v1\nkind: [RayCluster]", "kind: expected a string, got array"),
        ("apiVersion: ray.io/v1\nkind: {a: 1}", "kind: expected a string, got object"),
        ("apiVersion: ray.io/v1", "kind: missing: kubectl refuses an object without one; set the object's kind (e.g. RayJob or RayCluster)"),
        ("kind: RayCluster", "apiVersion: missing: kubectl refuses an object without one; set it (ray.io/v1 for a RayCluster)"),
        ('apiVersion: ""\nkind: RayCluster', "apiVersion: missing: kubectl refuses an object without one; set it (ray.io/v1 for a RayCluster)"),
        ("apiVersion: [ray.io/v1]\nkind: RayCluster", "apiVersion: expected a string, got array; set it (ray.io/v1 for a RayCluster)"),
        ("apiVersion: v1\nkind: RayCluster", "apiVersion: 'v1': a RayCluster is in the ray.io group; set apiVersion: ray.io/v1"),
    ],
)
def test_a_kind_or_api_version_kubectl_refuses_is_named(head: str, message: str) -> None:
    assert [str(f) for f in validate_text(head + "\nmetadata: {name: x}\nspec: {}\n").errors] == [message]


@pytest.mark.parametrize(("kind", "message"), [
    ("RayCluster", "spec.headGroupSpec: required field is missing"),
    ("RayJob", "spec.rayClusterSpec: required field is missing (or set clusterSelector to use an existing cluster)"),
])
@pytest.mark.parametrize("spec", ["", "spec:\n", "spec: null\n"])
def test_an_object_without_a_spec_is_refused_as_the_operator_refuses_it(kind: str, message: str, spec: str) -> None:
    assert [str(f) for f in validate_text(f"apiVersion: ray.io/v1\nkind: {kind}\nmetadata: {{name: x}}\n{spec}").errors] == [message]


def _gate_notes(doc: dict[str, Any], version: str | None) -> list[tuple[str, str]]:
    return [(f.path, f.message.split(" feature gate")[0].rsplit(" ", 1)[-1])
            for f in validate_document(doc, version)[1] if f.warning and "feature gate" in f.message]


def test_a_field_the_operator_refuses_with_its_default_feature_gates_is_noted_with_the_gate() -> None:
    job = sample(JOB_SAMPLE)
    cluster = job["spec"]["rayClusterSpec"]
    job["spec"]["deletionStrategy"] = {"deletionRules": [
        {"condition": {"jobStatus": "FAILED", "ttlSeconds": 30}, "policy": "DeleteWorkers"}]}
    cluster["workerGroupSpecs"][0]["suspend"] = True
    # RayJobDeletionPolicy: on by default from 1.6.0, so noted only for an operator before it.
    assert _gate_notes(job, None) == _gate_notes(job, "1.6.0") == []
    assert _gate_notes(job, "1.5.1") == [("spec.deletionStrategy", "RayJobDeletionPolicy"),
                                         ("spec.rayClusterSpec.workerGroupSpecs[0].suspend", "RayJobDeletionPolicy")]
    assert _gate_notes(job, "1.3.0") == [("spec.rayClusterSpec.workerGroupSpecs[0].suspend", "RayJobDeletionPolicy")]
    cluster["workerGroupSpecs"][0]["suspend"] = False  # only suspending needs the gate
    assert _gate_notes(job, "1.5.1") == [("spec.deletionStrategy", "RayJobDeletionPolicy")]

    # Alpha gates, off by default in every release to 1.7.0: noted without a version too.
    ray_cluster = sample(CLUSTER_SAMPLE)
    ray_cluster["spec"]["networkPolicy"] = {"mode": "DenyAll"}
    ray_cluster["spec"]["gcsFaultToleranceOptions"] = {"backend": "redis", "redisAddress": "redis:6379"}
    gated = [("spec.networkPolicy", "RayClusterNetworkPolicy")]
    assert _gate_notes(ray_cluster, None) == _gate_notes(ray_cluster, "1.7.0") == gated
    ray_cluster["spec"]["gcsFaultToleranceOptions"] = {"backend": "rocksdb"}  # only the embedded backend is gated
    gated.append(("spec.gcsFaultToleranceOptions.backend", "GCSFaultToleranceEmbeddedStorage"))
    assert _gate_notes(ray_cluster, "1.7.0") == gated
    [note] = [f for f in validate_document(ray_cluster)[1] if f.path == "spec.networkPolicy"]
    assert str(note) == ("spec.networkPolicy: KubeRay refuses the object unless the operator runs with its "
                         "RayClusterNetworkPolicy feature gate on (alpha, off by default): enable it (Helm: featureGates, "
                         "name RayClusterNetworkPolicy, enabled true; or the operator's "
                         "--feature-gates=RayClusterNetworkPolicy=true)")
    # An operator without the field drops it instead: that error, not the gate, is what it needs.
    assert _gate_notes(ray_cluster, "1.6.0") == []
    assert any(f.path == "spec.networkPolicy" and not f.warning for f in validate_document(ray_cluster, "1.6.0")[1])
    job["spec"]["rayClusterSpec"]["tlsOptions"] = {}
    job["spec"]["rayClusterSpec"]["historyServerOptions"] = {}
    assert _gate_notes(job, None) == [("spec.rayClusterSpec.tlsOptions", "RayClusterMTLS"),
                                      ("spec.rayClusterSpec.historyServerOptions", "RayClusterHistoryServer")]


def test_other_ray_kinds_and_versions() -> None:
    assert errors({"apiVersion": "ray.io/v1alpha1", "kind": "RayJob", "metadata": {"name": "x"}}) == [
        "apiVersion: 'ray.io/v1alpha1': only ray.io/v1 is checked (v1alpha1 is deprecated); set apiVersion: ray.io/v1 "
        "to have the file checked"
    ]
    for known in ("RayService", "RayCronJob"):  # KubeRay kinds that are not checked offline: a warning, not an error
        kind, findings = validate_document({"apiVersion": "ray.io/v1", "kind": known, "metadata": {"name": "x"}})
        assert [str(f) for f in findings if f.warning] == [f"kind: {known!r} is not checked offline; only RayJob and RayCluster are"]
        assert all(f.warning for f in findings)


@pytest.mark.parametrize(("kind", "hint"), [
    ("RayClustr", "; did you mean 'RayCluster'?"),
    ("raycluster", "; did you mean 'RayCluster'?"),
    ("RayJobs", "; did you mean 'RayJob'?"),
    ("RayServe", "; did you mean 'RayService'?"),
    ("Deployment", ""),
])
def test_an_unknown_kind_in_the_ray_io_group_is_refused_naming_the_kinds(kind: str, hint: str) -> None:
    """kubectl finds no such resource in ray.io ("no matches for kind"); a warning and ok would let the typo ship."""
    report = validate_text(f"apiVersion: ray.io/v1\nkind: {kind}\nmetadata: {{name: x}}\nspec: {{}}\n")
    assert [str(f) for f in report.findings] == [
        f"kind: {kind!r} is not a kind of ray.io (kubectl: no matches for kind {kind!r} in version 'ray.io/v1'); "
        f"KubeRay defines RayCluster, RayCronJob, RayJob, RayService{hint}"]
    assert not report.ok


# Trimmed from ray-project/kuberay ray-operator/config/samples/ray-cluster.complete.large.yaml at
# v1.0.0 (1add258fcfd5c83319428355c0af4dde60ea9047): a KubeRay 1.0 file, with the deprecated
# headGroupSpec.replicas that KubeRay 1.1.0 removed from the CRD.
KUBERAY_1_0_CLUSTER = """\
apiVersion: ray.io/v1
kind: RayCluster
metadata:
  labels:
    controller-tools.k8s.io: "1.0"
  name: raycluster-complete
spec:
  rayVersion: '2.7.0'
  headGroupSpec:
    serviceType: ClusterIP
    # for the head group, replicas should always be 1.
    # headGroupSpec.replicas is deprecated in KubeRay >= 0.3.0.
    replicas: 1
    rayStartParams:
      dashboard-host: '0.0.0.0'
    template:
      spec:
        containers:
        - name: ray-head
          image: rayproject/ray:2.7.0
          resources:
            limits: {cpu: "14", memory: "54Gi"}
            requests: {cpu: "14", memory: "54Gi"}
"""


def test_a_field_kuberay_removed_is_named_as_removed_not_as_a_typo() -> None:
    report = validate_text(KUBERAY_1_0_CLUSTER)
    assert [str(f) for f in report.errors] == [
        "spec.headGroupSpec.replicas: removed in KubeRay 1.1.0 (kubectl refuses it as an unknown field, or the API "
        "server drops it): every operator ignores it, a Ray cluster has exactly one head pod; remove it"
    ]
    # The operator the file was written for still has the field: a warning, not an error.
    old = validate_text(KUBERAY_1_0_CLUSTER, kuberay_version="1.0.0")
    assert old.ok and [f.path for f in old.warnings] == ["spec.headGroupSpec.replicas"]
    assert not validate_text(KUBERAY_1_0_CLUSTER, kuberay_version="1.1.0").ok
    # From Python the version is named as the argument it is, not as the CLI's flag.
    with pytest.raises(ValueError, match=r"^kuberay_version: '1\.x' is not a version such as 1\.5\.0"):
        validate_text(KUBERAY_1_0_CLUSTER, kuberay_version="1.x")
    with pytest.raises(ValueError, match=r"^kuberay_version: 1\.1 is not a version such as 1\.5\.0 \(give it as text"):
        validate_text(KUBERAY_1_0_CLUSTER, kuberay_version=1.1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^text: expected the YAML as a str, got NoneType; for a file, call validate_file"):
        validate_text(None)  # type: ignore[arg-type]
    # The RayJob's base64 runtimeEnv went in the same release; its fix is runtimeEnvYAML.
    job = sample(JOB_SAMPLE)
    job["spec"]["runtimeEnv"] = "eyJwaXAiOiBbInJlcXVlc3RzIl19"
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["replicas"] = 1
    found = errors(job)
    assert any(f.startswith("spec.runtimeEnv: removed in KubeRay 1.1.0") and f.endswith("spec.runtimeEnvYAML") for f in found), found
    assert any(f.startswith("spec.rayClusterSpec.headGroupSpec.replicas: removed in KubeRay 1.1.0") for f in found), found
    # Elsewhere the same names are still typos.
    cluster = yaml.safe_load(KUBERAY_1_0_CLUSTER)
    cluster["spec"]["runtimeEnv"] = "x"
    assert "spec.runtimeEnv: unknown field; remove it or check its spelling" in errors(cluster)


def test_a_field_of_kuberay_1_3_and_1_4_only_is_removed_for_later_operators_and_unknown_to_earlier() -> None:
    job = sample(JOB_SAMPLE)
    job["spec"]["deletionPolicy"] = "DeleteCluster"

    def said(version: str | None) -> list[str]:
        return [str(f) for f in validate_document(job, kuberay_version=version)[1] if f.path == "spec.deletionPolicy"]

    assert said(None) == ["spec.deletionPolicy: removed in KubeRay 1.5.0 (kubectl refuses it as an unknown field, or the "
                          "API server drops it): spec.deletionStrategy replaced it: give the policy as "
                          "deletionStrategy.onSuccess.policy and deletionStrategy.onFailure.policy"]
    assert said("1.4.2") == ["spec.deletionPolicy: KubeRay 1.4.2 still accepts it, but 1.5.0 removed it: spec.deletionStrategy "
                             "replaced it: give the policy as deletionStrategy.onSuccess.policy and "
                             "deletionStrategy.onFailure.policy"]
    assert [f.warning for f in validate_document(job, kuberay_version="1.4.2")[1] if f.path == "spec.deletionPolicy"] == [True]
    assert [m.split(";")[0] for m in said("1.2.0")] == ["spec.deletionPolicy: unknown field"]  # that operator never had it


def test_every_versioned_field_is_where_the_shipped_crd_has_it() -> None:
    from spotfallback.deploy.schema import kuberay_schema
    from spotfallback.deploy.validate import FEATURE_GATED, KUBERAY_FIELD_SINCE

    cluster = kuberay_schema("RayCluster")["properties"]["spec"]
    places = {
        "cluster": cluster,
        "job": kuberay_schema("RayJob")["properties"]["spec"],
        "head group": cluster["properties"]["headGroupSpec"],
        "worker group": cluster["properties"]["workerGroupSpecs"]["items"],
    }
    def has(schema: dict[str, Any], dotted: str) -> bool:
        for key in dotted.split("."):
            schema = schema.get("properties", {}).get(key)
            if schema is None:
                return False
        return True

    missing = [(where, key) for where, key in KUBERAY_FIELD_SINCE if not has(places[where], key)]
    assert missing == []
    gated = [(where, key) for where, key, *_ in FEATURE_GATED]
    assert [g for g in gated if g not in KUBERAY_FIELD_SINCE] == []  # each has its first release too


FIELDS_OF_LATER_OPERATORS = [
    # (where in the sample RayJob, value, the last release without it, the first whose CRD has it)
    (("spec", "rayClusterSpec", "gcsFaultToleranceOptions"), {"redisAddress": "redis:6379"}, "1.2.2", "1.3.0"),
    (("spec", "rayClusterSpec", "authOptions"), {"mode": "token"}, "1.5.0", "1.5.1"),
    (("spec", "deletionStrategy"), {"onSuccess": {"policy": "DeleteCluster"}, "onFailure": {"policy": "DeleteNone"}}, "1.4.2", "1.5.0"),
    (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "idleTimeoutSeconds"), 60, "1.2.2", "1.3.0"),
    (("spec", "preRunningDeadlineSeconds"), 600, "1.5.2", "1.6.0"),
    # Fields an option object gained after the object itself.
    (("spec", "rayClusterSpec", "authOptions", "secretName"), "ray-token", "1.5.2", "1.6.0"),
    (("spec", "rayClusterSpec", "gcsFaultToleranceOptions", "backend"), "rocksdb", "1.6.2", "1.7.0"),
    (("spec", "rayClusterSpec", "autoscalerOptions", "command"), ["ray"], "1.6.2", "1.7.0"),
]


@pytest.mark.parametrize(("at", "value", "before", "since"), FIELDS_OF_LATER_OPERATORS,
                         ids=[str(at[-1]) for at, *_ in FIELDS_OF_LATER_OPERATORS])
def test_a_field_an_older_operator_prunes_is_named_with_the_release_that_has_it(at: tuple, value: Any, before: str, since: str) -> None:
    job = sample(JOB_SAMPLE)
    parent = job
    for key in at[:-1]:
        parent = parent[key] if isinstance(key, int) else parent.setdefault(key, {})
    parent[at[-1]] = value
    path = ".".join(str(k) for k in at).replace(".0.", "[0].")
    assert [f for f in validate_document(job, kuberay_version=since)[1] if not f.warning] == []
    found = [str(f) for f in validate_document(job, kuberay_version=before)[1] if f.path == path and not f.warning]
    assert found == [f"{path}: KubeRay {before} drops this field silently (it first appears in {since}; upgrade the "
                     f"operator to {since} or later)"]
    job["metadata"].setdefault("annotations", {})["spotfallback/min-kuberay-version"] = before
    stated = [str(f) for f in validate_document(job)[1] if f.path.startswith("metadata.annotations")]
    assert len(stated) == 1 and f"but {path} " in stated[0] and stated[0].endswith(f"needs KubeRay {since}; set it to {since}")


LAUNCHER = {
    "cluster_name": "demo",
    "max_workers": 2,
    "provider": {"type": "aws", "region": "us-east-1"},
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "node_config": {"InstanceType": "m5.large"}},
        "spot": {"min_workers": 0, "max_workers": 2, "resources": {"CPU": 1}, "labels": {"ray.io/market-type": "spot"}, "node_config": {"InstanceType": "m5.large", "InstanceMarketOptions": {"MarketType": "spot"}}},
    },
    "head_node_type": "head",
}


def test_launcher_checks() -> None:
    assert validate_document(LAUNCHER) == ("cluster-launcher", [])
    spot_head = copy.deepcopy(LAUNCHER)
    spot_head["available_node_types"]["head"]["node_config"]["InstanceMarketOptions"] = {"MarketType": "spot"}
    assert errors(spot_head) == ["available_node_types.head.node_config: requests spot/preemptible capacity, but the head must run on on-demand capacity (a preempted head kills the run)"]
    legacy_gcp = copy.deepcopy(LAUNCHER)
    legacy_gcp["provider"] = {"type": "gcp", "region": "us-west1", "availability_zone": "us-west1-a", "project_id": "p"}
    legacy_gcp["available_node_types"]["head"]["node_config"] = {"machineType": "n2-standard-2", "scheduling": [{"preemptible": True}]}
    legacy_gcp["available_node_types"]["spot"]["node_config"] = {"machineType": "n2-standard-2", "scheduling": [{"preemptible": True}]}
    assert len(errors(legacy_gcp)) == 1
    broken = copy.deepcopy(LAUNCHER)
    broken["head_node_type"] = "ray.head"
    broken["idle_timout_minutes"] = 5
    broken["available_node_types"]["spot"]["resources"] = {"CPU": 0.5}
    broken["available_node_types"]["spot"]["labels"]["ray.io/market-type"] = "on-demand"
    _, findings = validate_document(broken)
    messages = {str(f) for f in findings if not f.warning}
    assert "head_node_type: 'ray.head' is not one of available_node_types (head, spot)" in messages
    assert any(m.startswith("idle_timout_minutes: unknown field") for m in messages)
    assert any(m.startswith("available_node_types.spot.resources.CPU: expected integer") for m in messages)
    assert [str(f) for f in findings if f.warning] == [
        'available_node_types.spot.labels["ray.io/market-type"]: says \'on-demand\', but node_config requests spot capacity'
    ]
    oversold = copy.deepcopy(LAUNCHER)
    oversold["available_node_types"]["spot"]["node_config"]["InstanceType"] = "p3.2xlarge"
    oversold["available_node_types"]["spot"]["resources"] = {"CPU": 8, "GPU": 8}
    assert errors(oversold) == ["available_node_types.spot.resources.GPU: declares 8, but 'p3.2xlarge' has 1: Ray would "
                                "place work on GPUs the node does not have"]
    oversold["available_node_types"]["spot"]["node_config"]["InstanceType"] = "p3.16xlarge"
    assert errors(oversold) == []


def test_a_launcher_node_types_zone_label_must_be_where_ray_puts_it() -> None:
    """Ray's label is trusted by the tier's selector; the launcher puts the node in the provider's zones."""
    doc = copy.deepcopy(LAUNCHER)
    doc["provider"]["availability_zone"] = "us-east-1a, us-east-1b"
    spot = doc["available_node_types"]["spot"]
    spot["labels"]["ray.io/availability-zone"] = "us-east-1c"
    assert errors(doc) == ['available_node_types.spot.labels["ray.io/availability-zone"]: says \'us-east-1c\', but the '
                           "provider launches nodes only in us-east-1a, us-east-1b (provider.availability_zone)"]
    spot["labels"]["ray.io/availability-zone"] = "us-east-1b"
    _, findings = validate_document(doc)
    assert [(str(f), f.warning) for f in findings] == [(
        'available_node_types.spot.labels["ray.io/availability-zone"]: says \'us-east-1b\', but the node type names no '
        "SubnetIds, so Ray's launcher may put it in any of us-east-1a, us-east-1b: give it us-east-1b's subnets", True)]
    spot["node_config"]["SubnetIds"] = ["subnet-0000000b"]
    assert validate_document(doc) == ("cluster-launcher", [])
    doc["provider"]["availability_zone"] = "us-east-1b"  # one zone: the launcher puts every node there
    del spot["node_config"]["SubnetIds"]
    assert validate_document(doc) == ("cluster-launcher", [])


def test_a_launcher_market_spelt_in_a_case_the_cloud_refuses_is_named() -> None:
    """EC2's MarketType and GCE's provisioningModel are case-sensitive enums: ray up would fail at the first launch."""
    aws = copy.deepcopy(LAUNCHER)
    aws["available_node_types"]["spot"]["node_config"]["InstanceMarketOptions"]["MarketType"] = "Spot"
    assert errors(aws) == ["available_node_types.spot.node_config.InstanceMarketOptions.MarketType: 'Spot': EC2 takes 'spot' (lower case)"]
    gcp = copy.deepcopy(LAUNCHER)
    gcp["provider"] = {"type": "gcp", "region": "us-west1", "availability_zone": "us-west1-a", "project_id": "p"}
    gcp["available_node_types"]["head"]["node_config"] = {"machineType": "n2-standard-8"}
    gcp["available_node_types"]["spot"]["node_config"] = {"machineType": "n2-standard-8", "scheduling": {"provisioningModel": "spot"}}
    assert errors(gcp) == ["available_node_types.spot.node_config.scheduling.provisioningModel: 'spot': Compute Engine takes 'SPOT' (upper case)"]


def test_an_azure_head_on_spot_priority_is_refused() -> None:
    azure = yaml.safe_load(AZURE_EXAMPLE_FULL)
    assert errors(azure) == []
    azure["available_node_types"]["ray.head.default"]["node_config"]["azure_arm_parameters"]["priority"] = "Spot"
    assert errors(azure) == ["available_node_types[\"ray.head.default\"].node_config: requests spot/preemptible capacity, but the "
                             "head must run on on-demand capacity (a preempted head kills the run)"]


# Trimmed from github.com/ray-project/ray, python/ray/autoscaler/azure/example-full.yaml @
# 3f70e60b9dedcf452817994232f0cfda588ad685 (aws/example-full.yaml @ 350466e142adff34cd18102fa15dd2dc8aa081be
# ends the same way): `ray up` drops the empty legacy head_node/worker_nodes before it checks its schema.
AZURE_EXAMPLE_FULL = """
cluster_name: default
max_workers: 2
provider:
    type: azure
    location: westus2
    resource_group: ray-cluster
available_node_types:
    ray.head.default:
        resources: {"CPU": 2}
        node_config:
            azure_arm_parameters:
                vmSize: Standard_D2s_v3
    ray.worker.default:
        min_workers: 0
        max_workers: 2
        resources: {"CPU": 2}
        node_config:
            azure_arm_parameters:
                vmSize: Standard_D2s_v3
                priority: Spot
head_node_type: ray.head.default
cluster_synced_files: []
head_node: {}
worker_nodes: {}
"""

# Trimmed from github.com/ray-project/ray, python/ray/autoscaler/local/example-minimal-automatic.yaml @
# 00501e2bd10f17c70dc12cdf54a203cf2db02a09: on-prem, Ray moves the top-level min_workers into its one node
# type and replaces the empty available_node_types and head_node_type.
LOCAL_AUTOMATIC = """
cluster_name: minimal-automatic
provider:
    type: local
    coordinator_address: COORDINATOR_HOST:COORDINATOR_PORT
min_workers: 0
max_workers: 2
auth:
    ssh_user: YOUR_USERNAME
available_node_types: {}
head_node_type: {}
"""

# Trimmed from github.com/ray-project/ray, python/ray/autoscaler/aws/example-minimal.yaml @
# 028dda96e78ebbad690c5902e7a89b8dc2a86a18, without cluster_name (Ray's defaults name it) and without the
# node types' `resources`, which Ray fills from the AWS instance type before it checks its schema.
AWS_NO_RESOURCES = """
provider:
    type: aws
    region: us-west-2
available_node_types:
    ray.head.default:
        node_config:
            InstanceType: m5.large
    ray.worker.default:
        min_workers: 1
        max_workers: 4
        node_config:
            InstanceType: m5.large
head_node_type: ray.head.default
"""

# Trimmed from github.com/ray-project/ray, python/ray/autoscaler/gcp/example-full.yaml @
# 21cc593f7dfe8c6439b12c897c210040d6b9b60a, a config of Ray before node types, which Ray 2 refuses.
GCP_LEGACY = """
cluster_name: default
min_workers: 0
max_workers: 2
initial_workers: 0
autoscaling_mode: default
target_utilization_fraction: 0.8
provider:
    type: gcp
    region: us-west1
    availability_zone: us-west1-a
    project_id: null
head_node:
    machineType: n1-standard-2
worker_nodes:
    machineType: n1-standard-2
    scheduling:
      - preemptible: true
"""


@pytest.mark.parametrize("text", [AZURE_EXAMPLE_FULL, LOCAL_AUTOMATIC, AWS_NO_RESOURCES])
def test_launcher_fields_ray_up_fills_or_drops_pass(text: str) -> None:
    report = validate_text(text)
    assert report.kinds == ("cluster-launcher",)
    assert [str(f) for f in report.errors] == []


# Trimmed from github.com/ray-project/ray: aws/example-network-interfaces.yaml @ 0718d5b02581bfef3960d8e37c4d6484f7c368f9,
# aws/example-launch-templates.yaml @ 5b17c27a81d80dfab7d4e732d25cc9545d820853 and gcp/tpu.yaml @
# 00a3bb90c0b4404fd1ef2a979e0cb96c05bfff26 (with a TPU scheduling config), each node_config whole: the fields
# beyond the usual instance type and image that real launcher files pass to the cloud.
AWS_NETWORK_INTERFACES = """
cluster_name: network_interfaces
max_workers: 2
provider: {type: aws, region: us-west-2, use_internal_ips: true}
available_node_types:
  ray.head.default:
    resources: {}
    node_config:
      NetworkInterfaces:
        - {DeviceIndex: 0, SubnetId: subnet-0000000, PrivateIpAddress: 172.31.64.10, Groups: [sg-00000000]}
      ImageId: latest_dlami
      InstanceType: m5.large
  ray.worker.efa:
    min_workers: 0
    max_workers: 1
    resources: {}
    node_config:
      NetworkInterfaces:
        - {DeviceIndex: 0, NetworkCardIndex: 0, AssociatePublicIpAddress: false, SubnetId: subnet-2, Groups: [sg-2], InterfaceType: efa}
      ImageId: latest_dlami
      InstanceType: p3dn.24xlarge
  ray.worker.template:
    min_workers: 0
    max_workers: 1
    resources: {}
    node_config:
      LaunchTemplate: {LaunchTemplateName: ExampleLaunchTemplate, Version: 2}
      ImageId: latest_dlami
      InstanceType: m5a.large
head_node_type: ray.head.default
"""
GCP_TPU = """
cluster_name: tputest
max_workers: 7
provider: {type: gcp, region: us-central1, availability_zone: us-central1-f, project_id: null}
available_node_types:
    ray_head_default:
        resources: {"CPU": 2}
        node_config:
            machineType: n2-standard-2
            disks:
              - {boot: true, autoDelete: true, type: PERSISTENT, initializeParams: {diskSizeGb: 50}}
    ray_tpu:
        min_workers: 7
        resources: {"TPU": 1}
        node_config:
            acceleratorType: v2-8
            runtimeVersion: v2-alpha
            schedulingConfig: {preemptible: true}
head_node_type: ray_head_default
"""


@pytest.mark.parametrize("text", [AWS_NETWORK_INTERFACES, GCP_TPU, AZURE_EXAMPLE_FULL, AWS_NO_RESOURCES])
def test_rays_own_node_configs_pass(text: str) -> None:
    assert [str(f) for f in validate_text(text).findings if "node_config" in f.path] == []


def test_a_misspelt_node_config_field_is_named_with_its_fix() -> None:
    """Ray hands node_config to the cloud as it is: a typo passes ray up and fails only when a node of that type
    is launched, for a worker type perhaps the first fallback to its tier, mid-run."""
    aws = copy.deepcopy(LAUNCHER)
    aws["available_node_types"]["gpu_spot"] = aws["available_node_types"].pop("spot")
    aws["available_node_types"]["gpu_spot"]["node_config"]["InstanceTyp"] = aws["available_node_types"]["gpu_spot"]["node_config"].pop("InstanceType")
    aws["available_node_types"]["head"]["node_config"]["keyname"] = "mine"
    assert errors(aws) == [
        "available_node_types.head.node_config.keyname: unknown field, not an EC2 RunInstances parameter: boto3 "
        "refuses it when Ray launches a node of this type; did you mean 'KeyName'?",
        "available_node_types.gpu_spot.node_config.InstanceTyp: unknown field, not an EC2 RunInstances parameter: "
        "boto3 refuses it when Ray launches a node of this type; did you mean 'InstanceType'?",
    ]
    gcp = yaml.safe_load(GCP_TPU)
    gcp["available_node_types"]["ray_head_default"]["node_config"]["machinetype"] = "n2-standard-2"
    del gcp["available_node_types"]["ray_head_default"]["node_config"]["machineType"]
    gcp["available_node_types"]["ray_tpu"]["node_config"]["pizza"] = True
    assert errors(gcp) == [
        "available_node_types.ray_head_default.node_config.machinetype: unknown field, not a field of a Compute Engine "
        "instance or a TPU node: the API refuses it when Ray launches a node of this type; did you mean 'machineType'?",
        "available_node_types.ray_tpu.node_config.pizza: unknown field, not a field of a Compute Engine instance or a "
        "TPU node: the API refuses it when Ray launches a node of this type; remove it or check its spelling",
    ]
    azure = yaml.safe_load(AZURE_EXAMPLE_FULL)
    worker = azure["available_node_types"]["ray.worker.default"]["node_config"]
    worker["azure_arm_parameters"]["imageOfer"] = "ubuntu-2204"
    worker["tag"] = {"team": "ml"}
    assert errors(azure) == [
        'available_node_types["ray.worker.default"].node_config.tag: unknown field, not read by Ray\'s Azure provider, '
        "which takes only azure_arm_parameters and tags: it is ignored; did you mean 'tags'?",
        'available_node_types["ray.worker.default"].node_config.azure_arm_parameters.imageOfer: unknown field, not a '
        "parameter of Ray's Azure VM template: Azure refuses the deployment when Ray launches a node of this type; "
        "did you mean 'imageOffer'?",
    ]
    # Other providers' node_config is not checked: spotfallback has no list of their fields.
    other = copy.deepcopy(LAUNCHER)
    other["provider"] = {"type": "vsphere"}
    other["available_node_types"]["spot"]["node_config"] = {"InstanceTyp": "x"}
    assert not [f for f in validate_document(other)[1] if "InstanceTyp" in f.path]


def test_a_head_of_too_little_memory_is_refused() -> None:
    """The head runs the GCS, the dashboard, the autoscaler and the driver: a 1 GiB machine never holds them.
    Only the head's type is judged, and only a type the machine table knows."""
    tiny = copy.deepcopy(LAUNCHER)
    tiny["available_node_types"]["head"]["node_config"]["InstanceType"] = "t2.micro"
    tiny["available_node_types"]["spot"]["node_config"]["InstanceType"] = "t3.small"
    assert errors(tiny) == [
        "available_node_types.head.node_config.InstanceType: 't2.micro' has 1 GiB of memory, too little for a Ray head "
        "node, which runs the GCS, the dashboard, the autoscaler and the job driver; name a type with at least 7.5 GiB "
        "(such as 't2.large')"]
    tiny["available_node_types"]["head"]["node_config"]["InstanceType"] = "x9.unknown"
    assert errors(tiny) == []
    azure = yaml.safe_load(AZURE_EXAMPLE_FULL)
    azure["available_node_types"]["ray.head.default"]["node_config"]["azure_arm_parameters"]["vmSize"] = "Standard_B1s"
    assert errors(azure) == [
        'available_node_types["ray.head.default"].node_config.azure_arm_parameters.vmSize: \'Standard_B1s\' has 1 GiB of '
        "memory, too little for a Ray head node, which runs the GCS, the dashboard, the autoscaler and the job driver; "
        "name a type with at least 7.5 GiB (such as 'Standard_B2ms')"]
    gcp = yaml.safe_load(GCP_TPU)
    gcp["available_node_types"]["ray_head_default"]["node_config"]["machineType"] = "e2-small"
    assert [e.partition(":")[0] for e in errors(gcp)] == ["available_node_types.ray_head_default.node_config.machineType"]


def test_node_config_fields_match_the_clouds_own_lists() -> None:
    """The AWS list is botocore's RunInstances input; the Azure one, the parameters of the ARM template this Ray
    ships. A newer botocore or Ray that adds one fails here, so the list is widened before a user's file is refused."""
    import importlib.util

    from spotfallback.deploy import node_config

    botocore_session = pytest.importorskip("botocore.session")
    model = botocore_session.get_session().get_service_model("ec2").operation_model("RunInstances")
    assert set(model.input_shape.members) == node_config.AWS_FIELDS
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations
    template = Path(spec.submodule_search_locations[0]) / "autoscaler" / "_private" / "_azure" / "azure-vm-template.json"
    assert set(json.loads(template.read_text())["parameters"]) == node_config.AZURE_ARM_PARAMETERS


def test_a_missing_max_workers_is_rays_default_cap() -> None:
    # Ray's own AWS example leaves max_workers out: its worker type allows 4, the default caps the cluster at 2.
    assert [str(f) for f in validate_text(AWS_NO_RESOURCES).findings] == [
        "max_workers: not set, so ray up takes Ray's aws default, 2, which caps the cluster at 2 worker nodes where "
        "its node types allow up to 4: set max_workers to the most worker nodes the cluster may have"]
    no_limit = yaml.safe_load(AWS_NO_RESOURCES)
    del no_limit["available_node_types"]["ray.worker.default"]["max_workers"]
    assert [f.message for f in validate_document(no_limit)[1]] == [
        "not set, so ray up takes Ray's aws default, 2, which caps the cluster at 2 worker nodes where its node types "
        "set no limit: set max_workers to the most worker nodes the cluster may have"]
    assert all(f.warning for f in validate_document(no_limit)[1])
    too_many = yaml.safe_load(AWS_NO_RESOURCES)
    too_many["available_node_types"]["ray.worker.default"]["min_workers"] = 3
    assert errors(too_many) == [
        "max_workers: not set, so ray up takes Ray's aws default, 2, which is less than the sum of min_workers (3): "
        "set max_workers to the most worker nodes the cluster may have"]
    too_many["max_workers"] = 3
    assert validate_document(too_many)[1] == []


def test_a_missing_head_node_type_is_rays_default_type() -> None:
    headless = copy.deepcopy(LAUNCHER)
    del headless["head_node_type"]
    assert errors(headless) == [
        "head_node_type: not set, so ray up takes Ray's aws default 'ray.head.default', which is not one of "
        "available_node_types (head, spot): name the head's node type"]
    headless["available_node_types"]["ray.head.default"] = headless["available_node_types"].pop("head")
    assert validate_document(headless)[1] == []
    headless["provider"] = {"type": "gcp", "region": "us-west1", "project_id": "p"}
    assert errors(headless)[0].startswith("head_node_type: not set, so ray up takes Ray's gcp default 'ray_head_default'")


@pytest.mark.parametrize("provider", [{"type": "aws", "region": "us-east-1"},
                                      {"type": "gcp", "region": "us-west1", "project_id": "p"}])
def test_an_empty_available_node_types_is_refused(provider: dict[str, Any]) -> None:
    """Ray's validate_config: head_node_type (given, or the provider's default) must be one of the node types."""
    empty = {**copy.deepcopy(LAUNCHER), "provider": provider, "available_node_types": {}}
    assert errors(empty) == ["available_node_types: is empty, but ray up needs head_node_type 'head' to be one of "
                             "available_node_types: define the head's node type here (and one per kind of worker node)"]
    del empty["head_node_type"]
    default = {"aws": "ray.head.default", "gcp": "ray_head_default"}[provider["type"]]
    assert errors(empty) == [f"available_node_types: is empty, but ray up needs head_node_type {default!r} (Ray's "
                             f"{provider['type']} default) to be one of available_node_types: define the head's node "
                             "type here (and one per kind of worker node)"]


def test_a_head_node_type_outside_rays_default_node_types_is_refused() -> None:
    """Without available_node_types, ray up takes its provider's, and the head type must be one of those."""
    typeless = copy.deepcopy(LAUNCHER)
    del typeless["available_node_types"]
    assert errors(typeless) == ["head_node_type: 'head' is not one of available_node_types, which is not set, so ray up "
                                "takes Ray's aws default node types (ray.head.default, ray.worker.default): define the "
                                "head's node type in available_node_types"]
    typeless["head_node_type"] = "ray.head.default"
    assert errors(typeless) == []


def _ray_up_refuses(doc: dict[str, Any]) -> bool:
    from click import ClickException
    from jsonschema import ValidationError as SchemaError
    from ray.autoscaler._private.util import prepare_config, validate_config

    try:
        validate_config(prepare_config(copy.deepcopy(doc)))
    except (ValueError, ClickException, SchemaError):  # on-prem configs are refused through Ray's CLI logger
        return True
    except (NotImplementedError, TypeError, AttributeError):  # an unknown provider, a null where a mapping goes:
        return True  # ray up stops with a traceback
    return False


def _variant(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    doc = copy.deepcopy(LAUNCHER)
    change(doc)
    return doc


@pytest.mark.parametrize(
    "doc",
    [
        _variant(lambda d: d.pop("max_workers")),
        _variant(lambda d: (d.pop("max_workers"), d["available_node_types"]["spot"].update(min_workers=2, max_workers=8))),
        _variant(lambda d: (d.pop("max_workers"), d["available_node_types"]["spot"].update(min_workers=3, max_workers=8))),
        _variant(lambda d: d["available_node_types"]["head"].update(min_workers=1) or d["available_node_types"]["spot"].update(min_workers=2)),
        _variant(lambda d: d.pop("head_node_type")),
        _variant(lambda d: (d.pop("head_node_type"), d["available_node_types"].update({"ray.head.default": d["available_node_types"].pop("head")}))),
        _variant(lambda d: (d["provider"].update(type="azure", location="westus2", resource_group="rg"),
                            [t.update(node_config={"azure_arm_parameters": {"vmSize": "Standard_D2s_v3"}})
                             for t in d["available_node_types"].values()])),
        _variant(lambda d: d["provider"].update(type="bogus")),
        _variant(lambda d: d["provider"].update(type="kubernetes")),
        _variant(lambda d: d.update(available_node_types=None)),
        _variant(lambda d: d.update(available_node_types={})),
        _variant(lambda d: (d.update(available_node_types={}), d.pop("head_node_type"))),
        _variant(lambda d: d.pop("available_node_types")),
        _variant(lambda d: (d.pop("available_node_types"), d.update(head_node_type="ray.head.default"))),
        _variant(lambda d: (d.pop("available_node_types"), d.pop("head_node_type"))),
        _variant(lambda d: d["available_node_types"].update(spot=None)),
    ],
)
def test_the_launchers_worker_cap_and_head_type_findings_agree_with_ray_up(doc: dict[str, Any]) -> None:
    """Ray's own ``prepare_config`` and ``validate_config`` (what ``ray up`` runs before it starts a node) refuse
    exactly the files these checks find an error in."""
    assert _ray_up_refuses(doc) == bool(errors(doc)), errors(doc)


ON_PREM_MANUAL = {"cluster_name": "lab", "provider": {"type": "local", "head_ip": "10.0.0.1", "worker_ips": ["10.0.0.2", "10.0.0.3"]},
                  "auth": {"ssh_user": "ray"}}


def _on_prem(base: str | dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    doc = yaml.safe_load(base) if isinstance(base, str) else copy.deepcopy(base)
    change(doc)
    return doc


ON_PREM_VARIANTS = {
    "coordinator": _on_prem(LOCAL_AUTOMATIC, lambda d: None),
    "coordinator without max_workers": _on_prem(LOCAL_AUTOMATIC, lambda d: d.pop("max_workers")),
    "coordinator with node types": _on_prem(LOCAL_AUTOMATIC, lambda d: d.update(available_node_types={
        "gpu": {"resources": {"CPU": 8}, "node_config": {}, "max_workers": 2}}, head_node_type="gpu")),
    "manual": _on_prem(ON_PREM_MANUAL, lambda d: None),
    "manual without worker_ips": _on_prem(ON_PREM_MANUAL, lambda d: d["provider"].pop("worker_ips")),
    "manual with a head_node": _on_prem(ON_PREM_MANUAL, lambda d: d.update(head_node={"InstanceType": "m5.large"})),
    "coordinator with min_workers above max_workers": _on_prem(LOCAL_AUTOMATIC, lambda d: d.update(min_workers=5, max_workers=2)),
    "coordinator with a placeholder min_workers": _on_prem(LOCAL_AUTOMATIC, lambda d: d.update(min_workers="N")),
}


@pytest.mark.parametrize("name", ON_PREM_VARIANTS)
def test_on_prem_findings_agree_with_ray_up(name: str) -> None:
    doc = ON_PREM_VARIANTS[name]
    assert _ray_up_refuses(doc) == bool(errors(doc)), errors(doc)


def test_on_prem_findings_name_the_field_and_the_fix() -> None:
    assert errors(ON_PREM_VARIANTS["coordinator without max_workers"]) == [
        "max_workers: required for an on-prem cluster whose machines a coordinator gives (provider.coordinator_address): "
        "set the most worker nodes to ask it for"]
    assert errors(ON_PREM_VARIANTS["coordinator with node types"]) == [
        "available_node_types: Ray refuses it on an on-prem (provider type local) cluster, which gets one node type of "
        "its own: remove it (the machines come from provider.head_ip and provider.worker_ips, or from "
        "provider.coordinator_address)"]
    assert [e.split(":")[0] for e in errors(ON_PREM_VARIANTS["manual with a head_node"])] == ["head_node"]
    assert errors(ON_PREM_VARIANTS["manual without worker_ips"]) == [
        "provider.worker_ips: required for an on-prem cluster: give head_ip and worker_ips, or a coordinator_address"]


def test_a_provider_ray_does_not_know_a_null_a_bad_on_prem_min_workers_and_a_second_document_are_named() -> None:
    bogus = _variant(lambda d: d["provider"].update(type="kubernetes"))
    [found] = errors(bogus)
    assert found.startswith("provider.type: 'kubernetes' is not one of Ray's node providers (aliyun, aws, azure,")
    assert found.endswith("on Kubernetes, Ray runs under KubeRay: write its files with spotfallback manifest kuberay")
    assert errors(_variant(lambda d: d["available_node_types"].update(spot=None))) == [
        'available_node_types.spot: expected object, got null']
    assert errors(ON_PREM_VARIANTS["coordinator with a placeholder min_workers"]) == [
        "min_workers: expected a number of worker nodes (0 or more), got string 'N'"]
    assert errors(ON_PREM_VARIANTS["coordinator with min_workers above max_workers"]) == [
        "min_workers: 5 is more than max_workers 2, which Ray refuses on an on-prem cluster"]
    report = validate_text(yaml.safe_dump(LAUNCHER) + "---\n" + (FIXTURES / JOB_SAMPLE).read_text())
    assert [str(f) for f in report.errors] == [
        "(file): a cluster-launcher config must be the file's only YAML document (ray up reads one; this file has 3): "
        "put the others in files of their own"]


def test_launcher_legacy_fields_name_their_replacement() -> None:
    report = validate_text(GCP_LEGACY)
    assert {f.path: f.message for f in report.errors} == {
        "autoscaling_mode": "a field of older Ray releases, which Ray 2's launcher refuses: upscaling_speed sets how fast the cluster grows",
        "head_node": "a field of older Ray releases, which Ray 2's launcher refuses: put the head's node config under "
                     "available_node_types.<head type>.node_config and name that type in head_node_type (Ray accepts "
                     "the field only when it is empty)",
        "initial_workers": "a field of older Ray releases, which Ray 2's launcher refuses: set min_workers on a node type in available_node_types",
        "target_utilization_fraction": "a field of older Ray releases, which Ray 2's launcher refuses: upscaling_speed sets how fast the cluster grows",
        "worker_nodes": "a field of older Ray releases, which Ray 2's launcher refuses: put the workers' node config under "
                        "available_node_types.<worker type>.node_config (Ray accepts the field only when it is empty)",
    }
    assert [str(f) for f in report.warnings] == [
        "min_workers: Ray ignores a top-level min_workers (only an on-prem cluster uses it): set min_workers on a "
        "node type in available_node_types"]


def test_launcher_config_without_provider_says_so() -> None:
    # Ray's own python/ray/autoscaler/local/defaults.yaml (ray 2.60.0), trimmed: a launcher config, but no
    # `ray up` file, since it names no provider.
    report = validate_text("cluster_name: default\nauth: {}\nsetup_commands: []\nfile_mounts: {}\n")
    assert report.kinds == ("cluster-launcher",)
    assert [str(f) for f in report.findings] == ["provider: required field is missing"]
    # A GCP node type still needs its resources: Ray fills them only on AWS.
    gcp = yaml.safe_load(AWS_NO_RESOURCES)
    gcp["provider"] = {"type": "gcp", "region": "us-west1", "project_id": "p"}
    assert "available_node_types[\"ray.head.default\"].resources: required field is missing" in errors(gcp)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kuberay is not present")
def test_fixtures_and_shipped_schema_match_shared() -> None:
    for name in (JOB_SAMPLE, CLUSTER_SAMPLE):
        assert (FIXTURES / name).read_text() == (SHARED / "samples" / name).read_text()
    crds = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
    for kind, target in KUBERAY_FILES.items():
        shipped = json.loads((DATA / "kuberay" / target).read_text())["schema"]
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 40k lines
        regenerated = extract_crd_schema(yaml.load((SHARED / crds[kind]).read_text(), Loader=loader))
        assert shipped == regenerated, f"regenerate with scripts/vendor_kuberay_schema.py ({kind})"


def test_gke_labels_kept_off_in_different_ored_terms_is_an_error() -> None:
    """Node selector terms are ORed: one term off Spot VMs and another off preemptible VMs lets
    the head onto either kind, each allowed by the other term."""
    doc = sample(CLUSTER_SAMPLE)
    pod = _head_pod(doc)
    terms = [
        {"matchExpressions": [{"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]}]},
        {"matchExpressions": [{"key": "cloud.google.com/gke-preemptible", "operator": "NotIn", "values": ["true"]}]},
    ]
    pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    found = errors(doc)
    assert len(found) == 1 and found[0].startswith("spec.headGroupSpec.template.spec.affinity.nodeAffinity:"), found
    assert "add that to every term of the node affinity" in found[0]
    # Each term keeping off both labels (here: DoesNotExist for one of them) is what holds.
    terms[0]["matchExpressions"].append({"key": "cloud.google.com/gke-preemptible", "operator": "DoesNotExist"})
    terms[1]["matchExpressions"].append({"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["false"]})
    assert errors(doc) == []


def test_a_spot_group_on_nap_regular_nodes_gets_a_market_warning() -> None:
    # AKS node auto-provisioning labels its regular (on-demand) VMs scalesetpriority=regular.
    doc = sample(CLUSTER_SAMPLE)
    group = doc["spec"]["workerGroupSpecs"][2]
    assert group["labels"]["ray.io/market-type"] == "spot"
    group["template"]["spec"]["nodeSelector"] = {"kubernetes.azure.com/scalesetpriority": "regular"}
    _, findings = validate_document(doc)
    assert "spec.workerGroupSpecs[2].labels[\"ray.io/market-type\"]: says 'spot', but the pods select kubernetes.azure.com/scalesetpriority=regular" in [
        str(f) for f in findings if f.warning
    ]


def _operator(doc: dict[str, Any], version: str | None) -> list[str]:
    _, findings = validate_document(doc, version)
    return [str(f) for f in findings if not f.warning]


@pytest.mark.parametrize(
    ("version", "first_missing"),
    [
        ("1.5.0", "spec.rayClusterSpec.workerGroupSpecs[0].labels: KubeRay 1.5.0 does not fully support scaling a worker "
                  "group for a label selector"),
        ("1.4.2", "spec.submissionMode: SidecarMode: KubeRay 1.4.2 does not know this mode"),
        ("1.3.2", "spec.rayClusterSpec.autoscalerOptions.version: KubeRay 1.3.2 drops this field silently (it first appears in 1.4.0;"),
        ("1.1.1", "spec.backoffLimit: KubeRay 1.1.1 drops this field silently (it first appears in 1.2.0;"),
        ("1.0.0", "spec.activeDeadlineSeconds: KubeRay 1.0.0 drops this field silently (it first appears in 1.1.0;"),
        ("0.6.0", "apiVersion: KubeRay 0.6.0 has no ray.io/v1 API (it first appears in 1.0.0;"),
    ],
)
def test_each_stated_operator_refuses_the_fields_it_predates(version: str, first_missing: str) -> None:
    """The field history, from the operator's own CRDs and types (ray-project/kuberay tags)."""
    doc = sample(JOB_SAMPLE)
    spec = doc["spec"]
    spec.update(submissionMode="SidecarMode", backoffLimit=2, activeDeadlineSeconds=600)
    spec["rayClusterSpec"]["autoscalerOptions"] = {"version": "v2"}
    spec["rayClusterSpec"]["enableInTreeAutoscaling"] = True
    spec["rayClusterSpec"]["workerGroupSpecs"][0]["labels"] = {"ray.io/market-type": "spot"}
    assert _operator(doc, None) == [] and _operator(doc, "1.5.1") == []
    found = _operator(doc, version)
    assert any(f.startswith(first_missing) for f in found), found
    assert any(f.startswith("spec.rayClusterSpec.workerGroupSpecs[0].labels: KubeRay") for f in found)


def test_dropped_group_labels_name_what_is_lost_where_the_group_has_no_market_label() -> None:
    # The upstream label-selector sample: its head group is labelled only ray.io/region, so
    # "no node gets ray.io/market-type" would blame a label it never had.
    found = _operator(sample(CLUSTER_SAMPLE), "1.4.0")
    assert ("spec.headGroupSpec.labels: KubeRay 1.4.0 drops group labels silently: this group's Ray nodes get none of "
            "them (ray.io/region), so no label selector matches them (it first appears in 1.5.0; upgrade the operator "
            "to 1.5.0 or later)") in found
    assert any(f.startswith("spec.workerGroupSpecs[0].labels: KubeRay 1.4.0 drops group labels silently: no node gets "
                            "ray.io/market-type") for f in found), found
    doc = sample(CLUSTER_SAMPLE)  # an autoscaled group labelled for its zone only: a group, not a tier
    doc["spec"]["enableInTreeAutoscaling"] = True
    doc["spec"]["workerGroupSpecs"][0]["labels"] = {"ray.io/availability-zone": "us-east-1a"}
    assert ("spec.workerGroupSpecs[0].labels: KubeRay 1.5.0 does not fully support scaling a worker group for a label "
            "selector: this group at zero replicas may never get nodes (it first appears in 1.5.1; upgrade the operator "
            "to 1.5.1 or later)") in _operator(doc, "1.5.0")


def test_the_min_kuberay_annotation_is_read_and_checked() -> None:
    doc = sample(JOB_SAMPLE)
    doc["spec"]["submissionMode"] = "SidecarMode"
    annotations = doc["metadata"].setdefault("annotations", {})
    where = 'metadata.annotations["spotfallback/min-kuberay-version"]'
    annotations["spotfallback/min-kuberay-version"] = "1.4.0"  # understated: SidecarMode needs 1.5.0
    assert _operator(doc, None) == [f"{where}: says 1.4.0, but spec.submissionMode (SidecarMode) needs KubeRay 1.5.0; set it to 1.5.0"]
    annotations["spotfallback/min-kuberay-version"] = "soon"
    assert _operator(doc, None) == [f"{where}: 'soon' is not a version such as 1.5.0; it says which KubeRay the file needs"]
    annotations["spotfallback/min-kuberay-version"] = "1.6.0"  # more than the fields need: the file's own claim
    assert _operator(doc, "1.5.1") == [f"{where}: the file needs KubeRay 1.6.0, the operator is 1.5.1; upgrade the operator to 1.6.0 or later"]
    assert _operator(doc, "1.6.0") == []


def _pin(doc: dict[str, Any], machine: str, requests: dict[str, str], **selector: str) -> dict[str, Any]:
    pod = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    pod["nodeSelector"] = {"node.kubernetes.io/instance-type": machine, **selector}
    pod["containers"][0]["resources"] = {"requests": requests, "limits": requests}
    return doc


PINNED = "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.nodeSelector[\"node.kubernetes.io/instance-type\"]"


HEAD_PINNED = "spec.rayClusterSpec.headGroupSpec.template.spec.nodeSelector[\"node.kubernetes.io/instance-type\"]"


def test_a_head_pod_pinned_to_a_machine_too_small_for_a_ray_head_is_an_error() -> None:
    """A 2 GiB head fits a t3.small, but the GCS, dashboard, autoscaler and driver do not: refused as `ray up`'s head is."""
    doc = sample(JOB_SAMPLE)
    pod = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    pod["nodeSelector"] = {"node.kubernetes.io/instance-type": "t3.small"}
    assert errors(doc) == [f"{HEAD_PINNED}: 't3.small' has 2 GiB of memory, too little for a Ray head node, which runs the GCS, "
                           "the dashboard, the autoscaler and the job driver; name a type with at least 7.5 GiB (such as "
                           "'t3.large')"]
    pod["nodeSelector"] = {"node.kubernetes.io/instance-type": "m5.large"}
    assert errors(doc) == []
    pod["nodeSelector"] = {"node.kubernetes.io/instance-type": "some-new-type"}  # not in the table: not judged
    assert errors(doc) == []
    # A head that cannot even fit its node says that, once.
    pod["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "8Gi"}, "limits": {"cpu": "1", "memory": "8Gi"}}
    pod["nodeSelector"] = {"node.kubernetes.io/instance-type": "t3.small"}
    [found] = errors(doc)
    assert found.startswith(f"{HEAD_PINNED}: no 't3.small' node can ever hold this pod"), found


def test_a_pod_pinned_to_a_machine_that_can_never_hold_it_is_an_error() -> None:
    """Someone else's file: 8 GPUs on a 1-GPU type, or 124 GiB on a 128 GiB GKE node, stays pending forever."""
    assert errors(_pin(sample(JOB_SAMPLE), "p4d.24xlarge", {"cpu": "90", "memory": "1000Gi", "nvidia.com/gpu": "8"})) == []
    found = errors(_pin(sample(JOB_SAMPLE), "p3.2xlarge", {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8"}))
    assert found == [f"{PINNED}: no 'p3.2xlarge' node can ever hold this pod, which asks for 8 CPUs, not fewer than the "
                     "node's 8 vCPUs (the kubelet keeps part of every node); 8 GPUs, more than its 1 GPU; name a larger type "
                     "or ask for less"]
    found = errors(_pin(sample(JOB_SAMPLE), "n2-standard-32", {"cpu": "31", "memory": "124Gi"}))
    assert found == [f"{PINNED}: no 'n2-standard-32' node can ever hold this pod, which asks for 124 GiB of memory, more "
                     "than the 118.7 GiB a gke node of 128 GiB leaves to pods; name a larger type or ask for less"]
    # Karpenter never counts on 7.5% of an instance's memory; a managed node group's node would hold the same pod.
    assert errors(_pin(sample(JOB_SAMPLE), "p4d.24xlarge", {"cpu": "90", "memory": "1100Gi"})) == []
    found = errors(_pin(sample(JOB_SAMPLE), "p4d.24xlarge", {"cpu": "90", "memory": "1100Gi"}, **{"karpenter.sh/capacity-type": "spot"}))
    assert len(found) == 1 and "a eks" not in found[0] and "than the 1065 GiB an eks-karpenter node of 1152 GiB" in found[0]
    # Types outside the catalog are not judged; a known one in other case matches no node.
    assert errors(_pin(sample(JOB_SAMPLE), "p5en.48xlarge", {"cpu": "900"})) == []
    assert errors(_pin(sample(JOB_SAMPLE), "Standard_nd96asr_v4", {"cpu": "8"})) == [
        f"{PINNED}: 'Standard_nd96asr_v4' is spelt 'Standard_ND96asr_v4' on the nodes' labels, which match case-sensitively; "
        "write 'Standard_ND96asr_v4'"]


def test_kubernetes_quantities_parse_as_the_api_server_reads_them() -> None:
    from spotfallback.deploy.common import parse_quantity

    assert parse_quantity("500m") == 0.5 and parse_quantity("2") == 2 and parse_quantity(4) == 4
    assert parse_quantity("8Gi") == 8 * 2**30 and parse_quantity("1G") == 1e9 and parse_quantity("1e3") == 1000
    assert parse_quantity("1.5Ki") == 1536 and parse_quantity("2E") == 2e18
    assert parse_quantity("lots") is None and parse_quantity(True) is None and parse_quantity(None) is None


GCP_LAUNCHER = {
    "cluster_name": "demo",
    "max_workers": 2,
    "provider": {"type": "gcp", "region": "us-central1", "availability_zone": "us-central1-a", "project_id": "p"},
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "node_config": {"machineType": "n2-standard-8", "disks": [
            {"boot": True, "initializeParams": {"sourceImage": "projects/p/global/images/i"}}]}},
        "h100": {"min_workers": 0, "max_workers": 2, "resources": {"CPU": 8, "GPU": 8}, "node_config": {
            "machineType": "a3-highgpu-8g",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/p/global/images/i", "diskType": "pd-balanced"}}],
            "networkInterfaces": [{"nicType": "GVNIC"}]}},
    },
    "head_node_type": "head",
}
A3_DISK = "available_node_types.h100.node_config.disks[0].initializeParams.diskType"


def test_a_gcp_node_types_boot_disk_and_nic_must_suit_its_machine_series() -> None:
    """A3 refuses pd-standard (the API's default) and has only gVNIC interfaces: no VM would ever start."""
    assert errors(GCP_LAUNCHER) == []
    standard = copy.deepcopy(GCP_LAUNCHER)
    h100 = standard["available_node_types"]["h100"]["node_config"]
    h100["disks"][0]["initializeParams"]["diskType"] = "zones/us-central1-a/diskTypes/pd-standard"
    assert errors(standard) == [f"{A3_DISK}: is 'pd-standard', which 'a3-highgpu-8g' (A3 High) refuses as a boot disk, so its "
                                "VMs are never created; use one of pd-balanced, pd-ssd, hyperdisk-balanced, "
                                "hyperdisk-balanced-high-availability"]
    del h100["disks"][0]["initializeParams"]["diskType"]
    assert errors(standard)[0].startswith(f"{A3_DISK}: is not set, so the API gives 'pd-standard', which 'a3-highgpu-8g'")
    virtio = copy.deepcopy(GCP_LAUNCHER)
    virtio["available_node_types"]["h100"]["node_config"]["networkInterfaces"] = [{"subnetwork": "regions/us-central1/subnetworks/s"}]
    assert errors(virtio) == ["available_node_types.h100.node_config.networkInterfaces[0].nicType: is not set (VirtIO), but "
                              "'a3-highgpu-8g' (A3 High) has only gVNIC network interfaces: set nicType: GVNIC, with a boot "
                              "image that has the gVNIC driver"]
    del virtio["available_node_types"]["h100"]["node_config"]["networkInterfaces"]
    assert errors(virtio)[0].startswith("available_node_types.h100.node_config.networkInterfaces: not set, so Ray gives the "
                                        "node a VirtIO network interface")


def test_gcp_series_checks_spare_what_the_series_takes() -> None:
    """A2 takes pd-standard and VirtIO; G2 does not take pd-standard; a template may set both; the head is checked too."""
    a2 = copy.deepcopy(GCP_LAUNCHER)
    a2["available_node_types"]["h100"]["node_config"] = {"machineType": "a2-highgpu-8g", "disks": [
        {"boot": True, "initializeParams": {"diskType": "pd-standard"}}]}
    a2["available_node_types"]["h100"]["resources"] = {"CPU": 8, "GPU": 8}
    assert errors(a2) == []
    a2["available_node_types"]["h100"]["node_config"]["machineType"] = "g2-standard-96"
    assert errors(a2) == [f"{A3_DISK}: is 'pd-standard', which 'g2-standard-96' (G2) refuses as a boot disk, so its VMs are "
                          "never created; use one of pd-balanced, pd-ssd"]
    templated = copy.deepcopy(GCP_LAUNCHER)
    templated["available_node_types"]["h100"]["node_config"] = {"machineType": "a3-highgpu-8g", "sourceInstanceTemplate": "t"}
    assert errors(templated) == []
    head = copy.deepcopy(GCP_LAUNCHER)
    head["available_node_types"]["head"]["node_config"]["machineType"] = "a3-ultragpu-8g"
    assert [e.split(":")[0] for e in errors(head)] == ["available_node_types.head.node_config.disks[0].initializeParams.diskType",
                                                       "available_node_types.head.node_config.networkInterfaces"]
