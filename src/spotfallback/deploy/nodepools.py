"""Karpenter NodePools for a tier ladder: the capacity the KubeRay file's worker groups ask for.

On EKS with Karpenter (``eks-karpenter``) and on AKS node auto-provisioning, which is Karpenter
on AKS (``aks-nap``), nodes exist only when a NodePool allows them. A NodePool that does not
allow ``spot`` leaves the spot tier's pods pending until the tier's capacity timeout: the
ladder falls to on-demand without ever trying spot. So the pools are written from the same job
file as the manifest, one per market the ladder uses (and GPU or instance type a tier pins), each requiring exactly the node labels
that market's pods select (``clouds.pod_placement``), plus one for the Ray head (the head pod
alone tolerates its taint), and validated offline against the vendored ``karpenter.sh_nodepools``
CRD schema plus the rules a schema cannot say.

What a training gang needs from Karpenter's disruption:
- ``consolidationPolicy: WhenEmpty``: a node is consolidated only once no pod runs on it; the
  default, ``WhenEmptyOrUnderutilized``, would move a running worker to pack nodes tighter,
  which restarts the whole gang from its last checkpoint;
- a budget of zero nodes for ``Drifted``: a changed node class does not replace running nodes
  (they are replaced when the run lets them go empty);
- ``expireAfter: Never``: Karpenter's default expiry (720 h) would take a node out of a run
  that lasts longer; spot nodes are taken back by the cloud anyway.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any

import yaml
from jsonschema import ValidationError

from spotfallback.config import ON_DEMAND, SPOT, JobConfig, Tier
from spotfallback.deploy.clouds import AKS_SPOT_TAINT, KARPENTER_KEY, K8sCloud, pod_placement
from spotfallback.deploy.common import (
    CLUSTER_LABEL,
    HEAD_CPU,
    HEAD_MEMORY,
    MANAGED_BY_LABEL,
    RUN_LABEL,
    ZONE_LABEL,
    check_user_labels,
    choice,
    head_size,
    k8s_name,
    label_value,
    tier_labels,
    to_yaml,
    with_run_name,
    worker_shape,
)
from spotfallback.deploy.pools import GPU_NODE_TAINT, HEAD_NODE_TAINT, HEAD_TOLERATION, k8s_pool
from spotfallback.deploy.schema import KubernetesValidator, extract_crd_schema, make_strict
from spotfallback.errors import ConfigError, ManifestInvalid

API_VERSION = "karpenter.sh/v1"
ZONE_KEY = "topology.kubernetes.io/zone"


class KarpenterCloud(StrEnum):
    EKS_KARPENTER = K8sCloud.EKS_KARPENTER.value
    AKS_NAP = K8sCloud.AKS_NAP.value


@dataclass(frozen=True)
class _Provider:
    """What differs between the two Karpenter providers."""

    data_dir: str
    node_class_group: str
    node_class_kind: str
    gpu_count_key: str  # a node label each provider sets: how many GPUs the instance type has
    spot_taints: tuple[dict[str, str], ...]


PROVIDERS: dict[KarpenterCloud, _Provider] = {
    KarpenterCloud.EKS_KARPENTER: _Provider(
        "aws", "karpenter.k8s.aws", "EC2NodeClass", "karpenter.k8s.aws/instance-gpu-count", ()
    ),
    # AKS spot pools are tainted; NAP's spot NodePool taints its nodes the same way, so the
    # KubeRay file's spot toleration (clouds.pod_placement) means the same on both.
    KarpenterCloud.AKS_NAP: _Provider(
        "azure",
        "karpenter.azure.com",
        "AKSNodeClass",
        "karpenter.azure.com/sku-gpu-count",
        ({k: v for k, v in AKS_SPOT_TAINT.items() if k != "operator"},),
    ),
}
# Karpenter's capacity types for the ladder's markets.
CAPACITY_TYPES = {SPOT: "spot", ON_DEMAND: "on-demand", "reserved": "reserved"}
# The head pool's cap at least: room for the default head's node (2 CPUs and 8 GiB: a 4-vCPU
# instance) and its replacement, twice over.
HEAD_POOL_CPU = 16
# The most memory per vCPU of the instance types Karpenter may pick for the head (memory-optimised
# ones: AWS r-types, Azure E-series): a head of much memory and few CPUs gets a node this wide.
GIB_PER_VCPU_MAX = 8
# The most GPUs one node of the common GPU instance types has (GCE's a2-megagpu-16g).
GPUS_PER_NODE_MAX = 16
# The images run on x86 Linux nodes (Ray's images are amd64; its arm64 ones carry an -aarch64 tag):
# without these, Karpenter may pick the cheapest fitting node, often an arm64 one, and the pods
# would fail with "exec format error".
PLATFORM_REQUIREMENTS = (
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
    {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
)
CONSOLIDATE_AFTER = "5m"  # an idle node outlives the Ray autoscaler's idle timeout (60 s) by far


@dataclass(frozen=True)
class NodePoolOptions:
    """What the NodePools need beyond the job file: the cloud and the node class to reference
    (an ``EC2NodeClass`` on EKS, an ``AKSNodeClass`` on AKS, which you manage)."""

    cloud: KarpenterCloud
    node_class: str = "default"
    run_name: str | None = None
    # Labels of your own (a team, a cost centre) on every NodePool and on the nodes each launches
    # (its template's labels), beside spotfallback/run on the pools.
    labels: Mapping[str, str] = field(default_factory=dict)
    # The KubeRay head pod's size (KubeRayOptions.head_cpu, head_memory), which the head pool must hold.
    head_cpu: str = HEAD_CPU
    head_memory: str = HEAD_MEMORY

    def __post_init__(self) -> None:
        object.__setattr__(self, "cloud", choice("cloud", self.cloud, KarpenterCloud))
        head_size(self.head_cpu, self.head_memory)
        # Every domain the CRD restricts is refused whole: the keys it still allows there are
        # well-known labels (capacity type, instance family...) that choose nodes, not name them.
        rules = template_label_rules(self.cloud)
        check_user_labels(self.labels, "Karpenter", tuple(r.domain for r in rules if r.domain is not None))
        for key in self.labels:
            if problem := template_label_problem(key, self.cloud):
                raise ConfigError(f"labels: {key!r}: {problem} (Karpenter's NodePool schema); choose another key")


def _market(tier: Tier, index: int) -> str:
    if tier.market not in CAPACITY_TYPES:
        raise ConfigError(
            f"tiers[{index}].market: {tier.market!r} has no Karpenter capacity type; use one of {', '.join(CAPACITY_TYPES)}"
        )
    return tier.market


def _pool_selector(cloud: KarpenterCloud, tier: Tier, index: int) -> dict[str, str]:
    """The node labels the tier's pods require beyond market and zone (its GPU type, instance
    type, own selector): what its NodePool must offer (``pools.k8s_pool``)."""
    return k8s_pool(K8sCloud(cloud.value), tier, index).node_selector


def _requirements(tiers: list[tuple[int, Tier]], market: str, provider: _Provider, pool: dict[str, str]) -> list[dict[str, Any]]:
    reqs: list[dict[str, Any]] = [{"key": KARPENTER_KEY, "operator": "In", "values": [CAPACITY_TYPES[market]]},
                                  *map(dict, PLATFORM_REQUIREMENTS)]
    # The zone a tier's worker group pins (tier_labels: exact label values only).
    zones = [tier_labels(t, i).get(ZONE_LABEL) for i, t in tiers]
    if all(zones):  # every tier of this pool is pinned: keep the pool to those zones
        reqs.append({"key": ZONE_KEY, "operator": "In", "values": sorted({z for z in zones if z})})
    if all(worker_shape(t, i)[1] > 0 for i, t in tiers):
        reqs.append({"key": provider.gpu_count_key, "operator": "Gt", "values": ["0"]})
    reqs += [{"key": key, "operator": "In", "values": [value]} for key, value in sorted(pool.items())]
    return reqs


def nodepools_for(job: JobConfig, opts: NodePoolOptions) -> list[dict[str, Any]]:
    """One NodePool per market the ladder uses, in ladder order, then one for the Ray head, ready for YAML.

    A ladder across clusters gets its pools per cluster, each labelled ``spotfallback/cluster``
    as its RayCluster is: a NodePool lives in one Kubernetes cluster, and a pool shared by tiers
    of two clusters would ask each for the other's machines and limits.
    """
    provider = PROVIDERS[opts.cloud]
    job = with_run_name(job, opts.run_name)
    name = job.name
    # One pool per cluster, market and machine pool: tiers of one market on different GPU types
    # or instance types need their own, or Karpenter may give either tier the other's machines.
    by_pool: dict[tuple[str | None, str, tuple[tuple[str, str], ...], bool], list[tuple[int, Tier]]] = {}
    for i, tier in enumerate(job.tiers):
        gpu = worker_shape(tier, i)[1] > 0
        key = (job.ladder.cluster_key(i), _market(tier, i), tuple(sorted(_pool_selector(opts.cloud, tier, i).items())), gpu)
        by_pool.setdefault(key, []).append((i, tier))
    per_market: dict[tuple[str | None, str], int] = {}
    for cluster, market, _, _ in by_pool:
        per_market[cluster, market] = per_market.get((cluster, market), 0) + 1
    pools = []
    node_class = {"group": provider.node_class_group, "kind": provider.node_class_kind, "name": opts.node_class}
    for (cluster, market, selector, gpu), tiers in by_pool.items():
        node_spec: dict[str, Any] = {
            "nodeClassRef": dict(node_class),
            "requirements": _requirements(tiers, market, provider, dict(selector)),
            "expireAfter": "Never",
        }
        taints = [dict(t) for t in provider.spot_taints] if market == SPOT else []
        if gpu:  # keep CPU pods off GPU nodes; the GPU tiers' pods tolerate it (pools.GPU_TOLERATIONS)
            taints.append(dict(GPU_NODE_TAINT))
        if taints:
            node_spec["taints"] = taints
        suffix = CAPACITY_TYPES[market] if per_market[cluster, market] == 1 else tiers[0][1].name
        pools.append(_pool(name, cluster, suffix, node_spec, _limits(tiers, gpu), opts.labels))
    for cluster in job.ladder.cluster_keys:
        # The Ray head: on-demand, CPU only, on a pool of its own that only it tolerates.
        head_spec: dict[str, Any] = {
            "nodeClassRef": dict(node_class),
            "requirements": [{"key": KARPENTER_KEY, "operator": "In", "values": [CAPACITY_TYPES[ON_DEMAND]]},
                             *map(dict, PLATFORM_REQUIREMENTS)],
            "expireAfter": "Never",
            "taints": [dict(HEAD_NODE_TAINT)],
        }
        pools.append(_pool(name, cluster, "head", head_spec, {"cpu": str(head_pool_cpu(opts))}, opts.labels))
    return pools


def head_pool_cpu(opts: NodePoolOptions) -> int:
    """The head pool's vCPU cap: a node for the head pod and one for its replacement. The node is
    the smallest power-of-two size above the pod's CPUs (room for the kubelet and daemonsets) and
    wide enough for its memory on a memory-optimised type; never below ``HEAD_POOL_CPU``."""
    cpu, gib = head_size(opts.head_cpu, opts.head_memory)
    node = 2 ** math.ceil(math.log2(max(cpu + 1, gib / GIB_PER_VCPU_MAX)))
    return max(HEAD_POOL_CPU, 2 * node)


def _pool(run: str, cluster: str | None, suffix: str, node_spec: dict[str, Any], limits: dict[str, str],
          user_labels: Mapping[str, str]) -> dict[str, Any]:
    """One NodePool of the run (of ``cluster``'s, in a ladder across clusters): the gang's disruption rules."""
    labels = {MANAGED_BY_LABEL: "spotfallback", RUN_LABEL: label_value(run)}
    if cluster is not None:
        labels[CLUSTER_LABEL] = label_value(cluster)
    labels.update(user_labels)
    template: dict[str, Any] = {"metadata": {"labels": dict(user_labels)}} if user_labels else {}
    return {
        "apiVersion": API_VERSION,
        "kind": "NodePool",
        "metadata": {
            "name": k8s_name(f"{run}-{suffix}" if cluster is None else f"{run}-{cluster}-{suffix}", 63),
            "labels": labels,
        },
        "spec": {
            "template": {**template, "spec": node_spec},
            "disruption": {
                "consolidationPolicy": "WhenEmpty",
                "consolidateAfter": CONSOLIDATE_AFTER,
                "budgets": [{"nodes": "0", "reasons": ["Drifted"]}],
            },
            **({"limits": limits} if limits else {}),
        },
    }


def _limits(tiers: list[tuple[int, Tier]], gpu: bool) -> dict[str, str]:
    """A cap on a runaway, not a fit: it must never stop the pool's own workers.

    Karpenter counts the capacity of the nodes it launches, not the pods' requests, and a node
    being replaced still counts until it is gone. So a GPU pool (every node of it has a GPU) is
    capped by GPUs alone, room for each worker on a node of its own of up to
    ``GPUS_PER_NODE_MAX`` GPUs, twice over: a CPU cap sized from the workers' requests would
    stop GPU instances, whose vCPUs are many (96 on a p4d.24xlarge, 8 workers of 8 CPUs capped
    at 128 would get one node). A CPU pool is capped at twice its workers' CPUs (Karpenter
    then picks instance types that fit under it), unless a tier pins the instance type: its
    vCPUs are not known here, and the KubeRay groups' ``maxReplicas`` bound the workers.
    """
    if gpu:
        per_node = sum(t.num_workers * max(GPUS_PER_NODE_MAX, math.ceil(worker_shape(t, i)[1])) for i, t in tiers)
        return {"nvidia.com/gpu": str(2 * per_node)}
    if any(t.placement.instance_type for _, t in tiers):
        return {}
    cpu = sum(t.num_workers * max(1, math.ceil(worker_shape(t, i)[0])) for i, t in tiers)
    return {"cpu": str(2 * cpu)}


# --- validation -------------------------------------------------------------------------------


@cache
def _nodepool_crd(cloud: KarpenterCloud) -> dict[str, Any]:
    text = resources.files("spotfallback").joinpath("data", "karpenter", PROVIDERS[cloud].data_dir, "karpenter.sh_nodepools.yaml").read_text("utf-8")
    crd: dict[str, Any] = yaml.safe_load(text)
    return crd


@cache
def nodepool_validator(cloud: KarpenterCloud) -> Any:
    """The provider's vendored ``karpenter.sh_nodepools`` CRD schema, made strict, as a validator."""
    return KubernetesValidator(make_strict(extract_crd_schema(_nodepool_crd(cloud))))


