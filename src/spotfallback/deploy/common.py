"""Pieces every generator shares: names, images, Ray node labels, resource quantities.

Pure functions of the validated configuration; each error names the field or option to fix.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from spotfallback import __version__
from spotfallback.config import MARKET_LABEL, JobConfig, Tier, run_name_error
from spotfallback.deploy.machines import HEAD_MIN_MEMORY_GIB
from spotfallback.errors import ConfigError

# Ray version the generated files pin; the image must carry the same Ray as `rayVersion`.
DEFAULT_RAY_VERSION = "2.60.0"
DEFAULT_PYTHON_TAG = "py311"

ZONE_LABEL = "ray.io/availability-zone"
REGION_LABEL = "ray.io/availability-region"
# The labels every generated Kubernetes object carries, so that `kubectl ... -l` finds what belongs
# together: who made it, its run, and in a ladder across clusters which cluster's document it is.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
RUN_LABEL = "spotfallback/run"
CLUSTER_LABEL = "spotfallback/cluster"

# Docker/OCI image reference grammar (distribution/reference), without the length quirks.
_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_RE = re.compile(
    rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_DNS1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def default_image(use_gpu: bool, ray_version: str = DEFAULT_RAY_VERSION) -> str:
    """The upstream Ray image matching ``rayVersion``; it must also contain spotfallback and the
    training code (build FROM it, or pass ``pip`` packages to install at start)."""
    suffix = "-gpu" if use_gpu else ""
    return f"rayproject/ray:{ray_version}-{DEFAULT_PYTHON_TAG}{suffix}"


# Ray's own images (rayproject/ray, as on Docker Hub): Ray and Python, no spotfallback.
STOCK_IMAGE_REPOSITORIES = ("rayproject/ray", "docker.io/rayproject/ray", "docker.io/library/rayproject/ray")


def _repository_and_tag(image: str) -> tuple[str, str]:
    """An image reference's repository and tag ("" when none), its digest left out. A colon counts
    as a tag only in the last path component: ``localhost:5000/ray`` names a registry's port."""
    reference = image.split("@", 1)[0]
    head, _, last = reference.rpartition("/")
    name, _, tag = last.partition(":")
    return (f"{head}/{name}" if head else name), tag


def is_stock_image(image: str | None) -> bool:
    """Whether ``image`` (None: the default) is Ray's own image, which has no spotfallback in it."""
    return image is None or _repository_and_tag(image)[0].lower() in STOCK_IMAGE_REPOSITORIES


def names_spotfallback(requirement: str) -> bool:
    """Whether a pip argument installs spotfallback (a requirement, a wheel or a source URL)."""
    name = re.split(r"[\[<>=!~;@ ]", requirement.strip(), maxsplit=1)[0]
    return name.lower().replace("_", "-") == "spotfallback" or "spotfallback" in requirement.lower().rsplit("/", 1)[-1]


def installs_spotfallback(image: str | None, pip: Sequence[str]) -> bool:
    """Whether the nodes get spotfallback only from the pip packages we add: a stock image and none of ``pip`` names it."""
    return is_stock_image(image) and not any(names_spotfallback(p) for p in pip)


# The extra each shipped example needs beyond spotfallback itself: the stock Ray image has
# neither torch nor tensorflow (the digits they train on ship with spotfallback).
EXAMPLE_EXTRAS = {"spotfallback.examples.ddp_digits": "torch", "spotfallback.examples.keras_digits": "tensorflow"}


def spotfallback_requirement(entrypoint: str | None = None) -> str:
    """This release of spotfallback as a pip requirement, with the extra that ``entrypoint``
    needs when it is one of the shipped examples (``spotfallback init``'s job runs one)."""
    extra = EXAMPLE_EXTRAS.get((entrypoint or "").split(":", 1)[0])
    return f"spotfallback{f'[{extra}]' if extra else ''}=={__version__}"


