"""Karpenter NodePools (`spotfallback manifest nodepools`): the vendored CRD schemas, what the
pools allow against what the KubeRay file's pods select and tolerate, and the disruption a
training gang needs."""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from spotfallback.config import JobConfig
from spotfallback.deploy import K8sCloud, KubeRayOptions, kuberay_manifest
from spotfallback.deploy.nodepools import (
    KarpenterCloud,
    NodePoolOptions,
    ladder_findings,
    nodepool_findings,
    nodepools_for,
    parse_label_rule,
    render_nodepools,
    template_label_problem,
    template_label_rules,
    template_label_rules_as_written,
)
from spotfallback.deploy.pools import GPU_NODE_TAINT, HEAD_NODE_TAINT, HEAD_TOLERATION
from spotfallback.deploy.validate import validate_text
from spotfallback.errors import ConfigError

DATA = Path(__file__).resolve().parents[2] / "src" / "spotfallback" / "data" / "karpenter"
SPOT = {"name": "spot", "market": "spot", "num_workers": 2, "resources_per_worker": {"CPU": 4}}
SPOT_B = {"name": "spot-b", "market": "spot", "num_workers": 2, "resources_per_worker": {"CPU": 4},
          "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-zone": "zone-b"}}
ON_DEMAND = {"name": "on-demand", "market": "on-demand", "num_workers": 2, "resources_per_worker": {"CPU": 4}}


def make_job(*tiers: dict[str, Any]) -> JobConfig:
    return JobConfig.model_validate({"name": "churn-model", "storage_path": "s3://ml-runs/sf", "entrypoint": "churn.train:f", "tiers": list(tiers)})


