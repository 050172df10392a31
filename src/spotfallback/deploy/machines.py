"""Machine types whose size spotfallback knows: vCPUs and GPUs, as each cloud documents them.

A tier pinned to a machine smaller than one of its workers (``placement.instance_type``,
``--instance-type``) never gets a node that can hold a worker: the pods stay pending, or the
launcher starts nodes Ray can never place a worker on, and the run waits on that tier until its
capacity timeout. Such a pin is refused here, for the types listed; others are not checked.

Sources (vCPUs and GPUs per type): the Amazon EC2 User Guide's "Accelerated computing instances"
and "General purpose instances" tables; Google Cloud's "GPU machine types" and "General-purpose
machine family" pages; Microsoft Learn's NC- and ND-series size pages. The GPU families here are
also what ``pools.GPUS`` and the launcher's default fit choose from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    """One machine type: its cloud (``aws``, ``gcp``, ``azure``), vCPUs and whole GPUs."""

    provider: str
    vcpus: int
    gpus: int


def _family(provider: str, names: str, sizes: tuple[tuple[str, int, int], ...]) -> dict[str, Machine]:
    return {names.format(size): Machine(provider, cpus, gpus) for size, cpus, gpus in sizes}


# EC2's G families share one layout (g6e.16xlarge, like g5's, has 1 GPU to 64 vCPUs).
_G_SIZES = (("xlarge", 4, 1), ("2xlarge", 8, 1), ("4xlarge", 16, 1), ("8xlarge", 32, 1), ("12xlarge", 48, 4),
            ("16xlarge", 64, 1), ("24xlarge", 96, 4), ("48xlarge", 192, 8))  # fmt: skip
_A2_SIZES = (("1g", 12, 1), ("2g", 24, 2), ("4g", 48, 4), ("8g", 96, 8))

MACHINES: dict[str, Machine] = {
    **_family("aws", "m5.{}", tuple((s, c, 0) for s, c in (
        ("large", 2), ("xlarge", 4), ("2xlarge", 8), ("4xlarge", 16), ("8xlarge", 32), ("12xlarge", 48), ("16xlarge", 64),
        ("24xlarge", 96),
    ))),
    **_family("aws", "p2.{}", (("xlarge", 4, 1), ("8xlarge", 32, 8), ("16xlarge", 64, 16))),
    **_family("aws", "p3.{}", (("2xlarge", 8, 1), ("8xlarge", 32, 4), ("16xlarge", 64, 8))),
    **_family("aws", "{}.24xlarge", (("p3dn", 96, 8), ("p4d", 96, 8), ("p4de", 96, 8))),
    "p5.48xlarge": Machine("aws", 192, 8),
    **_family("aws", "g4dn.{}", (*_G_SIZES[:5], ("16xlarge", 64, 1), ("metal", 96, 8))),
    **_family("aws", "g5.{}", _G_SIZES),
    **_family("aws", "g6.{}", _G_SIZES),
    **_family("aws", "g6e.{}", _G_SIZES),
    **_family("gcp", "n2-standard-{}", tuple((str(c), c, 0) for c in (2, 4, 8, 16, 32, 48, 64, 80, 96, 128))),
    **_family("gcp", "a2-highgpu-{}", _A2_SIZES),
    **_family("gcp", "a2-ultragpu-{}", _A2_SIZES),
    "a2-megagpu-16g": Machine("gcp", 96, 16),
    **_family("gcp", "a3-highgpu-{}", (("1g", 26, 1), ("2g", 52, 2), ("4g", 104, 4), ("8g", 208, 8))),
    **_family("gcp", "a3-{}-8g", (("megagpu", 208, 8), ("edgegpu", 208, 8), ("ultragpu", 224, 8))),
    **_family("gcp", "g2-standard-{}", (("4", 4, 1), ("8", 8, 1), ("12", 12, 1), ("16", 16, 1), ("24", 24, 2), ("32", 32, 1),
                                        ("48", 48, 4), ("96", 96, 8))),
    **_family("azure", "Standard_{}", (
        ("NC6s_v3", 6, 1), ("NC12s_v3", 12, 2), ("NC24s_v3", 24, 4), ("NC24rs_v3", 24, 4), ("ND40rs_v2", 40, 8),
        ("ND96asr_v4", 96, 8), ("ND96amsr_A100_v4", 96, 8), ("ND96isr_H100_v5", 96, 8),
        ("NC24ads_A100_v4", 24, 1), ("NC48ads_A100_v4", 48, 2), ("NC96ads_A100_v4", 96, 4),
        ("NC40ads_H100_v5", 40, 1), ("NC80adis_H100_v5", 80, 2),
        ("NC4as_T4_v3", 4, 1), ("NC8as_T4_v3", 8, 1), ("NC16as_T4_v3", 16, 1), ("NC64as_T4_v3", 64, 4),
    )),
}  # fmt: skip
_BY_LOWER = {name.lower(): name for name in MACHINES}


def machine(name: str) -> Machine | None:
    """The size of a known machine type, or None."""
    return MACHINES.get(name)


def machine_spelling_error(name: str, where: str) -> str | None:
    """Why ``name`` would match no node although it names a known type in other case, or None:
    nodes carry the type as their cloud spells it, and label selectors are case-sensitive."""
    known = _BY_LOWER.get(name.lower())
    if known is None or known == name:
        return None
    return f"{where}: {name!r} is spelt {known!r} on the nodes' labels, which match case-sensitively; write {known!r}"


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


def machine_fit_error(name: str, cpu: float, gpus: int, where: str, *, kubernetes: bool) -> str | None:
    """Why one worker (``cpu`` CPUs, ``gpus`` GPUs) can never run on machine type ``name``, or None.

    On Kubernetes a pod cannot have the whole node: the kubelet keeps part of every node's CPU
    for the system, so a worker must ask for fewer CPUs than the machine has.
    """
    m = machine(name)
    if m is None:
        return None
    too_few_cpus = cpu >= m.vcpus if kubernetes and cpu > 0 else cpu > m.vcpus
    if gpus <= m.gpus and not too_few_cpus:
        return None
    room = f"fewer CPUs than its {m.vcpus} (the kubelet keeps part of every node)" if kubernetes else f"at most {m.vcpus} CPUs"
    larger = [n for n, o in MACHINES.items() if o.provider == m.provider and o.gpus >= gpus and
              (o.vcpus > cpu if kubernetes else o.vcpus >= cpu) and _family_of(n) == _family_of(name)]
    hint = f" (such as {min(larger, key=lambda n: (MACHINES[n].gpus, MACHINES[n].vcpus))!r})" if larger else ""
    return (
        f"{where}: {name!r} has {m.vcpus} vCPUs and {_gpus(m.gpus)}, and one worker asks for {cpu:g} CPUs and {_gpus(gpus)} "
        f"(resources_per_worker), so no worker would ever run there; name a larger type{hint}, or give each worker "
        + " and ".join(([room] if too_few_cpus else []) + ([f"at most {_gpus(m.gpus)}"] if gpus > m.gpus else []))
    )


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def _family_of(name: str) -> str:
    """``p3`` of ``p3.2xlarge``, ``a2-highgpu`` of ``a2-highgpu-8g``, ``Standard_NC_v3`` of ``Standard_NC6s_v3``."""
    if "." in name:
        return name.split(".", 1)[0]
    if name.lower().startswith("standard_"):
        series, _, version = name.partition("_")[2].rpartition("_")
        return "".join(ch for ch in series if not ch.isdigit()) + "_" + version
    return name.rsplit("-", 1)[0]
