"""Which machines each tier's pool is, in the words of each cloud and the cluster launcher.

A ladder of GPU pools (A100 spot in one zone, then L4 spot elsewhere, then A100 on-demand) only
works if each tier's pods can land on its own pool and nowhere else. The market and zone say too
little: two spot tiers in one zone are the same tier to Kubernetes. So each tier's pool is pinned
by what the cloud labels its nodes with:

- the GPU type, when the tier's Ray label selector names one (``ray.io/accelerator-type``, Ray's
  own names: ``A100``, ``L4``, ...), where the cloud labels nodes by GPU type: GKE's
  ``cloud.google.com/gke-accelerator``, Karpenter on EKS's ``karpenter.k8s.aws/instance-gpu-name``;
- the instance type (``placement.instance_type``), by the well-known
  ``node.kubernetes.io/instance-type``: the way on EKS managed node groups and AKS, which label
  no GPU type;
- whatever else the tier asks for (``placement.node_selector``, ``placement.tolerations``).

GPU pods tolerate the taints GPU pools commonly carry: ``nvidia.com/gpu`` (EKS GPU node groups
and NodePools, GKE's own GPU taint) and AKS's documented ``sku=gpu:NoSchedule``. For ``ray up``
the GPU type picks the instance family (``p4d``, ``g6``, ``a2-highgpu``, ...), sized like the
CPU tiers by the worker's CPUs and GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from spotfallback.config import Tier
from spotfallback.deploy.clouds import AGENT_CLOUD, K8sCloud, VmCloud
from spotfallback.deploy.common import worker_shape
from spotfallback.deploy.machines import (
    MACHINES,
    family,
    machine_fit_error,
    machine_spelling_error,
    sized,
    vm_holds_memory,
    vm_memory_error,
)
from spotfallback.errors import ConfigError

ACCELERATOR_LABEL = "ray.io/accelerator-type"
INSTANCE_TYPE_KEY = "node.kubernetes.io/instance-type"
GKE_ACCELERATOR_KEY = "cloud.google.com/gke-accelerator"
KARPENTER_GPU_NAME_KEY = "karpenter.k8s.aws/instance-gpu-name"
KARPENTER_GPU_MEMORY_KEY = "karpenter.k8s.aws/instance-gpu-memory"  # MiB per GPU
GPU_TAINT_KEY = "nvidia.com/gpu"
# Pods that use GPUs tolerate the taints GPU pools carry; a toleration without its taint is inert.
GPU_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
)
# The taint ``manifest nodepools`` puts on GPU NodePools, so CPU pods keep off GPU nodes.
GPU_NODE_TAINT = {"key": GPU_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
# The taint of the head's own NodePool, which only the Ray head tolerates: on Karpenter a node
# exists only if a pool allows it, and a GPU ladder's on-demand pool is tainted for GPU pods.
HEAD_NODE_TAINT = {"key": "spotfallback/head", "value": "true", "effect": "NoSchedule"}
HEAD_TOLERATION = {"key": HEAD_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Gpu:
    """One GPU type (Ray's name) as each target knows it; None where the target has none.

    ``aws`` / ``gcp``: (machine type, vCPUs, GPUs), smallest first, for ``ray up``'s default fit.
    ``gcp_guest``: GCP's accelerator type where GPUs are attached to an N1 VM instead.
    ``gke_series``: (machine series, GKE accelerator name) where a series of the same GPU
    carries another name than ``gke`` (A3 Mega's H100s are ``nvidia-h100-mega-80gb``).
    """

    gke: str | None
    karpenter: str | None
    aws: tuple[tuple[str, int, int], ...]
    gcp: tuple[tuple[str, int, int], ...] = ()
    gcp_guest: str | None = None
    karpenter_memory_mib: int | None = None
    gke_series: tuple[tuple[str, str], ...] = ()

    def gke_names(self) -> set[str]:
        """Every GKE accelerator name a node with this GPU may carry."""
        return {n for n in (self.gke, *(name for _, name in self.gke_series)) if n}

    def gke_name(self, machine: str | None) -> str | None:
        """The GKE accelerator name of the nodes of machine type ``machine`` (None: any series)."""
        return next((name for series, name in self.gke_series if machine and machine.startswith(series)), self.gke)


# The G families' 16xlarge (1 GPU to 64 vCPUs) is left out of the fit: a larger size with more
# GPUs comes first. g4dn's fit stops at 12xlarge (its metal size is a bare-metal host).
_G_FIT_WITHOUT = ("16xlarge",)


def _n1_guest(most_vcpus: dict[int, int]) -> tuple[tuple[str, int, int], ...]:
    """(N1 machine, vCPUs, GPUs attached) of each shape Compute Engine allows, fewest GPUs first:
    N1 VMs take a GPU type only in some counts, each with at most so many vCPUs ("GPU machine
    types", N1 general-purpose, https://cloud.google.com/compute/docs/gpus)."""
    return tuple((f"n1-standard-{c}", c, g) for g, most in sorted(most_vcpus.items())
                 for c in (4, 8, 16, 32, 64, 96) if c <= most)


# Ray's accelerator names (ray.util.accelerators) -> each target's. GKE: its accelerator names;
# Karpenter on EKS: instance-gpu-name, lowercase; AWS and GCP: the instance families with that GPU.
GPUS: dict[str, Gpu] = {
    "A100": Gpu("nvidia-tesla-a100", "a100", sized("p4d.24xlarge"), family("a2-highgpu-")),
    "A100-80G": Gpu("nvidia-a100-80gb", "a100", sized("p4de.24xlarge"), family("a2-ultragpu-"), karpenter_memory_mib=81920),
    "H100": Gpu("nvidia-h100-80gb", "h100", sized("p5.48xlarge"), sized("a3-highgpu-8g"),
                gke_series=(("a3-megagpu-", "nvidia-h100-mega-80gb"),)),
    "L4": Gpu("nvidia-l4", "l4", family("g6.", without=_G_FIT_WITHOUT), family("g2-standard-")),
    "A10G": Gpu(None, "a10g", family("g5.", without=_G_FIT_WITHOUT)),
    "L40S": Gpu(None, "l40s", family("g6e.", without=_G_FIT_WITHOUT)),
    "T4": Gpu("nvidia-tesla-t4", "t4", family("g4dn.", without=(*_G_FIT_WITHOUT, "metal")),
              _n1_guest({1: 48, 2: 48, 4: 96}), "nvidia-tesla-t4"),
    "V100": Gpu("nvidia-tesla-v100", "v100", family("p3."), _n1_guest({1: 12, 2: 24, 4: 48, 8: 96}), "nvidia-tesla-v100"),
}


# How each provider spells a machine type: a type of another cloud would pin the tier's pods (or
# node type) to machines that never exist there.
MACHINE_TYPE_FORMS: dict[str, tuple[re.Pattern[str], str]] = {
    "aws": (re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+"), "an EC2 instance type such as 'p4d.24xlarge'"),
    "gcp": (re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+"), "a Compute Engine machine type such as 'a2-highgpu-8g'"),
    "azure": (re.compile(r"(Standard|Basic)_[A-Za-z0-9_]+"), "an Azure VM size such as 'Standard_ND96asr_v4'"),
}


def machine_type_error(provider: str, value: str, where: str) -> str | None:
    """Why ``value`` cannot be a machine type of ``provider`` (aws, gcp, azure), or None."""
    pattern, form = MACHINE_TYPE_FORMS[provider]
    if pattern.fullmatch(value):
        return None
    return f"{where}: {value!r} is not {form}, so no {provider} node would ever match it; name one of {provider}'s"


def machine_error(provider: str, name: str, where: str, cpu: float, gpus: int, *, kubernetes: bool) -> str | None:
    """Why machine type ``name`` cannot hold one worker on ``provider``, or None: another cloud's
    spelling, a known type in other case, or a known machine smaller than one worker."""
    return (machine_type_error(provider, name, where) or machine_spelling_error(name, where)
            or machine_fit_error(name, cpu, gpus, where, kubernetes=kubernetes))


def pinned_machine_error(provider: str, tier: Tier, index: int, cpu: float, gpus: int, *, kubernetes: bool,
                         name: str | None = None, where: str | None = None) -> str | None:
    """Why machine type ``name`` (default: the tier's ``placement.instance_type``) cannot hold the
    tier's workers there, or None: ``machine_error``, or a machine of another GPU type than the
    one the tier's label selector names."""
    name = name or tier.placement.instance_type
    assert name is not None
    where = where or f"tiers[{index}].placement.instance_type"
    return (machine_error(provider, name, where, cpu, gpus, kubernetes=kubernetes)
            or _other_gpu_error(provider, tier, index, name, where))


def _other_gpu_error(provider: str, tier: Tier, index: int, name: str, where: str) -> str | None:
    """Why ``name`` contradicts the tier's GPU type, or None: a machine the GPU table files under
    another type only (its nodes would carry that type's labels, so a selector asking for both
    matches no node, and the label Ray schedules by would lie)."""
    named = tier_gpu(tier, index)
    if named is None or provider not in ("aws", "gcp"):
        return None
    wanted, kind = named
    owners = [g for g, k in GPUS.items() if name in {m for m, _, _ in (k.aws if provider == "aws" else k.gcp)}]
    if not owners or any(GPUS[g].karpenter == kind.karpenter for g in owners):  # A100 takes its 80 GB variant too
        return None
    return (f"{where}: {name!r} has {' or '.join(owners)} GPUs, and the tier's label_selector asks for "
            f"{ACCELERATOR_LABEL}: {wanted}, so no node would match both; name a machine with {wanted} GPUs "
            "or drop one of the two")


def tier_gpu(tier: Tier, index: int) -> tuple[str, Gpu] | None:
    """(Ray's name, its table entry) of the GPU type the tier's label selector names, if any."""
    name = tier.label_selector.get(ACCELERATOR_LABEL)
    if name is None:
        return None
    if name not in GPUS:
        raise ConfigError(
            f"tiers[{index}].label_selector.{ACCELERATOR_LABEL}: {name!r} is not a GPU type spotfallback can place; "
            f"use one of {', '.join(GPUS)} (Ray's names), or drop it and name the machines in tiers[{index}].placement"
        )
    return name, GPUS[name]


@dataclass(frozen=True)
class PoolSelection:
    """What pins a tier's pods to its pool on one Kubernetes cloud."""

    node_selector: dict[str, str]
    tolerations: list[dict[str, str]]


def k8s_pool(cloud: K8sCloud, tier: Tier, index: int) -> PoolSelection:
    """The node labels and tolerations of the tier's pool on ``cloud`` (beyond market and zone)."""
    cpu, gpus, _ = worker_shape(tier, index)
    gpu = gpus > 0
    selector: dict[str, str] = {}
    named = tier_gpu(tier, index)
    if named is not None:
        name, kind = named
        if cloud is K8sCloud.GKE and kind.gcp_guest and gpus > (most := max(c for _, _, c in kind.gcp)):
            raise ConfigError(
                f"tiers[{index}].resources_per_worker: {_n1_shapes(name, kind.gcp)} (GKE's {name} nodes are N1 VMs), "
                f"and one worker asks for {gpus}, so its pods would never schedule; give each worker at most {most} "
                "(and the tier more workers)"
            )
        if cloud is K8sCloud.GKE and kind.gke:
            # The series' own name where it has one (A3 Mega), or the one a node_selector picks among the GPU's.
            chosen = tier.placement.node_selector.get(GKE_ACCELERATOR_KEY)
            selector[GKE_ACCELERATOR_KEY] = (chosen if chosen in kind.gke_names()
                                             else kind.gke_name(tier.placement.instance_type) or kind.gke)
        elif cloud is K8sCloud.EKS_KARPENTER and kind.karpenter:
            selector[KARPENTER_GPU_NAME_KEY] = kind.karpenter
            if kind.karpenter_memory_mib:
                selector[KARPENTER_GPU_MEMORY_KEY] = str(kind.karpenter_memory_mib)
        elif not tier.placement.instance_type and not tier.placement.node_selector:
            raise ConfigError(
                f"tiers[{index}].placement: {cloud.value} nodes carry no label for the GPU type {name!r}, so its pods "
                f"could land on any GPU pool; name the pool's machines with placement.instance_type (e.g. the node "
                "group's instance type or VM size) or placement.node_selector"
            )
    if tier.placement.instance_type:
        if problem := pinned_machine_error(AGENT_CLOUD[cloud], tier, index, cpu, gpus, kubernetes=True):
            raise ConfigError(problem)
        selector[INSTANCE_TYPE_KEY] = tier.placement.instance_type
    for key, value in tier.placement.node_selector.items():
        if selector.get(key, value) != value:
            raise ConfigError(
                f"tiers[{index}].placement.node_selector.{key}: {value!r} contradicts {selector[key]!r}, which the "
                "tier's GPU type or instance type already requires; drop one"
            )
        selector[key] = value
    tolerations = [dict(t) for t in GPU_TOLERATIONS] if gpu else []
    tolerations += [t.as_pod_field() for t in tier.placement.tolerations if t.as_pod_field() not in tolerations]
    return PoolSelection(selector, tolerations)


def k8s_machine_types(cloud: K8sCloud, tier: Tier, index: int) -> tuple[str, ...]:
    """The machine types the tier's pods may land on, where the manifest says (none otherwise):
    its pinned instance type, or its GPU type's on Karpenter (EKS) and GKE."""
    selector = k8s_pool(cloud, tier, index).node_selector
    if INSTANCE_TYPE_KEY in selector:
        return (selector[INSTANCE_TYPE_KEY],)
    named = tier_gpu(tier, index)
    if named is None or named[1].gcp_guest and cloud is K8sCloud.GKE:
        return ()
    kind = named[1]
    if cloud is K8sCloud.EKS_KARPENTER:
        return tuple(name for name, _, _ in kind.aws)
    if cloud is K8sCloud.GKE:
        series = [s for s, name in kind.gke_series if name == selector.get(GKE_ACCELERATOR_KEY)]
        return (tuple(name for name in MACHINES if name.startswith(series[0])) if series
                else tuple(name for name, _, _ in kind.gcp))
    return ()


def vm_pool(cloud: VmCloud, tier: Tier, index: int, cpu: float, gpus: int, pinned: str | None = None,
            where: str | None = None) -> tuple[str | None, dict[str, Any]]:
    """(``ray up`` instance/machine type, extra ``node_config``) of the tier's pool: ``pinned``
    (named by ``where``, e.g. ``--instance-type``) or the tier's own ``placement.instance_type``,
    else the smallest machine of its GPU type that fits the worker. (None, {}) when none is
    named: the launcher's CPU/GPU default fit applies."""
    pinned = pinned or tier.placement.instance_type
    where = where or f"tiers[{index}].placement.instance_type"
    memory = worker_shape(tier, index)[2].get("memory", 0.0)
    if pinned and (problem := pinned_machine_error(cloud.value, tier, index, cpu, gpus, kubernetes=False, name=pinned,
                                                   where=where) or vm_memory_error(pinned, memory, gpus, cpu, where)):
        raise ConfigError(problem)
    named = tier_gpu(tier, index)
    if named is None:
        return pinned, {}
    name, kind = named
    if cloud is VmCloud.GCP and kind.gcp_guest:
        return _n1_pool(kind, name, index, cpu, gpus, memory, pinned, where)
    if pinned:
        return pinned, {}
    table = kind.aws if cloud is VmCloud.AWS else kind.gcp
    for machine, vcpus, count in table:
        if vcpus >= cpu and count >= gpus and vm_holds_memory(machine, memory):
            return machine, {}
    raise ConfigError(
        f"{where}: no {cloud.value} machine with {name} GPUs fits {cpu:g} CPUs{with_memory(memory)} and {gpus} GPUs per "
        f"worker{'' if table else f' ({cloud.value} has no {name})'}; name one"
    )


def with_memory(memory_bytes: float) -> str:
    """``, 2794 GiB of memory`` where a worker names its memory (resources_per_worker.memory)."""
    return f", {memory_bytes / 2**30:.5g} GiB of memory" if memory_bytes else ""


def _n1_pool(kind: Gpu, name: str, index: int, cpu: float, gpus: int, memory: float, pinned: str | None,
             where: str) -> tuple[str, dict[str, Any]]:
    """An N1 VM (``pinned``, else the smallest that fits) and the GPUs attached to it: the fewest
    that cover the worker, in a count N1 takes with that many vCPUs."""
    table = kind.gcp
    fits = [(m, c) for m, v, c in table
            if c >= gpus and v >= cpu and (pinned is None and vm_holds_memory(m, memory) or m == pinned)]
    if not fits and pinned and all(m != pinned for m, _, _ in table):  # an N1 shape not listed (highmem, ...)
        fits = [(pinned, c) for c in sorted({c for _, _, c in table}) if c >= gpus]
    if not fits:
        raise ConfigError(f"{where if pinned else f'tiers[{index}].resources_per_worker'}: {_n1_shapes(name, table)}, "
                          f"and one worker asks for {cpu:g} CPUs{with_memory(memory)} and {gpus} GPUs; give each worker fewer")
    machine, count = fits[0]
    return machine, {"guestAccelerators": [{"acceleratorType": kind.gcp_guest, "acceleratorCount": count}]}


def _n1_shapes(name: str, table: tuple[tuple[str, int, int], ...]) -> str:
    """What N1 VMs take of GPU type ``name``, in words: counts and the largest machine each allows."""
    largest = {c: max(((v, m) for m, v, k in table if k == c))[1] for c in sorted({c for _, _, c in table})}
    return f"N1 VMs take {name} GPUs only " + ", ".join(f"{c} (up to {m})" for c, m in largest.items())