@dataclass(frozen=True)
class LabelRule:
    """One of the CRD's rules (CEL) on the node labels a NodePool's template sets: a key it
    refuses, or a domain it refuses but for the keys it lists."""

    message: str
    key: str | None = None
    domain: str | None = None
    allowed: frozenset[str] = frozenset()

    def refuses(self, key: str) -> bool:
        if self.key is not None:
            return key == self.key
        # CEL's x.find("^([^/]+)") is the key's prefix, or the whole key where it has none.
        return self.domain is not None and key not in self.allowed and key.partition("/")[0].endswith(self.domain)


# The two shapes of rule the providers' CRDs write on spec.template.metadata.labels.
_DOMAIN_RULE = re.compile(r'^self\.all\(x, x in \[(?P<allowed>[^\]]*)\] \|\| !x\.find\("\^\(\[\^/\]\+\)"\)\.endsWith\("(?P<domain>[^"]+)"\)\)$')
_KEY_RULE = re.compile(r"""^self\.all\(x, x != (?P<q>["'])(?P<key>[^"']+)(?P=q)\)$""")


def parse_label_rule(message: str, rule: str) -> LabelRule | None:
    """The rule as a :class:`LabelRule`, or None for a shape this module does not know."""
    if m := _DOMAIN_RULE.fullmatch(rule.strip()):
        allowed = frozenset(k.strip().strip("\"'") for k in m["allowed"].split(",") if k.strip())
        return LabelRule(message, domain=m["domain"], allowed=allowed)
    if m := _KEY_RULE.fullmatch(rule.strip()):
        return LabelRule(message, key=m["key"])
    return None