def with_spotfallback(image: str | None, pip: Sequence[str], entrypoint: str | None = None) -> list[str]:
    """``pip``, plus this version of spotfallback when the stock image would otherwise lack it
    (the driver's `spotfallback run` and the notice agent would not be found there)."""
    return [spotfallback_requirement(entrypoint), *pip] if installs_spotfallback(image, pip) else list(pip)


def image_error(image: str) -> str | None:
    """Why ``image`` is not a usable container image reference, or None."""
    if not image or len(image) > 512 or not _IMAGE_RE.fullmatch(image):
        return (
            f"{image!r} is not a container image reference such as 'rayproject/ray:2.60.0-py311' "
            "or 'registry.example.com:5000/team/train@sha256:...' (no spaces, lowercase repository)"
        )
    return None


def check_image(image: str, ray_version: str = DEFAULT_RAY_VERSION) -> str:
    """``image``, or ConfigError: not an image reference, or Ray's own image of another Ray release than
    the files pin (a head and workers of another release than ``rayVersion`` fail to join, or join a
    cluster its autoscaler does not understand)."""
    problem = image_error(image)
    if problem:
        raise ConfigError(f"image: {problem}")
    tag = _repository_and_tag(image)[1]
    release = re.match(r"\d+\.\d+\.\d+", tag)
    if is_stock_image(image) and release is not None and release.group() != ray_version:
        raise ConfigError(f"image: {image!r} carries Ray {release.group()}, but the files pin Ray {ray_version} (rayVersion, "
                          f"the driver's own); use {default_image('gpu' in tag, ray_version)!r} or an image built FROM it")
    return image


def is_dns1035_label(name: str, max_len: int = 63) -> bool:
    return len(name) <= max_len and bool(_DNS1035_RE.fullmatch(name))


def k8s_name(run_name: str, max_len: int) -> str:
    """A DNS-1035 object name for ``run_name``; a short hash keeps distinct run names distinct
    whenever lowercasing, replacing characters or truncating loses information."""
    base = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")
    if not base or not base[0].isalpha():
        base = f"run-{base}".rstrip("-")
    if base == run_name and len(base) <= max_len:
        return base
    digest = hashlib.sha256(run_name.encode()).hexdigest()[:6]
    return f"{base[: max_len - len(digest) - 1].rstrip('-')}-{digest}"


def label_value(name: str) -> str:
    """A run's or cluster's name as the value of its label (a label value holds at most 63 characters)."""
    return k8s_name(name, 63)


