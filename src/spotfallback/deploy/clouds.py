"""How each cloud is told "spot" or "on-demand": the documented node labels, taints and
instance settings. One table per target, so a reviewer can check the keys in one place.

Kubernetes (node labels set by the cloud or its autoscaler):
- EKS + Karpenter: ``karpenter.sh/capacity-type: spot | on-demand | reserved``
- EKS managed node groups: ``eks.amazonaws.com/capacityType: SPOT | ON_DEMAND``
- AKS: spot pools carry the label *and* the taint ``kubernetes.azure.com/scalesetpriority=spot:NoSchedule``;
  regular pools carry neither, so on-demand means "not spot".
- GKE: spot nodes carry ``cloud.google.com/gke-spot: "true"`` (tainted with the same key where the
  pool is tainted); on-demand nodes do not, so on-demand means "not spot".
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
    GKE = "gke"


class VmCloud(StrEnum):
    AWS = "aws"
    GCP = "gcp"


KARPENTER_KEY = "karpenter.sh/capacity-type"
EKS_MANAGED_KEY = "eks.amazonaws.com/capacityType"
AKS_KEY = "kubernetes.azure.com/scalesetpriority"
GKE_KEY = "cloud.google.com/gke-spot"

# Node selectors that pick each market, where the cloud labels that market.
_SELECTOR_VALUES: dict[K8sCloud, tuple[str, dict[str, str]]] = {
    K8sCloud.EKS_KARPENTER: (KARPENTER_KEY, {SPOT: "spot", ON_DEMAND: "on-demand", "reserved": "reserved"}),
    K8sCloud.EKS_MANAGED: (EKS_MANAGED_KEY, {SPOT: "SPOT", ON_DEMAND: "ON_DEMAND"}),
    K8sCloud.AKS: (AKS_KEY, {SPOT: "spot"}),
    K8sCloud.GKE: (GKE_KEY, {SPOT: "true"}),
}
# Clouds whose spot nodes are tainted: spot pods tolerate it, everything else stays off.
_SPOT_TAINTS: dict[K8sCloud, dict[str, str]] = {
    K8sCloud.AKS: {"key": AKS_KEY, "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
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
        ("cloud.google.com/gke-preemptible", "true"),
    }
)
ON_DEMAND_NODE_LABELS: frozenset[tuple[str, str]] = frozenset(
    {(KARPENTER_KEY, "on-demand"), (EKS_MANAGED_KEY, "ON_DEMAND")}
)
SPOT_TAINT_KEYS: frozenset[str] = frozenset({AKS_KEY, GKE_KEY, "cloud.google.com/gke-preemptible"})


# terminationGracePeriodSeconds of spot worker pods that run the notice agent: how long a pod
# lives after its SIGTERM, which is the warning a pod gets. It must fit inside the cloud's
# notice, or the VM dies first. EKS: the spot notice is 2 minutes and Karpenter / the AWS node
# termination handler drain the node on it, so 90 s leaves a margin. AKS: the eviction notice is
# at least 30 s. GKE: graceful node shutdown of a Spot VM gives ordinary pods 15 s of its 30 s.
SPOT_GRACE_S: dict[K8sCloud, int] = {
    K8sCloud.EKS_KARPENTER: 90,
    K8sCloud.EKS_MANAGED: 90,
    K8sCloud.AKS: 25,
    K8sCloud.GKE: 15,
}


@dataclass(frozen=True)
class PodPlacement:
    """The pod-spec fields that put a pod on one market of one cloud."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    affinity: dict[str, Any] | None = None


def _not_spot(key: str, spot_value: str) -> dict[str, Any]:
    # NotIn also matches nodes without the label, which is how these clouds mark regular nodes.
    term = {"matchExpressions": [{"key": key, "operator": "NotIn", "values": [spot_value]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def pod_placement(cloud: K8sCloud, market: str, where: str = "market") -> PodPlacement:
    """Node selection for ``market`` on ``cloud``; ``where`` names the field in errors."""
    key, values = _SELECTOR_VALUES[cloud]
    if market in values:
        taint = _SPOT_TAINTS.get(cloud) if market == SPOT else None
        return PodPlacement({key: values[market]}, [dict(taint)] if taint else [])
    if market == ON_DEMAND:
        return PodPlacement(affinity=_not_spot(key, values[SPOT]))
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


def vm_config_is_spot(node_config: Any) -> bool:
    """Whether a launcher ``node_config`` asks for spot/preemptible capacity (AWS or GCP,
    including GCP's legacy list form ``scheduling: [{preemptible: true}]``)."""
    if not isinstance(node_config, dict):
        return False
    market = node_config.get("InstanceMarketOptions")
    if isinstance(market, dict) and str(market.get("MarketType", "")).lower() == "spot":
        return True
    scheduling = node_config.get("scheduling")
    entries = scheduling if isinstance(scheduling, list) else [scheduling]
    return any(
        isinstance(e, dict) and (e.get("preemptible") is True or str(e.get("provisioningModel", "")).upper() == "SPOT")
        for e in entries
    )