def template_label_rules_as_written(cloud: KarpenterCloud) -> list[tuple[str, str]]:
    """(message, rule) of every CEL rule the provider's CRD sets on a NodePool's template labels."""
    schema = extract_crd_schema(_nodepool_crd(cloud))
    labels = schema["properties"]["spec"]["properties"]["template"]["properties"]["metadata"]["properties"]["labels"]
    return [(r["message"], r["rule"]) for r in labels.get("x-kubernetes-validations", [])]


@cache
def template_label_rules(cloud: KarpenterCloud) -> tuple[LabelRule, ...]:
    """The rules on a NodePool's template labels that the API server applies (it evaluates the
    CRD's CEL, which the JSON-schema check here does not), read from the vendored CRD."""
    parsed = (parse_label_rule(message, rule) for message, rule in template_label_rules_as_written(cloud))
    return tuple(r for r in parsed if r is not None)


def template_label_problem(key: str, cloud: KarpenterCloud) -> str | None:
    """Why the provider's Karpenter refuses ``key`` as a node label of a NodePool's template, or None."""
    return next((rule.message for rule in template_label_rules(cloud) if rule.refuses(key)), None)


def _path(error: ValidationError) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path]
    return "".join(parts).lstrip(".") or "(top level)"


def _at(pool: Any, *path: str) -> Any:
    """The value at ``path`` in a pool, or None where any level is missing or not a mapping
    (a hand-edited file may hold anything)."""
    node: Any = pool
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _node_spec(pool: Any, field: str) -> Any:
    """``spec.template.spec.<field>`` of a pool: what the nodes it launches are given."""
    return _at(pool, "spec", "template", "spec", field)