def unique_run_name(base: str, *, now: datetime | None = None, token: str | None = None) -> str:
    """``base`` plus a UTC timestamp and a random token: a run name nobody has used before,
    for when a fresh run (not a resume) is meant."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    suffix = f"-{stamp}-{token or secrets.token_hex(2)}"
    return base[: 128 - len(suffix)] + suffix


def with_run_name(job: JobConfig, run_name: str | None) -> JobConfig:
    """``job`` under another run name (same rules as JobConfig.name)."""
    if run_name is None or run_name == job.name:
        return job
    problem = run_name_error(run_name)
    if problem:
        raise ConfigError(f"name: {problem}")
    return job.model_copy(update={"name": run_name})


def tier_labels(tier: Tier, index: int) -> dict[str, str]:
    """The Ray node labels a tier's nodes must carry so the tier's label selector matches them.

    A node has one value per label, so selector sets (``in(a,b)``) and negations (``!a``)
    cannot be turned into node labels: the tier has to be split, one per value.
    """
    labels = {MARKET_LABEL: tier.market}
    for key, value in tier.label_selector.items():
        where = f"tiers[{index}].label_selector.{key}"
        if value.startswith("!") or value.startswith("in("):
            raise ConfigError(
                f"{where}: {value!r} selects several values, but the nodes of one worker group "
                "carry one value per label; split the tier into one tier per value"
            )
        if key == MARKET_LABEL and value != tier.market:
            raise ConfigError(f"{where}: {value!r} contradicts the tier's market {tier.market!r}")
        labels[key] = value
    return labels


def shared_label(job: JobConfig, key: str) -> str | None:
    """The one value the tiers give label ``key`` (None if none does). A cluster-wide setting
    such as a launcher's region or zone cannot differ between tiers; a tier without the label
    runs anywhere, so it fits whatever the others chose."""
    first: tuple[int, str] | None = None
    for i, tier in enumerate(job.tiers):
        value = tier.label_selector.get(key)
        if value is None:
            continue
        if first is None:
            first = (i, value)
        elif value != first[1]:
            raise ConfigError(
                f"tiers[{i}].label_selector.{key}: {value!r} differs from tiers[{first[0]}]'s "
                f"{first[1]!r}, but one cluster-launcher cluster has one {key}; generate one "
                "cluster per value, or use KubeRay"
            )
    return first[1] if first else None


def multi_gpu_worker_notes(job: JobConfig) -> list[str]:
    """Tiers whose workers ask for several GPUs each: a Ray Train worker is one process, and
    ``ray.train.torch`` (``get_device``, ``prepare_model``) gives it the lowest of its GPUs, so
    the others idle unless the training function uses them itself."""
    notes = []
    for i, tier in enumerate(job.tiers):
        gpus = worker_shape(tier, i)[1]
        if gpus > 1:
            notes.append(
                f"tiers[{i}] ({tier.name}): each worker is one Ray Train process with {gpus} GPUs, and ray.train.torch "
                f"trains on one of them (get_device, prepare_model); unless your training function uses all {gpus}, "
                f"give the tier {gpus}x the workers with GPU: 1 (a node of {gpus} GPUs then holds {gpus} of them)"
            )
    return notes


def same_nodes_notes(job: JobConfig) -> list[str]:
    """Tiers whose gang is an earlier tier's, on the same nodes (``Ladder.same_nodes``, the same
    workers): the ladder's fall between them stays in one pool and changes nothing but budgets.
    A smaller gang on the same nodes is a fall that can fit where the first did not."""
    notes = []
    for a, b in job.ladder.same_nodes():
        first, second = job.tiers[a], job.tiers[b]
        if (first.num_workers, first.worker_resources()) != (second.num_workers, second.worker_resources()):
            continue
        notes.append(f"tiers[{b}] ({second.name}) selects the same nodes as tiers[{a}] ({first.name}), "
                     f"{dict(first.label_selector) or 'no label selector'}, with the same gang, so falling from one "
                     "to the other stays in the pool whose capacity just failed; give each a label_selector of its "
                     "own pool (e.g. ray.io/availability-zone), or drop one")
    tiers = job.tiers
    for b in range(len(tiers)):
        for a in range(b):
            first, second = tiers[a], tiers[b]
            if (job.ladder.same_cluster(a, b) and first.market == second.market
                    and dict(first.label_selector) == dict(second.label_selector) and first.placement != second.placement):
                notes.append(
                    f"tiers[{b}] ({second.name}) and tiers[{a}] ({first.name}) get worker groups of their own placements "
                    f"but one label selector, {dict(first.label_selector)}: Ray places either tier's gang on the other's "
                    "nodes and counts them as its capacity, so a fall or climb between them can land where it started; "
                    "give each a label_selector of its own pool (e.g. pool: a and pool: b, which the file then puts on "
                    "its worker group)")
    return notes


def fabric_note(tier: Tier, index: int, nodes: int, machine_type: str, fabric: str, needs: str) -> str:
    """Why a gang that spans ``nodes`` nodes of ``machine_type`` all-reduces slowly: the file sets
    up none of the GPU ``fabric`` the type is built for, which ``needs`` says how to add."""
    return (f"tiers[{index}] ({tier.name}): its gang spans {nodes} {machine_type} nodes, and this file sets up no "
            f"{fabric} for them: NCCL between the nodes runs over TCP on their primary network interface, a fraction "
            f"of the bandwidth the type is built for; for all-reduce at full speed {needs}")


def worker_shape(tier: Tier, index: int) -> tuple[float, int, dict[str, float]]:
    """(CPUs, GPUs, other Ray resources) of one worker; GPUs must be whole for the clouds."""
    res = tier.worker_resources()
    cpu = float(res.pop("CPU", 0.0))
    gpu = float(res.pop("GPU", 0.0))
    if gpu != int(gpu):
        raise ConfigError(
            f"tiers[{index}].resources_per_worker.GPU: {gpu} is fractional; nodes and pods get whole GPUs"
        )
    return cpu, int(gpu), res


# Kubernetes quantity suffixes (resource.Quantity): binary, then decimal SI.
_QUANTITY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                      "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def parse_quantity(value: object) -> float | None:
    """A Kubernetes quantity (``"500m"``, ``"8Gi"``, ``"1e3"``, ``4``) as a number, or None if it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if not isinstance(value, str):
        return float(value)
    try:
        return float(value)  # plain and exponent forms
    except ValueError:
        pass
    for suffix in sorted(_QUANTITY_SUFFIXES, key=len, reverse=True):
        if value.endswith(suffix):
            try:
                return float(value[: -len(suffix)]) * _QUANTITY_SUFFIXES[suffix]
            except ValueError:
                return None
    return None


