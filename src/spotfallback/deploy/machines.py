"""Machine types whose size spotfallback knows: vCPUs, GPUs and memory, as each cloud documents them.

A tier pinned to a machine smaller than one of its workers (``placement.instance_type``,
``--instance-type``) never gets a node that can hold a worker: the pods stay pending, or the
launcher starts nodes Ray can never place a worker on, and the run waits on that tier until its
capacity timeout. Such a pin is refused here, for the types listed; others are not checked.

The small general-purpose types (EC2's burstable T2/T3/T3a, Compute Engine's E2 and shared-core
f1/g1, Azure's B-series and Dsv3) are here for the head: a Ray head on a type with less memory
than ``HEAD_MIN_MEMORY_GIB`` is refused (``head_machine_error``).

Sources (vCPUs, GPUs and memory per type): the Amazon EC2 User Guide's "Accelerated computing
instances" and "General purpose instances" tables; for g6, g6e and p5, which that guide predates,
the instance memory Karpenter's AWS provider lists from EC2's DescribeInstanceTypes
(``karpenter.k8s.aws/instance-memory``); Google Cloud's "GPU machine types" and "General-purpose
machine family" pages (their GB are 2^30 bytes); Microsoft Learn's NC- and ND-series, B-series
and Dsv3-series size pages. The GPU families here are also what ``pools.GPUS`` and the
launcher's default fit choose from.

What a Kubernetes node keeps from its pods (``node_keeps_mib``): GKE's "Plan node sizes" memory
reservations (as ``cluster-autoscaler/cloudprovider/gce/reserved.go`` computes them, GB read as
1000 MiB); the EKS-optimized AMI's ``11 MiB x maxPods + 255 MiB`` (nodeadm, ``bootstrap.sh``) and
Karpenter's 7.5% ``vmMemoryOverheadPercent``; AKS's "Node resource reservations" for Kubernetes
1.29 and later (the lesser of ``20 MB x maxPods + 50 MB`` and 25%); and the kubelet's
``memory.available<100Mi`` eviction threshold on all three.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from spotfallback.deploy.clouds import K8sCloud


@dataclass(frozen=True)
class Machine:
    """One machine type: its cloud (``aws``, ``gcp``, ``azure``), vCPUs, whole GPUs and memory (GiB)."""

    provider: str
    vcpus: int
    gpus: int
    memory_gib: float


def _family(provider: str, names: str, sizes: tuple[tuple[str, int, int, float], ...]) -> dict[str, Machine]:
    return {names.format(size): Machine(provider, cpus, gpus, mem) for size, cpus, gpus, mem in sizes}


# EC2's G families share one CPU/GPU layout (g6e.16xlarge, like g5's, has 1 GPU to 64 vCPUs);
# g4dn, g5 and g6 have 4 GiB per vCPU, g6e twice that.
_G_SIZES = (("xlarge", 4, 1), ("2xlarge", 8, 1), ("4xlarge", 16, 1), ("8xlarge", 32, 1), ("12xlarge", 48, 4),
            ("16xlarge", 64, 1), ("24xlarge", 96, 4), ("48xlarge", 192, 8))  # fmt: skip


def _g(gib_per_vcpu: int) -> tuple[tuple[str, int, int, float], ...]:
    return tuple((size, cpus, gpus, cpus * gib_per_vcpu) for size, cpus, gpus in _G_SIZES)


def _a2(gib_per_gpu: int) -> tuple[tuple[str, int, int, float], ...]:
    return tuple((f"{g}g", 12 * g, g, gib_per_gpu * g) for g in (1, 2, 4, 8))


# EC2's T3 and T3a sizes (T2's nano to small have 1 vCPU): (size, vCPUs, memory GiB).
_T_SIZES = (("nano", 2, 0.5), ("micro", 2, 1), ("small", 2, 2), ("medium", 2, 4), ("large", 2, 8), ("xlarge", 4, 16),
            ("2xlarge", 8, 32))  # fmt: skip


def _cpu_only(sizes: tuple[tuple[str, int, float], ...]) -> tuple[tuple[str, int, int, float], ...]:
    return tuple((size, cpus, 0, mem) for size, cpus, mem in sizes)


MACHINES: dict[str, Machine] = {
    **_family("aws", "m5.{}", tuple((s, c, 0, 4 * c) for s, c in (
        ("large", 2), ("xlarge", 4), ("2xlarge", 8), ("4xlarge", 16), ("8xlarge", 32), ("12xlarge", 48), ("16xlarge", 64),
        ("24xlarge", 96),
    ))),
    **_family("aws", "p2.{}", (("xlarge", 4, 1, 61), ("8xlarge", 32, 8, 488), ("16xlarge", 64, 16, 732))),
    **_family("aws", "p3.{}", (("2xlarge", 8, 1, 61), ("8xlarge", 32, 4, 244), ("16xlarge", 64, 8, 488))),
    **_family("aws", "{}.24xlarge", (("p3dn", 96, 8, 768), ("p4d", 96, 8, 1152), ("p4de", 96, 8, 1152))),
    "p5.48xlarge": Machine("aws", 192, 8, 2048),
    **_family("aws", "g4dn.{}", (*_g(4)[:5], ("16xlarge", 64, 1, 256), ("metal", 96, 8, 384))),
    **_family("aws", "g5.{}", _g(4)),
    **_family("aws", "g6.{}", _g(4)),
    **_family("aws", "g6e.{}", _g(8)),
    **_family("aws", "t2.{}", _cpu_only(tuple((s, 1 if m < 4 else c, m) for s, c, m in _T_SIZES))),
    **_family("aws", "t3.{}", _cpu_only(_T_SIZES)),
    **_family("aws", "t3a.{}", _cpu_only(_T_SIZES)),
    **_family("gcp", "n2-standard-{}", tuple((str(c), c, 0, 4 * c) for c in (2, 4, 8, 16, 32, 48, 64, 80, 96, 128))),
    **_family("gcp", "e2-{}", _cpu_only((("micro", 2, 1), ("small", 2, 2), ("medium", 2, 4)))),
    **_family("gcp", "e2-standard-{}", tuple((str(c), c, 0, 4 * c) for c in (2, 4, 8, 16, 32))),
    **_family("gcp", "{}", _cpu_only((("f1-micro", 1, 0.6), ("g1-small", 1, 1.7)))),
    **_family("gcp", "a2-highgpu-{}", _a2(85)),
    **_family("gcp", "a2-ultragpu-{}", _a2(170)),
    "a2-megagpu-16g": Machine("gcp", 96, 16, 1360),
    **_family("gcp", "a3-highgpu-{}", (("1g", 26, 1, 234), ("2g", 52, 2, 468), ("4g", 104, 4, 936), ("8g", 208, 8, 1872))),
    **_family("gcp", "a3-{}-8g", (("megagpu", 208, 8, 1872), ("edgegpu", 208, 8, 1872), ("ultragpu", 224, 8, 2952))),
    **_family("gcp", "g2-standard-{}", tuple((str(c), c, g, 4 * c) for c, g in (
        (4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8),
    ))),
    **_family("azure", "Standard_{}", (
        ("NC6s_v3", 6, 1, 112), ("NC12s_v3", 12, 2, 224), ("NC24s_v3", 24, 4, 448), ("NC24rs_v3", 24, 4, 448),
        ("ND40rs_v2", 40, 8, 672), ("ND96asr_v4", 96, 8, 900), ("ND96amsr_A100_v4", 96, 8, 1900),
        ("ND96isr_H100_v5", 96, 8, 1900), ("NC24ads_A100_v4", 24, 1, 220), ("NC48ads_A100_v4", 48, 2, 440),
        ("NC96ads_A100_v4", 96, 4, 880), ("NC40ads_H100_v5", 40, 1, 320), ("NC80adis_H100_v5", 80, 2, 640),
        ("NC4as_T4_v3", 4, 1, 28), ("NC8as_T4_v3", 8, 1, 56), ("NC16as_T4_v3", 16, 1, 110), ("NC64as_T4_v3", 64, 4, 440),
    )),
    **_family("azure", "Standard_{}", _cpu_only((
        ("B1ls", 1, 0.5), ("B1s", 1, 1), ("B1ms", 1, 2), ("B2s", 2, 4), ("B2ms", 2, 8), ("B4ms", 4, 16), ("B8ms", 8, 32),
        ("D2s_v3", 2, 8), ("D4s_v3", 4, 16), ("D8s_v3", 8, 32), ("D16s_v3", 16, 64), ("D32s_v3", 32, 128),
    ))),
}  # fmt: skip
_BY_LOWER = {name.lower(): name for name in MACHINES}


def machine(name: str) -> Machine | None:
    """The size of a known machine type, or None."""
    return MACHINES.get(name)


# The least memory a Ray head node may have: the smallest head of Ray's own cluster-launcher examples
# (``python/ray/autoscaler/{aws,gcp,azure}/example-full.yaml``: AWS m5.large and Azure Standard_D2s_v3,
# 8 GiB; GCP n1-standard-2, 7.5 GB). The head runs the GCS, the dashboard, the autoscaler and the job
# driver with Ray Train's controller; Ray's "Best practices for deploying large clusters" calls
# 8 CPUs and 32 GB "a good starting hardware specification for the head node" of a large cluster.
HEAD_MIN_MEMORY_GIB = 7.5


def head_machine_error(name: str, where: str, default: str | None = None) -> str | None:
    """``head_machine_problem``, prefixed with the field it was found in."""
    problem = head_machine_problem(name, default)
    return None if problem is None else f"{where}: {problem}"


def head_machine_problem(name: str, default: str | None = None) -> str | None:
    """Why machine type ``name`` is too small for a Ray head node, or None (also for a type the
    catalog does not know: its memory is not guessed). An error, not a note: the head's processes
    alone fill such a machine, so the cluster never comes up or its head dies with the run.
    ``default``: the type used when none is named, offered as a fix too."""
    m = machine(name)
    if m is None or m.memory_gib >= HEAD_MIN_MEMORY_GIB:
        return None
    fits = [n for n, o in MACHINES.items() if o.provider == m.provider and not o.gpus and o.memory_gib >= HEAD_MIN_MEMORY_GIB]
    # The smallest that fits of the type's family (t2.large for t2.micro), else of its series (e2-standard-2
    # for e2-micro), else of its cloud.
    series = re.split(r"[.-]", name, maxsplit=1)[0]
    same = [n for n in fits if _family_of(n) == _family_of(name)] or [n for n in fits if n.startswith(series)] or fits
    larger = min(same, key=lambda n: (MACHINES[n].vcpus, MACHINES[n].memory_gib), default=None)
    hint = f" (such as {larger!r})" if larger else ""
    otherwise = f", or leave it out for the default {default!r}" if default else ""
    return (f"{name!r} has {m.memory_gib:g} GiB of memory, too little for a Ray head node, which runs the GCS, "
            f"the dashboard, the autoscaler and the job driver; name a type with at least {HEAD_MIN_MEMORY_GIB:g} GiB"
            f"{hint}{otherwise}")


def machine_spelling(name: str) -> str | None:
    """Why ``name`` would match no node although it names a known type in other case, or None:
    nodes carry the type as their cloud spells it, and label selectors are case-sensitive."""
    known = _BY_LOWER.get(name.lower())
    if known is None or known == name:
        return None
    return f"{name!r} is spelt {known!r} on the nodes' labels, which match case-sensitively; write {known!r}"


def machine_spelling_error(name: str, where: str) -> str | None:
    """``machine_spelling``, prefixed with the field it was found in."""
    problem = machine_spelling(name)
    return None if problem is None else f"{where}: {problem}"


def sized(*names: str) -> tuple[tuple[str, int, int], ...]:
    """(name, vCPUs, GPUs) of known machine types, in the order given (a default fit's table)."""
    return tuple((name, MACHINES[name].vcpus, MACHINES[name].gpus) for name in names)


def family(prefix: str, *, without: tuple[str, ...] = ()) -> tuple[tuple[str, int, int], ...]:
    """(name, vCPUs, GPUs) of the known types named ``prefix`` + a size, smallest first as listed
    above, less the sizes in ``without``: a default fit's table, from the one catalog."""
    names = [n for n in MACHINES if n.startswith(prefix) and n[len(prefix):] not in without]
    if not names:
        raise KeyError(f"no known machine type starts with {prefix!r}")
    return sized(*names)


def machine_fit_error(name: str, cpu: float, gpus: int, where: str, *, kubernetes: bool, beside_cpu: float = 0.0,
                      beside: str = "") -> str | None:
    """Why one worker (``cpu`` CPUs, ``gpus`` GPUs) can never run on machine type ``name``, or None.
    ``beside_cpu``: the CPUs of the pod's sidecar, which ``beside`` names (its requests add to the worker's).

    On Kubernetes a pod cannot have the whole node: the kubelet keeps part of every node's CPU
    for the system, so a worker must ask for fewer CPUs than the machine has.
    """
    m = machine(name)
    if m is None:
        return None
    too_few_cpus = _cpus_short(m, cpu + beside_cpu, kubernetes=kubernetes)
    if gpus <= m.gpus and not too_few_cpus:
        return None
    kept = "the kubelet keeps part of every node"
    room = ((f"fewer CPUs than {m.vcpus - beside_cpu:g} (its {m.vcpus} less {beside}; {kept})" if beside_cpu
             else f"fewer CPUs than its {m.vcpus} ({kept})") if kubernetes else f"at most {m.vcpus} CPUs")
    hint = _larger(name, lambda o: o.gpus >= gpus and not _cpus_short(o, cpu + beside_cpu, kubernetes=kubernetes))
    return (
        f"{where}: {name!r} has {m.vcpus} vCPUs and {_gpus(m.gpus)}, and one worker asks for {cpu:g} CPUs and {_gpus(gpus)} "
        f"(resources_per_worker){f' beside {beside}' if beside_cpu else ''}, so no worker would ever run there; name a "
        f"larger type{hint}, or give each worker "
        + " and ".join(([room] if too_few_cpus else []) + ([f"at most {_gpus(m.gpus)}"] if gpus > m.gpus else []))
    )


# What every Kubernetes node keeps from its pods, beyond the cloud's own reservation.
EVICTION_MIB = 100  # the kubelet's memory.available<100Mi hard-eviction threshold
_GKE_BANDS_MIB = ((4000, 0.25), (8000, 0.20), (16000, 0.10), (128000, 0.06), (math.inf, 0.02))  # GB read as 1000 MiB
_EKS_RESERVED_MIB = 255  # plus 11 MiB for each pod the type may run, which depends on its network interfaces
_KARPENTER_VM_OVERHEAD = 0.075  # Karpenter's vmMemoryOverheadPercent: memory it never counts on
_AKS_RESERVED_MB = 20 * 30 + 50  # 20 MB x maxPods + 50 MB at the fewest pods AKS defaults to (legacy Azure CNI: 30)


def node_keeps_mib(cloud: K8sCloud, memory_gib: float) -> float:
    """The least memory (MiB) a Kubernetes node of ``memory_gib`` keeps from pods on ``cloud``.

    The cloud's documented kube-reserved plus the eviction threshold: a lower bound, since the
    kernel takes its share before the kubelet counts the node's capacity, so a worker refused
    here can never schedule, and one allowed may still find the node a little short.
    """
    total = memory_gib * 1024
    if cloud is K8sCloud.GKE:
        kept, low = (255.0 if total < 1000 else 0.0), 0.0  # a node under 1 GB keeps 255 MiB
        for high, share in _GKE_BANDS_MIB if not kept else ():
            kept += share * max(0.0, min(total, high) - low)
            low = high
    elif cloud in (K8sCloud.EKS_MANAGED, K8sCloud.EKS_KARPENTER):
        overhead = math.ceil(total * _KARPENTER_VM_OVERHEAD) if cloud is K8sCloud.EKS_KARPENTER else 0
        kept = overhead + _EKS_RESERVED_MIB
    else:
        kept = min(_AKS_RESERVED_MB * 1e6 / 2**20, 0.25 * total)
    return kept + EVICTION_MIB


def machine_memory_error(name: str, memory_bytes: float, cpu: float, gpus: int, cloud: K8sCloud, where: str,
                         why: str = "", beside_bytes: float = 0.0) -> str | None:
    """Why a worker pod asking for ``memory_bytes`` (and ``beside_bytes`` for its other containers)
    can never schedule on a node of type ``name``, or None.

    ``why``: how the ask came about, when the user did not write it all (the default per CPU).
    """
    m = machine(name)
    if m is None:
        return None
    ask, room = (memory_bytes + beside_bytes) / 2**20, _pod_room_mib(m, cloud)
    if not _memory_short(m, cloud, ask):
        return None
    hint = _larger(name, lambda o: o.gpus >= gpus and not _cpus_short(o, cpu, kubernetes=True)
                   and not _memory_short(o, cloud, ask))
    most = math.floor((room - beside_bytes / 2**20) / 1024)
    return (
        f"{where}: one worker asks for {ask / 1024:.4g} GiB of memory{why}, and {name!r} has {m.memory_gib:g} GiB, of which "
        f"{_a(cloud.value)} node keeps at least {(m.memory_gib * 1024 - room) / 1024:.2g} GiB for the kubelet and evictions, "
        f"so the pods would never schedule; give each worker at most {most} GiB (resources_per_worker.memory, in bytes: "
        f"{most * 2**30}), or name a larger type{hint}"
    )


def vm_holds_memory(name: str, memory_bytes: float) -> bool:
    """Whether a VM of type ``name`` has ``memory_bytes`` for one worker (a type outside the catalog
    is taken to). The launcher's node types advertise the workers' memory to Ray as declared, so a
    worker asking for more than the machine has would be placed there and run out of memory."""
    m = machine(name)
    return m is None or _holds(m, memory_bytes)


def _holds(m: Machine, memory_bytes: float) -> bool:
    return memory_bytes <= m.memory_gib * 2**30


def vm_memory_error(name: str, memory_bytes: float, gpus: int, cpu: float, where: str) -> str | None:
    """Why a VM of type ``name`` can never hold a worker asking for ``memory_bytes``, or None."""
    if vm_holds_memory(name, memory_bytes):
        return None
    m = MACHINES[name]
    hint = _larger(name, lambda o: o.gpus >= gpus and o.vcpus >= cpu and _holds(o, memory_bytes))
    return (f"{where}: one worker asks for {memory_bytes / 2**30:.5g} GiB of memory, and {name!r} has {m.memory_gib:g} GiB, "
            f"so no worker would ever fit there; give each worker at most {m.memory_gib:g} GiB (resources_per_worker.memory, "
            f"in bytes: {int(m.memory_gib * 2**30)}), or name a larger type{hint}")


def pod_shortfall(name: str, cpu: float, gpus: float, memory_bytes: float, cloud: K8sCloud) -> list[str] | None:
    """What of one pod's requests a Kubernetes node of type ``name`` can never give (empty if
    it fits), or None for a type outside the catalog."""
    m = machine(name)
    if m is None:
        return None
    short = []
    if _cpus_short(m, cpu, kubernetes=True):
        short.append(f"{cpu:g} CPUs, not fewer than the node's {m.vcpus} vCPUs (the kubelet keeps part of every node)")
    if gpus > m.gpus:
        short.append(f"{gpus:g} GPUs, more than its {_gpus(m.gpus)}")
    room = _pod_room_mib(m, cloud)
    if _memory_short(m, cloud, memory_bytes / 2**20):
        short.append(f"{memory_bytes / 2**30:.4g} GiB of memory, more than the {room / 1024:.4g} GiB {_a(cloud.value)} node "
                     f"of {m.memory_gib:g} GiB leaves to pods")
    return short


def _pod_room_mib(m: Machine, cloud: K8sCloud) -> float:
    return m.memory_gib * 1024 - node_keeps_mib(cloud, m.memory_gib)


def _cpus_short(m: Machine, cpu: float, *, kubernetes: bool) -> bool:
    """Whether ``cpu`` CPUs can never be had on ``m``: all of its vCPUs at most on a VM, fewer
    than all on a Kubernetes node, whose kubelet keeps part of every node's CPU."""
    return cpu >= m.vcpus if kubernetes and cpu > 0 else cpu > m.vcpus


def _memory_short(m: Machine, cloud: K8sCloud, ask_mib: float) -> bool:
    """Whether a pod asking for ``ask_mib`` can never have it on a ``cloud`` node of type ``m``."""
    return ask_mib > _pod_room_mib(m, cloud)


def _larger(name: str, fits: Callable[[Machine], bool]) -> str:
    """`` (such as 'p3.16xlarge')``: the smallest type of ``name``'s family that ``fits``, or ''."""
    m = MACHINES[name]
    larger = [n for n, o in MACHINES.items() if o.provider == m.provider and _family_of(n) == _family_of(name) and fits(o)]
    return f" (such as {min(larger, key=lambda n: (MACHINES[n].gpus, MACHINES[n].vcpus, MACHINES[n].memory_gib))!r})" if larger else ""


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def _family_of(name: str) -> str:
    """``p3`` of ``p3.2xlarge``, ``a2-highgpu`` of ``a2-highgpu-8g``, ``Standard_NC_v3`` of ``Standard_NC6s_v3``."""
    if "." in name:
        return name.split(".", 1)[0]
    if name.lower().startswith("standard_"):
        size = name.partition("_")[2]
        series, _, version = size.rpartition("_") if "_" in size else (size, "", "")
        return "".join(ch for ch in series if not ch.isdigit()) + "_" + version
    return name.rsplit("-", 1)[0]


# --- GCP accelerator-optimized series: boot disk and network interface --------------------------
#
# A GCE instance whose boot disk names no diskType gets pd-standard (the Compute API's
# AttachedDiskInitializeParams.diskType: "If not specified, the default is pd-standard";
# https://cloud.google.com/compute/docs/reference/rest/v1/instances), which newer series refuse,
# so the VM is never created. Boot disk types per series: "Supported disk types for ..." on
# https://cloud.google.com/compute/docs/accelerator-optimized-machines (Hyperdisk ML, Throughput and
# Extreme are left out: "Hyperdisk Balanced and Hyperdisk Balanced High Availability are the only
# Hyperdisk types you can use as a boot disk",
# https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced-ha). gVNIC: "gVNIC replaces
# VirtIO-Net as the only supported network interface in Compute Engine for all new machine types
# (Generation 3 and onwards)", https://cloud.google.com/compute/docs/instances/create-vm-with-gvnic;
# A2 and G2 (generation 2) also take VirtIO-Net. N1 and N2 are not listed: their file keeps the API's
# default disk and NIC, as before.
GCP_DISK_TYPE_DEFAULT = "pd-standard"
GVNIC = "GVNIC"
_PD_BOOT = ("pd-balanced", "pd-ssd")
_HYPERDISK_BOOT = ("hyperdisk-balanced", "hyperdisk-balanced-high-availability")


@dataclass(frozen=True)
class GcpSeries:
    """What a GCP machine series needs of a ``node_config``: ``boot_disks`` are the boot disk types
    it takes (the launcher writes the first), ``gvnic`` whether gVNIC is its only network interface."""

    name: str
    boot_disks: tuple[str, ...]
    gvnic: bool


_A3_PD = (*_PD_BOOT, *_HYPERDISK_BOOT)  # A3 High, Mega and Edge: no pd-standard
_HYPERDISK_ONLY = ("hyperdisk-balanced",)  # "the only disk type that is supported for the boot disk"
GCP_SERIES: dict[str, GcpSeries] = {
    "a3-highgpu": GcpSeries("A3 High", _A3_PD, gvnic=True),
    "a3-megagpu": GcpSeries("A3 Mega", _A3_PD, gvnic=True),
    "a3-edgegpu": GcpSeries("A3 Edge", _A3_PD, gvnic=True),
    "a3-ultragpu": GcpSeries("A3 Ultra", _HYPERDISK_ONLY, gvnic=True),
    "a4-highgpu": GcpSeries("A4", _HYPERDISK_ONLY, gvnic=True),
    "a4x-highgpu": GcpSeries("A4X", _HYPERDISK_ONLY, gvnic=True),
    "g4-standard": GcpSeries("G4", _HYPERDISK_ONLY, gvnic=True),
    "a2-highgpu": GcpSeries("A2 Standard", (*_PD_BOOT, GCP_DISK_TYPE_DEFAULT), gvnic=False),
    "a2-megagpu": GcpSeries("A2 Standard", (*_PD_BOOT, GCP_DISK_TYPE_DEFAULT), gvnic=False),
    "a2-ultragpu": GcpSeries("A2 Ultra", (*_PD_BOOT, GCP_DISK_TYPE_DEFAULT), gvnic=False),
    "g2-standard": GcpSeries("G2", _PD_BOOT, gvnic=False),  # "pd-standard isn't supported"
}


def gcp_series(machine_type: str) -> GcpSeries | None:
    """The series of a GCE machine type (a name, or a URL ending in one) whose boot disk or NIC is
    constrained, or None."""
    name = machine_type.rsplit("/", 1)[-1]
    return next((s for prefix, s in GCP_SERIES.items() if name.startswith(prefix + "-")), None)


# Machine types built for training across nodes: their GPUs reach other nodes' through a fabric
# that the node's own configuration must set up (EC2: an EFA interface on each network card;
# Compute Engine: GPUDirect's extra GPU network interfaces), with NCCL's plugin for it in the
# image. Without it NCCL between nodes runs over TCP on the primary interface, a fraction of the
# bandwidth the type is built for. Sources: the Amazon EC2 User Guide's "Elastic Fabric Adapter"
# (supported instance types) and Google Cloud's GPU network bandwidth pages for A3, A4 and A4X.
_EFA_FAMILIES = ("p3dn.", "p4d.", "p4de.", "p5.", "p5e.", "p5en.", "p6-")
_GCP_FABRICS = {
    "a3-highgpu-8g": "GPUDirect-TCPX", "a3-edgegpu-8g": "GPUDirect-TCPX", "a3-megagpu-8g": "GPUDirect-TCPXO",
    "a3-ultragpu-8g": "GPUDirect RDMA", "a4-highgpu-8g": "GPUDirect RDMA", "a4x-highgpu-4g": "GPUDirect RDMA",
}  # fmt: skip


def gpu_fabric(machine_type: str) -> str | None:
    """The inter-node GPU fabric a machine type is built for (``EFA``, ``GPUDirect-TCPX`` ...), or None."""
    name = machine_type.rsplit("/", 1)[-1]
    if name.startswith(_EFA_FAMILIES):
        return "EFA"
    return _GCP_FABRICS.get(name)