def _requirement_list(pool: Any) -> list[dict[str, Any]]:
    reqs = _node_spec(pool, "requirements")
    return [r for r in reqs if isinstance(r, dict)] if isinstance(reqs, list) else []


def _capacity_types(pool: dict[str, Any]) -> set[str] | None:
    """The capacity types a pool allows (None: unrestricted)."""
    allowed: set[str] | None = None
    for req in _requirement_list(pool):
        if req.get("key") == KARPENTER_KEY:
            raw = req.get("values")
            values = {v for v in raw if isinstance(v, str)} if isinstance(raw, list) else set()
            if req.get("operator") == "In":
                allowed = values if allowed is None else allowed & values
            elif req.get("operator") == "NotIn":
                allowed = (allowed if allowed is not None else set(CAPACITY_TYPES.values())) - values
    return allowed


def nodepool_findings(docs: list[Any], job: JobConfig, cloud: KarpenterCloud) -> Iterator[str]:
    """Errors, each naming the document and field: the CRD schema, then whether every tier's
    market has a pool that allows it (a spot tier with no pool allowing spot waits until its
    capacity timeout) and whether AKS spot pools taint their nodes as the pods expect."""
    validator = nodepool_validator(cloud)
    valid_pools: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        where = f"NodePool[{i}]"
        if not isinstance(doc, dict) or doc.get("kind") != "NodePool":
            yield f"{where}: not a NodePool"
            continue
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            yield f"{where}.{_path(error)}: {error.message}"
        for refused in template_label_problems(doc, cloud):
            yield f"{where}.{TEMPLATE_LABELS_PATH}: {refused}"
        valid_pools.append(doc)
        problem = aks_spot_taint_problem(doc, cloud)
        if problem:
            yield f"{where}.{TAINTS_PATH}: {problem}"
    yield from ladder_findings(valid_pools, job, cloud)