HEAD_CPU = "2"  # the KubeRay head pod's CPUs and memory by default
HEAD_MEMORY = "8Gi"


def head_size(cpu: object, memory: object) -> tuple[float, float]:
    """The KubeRay head pod's (CPUs, GiB) from its quantities, refused where Ray's head could not
    run in them: it holds the GCS, the dashboard, the driver and Ray Train's controller."""
    cores = parse_quantity(cpu)
    if cores is None or not math.isfinite(cores):
        raise ConfigError(f"head_cpu: {cpu!r} is not a Kubernetes CPU quantity (such as 2, 8 or 1500m)")
    if cores < 1:
        raise ConfigError(f"head_cpu: {cpu!r} is too little for a Ray head, which runs the GCS, the dashboard, the "
                          f"driver and Ray Train's controller; give at least 1 (default {HEAD_CPU})")
    size = parse_quantity(memory)
    if size is None or not math.isfinite(size):
        raise ConfigError(f"head_memory: {memory!r} is not a Kubernetes memory quantity (such as 8Gi or 32Gi)")
    if size / 2**30 < HEAD_MIN_MEMORY_GIB:
        raise ConfigError(f"head_memory: {memory!r} is too little for a Ray head, which runs the GCS, the dashboard, "
                          f"the driver and Ray Train's controller; give at least {HEAD_MIN_MEMORY_GIB:g} GiB "
                          f"(default {HEAD_MEMORY})")
    return cores, size / 2**30


def cpu_quantity(cpu: float) -> str:
    """A Kubernetes CPU quantity string ('2', '500m'); strings, because the CRD's
    int-or-string schema rejects YAML floats such as 0.5."""
    if cpu == int(cpu):
        return str(int(cpu))
    return f"{math.ceil(cpu * 1000)}m"


class _NoAliasDumper(yaml.SafeDumper):
    """Writes shared sub-objects out in full: anchors and aliases confuse readers and reviews."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def to_yaml(doc: object, header: list[str] | tuple[str, ...] = ()) -> str:
    """Block-style YAML in the dict's own key order, behind ``# `` comment lines."""
    body = yaml.dump(
        doc, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=1_000_000, allow_unicode=True
    )
    return "".join(f"# {line}\n" for line in header) + body


_DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def object_name_error(name: str) -> str | None:
    """Why ``name`` cannot name a Kubernetes object (Secret, PVC, namespace...), or None."""
    if len(name) > 253 or not _DNS1123_SUBDOMAIN_RE.fullmatch(name):
        return f"{name!r} is not a Kubernetes object name (lowercase letters, digits, '-' and '.')"
    return None


_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# The label keys a user's labels must leave alone: ours (RUN_LABEL on every object and pod), Ray's and
# KubeRay's (ray.io/cluster, ray.io/node-type...), and Kubernetes' reserved prefixes.
OWN_LABEL_PREFIXES = ("spotfallback/", "ray.io/", "kubernetes.io/", "k8s.io/")


