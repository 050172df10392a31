"""How each cloud is told "spot" or "on-demand": the documented node labels, taints and
instance settings. One table per target, so a reviewer can check the keys in one place.

Kubernetes (node labels set by the cloud or its autoscaler):
- EKS + Karpenter: ``karpenter.sh/capacity-type: spot | on-demand | reserved``
- AKS node auto-provisioning (Karpenter on AKS): ``karpenter.sh/capacity-type: spot | on-demand``;
  its nodes also carry AKS's ``kubernetes.azure.com/scalesetpriority: spot | regular`` (the Azure
  provider writes both), and the NodePools ``manifest nodepools`` writes taint the spot ones as
  AKS spot pools are tainted.
- EKS managed node groups: ``eks.amazonaws.com/capacityType: SPOT | ON_DEMAND``
- AKS: spot pools carry the label *and* the taint ``kubernetes.azure.com/scalesetpriority=spot:NoSchedule``;
  regular pools carry neither, so on-demand means "not spot".
- GKE: spot nodes carry ``cloud.google.com/gke-spot: "true"`` (tainted with the same key where the
  pool is tainted); legacy preemptible VMs carry ``cloud.google.com/gke-preemptible: "true"`` and are
  not tainted by default; on-demand nodes carry neither, so on-demand means "neither label".
VMs (Ray cluster launcher ``node_config``):
- AWS: ``InstanceMarketOptions: {MarketType: spot}``; on-demand is the default (no key).
- GCP: ``scheduling.provisioningModel: SPOT`` (deleted on preemption); on-demand ``STANDARD``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from spotfallback.config import ON_DEMAND, SPOT
from spotfallback.errors import ConfigError


class K8sCloud(StrEnum):
    EKS_KARPENTER = "eks-karpenter"
    EKS_MANAGED = "eks-managed"
    AKS = "aks"
    AKS_NAP = "aks-nap"
    GKE = "gke"


class VmCloud(StrEnum):
    AWS = "aws"
    GCP = "gcp"


KARPENTER_KEY = "karpenter.sh/capacity-type"
EKS_MANAGED_KEY = "eks.amazonaws.com/capacityType"
AKS_KEY = "kubernetes.azure.com/scalesetpriority"
GKE_KEY = "cloud.google.com/gke-spot"
GKE_PREEMPTIBLE_KEY = "cloud.google.com/gke-preemptible"

# Node selectors that pick each market, where the cloud labels that market.
_SELECTOR_VALUES: dict[K8sCloud, tuple[str, dict[str, str]]] = {
    K8sCloud.EKS_KARPENTER: (KARPENTER_KEY, {SPOT: "spot", ON_DEMAND: "on-demand", "reserved": "reserved"}),
    K8sCloud.EKS_MANAGED: (EKS_MANAGED_KEY, {SPOT: "SPOT", ON_DEMAND: "ON_DEMAND"}),
    K8sCloud.AKS: (AKS_KEY, {SPOT: "spot"}),
    K8sCloud.AKS_NAP: (KARPENTER_KEY, {SPOT: "spot", ON_DEMAND: "on-demand"}),
    K8sCloud.GKE: (GKE_KEY, {SPOT: "true"}),
}
# Every (label, value) that marks a node this cloud can take away, where the cloud labels spot
# without tainting it: the head and on-demand pods must exclude each, not only the first.
NOT_ON_DEMAND: dict[K8sCloud, tuple[tuple[str, str], ...]] = {
    K8sCloud.AKS: ((AKS_KEY, "spot"),),
    K8sCloud.GKE: ((GKE_KEY, "true"), (GKE_PREEMPTIBLE_KEY, "true")),
}
# For the validator: label keys of one cloud's spot families; a pod that excludes one of a
# family's labels is avoiding spot on that cloud, so it must exclude all of them.
SPOT_LABEL_FAMILIES: tuple[frozenset[tuple[str, str]], ...] = tuple(
    frozenset(pairs) for pairs in NOT_ON_DEMAND.values() if len(pairs) > 1
)
# Clouds whose spot nodes are tainted: spot pods tolerate it, everything else stays off.
AKS_SPOT_TAINT = {"key": AKS_KEY, "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
_SPOT_TAINTS: dict[K8sCloud, dict[str, str]] = {
    K8sCloud.AKS: AKS_SPOT_TAINT,
    K8sCloud.AKS_NAP: AKS_SPOT_TAINT,
    K8sCloud.GKE: {"key": GKE_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"},
}

# For the validator: (node label, value) pairs that mean "this node is spot/preemptible", on
# any cloud, and the taint keys that keep ordinary pods off spot nodes.
SPOT_NODE_LABELS: frozenset[tuple[str, str]] = frozenset(
    {
        (KARPENTER_KEY, "spot"),
        (EKS_MANAGED_KEY, "SPOT"),
        (AKS_KEY, "spot"),
        (GKE_KEY, "true"),
        ("cloud.google.com/gke-provisioning", "spot"),
        (GKE_PREEMPTIBLE_KEY, "true"),
    }
)
# AKS node auto-provisioning labels its regular nodes ``scalesetpriority: regular`` too.
ON_DEMAND_NODE_LABELS: frozenset[tuple[str, str]] = frozenset(
    {(KARPENTER_KEY, "on-demand"), (EKS_MANAGED_KEY, "ON_DEMAND"), (AKS_KEY, "regular")}
)
SPOT_TAINT_KEYS: frozenset[str] = frozenset({AKS_KEY, GKE_KEY, GKE_PREEMPTIBLE_KEY})


@dataclass(frozen=True)
class SpotShutdown:
    """How one cloud takes a spot node away from its pods.

    ``notice_s``: the longest warning the cloud gives before the VM stops; a pod's grace period
    longer than that ends with the VM, not with the pod. ``grace_s``: the spot pods' default
    ``terminationGracePeriodSeconds``. ``sigterm_from``: what sends the pods their SIGTERM.
    ``longer_needs``: what the nodes need for a grace longer than ``grace_s`` to be honoured,
    where the cloud's default shutdown cuts pods off sooner than its notice.
    """

    notice_s: int
    grace_s: int
    sigterm_from: str
    longer_needs: str | None = None


# Spot pods' timing, per cloud. Whatever drains a spot node sends its pods SIGTERM; Ray 2.60's
# `ray start --block` (KubeRay's command) then drains the Ray node for
# RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S with reason PREEMPTION (Ray Train checkpoints just in time
# and tears the workers down at that deadline) and stops. So the window is the grace less
# DRAIN_MARGIN_S (the kubelet SIGKILLs at the grace; Ray's teardown after the window took 0.2 s
# here, tests/e2e/test_sigterm_drain_e2e.py), and the grace fits the cloud's notice.
#
#   cloud         notice  grace  why this grace
#   eks-*         120 s   90 s   AWS's 2-minute interruption notice less ~30 s for it to reach the pod
#                                (EventBridge -> SQS -> Karpenter, or the ASG's lifecycle hook); a
#                                longer window only delays the restart, 85 s is room for a checkpoint
#   aks, aks-nap   30 s   25 s   Scheduled Events' Preempt comes 30 s before the eviction (NotBefore);
#                                the drain starts a few seconds after it
#   gke           120 s   15 s   graceful node shutdown gives ordinary pods 15 s of a Spot VM's 30 s;
#                                GKE Standard (1.35.0-gke.1171000+) can extend it to 120 s per node
#                                pool: pass --spot-grace to match
SPOT_SHUTDOWN: dict[K8sCloud, SpotShutdown] = {
    K8sCloud.EKS_KARPENTER: SpotShutdown(120, 90, "Karpenter, only with its interruption queue configured"),
    K8sCloud.EKS_MANAGED: SpotShutdown(120, 90, "EKS, through the node group's Capacity Rebalancing"),
    K8sCloud.AKS: SpotShutdown(30, 25, "AKS node auto-drain on the Preempt scheduled event"),
    K8sCloud.AKS_NAP: SpotShutdown(30, 25, "Karpenter node repair at best (nothing documented drains these VMs on Preempt: keep the agent)"),
    K8sCloud.GKE: SpotShutdown(
        120, 15, "GKE graceful node shutdown",
        "a GKE Standard node pool (control plane 1.35.0-gke.1171000 or later) whose node system configuration "
        "extends the Spot VMs' graceful termination to match; on any other pool GKE stops ordinary pods "
        "15 s after the preemption notice, whatever their grace",
    ),
}
# What Ray keeps of the grace for stopping its processes after the drain window.
DRAIN_MARGIN_S = 5
RAY_DRAIN_TIMEOUT_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
# Ray's default drain window, used when a pod does not set RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S.
RAY_DEFAULT_DRAIN_TIMEOUT_S = 30.0
# Kubernetes' default terminationGracePeriodSeconds.
K8S_DEFAULT_GRACE_S = 30


def ray_drain_timeout_s(grace_s: int) -> int:
    """Ray's SIGTERM drain window for a pod with ``grace_s`` of grace: the grace less the margin."""
    return max(1, grace_s - DRAIN_MARGIN_S)