def test_vendored_crds_are_the_upstream_files_named_in_the_readme() -> None:
    readme = (DATA / "README.md").read_text()
    rows = re.findall(r"\| `([\w/.]+\.yaml)` \|.*\| ([0-9a-f]{64}) \|", readme)
    assert len(rows) == 4
    for name, digest in rows:
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("cloud", list(KarpenterCloud))
def test_pools_validate_and_allow_each_market_the_pods_select(cloud: KarpenterCloud) -> None:
    job = make_job(SPOT, SPOT_B, ON_DEMAND)
    pools = nodepools_for(job, NodePoolOptions(cloud=cloud))
    assert list(nodepool_findings(pools, job, cloud)) == []
    assert [p["metadata"]["name"] for p in pools] == ["churn-model-spot", "churn-model-on-demand", "churn-model-head"]
    # Each market's pods (the KubeRay file for the same cloud) select what its pool allows and
    # tolerate every taint it sets.
    manifest = kuberay_manifest(job, KubeRayOptions(cloud=K8sCloud(cloud.value)))
    groups = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    *tiers_pools, head_pool = pools
    by_market = {p["spec"]["template"]["spec"]["requirements"][0]["values"][0]: p for p in tiers_pools}
    for group, market in zip(groups, ["spot", "spot", "on-demand"], strict=True):
        pod, pool = group["template"]["spec"], by_market[market]["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["karpenter.sh/capacity-type"] == market
        tolerated = {(t["key"], t.get("value"), t["effect"]) for t in pod.get("tolerations", [])}
        assert {(t["key"], t.get("value"), t["effect"]) for t in pool.get("taints", [])} <= tolerated
    spot_taints = by_market["spot"]["spec"]["template"]["spec"].get("taints", [])
    expected = [{"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}]
    assert spot_taints == (expected if cloud is KarpenterCloud.AKS_NAP else [])
    # The head's own pool: on-demand, tainted so that only the head, which tolerates it, lands there.
    head_pod = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head_pool["spec"]["template"]["spec"]["requirements"] == [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}, *PLATFORM]
    # Every pool keeps to the x86 Linux nodes the images run on: Karpenter would take arm64 ones where cheaper.
    assert all(r in pool["spec"]["template"]["spec"]["requirements"] for pool in pools for r in PLATFORM)
    assert head_pool["spec"]["template"]["spec"]["taints"] == [HEAD_NODE_TAINT]
    assert HEAD_TOLERATION in head_pod["tolerations"] and head_pod["nodeSelector"] == {"karpenter.sh/capacity-type": "on-demand"}
    assert all(HEAD_TOLERATION not in g["template"]["spec"].get("tolerations", []) for g in groups)


PLATFORM = [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]


def test_disruption_never_takes_a_running_gang() -> None:
    (spot, _, _) = nodepools_for(make_job(SPOT, ON_DEMAND), NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    assert spot["spec"]["disruption"] == {
        "consolidationPolicy": "WhenEmpty",
        "consolidateAfter": "5m",
        "budgets": [{"nodes": "0", "reasons": ["Drifted"]}],
    }
    assert spot["spec"]["template"]["spec"]["expireAfter"] == "Never"
    assert spot["spec"]["template"]["spec"]["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}


def test_zones_and_gpus_of_the_tiers_become_requirements() -> None:
    gpu = {"resources_per_worker": {"CPU": 8, "GPU": 1}, "use_gpu": True}
    pinned = {**SPOT, **gpu, "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-zone": "zone-a"}}
    job = make_job(pinned, {**SPOT_B, **gpu}, {**ON_DEMAND, **gpu})
    spot, on_demand, _ = nodepools_for(job, NodePoolOptions(cloud=KarpenterCloud.AKS_NAP, node_class="gpu"))
    reqs = spot["spec"]["template"]["spec"]["requirements"]
    assert {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a", "zone-b"]} in reqs
    assert {"key": "karpenter.azure.com/sku-gpu-count", "operator": "Gt", "values": ["0"]} in reqs
    # The on-demand tier is not pinned to a zone: its pool is not either.
    assert all(r["key"] != "topology.kubernetes.io/zone" for r in on_demand["spec"]["template"]["spec"]["requirements"])
    # GPU nodes are capped by GPUs alone: room for each of the 4 workers on a node of up to 16 GPUs, twice.
    assert spot["spec"]["limits"] == {"nvidia.com/gpu": "128"}
    assert spot["spec"]["template"]["spec"]["nodeClassRef"]["kind"] == "AKSNodeClass"


def test_a_pool_set_that_does_not_allow_spot_is_refused_naming_the_tier() -> None:
    job = make_job(SPOT, ON_DEMAND)
    pools = nodepools_for(job, NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    spot = pools[0]["spec"]["template"]["spec"]["requirements"][0]
    spot["values"] = ["on-demand"]
    assert list(nodepool_findings(pools, job, KarpenterCloud.EKS_KARPENTER)) == [
        "tiers[0] ('spot', spot): no NodePool allows karpenter.sh/capacity-type 'spot'; its pods would stay pending "
        "until the tier's capacity timeout. Add 'spot' to a pool's requirements"
    ]
    spot["operator"], spot["values"] = "NotIn", ["reserved"]  # NotIn leaves spot allowed
    assert list(nodepool_findings(pools, job, KarpenterCloud.EKS_KARPENTER)) == []


def test_an_aks_spot_pool_without_the_spot_taint_is_refused() -> None:
    job = make_job(SPOT, ON_DEMAND)
    pools = nodepools_for(job, NodePoolOptions(cloud=KarpenterCloud.AKS_NAP))
    del pools[0]["spec"]["template"]["spec"]["taints"]
    (finding,) = nodepool_findings(pools, job, KarpenterCloud.AKS_NAP)
    assert finding.startswith("NodePool[0].spec.template.spec.taints: a spot pool on AKS must taint its nodes")


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda p: p["spec"]["disruption"].update(consolidationPolicy="Sometimes"), "NodePool[0].spec.disruption.consolidationPolicy"),
        (lambda p: p["spec"]["disruption"].update(consolidatAfter="5m"), "NodePool[0].spec.disruption"),
        (lambda p: p["spec"]["template"]["spec"].pop("nodeClassRef"), "NodePool[0].spec.template.spec"),
        (lambda p: p["spec"]["template"]["spec"].update(expireAfter="forever"), "NodePool[0].spec.template.spec.expireAfter"),
    ],
)
def test_the_crd_schema_catches_what_the_api_server_would_reject_or_drop(mutate: Any, path: str) -> None:
    job = make_job(SPOT, ON_DEMAND)
    pools = nodepools_for(job, NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    broken = copy.deepcopy(pools)
    mutate(broken[0])
    findings = list(nodepool_findings(broken, job, KarpenterCloud.EKS_KARPENTER))
    assert findings and all(f.startswith(path) for f in findings), findings


@pytest.fixture()
def app() -> typer.Typer:
    """The `manifest` commands, as the CLI registers them."""
    from spotfallback.cli import manifest as cli_manifest

    app = typer.Typer()
    app.command("noop")(lambda: None)
    cli_manifest.register(app)
    return app


@pytest.fixture()
def job_file(tmp_path: Path) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(make_job(SPOT, ON_DEMAND).model_dump(mode="json", exclude_unset=True)))
    return job


def test_cli_writes_the_pools_and_refuses_other_clouds(app: typer.Typer, job_file: Path, tmp_path: Path) -> None:
    job = job_file
    out = tmp_path / "pools.yaml"
    ok = CliRunner().invoke(app, ["manifest", "nodepools", "--cloud", "aks-nap", "--job", str(job), "--out", str(out)])
    assert ok.exit_code == 0, ok.stderr
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in docs] == ["NodePool", "NodePool", "NodePool"]
    assert out.read_text() == render_nodepools(make_job(SPOT, ON_DEMAND), NodePoolOptions(cloud=KarpenterCloud.AKS_NAP))
    bad = CliRunner().invoke(app, ["manifest", "nodepools", "--cloud", "gke", "--job", str(job)])
    assert bad.exit_code == 2 and bad.stderr == "error: --cloud: 'gke' is not one of: eks-karpenter, aks-nap\n"


@pytest.mark.parametrize("cloud", list(KarpenterCloud))
def test_labels_of_your_own_reach_every_pool_and_the_nodes_it_launches(cloud: KarpenterCloud) -> None:
    job = make_job(SPOT, ON_DEMAND)
    labels = {"team": "forecasting", "cost-centre": "42"}
    pools = nodepools_for(job, NodePoolOptions(cloud=cloud, labels=labels))
    for pool in pools:
        assert pool["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "spotfallback", "spotfallback/run": "churn-model", **labels}
        assert pool["spec"]["template"]["metadata"] == {"labels": labels}
    assert list(nodepool_findings(pools, job, cloud)) == []  # the provider's CRD schema and the ladder's rules
    # Without labels of one's own the template has no metadata, as before.
    assert all("metadata" not in p["spec"]["template"] for p in nodepools_for(job, NodePoolOptions(cloud=cloud)))


@pytest.mark.parametrize(("cloud", "key"), [
    (KarpenterCloud.EKS_KARPENTER, "karpenter.sh/team"),  # the CRD's rule: domain "karpenter.sh" is restricted
    (KarpenterCloud.EKS_KARPENTER, "team.karpenter.sh/x"),  # ...and its subdomains
    (KarpenterCloud.EKS_KARPENTER, "karpenter.k8s.aws/instance-family"),
    (KarpenterCloud.AKS_NAP, "karpenter.azure.com/sku-family"),
    (KarpenterCloud.AKS_NAP, "spotfallback/run"),
    (KarpenterCloud.AKS_NAP, "kubernetes.io/hostname"),
])
def test_label_keys_karpenter_or_the_file_set_are_refused(cloud: KarpenterCloud, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^labels: {re.escape(repr(key))} is a key the file, Karpenter or Kubernetes sets itself"):
        NodePoolOptions(cloud=cloud, labels={key: "x"})
    # The other provider's domain is only a name there.
    other = {KarpenterCloud.EKS_KARPENTER: "karpenter.azure.com/x", KarpenterCloud.AKS_NAP: "karpenter.k8s.aws/x"}[cloud]
    assert NodePoolOptions(cloud=cloud, labels={other: "x"}).labels


@pytest.mark.parametrize("cloud", list(KarpenterCloud))
def test_every_rule_the_crd_sets_on_template_labels_is_read(cloud: KarpenterCloud) -> None:
    """A vendored CRD with a rule of another shape fails here, not silently in a user's cluster."""
    written = template_label_rules_as_written(cloud)
    assert len(written) >= 4 and all(parse_label_rule(message, rule) is not None for message, rule in written)
    assert len(template_label_rules(cloud)) == len(written)


@pytest.mark.parametrize(("cloud", "key", "message"), [
    (KarpenterCloud.EKS_KARPENTER, "karpenter.sh/capacity-type", None),  # listed as allowed in the domain rule
    (KarpenterCloud.EKS_KARPENTER, "karpenter.sh/nodepool", 'label "karpenter.sh/nodepool" is restricted'),  # allowed by the domain rule only
    (KarpenterCloud.EKS_KARPENTER, "karpenter.sh/team", 'label domain "karpenter.sh" is restricted'),
    (KarpenterCloud.EKS_KARPENTER, "x.karpenter.sh/team", 'label domain "karpenter.sh" is restricted'),
    (KarpenterCloud.EKS_KARPENTER, "kubernetes.io/hostname", 'label "kubernetes.io/hostname" is restricted'),
    (KarpenterCloud.EKS_KARPENTER, "karpenter.k8s.aws/instance-family", None),
    (KarpenterCloud.EKS_KARPENTER, "karpenter.k8s.aws/team", 'label domain "karpenter.k8s.aws" is restricted'),
    (KarpenterCloud.EKS_KARPENTER, "karpenter.azure.com/team", None),  # another provider's domain
    (KarpenterCloud.EKS_KARPENTER, "agentpool", None),
    (KarpenterCloud.AKS_NAP, "agentpool", 'label "agentpool" is restricted'),
    (KarpenterCloud.AKS_NAP, "kubernetes.azure.com/team", 'label domain "kubernetes.azure.com" is restricted'),
    (KarpenterCloud.AKS_NAP, "kubernetes.azure.com/scalesetpriority", None),
    (KarpenterCloud.AKS_NAP, "team", None),
])
def test_template_labels_are_judged_by_the_crds_own_rules(cloud: KarpenterCloud, key: str, message: str | None) -> None:
    assert template_label_problem(key, cloud) == message


def test_validate_names_a_template_label_the_api_server_would_refuse() -> None:
    pools = nodepools_for(make_job(SPOT, ON_DEMAND), NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    pools[0]["spec"]["template"]["metadata"] = {"labels": {"team": "ml", "karpenter.sh/team": "ml", "karpenter.sh/capacity-type": "spot"}}
    report = validate_text(_dump(pools))
    assert [(f.document, f.path, f.message) for f in report.errors] == [
        (0, "spec.template.metadata.labels",
         "'karpenter.sh/team': label domain \"karpenter.sh\" is restricted (Karpenter's NodePool schema)")]
    job = make_job(SPOT, ON_DEMAND)
    assert list(nodepool_findings(pools, job, KarpenterCloud.EKS_KARPENTER)) == [
        "NodePool[0].spec.template.metadata.labels: 'karpenter.sh/team': label domain \"karpenter.sh\" is restricted "
        "(Karpenter's NodePool schema)"]


def test_aks_keys_the_crd_restricts_are_refused_as_labels_of_your_own() -> None:
    with pytest.raises(ConfigError, match="^labels: 'agentpool': label \"agentpool\" is restricted \\(Karpenter's NodePool schema\\)"):
        NodePoolOptions(cloud=KarpenterCloud.AKS_NAP, labels={"agentpool": "x"})
    # A domain the CRD restricts is refused whole, its well-known keys too: they choose nodes.
    with pytest.raises(ConfigError, match="^labels: 'kubernetes.azure.com/scalesetpriority' is a key the file, Karpenter"):
        NodePoolOptions(cloud=KarpenterCloud.AKS_NAP, labels={"kubernetes.azure.com/scalesetpriority": "spot"})
    assert NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER, labels={"agentpool": "x"}).labels  # only AKS's rule


def test_cli_labels_the_pools_and_names_the_option_for_a_bad_one(app: typer.Typer, job_file: Path) -> None:
    job = job_file
    ok = CliRunner().invoke(app, ["manifest", "nodepools", "--cloud", "eks-karpenter", "--job", str(job), "--label", "team=ml"])
    assert ok.exit_code == 0, ok.stderr
    assert all(d["spec"]["template"]["metadata"]["labels"] == {"team": "ml"} for d in yaml.safe_load_all(ok.stdout))
    for entry, message in [("team", "expected KEY=VALUE, got 'team'"), ("karpenter.sh/x=1", "'karpenter.sh/x' is a key the file"),
                           ("team=a b", "team=a b: invalid label value 'a b'")]:
        bad = CliRunner().invoke(app, ["manifest", "nodepools", "--cloud", "eks-karpenter", "--job", str(job), "--label", entry])
        assert bad.exit_code == 2 and bad.stderr.startswith(f"error: --label: {message}"), bad.stderr


EAST = {"address": "http://head-east:8265", "name": "east", "region": "us-east-1"}
WEST = {"address": "http://head-west:8265", "name": "west", "region": "us-west-2"}


@pytest.mark.parametrize("cloud", list(KarpenterCloud))
def test_a_ladder_across_clusters_gets_each_clusters_pools_labelled_for_it(cloud: KarpenterCloud) -> None:
    """Each Kubernetes cluster holds only its tiers' pools: one file, applied per cluster by label."""
    job = make_job({**SPOT, "cluster": EAST}, {**SPOT_B, "cluster": WEST}, {**ON_DEMAND, "cluster": EAST})
    pools = nodepools_for(job, NodePoolOptions(cloud=cloud))
    assert [(p["metadata"]["name"], p["metadata"]["labels"]["spotfallback/cluster"]) for p in pools] == [
        ("churn-model-east-spot", "east"), ("churn-model-west-spot", "west"), ("churn-model-east-on-demand", "east"),
        ("churn-model-east-head", "east"), ("churn-model-west-head", "west")]  # each cluster has its own head
    assert [p["spec"]["limits"] for p in pools[:3]] == [{"cpu": "16"}] * 3  # one tier's 2 workers x 4 CPUs each, twice
    assert list(nodepool_findings(pools, job, cloud)) == []
    # East's spot pool does not serve the west tier: that cluster has no spot pool of its own.
    west = pools.pop(1)
    assert list(nodepool_findings(pools, job, cloud)) == [
        "tiers[1] ('spot-b', spot): no NodePool of cluster 'west' allows karpenter.sh/capacity-type 'spot'; its pods "
        "would stay pending until the tier's capacity timeout. Add 'spot' to a pool's requirements"]
    del west["metadata"]["labels"]["spotfallback/cluster"]  # a pool that names no cluster serves any
    assert list(nodepool_findings([*pools, west], job, cloud)) == []
    text = render_nodepools(job, NodePoolOptions(cloud=cloud))
    assert "Cluster 'east' in us-east-1: the pools of tiers spot, on-demand. Apply them in that Kubernetes cluster: " \
           "kubectl apply -f FILE -l spotfallback/cluster=east" in text
    assert "kubectl apply -f FILE -l spotfallback/cluster=west" in text.split("---")[1]


# -- `manifest validate` on a NodePool file: one of ours edited by hand, or anyone's ----------------


def _dump(pools: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(pools, sort_keys=False)


@pytest.mark.parametrize("cloud", list(KarpenterCloud))
def test_validate_checks_a_nodepool_file_against_its_providers_schema(cloud: KarpenterCloud) -> None:
    pools = nodepools_for(make_job(SPOT, ON_DEMAND), NodePoolOptions(cloud=cloud))
    report = validate_text(_dump(pools))
    assert report.ok and report.kinds == ("NodePool", "NodePool", "NodePool") and not report.findings
    pools[1]["spec"]["disruption"]["consolidationPolicy"] = "WhenIdle"
    pools[1]["spec"]["template"]["spec"]["expireAfter"] = "forever"
    report = validate_text(_dump(pools))
    assert sorted((f.document, f.path) for f in report.errors) == [
        (1, "spec.disruption.consolidationPolicy"), (1, "spec.template.spec.expireAfter")]
    if cloud is KarpenterCloud.AKS_NAP:  # the spot pool's taint, which the spot pods tolerate
        del pools[0]["spec"]["template"]["spec"]["taints"]
        assert ("spec.template.spec.taints", 0) in {(f.path, f.document) for f in validate_text(_dump(pools)).errors}


def test_validate_refuses_a_misspelt_field_the_api_server_would_drop() -> None:
    """As in one of Karpenter's own examples: a grace period that silently never applies."""
    pool = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {
                "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "expireAfter": "168h", "terminationGracePeirod": "24h"}}}}
    assert [str(f) for f in validate_text(_dump([pool])).errors] == [
        "spec.template.spec.terminationGracePeirod: unknown field; did you mean 'terminationGracePeriod'?"]
    pool["spec"]["template"]["spec"]["terminationGracePeriod"] = pool["spec"]["template"]["spec"].pop("terminationGracePeirod")
    assert validate_text(_dump([pool])).ok


def test_validate_names_a_nodepool_it_cannot_check_and_one_of_an_unknown_provider() -> None:
    (pool, _head) = nodepools_for(make_job(SPOT), NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    old = {**pool, "apiVersion": "karpenter.sh/v1beta1"}
    assert [str(f) for f in validate_text(_dump([old])).errors] == [
        "apiVersion: 'karpenter.sh/v1beta1': Karpenter 1.1 and later serve NodePools only as karpenter.sh/v1 (the "
        "shipped CRDs too), and only those are checked; migrate the NodePool to karpenter.sh/v1 (Karpenter's v1 "
        "migration guide)"]
    pool["spec"]["template"]["spec"]["nodeClassRef"]["group"] = "karpenter.example.com"
    report = validate_text(_dump([pool]))
    assert report.ok and [f.path for f in report.warnings] == ["spec.template.spec.nodeClassRef.group"]


# Trimmed from github.com/aws/karpenter-provider-aws, examples/v1/windows-custom-userdata.yaml @
# 1d927085dd81a9df9301e613f371dac5b4d16bfe: its nodeClassRef.group is an apiVersion, which the CRD's
# pattern (no '/') refuses; the EC2NodeClass after it is not checked.
WINDOWS_EXAMPLE = """
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: windows2022
spec:
  template:
    spec:
      requirements:
        - key: kubernetes.io/os
          operator: In
          values: ["windows"]
      nodeClassRef:
        group: karpenter.k8s.aws/v1
        kind: EC2NodeClass
        name: windows2022
---
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata:
  name: windows2022
spec:
  amiSelectorTerms:
    - alias: windows2022@latest
"""

# Trimmed from github.com/Azure/karpenter-provider-azure, examples/v1/perftest.yaml @
# 352646f599290c3a6d2f9710fb535a7b288f88ed: a spot pool Karpenter accepts, without AKS's spot taint.
AKS_PERFTEST_SPOT = """
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: spot
spec:
  template:
    spec:
      nodeClassRef:
        group: karpenter.azure.com
        kind: AKSNodeClass
        name: default
      expireAfter: Never
      requirements:
        - key: karpenter.sh/capacity-type
          operator: In
          values: ["spot"]
"""


def test_validate_names_the_group_for_a_versioned_node_class_group() -> None:
    report = validate_text(WINDOWS_EXAMPLE)
    assert report.kinds == ("NodePool", "EC2NodeClass (not checked)")
    assert [str(f) for f in report.findings] == [
        "spec.template.spec.nodeClassRef.group: 'karpenter.k8s.aws/v1' is an apiVersion, which the API server refuses "
        "here: nodeClassRef.group is the API group alone, 'karpenter.k8s.aws'"]
    assert validate_text(WINDOWS_EXAMPLE.replace("group: karpenter.k8s.aws/v1", "group: karpenter.k8s.aws")).findings == ()


def test_validate_says_the_aks_spot_taint_is_spotfallbacks_rule() -> None:
    (finding,) = validate_text(AKS_PERFTEST_SPOT).errors
    assert finding.path == "spec.template.spec.taints"
    assert "for spotfallback" in finding.message and "Karpenter accepts the pool without it" in finding.message
    assert finding.message.endswith("add {key: kubernetes.azure.com/scalesetpriority, value: spot, effect: NoSchedule} to the taints")


def test_validate_with_the_job_checks_that_the_files_pools_serve_its_ladder(tmp_path: Path) -> None:
    from spotfallback.cli import manifest as cli_manifest

    job = make_job(SPOT, ON_DEMAND)
    spot, on_demand, _head = nodepools_for(job, NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    assert validate_text(_dump([spot, on_demand]), job=job).ok  # the untainted on-demand pool serves the head too
    (finding,) = validate_text(_dump([on_demand, on_demand]), job=job).errors
    assert finding.of_file and str(finding).startswith(
        "(job): tiers[0] ('spot', spot): no NodePool allows karpenter.sh/capacity-type 'spot'")
    # Through the CLI: a file-wide finding names the file, not one of its documents.
    app = typer.Typer()
    app.command("noop")(lambda: None)
    cli_manifest.register(app)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json", exclude_unset=True)))
    (tmp_path / "pools.yaml").write_text(_dump([on_demand, on_demand]))
    args = ["manifest", "validate", str(tmp_path / "pools.yaml"), "--job", str(tmp_path / "job.yaml")]
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code == 1 and bad.stderr.startswith(f"{tmp_path / 'pools.yaml'}: (job): tiers[0] ('spot', spot)")
    (tmp_path / "pools.yaml").write_text(_dump([spot, on_demand]))
    ok = CliRunner().invoke(app, args)
    assert ok.exit_code == 0 and ok.stdout == f"{tmp_path / 'pools.yaml'}: ok (NodePool, NodePool)\n"
    # A ladder no pool could be matched against is the job file's error, as for `manifest nodepools`.
    odd = make_job({**SPOT, "label_selector": {"ray.io/market-type": "spot", "ray.io/accelerator-type": "Z9"}})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(odd.model_dump(mode="json", exclude_unset=True)))
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code == 2 and bad.stderr.startswith(
        f"error: {tmp_path / 'job.yaml'}: tiers[0].label_selector.ray.io/accelerator-type: 'Z9' is not a GPU type")


@pytest.mark.parametrize("spec", [[], "x", {"template": []}, {"template": {"spec": {"requirements": "x", "taints": 3}}},
                                  {"template": {"spec": {"requirements": [1, {"key": "karpenter.sh/capacity-type",
                                                                               "operator": "In", "values": "spot"}]}}}])
def test_validate_reports_a_malformed_nodepool_without_crashing(spec: Any) -> None:
    """A hand-edited file may hold anything where a mapping belongs: findings, with or without the job."""
    doc = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p", "labels": []}, "spec": spec}
    for cloud in ("karpenter.k8s.aws", "karpenter.azure.com"):
        if isinstance(spec, dict) and isinstance(spec.get("template"), dict):
            spec["template"]["spec"]["nodeClassRef"] = {"group": cloud, "kind": "X", "name": "d"}
        report = validate_text(_dump([doc]), job=make_job(SPOT, ON_DEMAND))
        assert not report.ok and all(f.document == 0 and f.path != "(top level)" for f in report.errors), report


GPU8 = {"resources_per_worker": {"CPU": 8, "GPU": 8}, "use_gpu": True, "placement": {"instance_type": "p4d.24xlarge"}}


def test_a_gpu_ladders_head_gets_a_pool_of_its_own() -> None:
    """Every pool of a GPU ladder is tainted for GPU pods and requires GPUs: without a pool of its
    own, the head (on-demand, no GPU, no toleration for them) would stay pending."""
    job = make_job({**SPOT, **GPU8, "num_workers": 8}, {**ON_DEMAND, **GPU8, "num_workers": 8})
    cloud = KarpenterCloud.EKS_KARPENTER
    *gpu_pools, head = nodepools_for(job, NodePoolOptions(cloud=cloud))
    assert all(GPU_NODE_TAINT in p["spec"]["template"]["spec"]["taints"] for p in gpu_pools)
    assert head["metadata"]["name"] == "churn-model-head" and list(nodepool_findings([*gpu_pools, head], job, cloud)) == []
    assert list(ladder_findings(gpu_pools, job, cloud)) == [
        "the Ray head: no NodePool lets its on-demand node exist (every one that allows on-demand taints its nodes); the "
        "run never starts. Add a pool that allows on-demand without taints, or tainted spotfallback/head as the head "
        "pool `manifest nodepools` writes"]


def test_limits_never_stop_the_pools_own_nodes() -> None:
    """Karpenter counts node capacity: 8 workers of 8 CPUs on p4d.24xlarge (96 vCPUs each) under a
    CPU cap sized from the requests (128) would get one node. GPU pools are capped by GPUs alone."""
    job = make_job({**SPOT, **GPU8, "num_workers": 8}, {**ON_DEMAND, **GPU8, "num_workers": 8})
    spot, on_demand, head = nodepools_for(job, NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    for pool in (spot, on_demand):
        limits = pool["spec"]["limits"]
        assert limits == {"nvidia.com/gpu": "256"}  # 8 workers, each on a node of up to 16 GPUs, twice over
        assert int(limits["nvidia.com/gpu"]) >= 2 * 8 * 8  # the gang's 8 nodes and 8 replacements
    assert head["spec"]["limits"] == {"cpu": "16"}
    # A CPU pool of a pinned instance type: its vCPUs are unknown here, so no CPU cap that could stop it.
    pinned = make_job({**SPOT, "placement": {"instance_type": "c7i.48xlarge"}}, ON_DEMAND)
    spot, on_demand, _ = nodepools_for(pinned, NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    assert "limits" not in spot["spec"] and on_demand["spec"]["limits"] == {"cpu": "16"}


@pytest.mark.parametrize(("cpu", "memory", "cap"), [("2", "8Gi", 16), ("8", "32Gi", 32), ("2", "256Gi", 64), ("31", "64Gi", 64)])
def test_the_head_pool_holds_the_head_pods_node_and_its_replacement(cpu: str, memory: str, cap: int) -> None:
    """The node: a power-of-two size above the pod's CPUs, and for its memory on a memory-optimised
    type (8 GiB a vCPU); twice, for the replacement; never below the default's 16."""
    opts = NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER, head_cpu=cpu, head_memory=memory)
    *_, head = nodepools_for(make_job(SPOT, ON_DEMAND), opts)
    assert head["spec"]["limits"] == {"cpu": str(cap)}


def test_pools_whose_taints_the_tiers_pods_do_not_tolerate_are_refused() -> None:
    """GPU pools (tainted nvidia.com/gpu) checked against a CPU ladder: Karpenter skips a pool
    whose taints a pending pod does not tolerate, so these tiers would wait out their timeouts."""
    gpu_job = make_job({**SPOT, **GPU8}, {**ON_DEMAND, **GPU8})
    pools = nodepools_for(gpu_job, NodePoolOptions(cloud=KarpenterCloud.EKS_KARPENTER))
    findings = list(ladder_findings(pools, make_job(SPOT, ON_DEMAND), KarpenterCloud.EKS_KARPENTER))
    assert findings == [
        f"tiers[{i}] ({name!r}): every NodePool that allows its nodes taints them ({taints}), "
        "which its pods do not tolerate; they would stay pending until the tier's capacity timeout. Drop the taint, "
        "or give the tier a matching placement.tolerations entry"
        for i, name, taints in [(0, "spot", "nvidia.com/gpu=true:NoSchedule"),
                                (1, "on-demand", "nvidia.com/gpu=true:NoSchedule, spotfallback/head=true:NoSchedule")]
    ]


def test_nodepool_options_take_the_clouds_string_and_refuse_another():
    assert NodePoolOptions(cloud="aks-nap").cloud is KarpenterCloud.AKS_NAP  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^cloud: 'eks' is not one of: eks-karpenter, aks-nap"):
        NodePoolOptions(cloud="eks")  # type: ignore[arg-type]