E = TypeVar("E", bound=StrEnum)


def choice(field: str, value: Any, enum: type[E]) -> E:
    """``value`` as one of ``enum``'s members (its value as a string is taken too): options built in
    Python may pass "rayjob" for ``Kind.RAYJOB``, and a misspelling must not pass for the default."""
    try:
        return enum(value)
    except ValueError:
        raise ConfigError(f"{field}: {value!r} is not one of: {', '.join(e.value for e in enum)}") from None


def pip_packages(packages: str | Sequence[str]) -> tuple[str, ...]:
    """The packages to pip-install on the nodes, each a requirement, a wheel or archive path, or a
    URL (one string is one package): anything else would reach pip only on the nodes, and fail
    every one of them at start."""
    listed = (packages,) if isinstance(packages, str) else tuple(packages)
    for p in listed:
        if not isinstance(p, str):
            raise ConfigError(f"pip: {p!r} is not a package; give each as a string, such as 'torch==2.3.1'")
        if not p.strip():
            raise ConfigError("pip: an empty package; give a pip requirement such as 'torch==2.3.1', or leave it out")
        if p.lstrip().startswith("-"):
            raise ConfigError(f"pip: {p!r} is a pip option; give one requirement, wheel or URL each (pip's options "
                              "belong in the image or a requirements file it installs)")
        if _path_or_url(p):
            continue  # pip reads it there
        try:
            Requirement(p)
        except InvalidRequirement as e:
            raise ConfigError(f"pip: {p!r} is not a pip requirement ({str(e).splitlines()[0].rstrip('.')}); give one "
                              "such as 'torch==2.3.1' or 'transformers>=4.40,<5'") from None
    return listed


def _path_or_url(package: str) -> bool:
    """A wheel or archive path, or a URL, as pip takes one: one word (a requirement's markers or
    a pip option after a space are no path), naming a file or a place."""
    if any(c.isspace() for c in package):
        return False
    return "://" in package or package.startswith((".", "/", "~")) or package.endswith((".whl", ".tar.gz", ".zip"))


def short_repr(value: Any) -> str:
    """The value as a message shows it: its repr, cut to 60 characters; nothing for null, whose
    type (or the message) says it all."""
    if value is None:
        return ""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def label_problem(key: str, value: Any) -> str | None:
    """Kubernetes' IsQualifiedName / IsValidLabelValue: the API server's rule for an object's and a
    pod's labels, which KubeRay also applies to group labels."""
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix))) or len(name) > 63 or not _LABEL_NAME_RE.fullmatch(name):
        return f"invalid label key {key!r}: an optional DNS prefix and '/', then 1-63 alphanumerics, '-', '_' or '.'"
    if not isinstance(value, str) or (value and (len(value) > 63 or not _LABEL_NAME_RE.fullmatch(value))):
        return f"invalid label value {short_repr(value) or 'null'}: at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends"
    return None


def check_user_labels(labels: Mapping[str, str], set_by: str, reserved_domains: Sequence[str] = ()) -> None:
    """Refuse labels the API server would refuse, and keys that the file, ``set_by`` or Kubernetes set
    themselves: ours, :data:`OWN_LABEL_PREFIXES`, and each of ``reserved_domains`` with its subdomains."""
    for key, value in labels.items():
        if problem := label_problem(key, value):
            raise ConfigError(f"labels: {key}={value}: {problem}")
        domain = key.rpartition("/")[0]
        if (key == MANAGED_BY_LABEL or key.startswith(OWN_LABEL_PREFIXES)
                or any(domain == d or domain.endswith("." + d) for d in reserved_domains)):
            reserved = [MANAGED_BY_LABEL, *(p + "..." for p in OWN_LABEL_PREFIXES), *(f"[*.]{d}/..." for d in reserved_domains)]
            raise ConfigError(f"labels: {key!r} is a key the file, {set_by} or Kubernetes sets itself ({', '.join(reserved)}); "
                              "choose another key")