TAINTS_PATH = "spec.template.spec.taints"
TEMPLATE_LABELS_PATH = "spec.template.metadata.labels"


def template_label_problems(pool: dict[str, Any], cloud: KarpenterCloud) -> list[str]:
    """The node labels of a pool's template that the API server would refuse by the CRD's CEL rules,
    which the schema check does not run; a hand-edited file may hold anything."""
    labels = _at(pool, "spec", "template", "metadata", "labels")
    keys = [k for k in labels if isinstance(k, str)] if isinstance(labels, dict) else []
    return [f"{key!r}: {problem} (Karpenter's NodePool schema)" for key in keys if (problem := template_label_problem(key, cloud))]


def aks_spot_taint_problem(pool: dict[str, Any], cloud: KarpenterCloud) -> str | None:
    """Why a spot-only pool on AKS breaks the KubeRay file's placement (no spot taint), or None."""
    taints = _node_spec(pool, "taints")
    taints = taints if isinstance(taints, list) else []
    if cloud is KarpenterCloud.AKS_NAP and _capacity_types(pool) == {"spot"} and not any(
        isinstance(t, dict) and t.get("key") == AKS_SPOT_TAINT["key"] for t in taints
    ):
        return (f"a spot pool on AKS must taint its nodes {AKS_SPOT_TAINT['key']}=spot:NoSchedule for spotfallback, "
                "as AKS spot node pools are, or on-demand pods land on spot nodes (Karpenter accepts the pool "
                f"without it); add {{key: {AKS_SPOT_TAINT['key']}, value: spot, effect: NoSchedule}} to the taints")
    return None