# The notice the sidecar agent watches on each cloud, earlier than the pod's SIGTERM: AWS's
# 2-minute interruption warning and rebalance recommendations (IMDS), GCE's preemption and host
# maintenance events, Azure's Scheduled Events.
AGENT_CLOUD: dict[K8sCloud, str] = {
    K8sCloud.EKS_KARPENTER: "aws",
    K8sCloud.EKS_MANAGED: "aws",
    K8sCloud.AKS: "azure",
    K8sCloud.AKS_NAP: "azure",
    K8sCloud.GKE: "gcp",
}


@dataclass(frozen=True)
class PodPlacement:
    """The pod-spec fields that put a pod on one market of one cloud."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    affinity: dict[str, Any] | None = None


def _not_spot(pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    # NotIn also matches nodes without the label, which is how these clouds mark regular nodes;
    # the expressions of one term must all hold, so the node carries none of the spot labels.
    term = {"matchExpressions": [{"key": key, "operator": "NotIn", "values": [value]} for key, value in pairs]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def pod_placement(cloud: K8sCloud, market: str, where: str = "market") -> PodPlacement:
    """Node selection for ``market`` on ``cloud``; ``where`` names the field in errors."""
    key, values = _SELECTOR_VALUES[cloud]
    if market in values:
        taint = _SPOT_TAINTS.get(cloud) if market == SPOT else None
        return PodPlacement({key: values[market]}, [dict(taint)] if taint else [])
    if market == ON_DEMAND:
        return PodPlacement(affinity=_not_spot(NOT_ON_DEMAND[cloud]))
    known = sorted({*values, ON_DEMAND})
    raise ConfigError(
        f"{where}: {market!r} has no node selection on {cloud.value}; use one of {', '.join(known)}"
    )


def vm_market_config(cloud: VmCloud, market: str, *, gpu: bool, where: str = "market") -> dict[str, Any]:
    """The ``node_config`` entries that request ``market`` capacity on ``cloud``."""
    if cloud is VmCloud.AWS:
        if market == SPOT:
            return {"InstanceMarketOptions": {"MarketType": "spot"}}
        if market == ON_DEMAND:
            return {}
    elif cloud is VmCloud.GCP:
        if market == SPOT:
            return {
                "scheduling": {
                    "provisioningModel": "SPOT",
                    "instanceTerminationAction": "DELETE",
                    "onHostMaintenance": "TERMINATE",
                    "automaticRestart": False,
                }
            }
        if market == ON_DEMAND:
            # GPU VMs cannot live-migrate, so they must stop for host maintenance.
            scheduling: dict[str, Any] = {"provisioningModel": "STANDARD"}
            if gpu:
                scheduling["onHostMaintenance"] = "TERMINATE"
            return {"scheduling": scheduling}
    raise ConfigError(f"{where}: {market!r} has no instance setting on {cloud.value}; use spot or on-demand")


def _market_fields(node_config: Any) -> list[tuple[str, Any]]:
    """``(field, value)`` of each field where a launcher ``node_config`` names its market: EC2's
    ``InstanceMarketOptions.MarketType``, Azure's ``azure_arm_parameters.priority`` and GCE's
    ``scheduling`` (a mapping, or the legacy list) ``provisioningModel`` and ``preemptible``."""
    if not isinstance(node_config, dict):
        return []
    found: list[tuple[str, Any]] = []
    for key, inner in (("InstanceMarketOptions", "MarketType"), ("azure_arm_parameters", "priority")):
        section = node_config.get(key)
        if isinstance(section, dict) and inner in section:
            found.append((f"{key}.{inner}", section[inner]))
    scheduling = node_config.get("scheduling")
    for i, entry in enumerate(scheduling if isinstance(scheduling, list) else [scheduling]):
        where = f"scheduling[{i}]" if isinstance(scheduling, list) else "scheduling"
        if isinstance(entry, dict):
            found += [(f"{where}.{k}", entry[k]) for k in ("provisioningModel", "preemptible") if k in entry]
    return found


def vm_config_is_spot(node_config: Any) -> bool:
    """Whether a launcher ``node_config`` asks for spot/preemptible capacity (AWS, GCP including its
    legacy list form ``scheduling: [{preemptible: true}]``, or Azure's ``azure_arm_parameters.priority``),
    whatever the case it is spelt in (``vm_market_spelling`` says when a cloud would refuse that case)."""
    return any(
        value is True if name.endswith(".preemptible") else str(value).lower() == "spot"
        for name, value in _market_fields(node_config)
    )


def vm_market_spelling(node_config: Any) -> tuple[str, str] | None:
    """``(field, problem)`` where a launcher ``node_config`` spells its market in a case the cloud's API
    refuses (its enums are case-sensitive: EC2's ``MarketType`` is ``spot``, GCE's ``provisioningModel``
    ``SPOT`` or ``STANDARD``), else None."""
    for name, value in _market_fields(node_config):
        if not isinstance(value, str):
            continue
        if name.endswith(".MarketType") and value.lower() == "spot" and value != "spot":
            return name, f"{value!r}: EC2 takes 'spot' (lower case)"
        if name.endswith(".provisioningModel") and value.upper() in ("SPOT", "STANDARD") and value != value.upper():
            return name, f"{value!r}: Compute Engine takes {value.upper()!r} (upper case)"
    return None