def nodeclass_group(pool: dict[str, Any]) -> Any:
    """A NodePool's ``spec.template.spec.nodeClassRef.group``, as written (None where it is missing)."""
    ref = _node_spec(pool, "nodeClassRef")
    return ref.get("group") if isinstance(ref, dict) else None


def group_cloud(group: Any) -> KarpenterCloud | None:
    """The provider whose node classes are in API group ``group`` (None: neither's)."""
    return next((cloud for cloud, p in PROVIDERS.items() if p.node_class_group == group), None)


def nodepool_cloud(pool: dict[str, Any]) -> KarpenterCloud | None:
    """The provider a NodePool is for, by its ``nodeClassRef.group`` (None: neither's)."""
    return group_cloud(nodeclass_group(pool))


def _cluster_pools(pools: list[dict[str, Any]], key: str | None) -> tuple[list[dict[str, Any]], str]:
    """The pools that serve cluster ``key`` (its own and those that name no cluster), and how to say so."""
    mine = pools if key is None else [p for p in pools if _pool_cluster(p) in (None, label_value(key))]
    return mine, "NodePool" if key is None else f"NodePool of cluster {key!r}"


def _tolerated(taint: Any, tolerations: list[dict[str, str]]) -> bool:
    """Whether a pod with ``tolerations`` may run on a node with ``taint`` (Kubernetes' matching)."""
    if not isinstance(taint, dict):
        return True
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _untolerated(pool: dict[str, Any], tolerations: list[dict[str, str]]) -> list[str]:
    """The pool's taints a pod with ``tolerations`` does not tolerate, as key=value:effect."""
    taints = _node_spec(pool, "taints")
    return [f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in (taints if isinstance(taints, list) else [])
            if isinstance(t, dict) and not _tolerated(t, tolerations)]


def _head_findings(pools: list[dict[str, Any]], job: JobConfig, cloud: KarpenterCloud) -> Iterator[str]:
    """Whether each cluster's Ray head (on-demand, no GPU) has a pool that lets its node exist."""
    tolerations = [*pod_placement(K8sCloud(cloud.value), ON_DEMAND).tolerations, dict(HEAD_TOLERATION)]
    for key in job.ladder.cluster_keys:
        mine, which = _cluster_pools(pools, key)
        serving = [p for p in mine if _allows(p, KARPENTER_KEY, CAPACITY_TYPES[ON_DEMAND])]
        if not any(not _untolerated(p, tolerations) for p in serving):
            yield (
                f"the Ray head{'' if key is None else f' of cluster {key!r}'}: no {which} lets its on-demand node exist "
                f"({'every one that allows on-demand taints its nodes' if serving else 'none allows on-demand'}); the run "
                f"never starts. Add a pool that allows on-demand without taints, or tainted {HEAD_NODE_TAINT['key']} "
                "as the head pool `manifest nodepools` writes"
            )


def ladder_findings(pools: list[dict[str, Any]], job: JobConfig, cloud: KarpenterCloud) -> Iterator[str]:
    """Whether every tier of ``job`` has a pool of its cluster that lets its pods' nodes exist, and
    whether each cluster's head has one."""
    yield from _head_findings(pools, job, cloud)
    for i, tier in enumerate(job.tiers):
        # A tier of a ladder across clusters is served only by its own cluster's pools (and by
        # pools that name no cluster).
        mine, which = _cluster_pools(pools, job.ladder.cluster_key(i))
        allowed: set[str] = set()
        for pool in mine:
            types = _capacity_types(pool)
            allowed |= types if types is not None else set(CAPACITY_TYPES.values())
        wanted = CAPACITY_TYPES.get(tier.market)
        if wanted and wanted not in allowed:
            yield (
                f"tiers[{i}] ({tier.name!r}, {tier.market}): no {which} allows {KARPENTER_KEY} {wanted!r}; its pods "
                f"would stay pending until the tier's capacity timeout. Add {wanted!r} to a pool's requirements"
            )
            continue
        needs = {KARPENTER_KEY: wanted, **_pool_selector(cloud, tier, i)} if wanted else {}
        making = [pool for pool in mine if all(_allows(pool, k, value) for k, value in needs.items())]
        if needs and not making:
            pairs = ", ".join(f"{k}={v}" for k, v in needs.items())
            yield (
                f"tiers[{i}] ({tier.name!r}): no {which} allows nodes labelled {pairs}; its pods would stay pending "
                "until the tier's capacity timeout. Add a pool whose requirements allow them"
            )
            continue
        tolerations = _tier_tolerations(cloud, tier, i)
        if needs and all(_untolerated(pool, tolerations) for pool in making):
            taints = sorted({t for pool in making for t in _untolerated(pool, tolerations)})
            yield (
                f"tiers[{i}] ({tier.name!r}): every {which} that allows its nodes taints them ({', '.join(taints)}), "
                "which its pods do not tolerate; they would stay pending until the tier's capacity timeout. Drop the "
                "taint, or give the tier a matching placement.tolerations entry"
            )


def _tier_tolerations(cloud: KarpenterCloud, tier: Tier, index: int) -> list[dict[str, str]]:
    """The tolerations of the tier's pods in the KubeRay file for ``cloud``."""
    k8s = K8sCloud(cloud.value)
    pool = k8s_pool(k8s, tier, index)
    return [*pod_placement(k8s, tier.market, f"tiers[{index}].market").tolerations, *pool.tolerations]


def _pool_cluster(pool: dict[str, Any]) -> str | None:
    """The cluster a pool is labelled for (None: any)."""
    metadata = pool.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    value = labels.get(CLUSTER_LABEL) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else None


def _allows(pool: dict[str, Any], key: str, value: str) -> bool:
    """Whether a NodePool's requirements let it make a node labelled ``key=value``."""
    for req in _requirement_list(pool):
        if req.get("key") != key:
            continue
        op, raw = req.get("operator"), req.get("values")
        values: list[Any] = raw if isinstance(raw, list) else []
        if (op == "In" and value not in values) or (op == "NotIn" and value in values) or op == "DoesNotExist":
            return False
    return True


def render_nodepools(job: JobConfig, opts: NodePoolOptions) -> str:
    """The NodePools as commented multi-document YAML, validated first."""
    pools = nodepools_for(job, opts)
    problems = list(nodepool_findings(pools, job, opts.cloud))
    if problems:
        raise ManifestInvalid(problems)
    provider = PROVIDERS[opts.cloud]
    header = [
        f"Generated by `spotfallback manifest nodepools --cloud {opts.cloud.value}`; do not edit by hand.",
        f"Karpenter NodePools for run {opts.run_name or job.name!r}: one per market of its ladder and one for the Ray "
        f"head (tainted {HEAD_NODE_TAINT['key']}, which only the head tolerates), referencing the "
        f"{provider.node_class_kind} {opts.node_class!r} (yours to manage).",
        "Disruption: nodes go only when empty (a running training gang is never consolidated), drifted nodes are "
        "not replaced under a run, and nodes do not expire.",
    ]
    if opts.cloud is KarpenterCloud.EKS_KARPENTER:
        header.append("Karpenter drains spot nodes on AWS's 2-minute notice only with its interruption queue configured.")
    headers: list[list[str]] = [header] + [[] for _ in pools[1:]]
    if job.ladder.across_clusters:
        # One file for every cluster: each applies its own pools by their label.
        headers = [[] for _ in pools]
        for key, ref in job.ladder.clusters.items():
            first = next(i for i, p in enumerate(pools) if _pool_cluster(p) == label_value(key))
            tiers = ", ".join(t.name for i, t in enumerate(job.tiers) if job.ladder.cluster_key(i) == key)
            region = f" in {ref.region}" if ref.region else ""
            headers[first] = [*(header if first == 0 else []),
                              f"Cluster {key!r}{region}: the pools of tiers {tiers}. Apply them in that Kubernetes "
                              f"cluster: kubectl apply -f FILE -l {CLUSTER_LABEL}={label_value(key)}"]
    return "---\n".join(to_yaml(p, h) for p, h in zip(pools, headers, strict=True))
