"""Offline validation of KubeRay manifests, Karpenter NodePools and Ray cluster-launcher configs.

Two layers, both without a cluster or network:
1. the shipped schema (KubeRay CRD v1, made strict; the Karpenter provider's NodePool CRD, picked
   by the pool's ``nodeClassRef.group``; Ray's launcher schema), with the Kubernetes
   list-map/int32 rules the API server adds;
2. the checks the KubeRay operator (``ray-operator/controllers/ray/utils/validation.go``) makes
   only after the object is accepted, where a mistake surfaces as a failed RayJob much later,
   plus spotfallback's own rules: the head never runs on spot capacity, and an AKS spot pool
   taints its nodes as the KubeRay file's pods expect.

Every finding names the field, e.g. ``spec.rayClusterSpec.workerGroupSpecs[0].groupName: required``.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import math
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonschema import ValidationError
from jsonschema.protocols import Validator
from pydantic import ValidationError as PydanticValidationError

from spotfallback.config import MARKET_LABEL, ON_DEMAND, SPOT, JobConfig, StrictYamlLoader
from spotfallback.deploy import machines as catalog
from spotfallback.deploy import nodepools as karpenter
from spotfallback.deploy.clouds import (
    K8S_DEFAULT_GRACE_S,
    ON_DEMAND_NODE_LABELS,
    RAY_DEFAULT_DRAIN_TIMEOUT_S,
    RAY_DRAIN_TIMEOUT_ENV,
    SPOT_LABEL_FAMILIES,
    SPOT_NODE_LABELS,
    SPOT_TAINT_KEYS,
    K8sCloud,
    vm_config_is_spot,
    vm_market_spelling,
)
from spotfallback.deploy.common import (
    ZONE_LABEL,
    label_problem,
    object_name_error,
    parse_quantity,
    short_repr,
)
from spotfallback.deploy.machines import (
    head_machine_problem,
    machine,
    machine_spelling,
    pod_shortfall,
)
from spotfallback.deploy.node_config import unknown_fields
from spotfallback.deploy.pools import INSTANCE_TYPE_KEY
from spotfallback.deploy.schema import (
    KUBERAY_FILES,
    kuberay_validator,
    launcher_schema,
    launcher_validator,
)
from spotfallback.errors import ManifestInvalid

MAX_NAME = {"RayJob": 47, "RayCluster": 53}
# The kinds of KubeRay's ray.io API group (ray-operator/config/crd/bases at v1.7.0): kubectl refuses
# any other there ("no matches for kind"). Only KUBERAY_FILES' are checked offline.
KUBERAY_KINDS = ("RayCluster", "RayCronJob", "RayJob", "RayService")
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
LAUNCHER_KIND = "cluster-launcher"

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(
    r"^[+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_RAY_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")


@dataclass(frozen=True)
class Finding:
    """One problem, at one field of one YAML document (0-based), or of the whole file (``of_file``)."""

    path: str
    message: str
    warning: bool = False
    document: int = 0

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    @property
    def of_file(self) -> bool:
        return self.path in ("(file)", "(job)")


@dataclass(frozen=True)
class Report:
    kinds: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if not f.warning]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.warning]

    @property
    def ok(self) -> bool:
        return not self.errors


# --- parsing -----------------------------------------------------------------------------------


def load_documents(text: str) -> list[Any]:
    """All YAML documents of ``text``; raises ValueError naming the line of a syntax error."""
    try:
        return list(yaml.load_all(text, Loader=StrictYamlLoader))
    except RecursionError:
        raise ValueError("not readable YAML: its values nest deeper than the YAML reader can follow") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ValueError(f"{where}not valid YAML: {getattr(e, 'problem', None) or e}") from None


def _normalize(value: Any, keep_null: bool = False) -> Any:
    """What the API server sees: nulls in objects dropped (it prunes them), keys as strings,
    YAML timestamps as strings (Kubernetes' YAML reader keeps them as text). ``keep_null``: what
    ``ray up`` sees, which keeps a null as a value (and fails on it where it wants another)."""
    if isinstance(value, dict):
        return {_key(k): _normalize(v, keep_null) for k, v in value.items() if keep_null or v is not None}
    if isinstance(value, list):
        return [_normalize(v, keep_null) for v in value]
    if isinstance(value, _dt.date):
        return value.isoformat()
    return value


def _key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


# --- formatting --------------------------------------------------------------------------------


def field_path(parts: Iterable[str | int]) -> str:
    """``spec.workerGroupSpecs[0].labels["ray.io/market-type"]`` from its parts."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out or "(top level)"


def _json_type(value: Any) -> str:
    for name, kind in (("boolean", bool), ("integer", int), ("number", float), ("string", str), ("array", list), ("object", dict)):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def _schema_findings(err: ValidationError) -> list[Finding]:
    path = list(err.absolute_path)
    schema = err.schema if isinstance(err.schema, Mapping) else {}
    kind = err.validator
    if kind == "required":
        match = re.match(r"'(.+)' is a required property", err.message)
        missing = [match.group(1)] if match else [k for k in err.validator_value if k not in err.instance]
        return [Finding(field_path([*path, m]), "required field is missing") for m in missing]
    if kind == "additionalProperties" and isinstance(err.instance, dict):
        known = list(schema.get("properties", {}))
        patterns = list(schema.get("patternProperties", {}))
        out = []
        for key in err.instance:
            if key in known or any(re.search(p, key) for p in patterns):
                continue
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; remove it or check its spelling"
            out.append(Finding(field_path([*path, key]), f"unknown field{hint}"))
        return out
    where = field_path(path)
    if kind == "type":
        expected = err.validator_value if isinstance(err.validator_value, str) else " or ".join(err.validator_value)
        return [Finding(where, f"expected {expected}, got {_json_type(err.instance)} {short_repr(err.instance)}".rstrip())]
    if kind == "anyOf" and schema.get("x-kubernetes-int-or-string"):
        return [Finding(where, f"expected an integer or a string such as \"2\" or \"500m\", got {_json_type(err.instance)} {short_repr(err.instance)}".rstrip())]
    if kind == "enum":
        allowed = ", ".join(map(str, err.validator_value))
        return [Finding(where, f"{short_repr(err.instance)} is not one of: {allowed}")]
    if kind == "pattern":
        return [Finding(where, f"{short_repr(err.instance)} does not match {err.validator_value}")]
    return [Finding(where, err.message)]


def _schema_check(validator: Validator, doc: Any) -> list[Finding]:
    findings = [f for e in validator.iter_errors(doc) for f in _schema_findings(e)]
    return sorted(findings, key=lambda f: f.path)


# --- operator-side checks ------------------------------------------------------------------------


def _get(obj: Any, *keys: str | int) -> Any:
    for key in keys:
        if isinstance(key, int):
            obj = obj[key] if isinstance(obj, list) and -len(obj) <= key < len(obj) else None
        else:
            obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else {}


def _list(obj: Any) -> list[Any]:
    return obj if isinstance(obj, list) else []


def _env_value(container: Any, name: str) -> tuple[int, Any] | None:
    for i, entry in enumerate(_get(container, "env") or []):
        if isinstance(entry, dict) and entry.get("name") == name:
            return i, entry.get("value")
    return None


def _group_findings(group: dict[str, Any], at: list[str | int], is_head: bool) -> Iterator[Finding]:
    pod = _dict(_get(group, "template", "spec"))
    if isinstance(pod.get("containers"), list) and not pod["containers"]:
        yield Finding(field_path([*at, "template", "spec", "containers"]), "needs at least one container (the first is the Ray container)")
    yield from _pod_spec_findings(pod, [*at, "template", "spec"])
    yield from _labels_findings(_get(group, "template", "metadata", "labels"), [*at, "template", "metadata", "labels"])
    params = _dict(group.get("rayStartParams"))
    if "labels" in params:
        yield Finding(
            field_path([*at, "rayStartParams", "labels"]),
            "not supported since KubeRay 1.5; set node labels in the group's top-level `labels` field",
        )
    resources = _dict(group.get("resources"))
    in_params = [k for k in _RAY_RESOURCE_PARAMS if params.get(k)]
    if in_params and resources:
        yield Finding(
            field_path([*at, "resources"]),
            f"resources are also set in rayStartParams ({', '.join(in_params)}); use only the top-level `resources` field",
        )
    for key, value in resources.items():
        if isinstance(value, str) and not _QUANTITY.fullmatch(value):
            yield Finding(field_path([*at, "resources", key]), f"{value!r} is not a Kubernetes quantity; the operator would skip it")
    yield from _labels_findings(group.get("labels"), [*at, "labels"])
    yield from _pinned_machine(group, at, is_head)
    if is_head:
        yield from _head_on_spot(group, at)
        return
    name = group.get("groupName")
    if isinstance(name, str) and name and label_problem("ray.io/group", name):
        yield Finding(field_path([*at, "groupName"]), f"{name!r} must be a valid label value (KubeRay labels pods with it): 1-63 alphanumerics, '-', '_' or '.'")
    low, high, replicas = group.get("minReplicas"), group.get("maxReplicas"), group.get("replicas")
    for key in ("minReplicas", "maxReplicas", "replicas"):
        if isinstance(group.get(key), int) and group[key] < 0:
            yield Finding(field_path([*at, key]), f"must not be negative (got {group[key]})")
    if isinstance(low, int) and isinstance(high, int) and low > high:
        yield Finding(field_path([*at, "minReplicas"]), f"{low} is more than maxReplicas {high}")
    elif isinstance(replicas, int) and isinstance(low, int) and isinstance(high, int) and not low <= replicas <= high:
        yield Finding(field_path([*at, "replicas"]), f"{replicas} is outside [minReplicas, maxReplicas] = [{low}, {high}]; the operator clamps it", warning=True)
    yield from _market_mismatch(group, at)
    yield from _drain_window(group, at)


_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# Kubernetes' own resources may be overcommitted; any other (nvidia.com/gpu, ...) may not: its request, if
# given, must equal its limit, and it needs a limit.
_OVERCOMMITTABLE = ("cpu", "memory", "ephemeral-storage")


def _pod_spec_findings(pod: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    """What the API server's pod validation refuses in a group's pod template: the RayCluster is
    accepted, and then every pod the operator creates for the group is rejected, so the group never starts."""
    for kind in ("containers", "initContainers"):
        for i, container in enumerate(_list(pod.get(kind))):
            if not isinstance(container, dict):
                continue
            where = [*at, kind, i]
            name = container.get("name")
            if isinstance(name, str) and (len(name) > 63 or not _DNS1123_LABEL.fullmatch(name)):
                yield Finding(field_path([*where, "name"]), f"{name!r} must be 1-63 lowercase letters, digits or '-', "
                                                            "alphanumeric at both ends (a DNS-1123 label)")
            if container.get("image") in (None, ""):  # the CRD leaves it optional; pod validation does not
                yield Finding(field_path([*where, "image"]), "required; name the container's image")
            yield from _container_resource_findings(_dict(container.get("resources")), [*where, "resources"])
    for i, toleration in enumerate(_list(pod.get("tolerations"))):
        if isinstance(toleration, dict):
            yield from _toleration_findings(toleration, [*at, "tolerations", i])
    yield from _labels_findings(pod.get("nodeSelector"), [*at, "nodeSelector"])
    priority = pod.get("priorityClassName")
    if isinstance(priority, str) and priority and (problem := object_name_error(priority)):
        yield Finding(field_path([*at, "priorityClassName"]), f"{problem}: the API server refuses every pod of the group")


def _labels_findings(labels: Any, at: list[str | int]) -> Iterator[Finding]:
    """Label keys and values the API server refuses: an object's labels, or a pod template's labels or
    node selector (then it refuses every pod of the group)."""
    for key, value in _dict(labels).items():
        if problem := label_problem(key, value):
            yield Finding(field_path([*at, key]), problem)


def _container_resource_findings(resources: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    requests, limits = _dict(resources.get("requests")), _dict(resources.get("limits"))
    for key, asked in requests.items():
        request, limit = parse_quantity(asked), parse_quantity(limits.get(key))
        if key not in _OVERCOMMITTABLE and "/" in key and not key.startswith("kubernetes.io/"):
            if key not in limits:
                yield Finding(field_path([*at, "limits", key]), f"missing: {key} cannot be overcommitted, so a pod that "
                                                                  "requests it must give the same limit")
                continue
            if request is not None and limit is not None and request != limit:
                yield Finding(field_path([*at, "requests", key]), f"{short_repr(asked)} differs from limits.{key} "
                                                                    f"{short_repr(limits[key])}: {key} cannot be overcommitted; give one value")
                continue
        if request is not None and limit is not None and request > limit:
            yield Finding(field_path([*at, "requests", key]), f"{short_repr(asked)} is more than limits.{key} "
                                                                f"{short_repr(limits[key])}: a request must not exceed its limit")


def _toleration_findings(toleration: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    effect, operator = toleration.get("effect"), toleration.get("operator")
    if effect not in (None, "", *_TOLERATION_EFFECTS):
        yield Finding(field_path([*at, "effect"]), f"{short_repr(effect)} is not a taint effect: give one of "
                                                   f"{', '.join(_TOLERATION_EFFECTS)}, or none for all")
    if operator not in (None, "", "Equal", "Exists"):
        yield Finding(field_path([*at, "operator"]), f"{short_repr(operator)} must be 'Equal' or 'Exists'")
    if operator == "Exists" and toleration.get("value"):
        yield Finding(field_path([*at, "value"]), "must be empty when operator is 'Exists' (it matches any value); "
                                                  "drop the value, or use operator 'Equal'")
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        yield Finding(field_path([*at, "tolerationSeconds"]), "only a NoExecute toleration may have tolerationSeconds")


def _pod_requests(pod: dict[str, Any]) -> tuple[float, float, float]:
    """(CPUs, GPUs, memory bytes) the scheduler reserves for one pod: its containers' and native
    sidecars' requests (their limits where a request is not set)."""
    sidecars = [c for c in pod.get("initContainers") or [] if isinstance(c, dict) and c.get("restartPolicy") == "Always"]
    total = {"cpu": 0.0, "nvidia.com/gpu": 0.0, "memory": 0.0}
    for container in [*(pod.get("containers") or []), *sidecars]:
        resources = _dict(_dict(container).get("resources"))
        asked = {**_dict(resources.get("limits")), **_dict(resources.get("requests"))}
        for key in total:
            total[key] += parse_quantity(asked.get(key)) or 0.0
    return total["cpu"], total["nvidia.com/gpu"], total["memory"]


def _pinned_machine(group: dict[str, Any], at: list[str | int], is_head: bool) -> Iterator[Finding]:
    """A pod pinned to a known machine type that can never hold it stays pending: refuse it here.

    The memory a node leaves to pods is its cloud's (the type's provider; on AWS, Karpenter's
    when the pod selects Karpenter's labels): a lower bound, so only a sure misfit is reported.
    A head pod that fits must also have a machine large enough for a Ray head, as ``ray up``'s
    head type must (``head_machine_problem``).
    """
    selector = _dict(_get(group, "template", "spec", "nodeSelector"))
    name = selector.get(INSTANCE_TYPE_KEY)
    if not isinstance(name, str):
        return
    where = field_path([*at, "template", "spec", "nodeSelector", INSTANCE_TYPE_KEY])
    if problem := machine_spelling(name):
        yield Finding(where, problem)
        return
    known = machine(name)
    if known is None:
        return
    karpenter_pod = any(key.startswith(("karpenter.sh/", "karpenter.k8s.aws/")) for key in selector)
    cloud = {"gcp": K8sCloud.GKE, "azure": K8sCloud.AKS}.get(
        known.provider, K8sCloud.EKS_KARPENTER if karpenter_pod else K8sCloud.EKS_MANAGED)
    short = pod_shortfall(name, *_pod_requests(_dict(_get(group, "template", "spec"))), cloud)
    if short:
        yield Finding(where, f"no {name!r} node can ever hold this pod, which asks for {'; '.join(short)}; name a larger "
                             "type or ask for less")
    elif is_head and (problem := head_machine_problem(name)):
        yield Finding(where, problem)


def _drain_window(group: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    """On a spot group, Ray's SIGTERM drain window must close inside the pod's grace period.

    ``ray start --block`` drains its node on SIGTERM for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S
    (30 s unless set) and only then stops; a grace period no longer than that lets the kubelet
    kill the workers in the middle of their just-in-time checkpoint.
    """
    if _get(group, "labels", MARKET_LABEL) != SPOT:
        return
    pod = _dict(_get(group, "template", "spec"))
    grace = pod.get("terminationGracePeriodSeconds", K8S_DEFAULT_GRACE_S)
    if not isinstance(grace, int) or isinstance(grace, bool):
        return  # the schema says what is wrong with it
    found = _env_value(_get(pod, "containers", 0), RAY_DRAIN_TIMEOUT_ENV)
    fix = f"set {RAY_DRAIN_TIMEOUT_ENV} a few seconds below terminationGracePeriodSeconds ({grace} s)"
    if found is None:
        if grace <= RAY_DEFAULT_DRAIN_TIMEOUT_S:
            yield Finding(
                field_path([*at, "template", "spec", "containers", 0, "env"]),
                f"Ray drains a node on SIGTERM for {RAY_DEFAULT_DRAIN_TIMEOUT_S:g} s by default, which does not end "
                f"before the pod's {grace} s grace; {fix}",
                warning=True,
            )
        return
    i, value = found
    where = field_path([*at, "template", "spec", "containers", 0, "env", i, "value"])
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        yield Finding(where, f"{RAY_DRAIN_TIMEOUT_ENV} must be a number of seconds (got {value!r})")
        return
    if seconds >= grace:
        yield Finding(
            where,
            f"Ray's SIGTERM drain window ({seconds:g} s) does not end before the pod's grace ({grace} s): the "
            f"kubelet would kill the workers mid-checkpoint; {fix}",
        )


_NOTICE_AGENT = re.compile(r"(^|[\s/])spotfallback(\.cli)?\s+notice-agent(\s|$)")


def _words(container: dict[str, Any]) -> list[str]:
    return [w for key in ("command", "args") for w in (container.get(key) or []) if isinstance(w, str)]


def _ray_tmp_mount(container: dict[str, Any]) -> tuple[str, str] | None:
    """(volume, path inside it) of the directory where `ray start` writes ray_current_cluster
    and the agent reads it: $RAY_TMPDIR/ray, /tmp/ray by default; None if no volume holds it."""
    tmp = _env_value(container, "RAY_TMPDIR")
    ray_dir = f"{(tmp[1] if tmp and isinstance(tmp[1], str) and tmp[1] else '/tmp').rstrip('/')}/ray"
    best: tuple[int, str, str] | None = None
    for mount in container.get("volumeMounts") or []:
        path = _get(mount, "mountPath")
        if not isinstance(path, str) or not (ray_dir == path.rstrip("/") or ray_dir.startswith(path.rstrip("/") + "/")):
            continue
        inside = f"{_get(mount, 'subPath') or ''}/{ray_dir[len(path.rstrip('/')):].strip('/')}"
        if best is None or len(path) > best[0]:
            best = (len(path), str(_get(mount, "name")), inside)
    return (best[1], best[2]) if best else None


def _notice_agent_findings(pod: dict[str, Any], at: list[str | int], restart_policy: str) -> Iterator[Finding]:
    """The notice agent must run beside the Ray container for the pod's whole life.

    A pod under autoscaler v2 (and SidecarMode) has restartPolicy Never, so an agent in
    ``containers`` that exits stays dead and the pod's evictions go undrained; in
    ``initContainers`` without ``restartPolicy: Always`` it would have to exit before the Ray
    container starts, which it never does. A native sidecar (Kubernetes 1.29+) is restarted
    whatever the pod's policy. It finds its Ray node through the file `ray start` writes in the
    Ray container's $RAY_TMPDIR/ray, so both must mount that directory from one volume.
    """
    containers = [c for c in pod.get("containers") or [] if isinstance(c, dict)]
    ray = containers[0] if containers else {}
    sidecar_fix = "make it a native sidecar: an initContainers entry with restartPolicy: Always (Kubernetes >= 1.29)"
    agents: list[tuple[list[str | int], dict[str, Any]]] = []
    for key in ("containers", "initContainers"):
        for i, container in enumerate(pod.get(key) or []):
            if not isinstance(container, dict) or not _NOTICE_AGENT.search(" ".join(_words(container))):
                continue
            where = [*at, key, i]
            agents.append((where, container))
            if key == "containers" and restart_policy != "Always":
                yield Finding(
                    field_path(where),
                    f"runs the notice agent as a plain container, which is never restarted in a pod with restartPolicy "
                    f"{restart_policy} (what autoscaler v2 and SidecarMode require): if it exits, this pod's evictions go "
                    f"undrained; {sidecar_fix}",
                )
            elif key == "initContainers" and container.get("restartPolicy") != "Always":
                yield Finding(
                    field_path([*where, "restartPolicy"]),
                    "the notice agent never exits, and an init container must exit before the Ray container starts: the "
                    "pod would never start; set restartPolicy: Always (a native sidecar, Kubernetes >= 1.29)",
                )
    for where, agent in agents:
        if _env_value(agent, "RAY_ADDRESS") or any(w == "--address" or w.startswith("--address=") for w in _words(agent)):
            continue  # told where the cluster is: no file to share
        shared = _ray_tmp_mount(agent)
        if shared is None or shared != _ray_tmp_mount(ray):
            yield Finding(
                field_path([*where, "volumeMounts"]),
                "the agent finds its Ray node through ray_current_cluster, which `ray start` writes in the Ray "
                "container's $RAY_TMPDIR/ray (/tmp/ray): mount one volume (an emptyDir) at /tmp/ray in both containers",
            )


def _selected_pairs(pod: dict[str, Any]) -> set[tuple[str, str]]:
    """(label, value) pairs a pod requires of its node via nodeSelector or required node affinity."""
    pairs = {(k, v) for k, v in _dict(pod.get("nodeSelector")).items() if isinstance(v, str)}
    for term in _required_terms(pod):
        for expr in _get(term, "matchExpressions") or []:
            if not isinstance(expr, dict) or expr.get("operator") != "In":
                continue
            key, values = expr.get("key"), expr.get("values")
            if isinstance(key, str) and isinstance(values, list) and len(values) == 1:
                pairs.add((key, values[0]))
    return pairs


def _required_terms(pod: dict[str, Any]) -> list[Any]:
    """The pod's required node affinity terms (ORed: a node matching any one will do)."""
    terms = _get(pod, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
    return terms if isinstance(terms, list) else []


def _term_keeps_off(term: Any, key: str, value: str) -> bool:
    """Whether one node selector term rules out nodes labelled ``key=value``."""
    for expr in _get(term, "matchExpressions") or []:
        if not isinstance(expr, dict) or expr.get("key") != key:
            continue
        op, values = expr.get("operator"), expr.get("values")
        listed = isinstance(values, list) and value in values
        if op == "DoesNotExist" or (op == "NotIn" and listed) or (op == "In" and isinstance(values, list) and not listed):
            return True
    return False


def _keeps_off(pod: dict[str, Any], key: str, value: str) -> bool:
    """Whether no node labelled ``key=value`` can take the pod: its nodeSelector asks another
    value, or every term of its required node affinity rules it out (terms are ORed, so one
    term that allows the label lets the pod onto such a node)."""
    selected = _dict(pod.get("nodeSelector")).get(key)
    if isinstance(selected, str) and selected != value:
        return True
    terms = _required_terms(pod)
    return bool(terms) and all(_term_keeps_off(t, key, value) for t in terms)


def _avoids(pod: dict[str, Any], key: str, value: str) -> bool:
    """Whether any part of the pod's node selection is written to rule ``key=value`` out."""
    selected = _dict(pod.get("nodeSelector")).get(key)
    return (isinstance(selected, str) and selected != value) or any(_term_keeps_off(t, key, value) for t in _required_terms(pod))


def _half_excluded_spot(pod: dict[str, Any], at: list[str | int], why: str) -> Iterator[Finding]:
    """A pod that keeps off one of a cloud's spot labels but not the others still lands on spot.

    GKE: Spot VMs carry ``gke-spot``, legacy preemptible VMs ``gke-preemptible``, untainted by
    default; excluding only the first sends the pod to the second, which is taken away as often.
    """
    for family in SPOT_LABEL_FAMILIES:
        if not any(_avoids(pod, *pair) for pair in family):
            continue  # not trying to keep off this cloud's spot nodes: the cloud is not known
        missing = sorted(pair for pair in family if not _keeps_off(pod, *pair))
        if missing:
            wanted = ", ".join(f"{k} NotIn [{v!r}]" for k, v in missing)
            yield Finding(
                field_path([*at, "template", "spec", "affinity", "nodeAffinity"]),
                f"keeps off some spot nodes but not those labelled {wanted}; add that to every term of the node "
                f"affinity: {why}",
            )


def _head_on_spot(group: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    """The head must not run on spot: Ray Train's controller runs on the driver's node there."""
    why = "the head must run on on-demand capacity (a preempted head kills the run)"
    if _get(group, "labels", MARKET_LABEL) == SPOT:
        yield Finding(field_path([*at, "labels", MARKET_LABEL]), f"is 'spot', but {why}")
    pod = _dict(_get(group, "template", "spec"))
    for key, value in sorted(_selected_pairs(pod) & SPOT_NODE_LABELS):
        yield Finding(field_path([*at, "template", "spec", "nodeSelector", key]), f"selects spot nodes ({value!r}), but {why}")
    yield from _half_excluded_spot(pod, at, why)
    for i, tol in enumerate(pod.get("tolerations") or []):
        if not isinstance(tol, dict):
            continue
        where = field_path([*at, "template", "spec", "tolerations", i])
        if tol.get("key") in SPOT_TAINT_KEYS:
            yield Finding(where, f"tolerates the spot taint {tol['key']!r}, but {why}")
        elif not tol.get("key") and tol.get("operator") == "Exists":
            yield Finding(where, f"tolerates every taint, spot ones included; {why}", warning=True)


def _market_mismatch(group: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    """A group labelled on-demand that selects spot nodes (or the reverse) makes Ray's view of
    the node's market wrong, so a tier's budgets would be charged to the wrong market."""
    market = _get(group, "labels", MARKET_LABEL)
    pod = _dict(_get(group, "template", "spec"))
    if market == ON_DEMAND:
        yield from _half_excluded_spot(pod, at, "an on-demand tier must not be preempted")
    pairs = _selected_pairs(pod)
    clash = (market == ON_DEMAND and pairs & SPOT_NODE_LABELS) or (market == SPOT and pairs & ON_DEMAND_NODE_LABELS)
    if clash:
        key, value = sorted(clash)[0]
        yield Finding(
            field_path([*at, "labels", MARKET_LABEL]),
            f"says {market!r}, but the pods select {key}={value}",
            warning=True,
        )


def _node_selection(pod: dict[str, Any]) -> str:
    """A pod's whole node selection (selector, required affinity, tolerations), canonical: two
    pods with the same one can land on the same nodes."""
    tolerations = pod.get("tolerations") if isinstance(pod.get("tolerations"), list) else []
    chosen = {"selector": _dict(pod.get("nodeSelector")), "terms": _required_terms(pod), "tolerations": tolerations}
    return json.dumps(chosen, sort_keys=True, default=str)


def _indistinguishable_pools(workers: list[Any], at: list[str | int]) -> Iterator[Finding]:
    """Worker groups Ray tells apart (different node labels: another GPU type, pool or market)
    but Kubernetes cannot (the same node selection): either's pods may land on the other's
    nodes, and then the Ray labels on those nodes are false, so a tier runs on another tier's pool."""
    seen: dict[str, tuple[int, Any, Any]] = {}
    for i, group in enumerate(workers):
        if not isinstance(group, dict):
            continue
        key = _node_selection(_dict(_get(group, "template", "spec")))
        if key in seen and seen[key][2] != group.get("labels"):
            first, name, _ = seen[key]
            yield Finding(
                field_path([*at, "workerGroupSpecs", i, "template", "spec", "nodeSelector"]),
                f"selects the same nodes as workerGroupSpecs[{first}] ({name!r}) but carries other Ray labels, so "
                "either group's pods may land on the other's pool; tell the pools apart by a node label (the tier's "
                "ray.io/accelerator-type, placement.instance_type or placement.node_selector)",
            )
        seen.setdefault(key, (i, group.get("groupName"), group.get("labels")))


def _cluster_findings(spec: Any, at: list[str | int], annotations: dict[str, Any]) -> Iterator[Finding]:
    if not isinstance(spec, dict):
        return
    head = spec.get("headGroupSpec")
    if isinstance(head, dict):
        yield from _group_findings(head, [*at, "headGroupSpec"], is_head=True)
    listed = spec.get("workerGroupSpecs")
    workers: list[Any] = listed if isinstance(listed, list) else []
    first_with: dict[str, int] = {}
    for i, group in enumerate(workers):
        if not isinstance(group, dict):
            continue
        yield from _group_findings(group, [*at, "workerGroupSpecs", i], is_head=False)
        name = group.get("groupName")
        if not isinstance(name, str):
            continue  # missing or mistyped: the schema says so
        where = field_path([*at, "workerGroupSpecs", i, "groupName"])
        if not name:
            yield Finding(where, "must not be empty")
        elif name in first_with:
            yield Finding(where, f"{name!r} is already the name of workerGroupSpecs[{first_with[name]}]")
        else:
            first_with[name] = i
    yield from _indistinguishable_pools(workers, at)
    head_container = _get(head, "template", "spec", "containers", 0)
    head_env_at = [*at, "headGroupSpec", "template", "spec", "containers", 0, "env"]
    autoscaling = spec.get("enableInTreeAutoscaling") is True
    v2_env = _env_value(head_container, "RAY_enable_autoscaler_v2")
    if v2_env and not autoscaling and v2_env[1] in ("1", "true"):
        yield Finding(field_path([*head_env_at, v2_env[0]]), "RAY_enable_autoscaler_v2 is set but enableInTreeAutoscaling is not true")
    if autoscaling and v2_env and _get(spec, "autoscalerOptions", "version") is not None:
        yield Finding(field_path([*head_env_at, v2_env[0]]), "set autoscalerOptions.version only, not also RAY_enable_autoscaler_v2")
    v2 = autoscaling and (_get(spec, "autoscalerOptions", "version") == "v2" or bool(v2_env and v2_env[1] in ("1", "true")))
    groups: list[tuple[list[str | int], Any]] = [(["headGroupSpec"], head)]
    groups += [(["workerGroupSpecs", i], g) for i, g in enumerate(workers)]
    for sub, group in groups:
        policy = _get(group, "template", "spec", "restartPolicy")
        if v2 and policy not in (None, "Never"):
            yield Finding(field_path([*at, *sub, "template", "spec", "restartPolicy"]), f"must be Never or unset with autoscaler v2 (got {policy!r})")
        # With autoscaler v2 the operator sets every pod's restartPolicy to Never.
        effective = "Never" if v2 else policy if isinstance(policy, str) else "Always"
        yield from _notice_agent_findings(_dict(_get(group, "template", "spec")), [*at, *sub, "template", "spec"], effective)
        if autoscaling and sub[0] == "workerGroupSpecs" and _get(group, "suspend") is True:
            yield Finding(field_path([*at, *sub, "suspend"]), "a worker group cannot be suspended while the autoscaler is enabled")
    if annotations.get("ray.io/ft-enabled") and spec.get("gcsFaultToleranceOptions") is not None:
        yield Finding(field_path([*at, "gcsFaultToleranceOptions"]), "set either this or the ray.io/ft-enabled annotation, not both")


def _job_findings(spec: Any, annotations: dict[str, Any]) -> Iterator[Finding]:
    if not isinstance(spec, dict):
        return
    mode = spec.get("submissionMode", "K8sJobMode")
    shutdown = spec.get("shutdownAfterJobFinishes") is True
    selector = _dict(spec.get("clusterSelector"))
    if isinstance(mode, str) and mode not in SUBMISSION_MODES:
        yield Finding("spec.submissionMode", f"{mode!r} is not one of: {', '.join(SUBMISSION_MODES)}")
    if spec.get("suspend") is True and not shutdown:
        yield Finding("spec.suspend", "a RayJob can be suspended only with shutdownAfterJobFinishes: true")
    ttl = spec.get("ttlSecondsAfterFinished")
    if isinstance(ttl, int) and ttl < 0:
        yield Finding("spec.ttlSecondsAfterFinished", f"must not be negative (got {ttl})")
    elif isinstance(ttl, int) and ttl > 0 and not shutdown:
        yield Finding("spec.ttlSecondsAfterFinished", "has no effect unless shutdownAfterJobFinishes is true; the operator rejects it")
    if spec.get("rayClusterSpec") is None and not selector:
        yield Finding("spec.rayClusterSpec", "required field is missing (or set clusterSelector to use an existing cluster)")
    if selector:
        if not selector.get("ray.io/cluster"):
            yield Finding('spec.clusterSelector["ray.io/cluster"]', "required: the name of the RayCluster to use")
        if spec.get("suspend") is True:
            yield Finding("spec.suspend", "cannot suspend a RayJob that uses clusterSelector")
        if mode == "SidecarMode":
            yield Finding("spec.submissionMode", "SidecarMode does not support clusterSelector")
    backoff = spec.get("backoffLimit")
    if isinstance(backoff, int) and backoff < 0:
        yield Finding("spec.backoffLimit", f"must not be negative (got {backoff})")
    if mode == "InteractiveMode" and isinstance(backoff, int) and backoff > 0:
        yield Finding("spec.backoffLimit", "retries are not supported in InteractiveMode")
    if mode == "SidecarMode":
        for key in ("submitterPodTemplate", "submitterConfig"):
            if key in spec:
                yield Finding(f"spec.{key}", "not supported with submissionMode SidecarMode")
        policy = _get(spec, "rayClusterSpec", "headGroupSpec", "template", "spec", "restartPolicy")
        if policy not in (None, "Never"):
            yield Finding("spec.rayClusterSpec.headGroupSpec.template.spec.restartPolicy", f"must be Never or unset with SidecarMode (got {policy!r})")
    submitter = spec.get("submitterPodTemplate")
    if isinstance(submitter, dict):  # the operator's K8s Job runs it as it is (only its command may be filled in)
        yield from _pod_spec_findings(_dict(submitter.get("spec")), ["spec", "submitterPodTemplate", "spec"])
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline <= 0:
        yield Finding("spec.activeDeadlineSeconds", f"must be positive (got {deadline})")
    runtime_env = spec.get("runtimeEnvYAML")
    if isinstance(runtime_env, str):
        try:
            parsed = yaml.load(runtime_env, Loader=StrictYamlLoader)  # aliases bounded, as in the file itself
        except (yaml.YAMLError, RecursionError):
            parsed = []
        if parsed is not None and not isinstance(parsed, dict):
            yield Finding("spec.runtimeEnvYAML", "must be a YAML mapping such as 'pip: [requests]'")
    yield from _cluster_findings(spec.get("rayClusterSpec"), ["spec", "rayClusterSpec"], annotations)
    yield from _embedded_ladder_findings(spec)


def _embedded_job(entrypoint: Any) -> tuple[JobConfig | None, str | None]:
    """The job a ``spotfallback run --job-json '...'`` entrypoint carries (what ``manifest kuberay``
    writes), or why its JSON is no job; (None, None) for any other entrypoint."""
    if not isinstance(entrypoint, str) or "--job-json" not in entrypoint:
        return None, None
    try:
        words = shlex.split(entrypoint)
    except ValueError as e:
        return None, f"is no command a shell can run ({e})"
    at = words.index("--job-json") + 1 if "--job-json" in words else len(words)
    if at >= len(words) or "spotfallback" not in words[:at]:
        return None, None
    try:
        return JobConfig.model_validate(json.loads(words[at])), None
    except (ValueError, PydanticValidationError) as e:
        first = e.errors()[0] if isinstance(e, PydanticValidationError) else None
        why = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(e)
        return None, f"carries --job-json that is no job spotfallback runs ({why})"


def _embedded_ladder_findings(spec: dict[str, Any]) -> Iterator[Finding]:
    """A RayJob that runs ``spotfallback run --job-json`` carries its ladder: each tier needs a
    worker group of its name (``manifest kuberay`` writes one per tier) whose pods can be its
    workers, one pod each. A file edited by hand can lose a group, or shrink one below its gang,
    and the run would then wait on that tier until its capacity timeout, every time."""
    job, problem = _embedded_job(spec.get("entrypoint"))
    if problem:
        yield Finding("spec.entrypoint", problem)
    if job is None or job.ladder.across_clusters or not isinstance(spec.get("rayClusterSpec"), dict):
        return  # (a RayJob on an existing cluster, clusterSelector, has no groups of its own to check)
    at = ["spec", "rayClusterSpec", "workerGroupSpecs"]
    groups = {g.get("groupName"): (i, g) for i, g in enumerate(_list(_get(spec, "rayClusterSpec", "workerGroupSpecs")))
              if isinstance(g, dict)}
    for t, tier in enumerate(job.tiers):
        named = f"tiers[{t}] ({tier.name}) of the job in spec.entrypoint"
        if tier.name not in groups:
            yield Finding(field_path(at), f"has no group {tier.name!r} for {named}: its workers would never get a node; "
                                          "add one (spotfallback manifest kuberay writes a group per tier)")
            continue
        i, group = groups[tier.name]
        most = group.get("maxReplicas")
        if isinstance(most, int) and not isinstance(most, bool) and most < tier.num_workers:
            yield Finding(field_path([*at, i, "maxReplicas"]), f"{most}, fewer than the {tier.num_workers} workers of "
                                                               f"{named} (one pod each): its gang would never start")
        containers = _list(_get(group, "template", "spec", "containers"))
        if not containers or not isinstance(containers[0], dict):
            continue
        _, gpus, _ = _pod_requests({"containers": containers[:1]})
        wanted = tier.worker_resources().get("GPU", 0.0)
        if gpus < wanted:
            yield Finding(field_path([*at, i, "template", "spec", "containers", 0, "resources"]),
                          f"asks for {gpus:g} GPUs (nvidia.com/gpu), and a worker of {named} needs {wanted:g}: "
                          "Ray would never place one on these pods")


def _metadata_findings(doc: dict[str, Any], kind: str) -> Iterator[Finding]:
    meta = _dict(doc.get("metadata"))
    yield from _labels_findings(meta.get("labels"), ["metadata", "labels"])
    name = meta.get("name")
    if name is None:
        if not meta.get("generateName"):
            yield Finding("metadata.name", "required field is missing")
        return
    if isinstance(name, str) and (len(name) > MAX_NAME[kind] or not _DNS1035.fullmatch(name)):
        yield Finding(
            "metadata.name",
            f"{name!r} must be a DNS-1035 label of at most {MAX_NAME[kind]} characters "
            "(lowercase letters, digits, '-', starting with a letter) for KubeRay",
        )


# --- launcher checks ---------------------------------------------------------------------------


def _node_machine(node_config: Any) -> tuple[list[str], str] | None:
    """(path inside ``node_config``, name) of a launcher node type's machine type: EC2's
    ``InstanceType``, GCE's ``machineType`` or Azure's ``azure_arm_parameters.vmSize``, or None."""
    config = _dict(node_config)
    for path in (["InstanceType"], ["machineType"], ["azure_arm_parameters", "vmSize"]):
        name = _get(config, *path)
        if isinstance(name, str):
            return path, name
    return None


def _declared_beyond_machine(node_type: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    """A ``ray up`` node type declaring more CPUs or GPUs than its known machine has: Ray trusts
    the declared ``resources``, so it would place work on CPUs or GPUs the node lacks."""
    found = _node_machine(node_type.get("node_config"))
    name = found[1] if found else ""
    known = machine(name)
    if known is None:
        return
    for key, has in (("CPU", known.vcpus), ("GPU", known.gpus)):
        declared = _get(node_type, "resources", key)
        if isinstance(declared, int | float) and not isinstance(declared, bool) and declared > has:
            yield Finding(field_path([*at, "resources", key]),
                          f"declares {declared:g}, but {name!r} has {has}: Ray would place work on {key}s the node does not have")


def _gcp_series_findings(node_type: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    """A GCP node type whose machine series refuses its boot disk type (none given: the API's
    pd-standard) or needs gVNIC it does not ask for: ``ray up`` starts, but no VM is ever created.
    A node config built on an instance template is left alone, as the template may set both."""
    config = _dict(node_type.get("node_config"))
    name = config.get("machineType")
    series = catalog.gcp_series(name) if isinstance(name, str) else None
    if series is None or "sourceInstanceTemplate" in config:
        return
    at = [*at, "node_config"]
    for i, disk in enumerate(_list(config.get("disks"))):
        params = _dict(_dict(disk).get("initializeParams"))
        if not _dict(disk).get("boot") or not params:
            continue
        given = params.get("diskType")
        kind = given.rsplit("/", 1)[-1] if isinstance(given, str) else catalog.GCP_DISK_TYPE_DEFAULT
        if kind not in series.boot_disks:
            said = f"is {kind!r}" if isinstance(given, str) else f"is not set, so the API gives {catalog.GCP_DISK_TYPE_DEFAULT!r}"
            yield Finding(field_path([*at, "disks", i, "initializeParams", "diskType"]),
                          f"{said}, which {name!r} ({series.name}) refuses as a boot disk, so its VMs are never created; "
                          f"use one of {', '.join(series.boot_disks)}")
    if not series.gvnic:
        return
    interfaces = _list(config.get("networkInterfaces"))
    if not interfaces:
        yield Finding(field_path([*at, "networkInterfaces"]),
                      f"not set, so Ray gives the node a VirtIO network interface, which {name!r} ({series.name}) does not "
                      f"have (gVNIC is its only one): set networkInterfaces: [{{nicType: {catalog.GVNIC}, accessConfigs: [{{name: "
                      "External NAT, type: ONE_TO_ONE_NAT}]}] (and subnetwork, if not the default network), on every node "
                      "type alike, with a boot image that has the gVNIC driver")
    for i, interface in enumerate(interfaces):
        nic = _dict(interface).get("nicType")
        if nic != catalog.GVNIC:
            yield Finding(field_path([*at, "networkInterfaces", i, "nicType"]),
                          f"{'is ' + repr(nic) if nic is not None else 'is not set (VirtIO)'}, but {name!r} ({series.name}) has only gVNIC network "
                          f"interfaces: set nicType: {catalog.GVNIC}, with a boot image that has the gVNIC driver")


# Top-level fields of older Ray releases that Ray 2's launcher schema no longer has, and what replaces them.
_RAY_LEGACY_FIELDS = {
    "head_node": "put the head's node config under available_node_types.<head type>.node_config and name that "
                 "type in head_node_type (Ray accepts the field only when it is empty)",
    "worker_nodes": "put the workers' node config under available_node_types.<worker type>.node_config (Ray accepts "
                    "the field only when it is empty)",
    "initial_workers": "set min_workers on a node type in available_node_types",
    "autoscaling_mode": "upscaling_speed sets how fast the cluster grows",
    "target_utilization_fraction": "upscaling_speed sets how fast the cluster grows",
}


# What ``ray up`` takes from its provider's defaults (``python/ray/autoscaler/<provider>/defaults.yaml``,
# Ray 2.60) for a config that leaves these top-level fields out: the cluster's cap on worker nodes
# and the head's node type. On-prem (``local``) clusters are prepared otherwise.
RAY_PROVIDER_DEFAULTS: dict[str, dict[str, Any]] = {
    "aws": {"max_workers": 2, "head_node_type": "ray.head.default"},
    "azure": {"max_workers": 2, "head_node_type": "ray.head.default"},
    "gcp": {"max_workers": 2, "head_node_type": "ray_head_default"},
    "vsphere": {"max_workers": 5, "head_node_type": "ray.head.default"},
    "spark": {"max_workers": 8, "head_node_type": "ray.head.default"},
    "readonly": {"max_workers": 0, "head_node_type": "ray.head.default"},
}


# The node types of those defaults (their ``available_node_types``), which ``ray up`` takes for a
# config that lists none of its own: its ``head_node_type`` must then be one of them.
RAY_DEFAULT_NODE_TYPES: dict[str, tuple[str, ...]] = {
    "aws": ("ray.head.default", "ray.worker.default"),
    "azure": ("ray.head.default", "ray.worker.default"),
    "gcp": ("ray_head_default", "ray_worker_small"),
    "vsphere": ("ray.head.default", "worker", "worker_2"),
    "spark": ("ray.head.default", "ray.worker"),
    "readonly": ("ray.head.default",),
}


# The node providers Ray 2.60's launcher knows (``ray.autoscaler._private.providers._NODE_PROVIDERS``;
# tests/unit/test_ray_contract.py pins the two together).
RAY_NODE_PROVIDERS = frozenset({"local", "fake_multinode", "fake_multinode_docker", "readonly", "aws", "gcp", "vsphere",
                                "azure", "kuberay", "aliyun", "external", "spark"})


def _provider_defaults(doc: dict[str, Any]) -> dict[str, Any]:
    """The top-level fields ``ray up`` fills from its provider's defaults, for those ``doc`` leaves out."""
    defaults = RAY_PROVIDER_DEFAULTS.get(str(_get(doc, "provider", "type")), {})
    return {key: value for key, value in defaults.items() if key not in doc}


def _as_ray_validates(doc: dict[str, Any]) -> dict[str, Any]:
    """The config as ``ray up`` checks it against its schema. Ray (``prepare_config``, then
    ``validate_config``) first merges its provider's defaults, which give ``cluster_name``,
    ``max_workers`` and ``head_node_type`` where the config has none, drops
    the top-level ``min_workers`` (on-prem, moves it into its one node type) and an empty legacy
    ``head_node``/``worker_nodes``, replaces an empty ``available_node_types``/``head_node_type``
    on-prem, and on AWS fills a node type's missing ``resources`` from its instance type."""
    out = {**_provider_defaults(doc), **doc}
    out.setdefault("cluster_name", "default")
    out.pop("min_workers", None)
    provider = _get(out, "provider", "type")
    emptied = ("head_node", "worker_nodes") + (("available_node_types", "head_node_type") if provider == "local" else ())
    for key in emptied:
        if key in out and not out[key]:
            del out[key]
    types = out.get("available_node_types")
    if provider == "aws" and isinstance(types, dict):
        out["available_node_types"] = {
            name: {"resources": {}, **node_type} if isinstance(node_type, dict) else node_type
            for name, node_type in types.items()
        }
    return out


def _launcher_schema_findings(doc: dict[str, Any]) -> Iterator[Finding]:
    on_prem = _get(doc, "provider", "type") == "local"
    for finding in _schema_check(launcher_validator(), _as_ray_validates(doc)):
        if on_prem and finding.path in ("head_node", "worker_nodes"):
            continue  # refused on-prem in any release (_on_prem_findings says so); no node type replaces it there
        hint = _RAY_LEGACY_FIELDS.get(finding.path)
        if hint and finding.message.startswith("unknown field"):
            finding = Finding(finding.path, f"a field of older Ray releases, which Ray 2's launcher refuses: {hint}")
        yield finding
    if "min_workers" in doc and _get(doc, "provider", "type") != "local":
        yield Finding("min_workers", "Ray ignores a top-level min_workers (only an on-prem cluster uses it): set "
                                     "min_workers on a node type in available_node_types", warning=True)


# The one node type Ray gives an on-prem cluster (``ray.autoscaler._private.local.config``); a config
# that already has it was prepared by ``ray up`` and is taken as it is.
LOCAL_CLUSTER_NODE_TYPE = "local.cluster.node"


def _on_prem_findings(doc: dict[str, Any]) -> Iterator[Finding]:
    """What ``ray up`` refuses in an on-prem (``provider.type: local``) config before it looks at its schema."""
    if LOCAL_CLUSTER_NODE_TYPE in _dict(doc.get("available_node_types")):
        return
    for key in ("head_node", "worker_nodes", "available_node_types"):
        if doc.get(key):
            yield Finding(key, "Ray refuses it on an on-prem (provider type local) cluster, which gets one node type of its "
                               "own: remove it (the machines come from provider.head_ip and provider.worker_ips, or from "
                               "provider.coordinator_address)")
    low, cap = doc.get("min_workers"), doc.get("max_workers")
    if "min_workers" in doc and (not isinstance(low, int) or isinstance(low, bool) or low < 0):
        yield Finding("min_workers", f"expected a number of worker nodes (0 or more), got {_json_type(low)} {short_repr(low)}".rstrip())
    elif isinstance(low, int) and isinstance(cap, int) and not isinstance(cap, bool) and low > cap:
        yield Finding("min_workers", f"{low} is more than max_workers {cap}, which Ray refuses on an on-prem cluster")
    provider = _dict(doc.get("provider"))
    if "coordinator_address" in provider:
        if "max_workers" not in doc:
            yield Finding("max_workers", "required for an on-prem cluster whose machines a coordinator gives "
                                         "(provider.coordinator_address): set the most worker nodes to ask it for")
    else:
        missing = [key for key in ("head_ip", "worker_ips") if key not in provider]
        if missing:
            yield Finding(field_path(["provider", missing[0]]), "required for an on-prem cluster: give head_ip and "
                                                                "worker_ips, or a coordinator_address")


def _launcher_findings(doc: dict[str, Any]) -> Iterator[Finding]:
    provider = _get(doc, "provider", "type")
    if isinstance(provider, str) and provider not in RAY_NODE_PROVIDERS:
        hint = ("; on Kubernetes, Ray runs under KubeRay: write its files with spotfallback manifest kuberay"
                if provider == "kubernetes" else "")
        yield Finding("provider.type", f"{provider!r} is not one of Ray's node providers "
                                       f"({', '.join(sorted(RAY_NODE_PROVIDERS))}){hint}")
        return
    if provider == "local":
        yield from _on_prem_findings(doc)
        return
    listed = doc.get("available_node_types")
    types = _dict(listed)
    # Ray's validate_config: where the config lists node types (even none), head_node_type (or the
    # provider's default) must be one of them; where it lists none, one of the provider's defaults.
    defaults = _provider_defaults(doc) if isinstance(listed, dict) else {}
    head_type = doc.get("head_node_type", defaults.get("head_node_type"))
    if isinstance(listed, dict) and not listed:
        named = (f"head_node_type {head_type!r} (Ray's {provider} default)" if "head_node_type" in defaults
                 else f"head_node_type {head_type!r}" if isinstance(head_type, str) else "head_node_type")
        yield Finding("available_node_types", f"is empty, but ray up needs {named} to be one of available_node_types: "
                                              "define the head's node type here (and one per kind of worker node)")
    elif "available_node_types" not in doc and isinstance(head_type, str) and not {"head_node", "worker_nodes"} & doc.keys():
        ray_types = RAY_DEFAULT_NODE_TYPES.get(str(provider), ())
        if ray_types and head_type not in ray_types:
            yield Finding("head_node_type", f"{head_type!r} is not one of available_node_types, which is not set, so ray "
                                            f"up takes Ray's {provider} default node types ({', '.join(ray_types)}): "
                                            "define the head's node type in available_node_types")
    elif isinstance(head_type, str) and types and head_type not in types:
        if "head_node_type" in defaults:
            provider = _get(doc, "provider", "type")
            yield Finding("head_node_type", f"not set, so ray up takes Ray's {provider} default {head_type!r}, which is "
                                            f"not one of available_node_types ({', '.join(types)}): name the head's node type")
        else:
            yield Finding("head_node_type", f"{head_type!r} is not one of available_node_types ({', '.join(types)})")
    why = "the head must run on on-demand capacity (a preempted head kills the run)"
    total_min = 0
    allowed: float = 0  # worker nodes the node types allow; a type without max_workers allows any number
    for name, node_type in types.items():
        if not isinstance(node_type, dict):
            continue
        at: list[str | int] = ["available_node_types", name]
        spot_config = vm_config_is_spot(node_type.get("node_config"))
        if (spelling := vm_market_spelling(node_type.get("node_config"))) is not None:
            yield Finding(field_path([*at, "node_config"]) + "." + spelling[0], spelling[1])
        for path, problem in unknown_fields(provider, node_type.get("node_config")):
            yield Finding(field_path([*at, "node_config", *path]), problem)
        if provider == "gcp":
            yield from _gcp_series_findings(node_type, at)
        yield from _zone_label_findings(doc, node_type, at)
        market = _get(node_type, "labels", MARKET_LABEL)
        low = node_type.get("min_workers", 0)
        if isinstance(low, int):
            total_min += low  # Ray counts every type's, the head's too
        if name == head_type:
            if (found := _node_machine(node_type.get("node_config"))) and (too_small := head_machine_problem(found[1])):
                yield Finding(field_path([*at, "node_config", *found[0]]), too_small)
            if spot_config:
                yield Finding(field_path([*at, "node_config"]), f"requests spot/preemptible capacity, but {why}")
            if market == SPOT:
                yield Finding(field_path([*at, "labels", MARKET_LABEL]), f"is 'spot', but {why}")
            continue
        yield from _declared_beyond_machine(node_type, at)
        high = node_type.get("max_workers")
        allowed += high if isinstance(high, int) else math.inf
        if isinstance(low, int) and isinstance(high, int) and low > high:
            yield Finding(field_path([*at, "min_workers"]), f"{low} is more than max_workers {high}")
        if (market == SPOT) != spot_config and market in (SPOT, ON_DEMAND):
            asked = "spot" if spot_config else "on-demand"
            yield Finding(field_path([*at, "labels", MARKET_LABEL]), f"says {market!r}, but node_config requests {asked} capacity", warning=True)
    yield from _worker_cap_findings(doc, defaults, total_min, allowed)


def _zone_label_findings(doc: dict[str, Any], node_type: dict[str, Any], at: list[str | int]) -> Iterator[Finding]:
    """A node type whose Ray zone label is not where Ray's launcher puts it: a zone the provider does
    not launch in, or (on AWS, with several zones) no subnets of its own, so that it may land in any."""
    zone, zones = _get(node_type, "labels", ZONE_LABEL), _get(doc, "provider", "availability_zone")
    if not isinstance(zone, str) or not isinstance(zones, str) or not zones.strip():
        return
    listed = [z.strip() for z in zones.split(",")]
    where = field_path([*at, "labels", ZONE_LABEL])
    if zone not in listed:
        yield Finding(where, f"says {zone!r}, but the provider launches nodes only in {', '.join(listed)} "
                             "(provider.availability_zone)")
    elif len(listed) > 1 and _get(doc, "provider", "type") == "aws" and not _get(node_type, "node_config", "SubnetIds"):
        yield Finding(where, f"says {zone!r}, but the node type names no SubnetIds, so Ray's launcher may put it in any of "
                             f"{', '.join(listed)}: give it {zone}'s subnets", warning=True)


def _worker_cap_findings(doc: dict[str, Any], defaults: dict[str, Any], total_min: int, allowed: float) -> Iterator[Finding]:
    """The cluster's cap on worker nodes against its node types' ``min_workers`` (Ray refuses a cap
    below their sum) and, where Ray's default is the cap, against what the node types allow."""
    cap = doc.get("max_workers", defaults.get("max_workers"))
    if not isinstance(cap, int):
        return
    if "max_workers" not in defaults:
        if total_min > cap:
            yield Finding("max_workers", f"{cap} is less than the sum of min_workers ({total_min})")
        return
    default = f"not set, so ray up takes Ray's {_get(doc, 'provider', 'type')} default, {cap},"
    fix = "set max_workers to the most worker nodes the cluster may have"
    if total_min > cap:
        yield Finding("max_workers", f"{default} which is less than the sum of min_workers ({total_min}): {fix}")
    elif allowed > cap:
        theirs = "set no limit" if math.isinf(allowed) else f"allow up to {allowed:g}"
        yield Finding("max_workers", f"{default} which caps the cluster at {cap} worker nodes where its node types "
                                     f"{theirs}: {fix}", warning=True)


# --- operator version ---------------------------------------------------------------------------

# The KubeRay release that first knows each field these files may use, from the operator's CRDs
# and Go types (ray-project/kuberay tags). An older operator's API server prunes a field its CRD
# lacks without a word; an unknown submission mode is kept, but that operator never submits the job.
#   ray.io/v1                                  1.0.0
#   spec.submissionMode, activeDeadlineSeconds 1.1.0
#   initContainers[].restartPolicy in pods     1.1.0  (CRD regenerated on Kubernetes 1.29 types)
#   RayJob spec.backoffLimit                   1.2.0
#   autoscalerOptions.version                  1.4.0
#   group labels and resources, SidecarMode    1.5.0
#   autoscaling a group for a label selector   1.5.1  (Ray's "KubeRay label-based scheduling" guide:
#                                                      full support with Ray 2.51 and KubeRay 1.5.1)
KUBERAY_SINCE: dict[str, str] = {
    "ray.io/v1": "1.0.0",
    "submissionMode": "1.1.0",
    "activeDeadlineSeconds": "1.1.0",
    "native sidecar": "1.1.0",
    "backoffLimit": "1.2.0",
    "autoscalerOptions.version": "1.4.0",
    "group labels": "1.5.0",
    "group resources": "1.5.0",
    "SidecarMode": "1.5.0",
    "label autoscaling": "1.5.1",
}

# Every other field of a RayCluster / RayJob spec and of their groups that the v1 CRD gained after
# 1.0.0: the tag whose ray-operator/config/crd/bases first has it (v1.0.0 to v1.7.0), by where it
# sits; a dotted key is a field an option object gained after the object itself. "cluster" is a
# RayCluster's spec or a RayJob's spec.rayClusterSpec. An older operator's API server prunes each
# without a word (a KubeRay 1.2 cluster with gcsFaultToleranceOptions runs without GCS fault
# tolerance; a 1.6 one drops gcsFaultToleranceOptions.backend and keeps Redis).
KUBERAY_FIELD_SINCE: dict[tuple[str, str], str] = {
    ("cluster", "suspend"): "1.1.0",
    ("cluster", "gcsFaultToleranceOptions"): "1.3.0",
    ("cluster", "managedBy"): "1.3.0",
    ("cluster", "authOptions"): "1.5.1",
    ("cluster", "authOptions.secretName"): "1.6.0",
    ("cluster", "authOptions.enableK8sTokenAuth"): "1.6.0",
    ("cluster", "autoscalerOptions.command"): "1.7.0",
    ("cluster", "autoscalerOptions.args"): "1.7.0",
    ("cluster", "gcsFaultToleranceOptions.backend"): "1.7.0",
    ("cluster", "gcsFaultToleranceOptions.storage"): "1.7.0",
    ("cluster", "upgradeStrategy"): "1.6.0",
    ("cluster", "historyServerOptions"): "1.7.0",
    ("cluster", "networkPolicy"): "1.7.0",
    ("cluster", "tlsOptions"): "1.7.0",
    ("job", "submitterConfig"): "1.2.0",
    ("job", "managedBy"): "1.3.0",
    ("job", "deletionStrategy"): "1.5.0",
    ("job", "preRunningDeadlineSeconds"): "1.6.0",
    ("head group", "ingressOptions"): "1.7.0",
    ("worker group", "numOfHosts"): "1.1.0",
    ("worker group", "idleTimeoutSeconds"): "1.3.0",
    ("worker group", "suspend"): "1.3.0",
    ("worker group", "priority"): "1.7.0",
}
KUBERAY_SINCE.update({f"{where} {key}": since for (where, key), since in KUBERAY_FIELD_SINCE.items()})


def _fields_since(obj: Any, where: str, at: list[str | int]) -> list[tuple[str, str]]:
    """(field path, ``KUBERAY_SINCE`` key) for each field of ``KUBERAY_FIELD_SINCE[where]`` that ``obj`` sets."""
    return [(field_path([*at, *key.split(".")]), f"{where} {key}") for (w, key) in KUBERAY_FIELD_SINCE
            if w == where and _get(obj, *key.split(".")) is not None]


MIN_KUBERAY_ANNOTATION = "spotfallback/min-kuberay-version"

# Fields that later releases of the v1 CRD removed, so the shipped schema does not know them: files
# written for the operator that had them still carry them, and "unknown field; check its spelling"
# would mislead. (first release with it, release that removed it, fix). From the removal on,
# kubectl's default strict field validation refuses them and a lax apply drops them.
KUBERAY_REMOVED: dict[tuple[str, str], tuple[str, str, str]] = {
    ("RayCluster", "spec.headGroupSpec.replicas"): (
        "1.0.0", "1.1.0", "every operator ignores it, a Ray cluster has exactly one head pod; remove it"),
    ("RayJob", "spec.rayClusterSpec.headGroupSpec.replicas"): (
        "1.0.0", "1.1.0", "every operator ignores it, a Ray cluster has exactly one head pod; remove it"),
    ("RayJob", "spec.runtimeEnv"): (
        "1.0.0", "1.1.0", "it held the runtime env base64-encoded; write it, decoded, as YAML in spec.runtimeEnvYAML"),
    ("RayJob", "spec.deletionPolicy"): (
        "1.3.0", "1.5.0", "spec.deletionStrategy replaced it: give the policy as deletionStrategy.onSuccess.policy "
                          "and deletionStrategy.onFailure.policy"),
}


def parse_version(text: str, where: str = "--kuberay-version") -> tuple[int, ...]:
    """``1.4.2`` -> (1, 4, 2); a leading ``v`` is allowed. ValueError names ``where`` and the form."""
    if not isinstance(text, str):
        raise ValueError(f"{where}: {text!r} is not a version such as 1.5.0 (give it as text, e.g. '1.5.0')")
    parts = text.strip().lstrip("v").split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{where}: {text!r} is not a version such as 1.5.0")
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _cluster_spec(doc: dict[str, Any], kind: str) -> tuple[dict[str, Any], list[str | int]]:
    """(spec, path) of the cluster: a RayCluster's spec or a RayJob's spec.rayClusterSpec."""
    spec = _dict(doc.get("spec"))
    if kind == "RayJob":
        return _dict(spec.get("rayClusterSpec")), ["spec", "rayClusterSpec"]
    return spec, ["spec"]


def _cluster_groups(doc: dict[str, Any], kind: str) -> list[tuple[list[str | int], Any]]:
    """(path, group) of the head group and each worker group of a RayCluster or a RayJob's cluster."""
    spec, at = _cluster_spec(doc, kind)
    groups: list[tuple[list[str | int], Any]] = [([*at, "headGroupSpec"], spec.get("headGroupSpec"))]
    listed = spec.get("workerGroupSpecs")
    groups += [([*at, "workerGroupSpecs", i], g) for i, g in enumerate(listed if isinstance(listed, list) else [])]
    return groups


def kuberay_needs(doc: dict[str, Any], kind: str) -> list[tuple[str, str]]:
    """(field path, ``KUBERAY_SINCE`` key) for each versioned field ``doc`` uses."""
    spec = _dict(doc.get("spec"))
    needs: list[tuple[str, str]] = [("apiVersion", "ray.io/v1")]
    at: list[str | int] = ["spec"]
    if kind == "RayJob":
        mode = spec.get("submissionMode")
        if mode is not None:
            needs.append(("spec.submissionMode", "SidecarMode" if mode == "SidecarMode" else "submissionMode"))
        needs += [(f"spec.{key}", key) for key in ("activeDeadlineSeconds", "backoffLimit") if key in spec]
        needs += _fields_since(spec, "job", at)
    spec, at = _cluster_spec(doc, kind)
    needs += _fields_since(spec, "cluster", at)
    if _get(spec, "autoscalerOptions", "version") is not None:
        needs.append((field_path([*at, "autoscalerOptions", "version"]), "autoscalerOptions.version"))
    autoscaled = spec.get("enableInTreeAutoscaling") is True
    for where, group in _cluster_groups(doc, kind):
        needs += [(field_path([*where, key]), f"group {key}") for key in ("labels", "resources") if _dict(group).get(key)]
        needs += _fields_since(group, "worker group" if "workerGroupSpecs" in where else "head group", where)
        if autoscaled and where[-2:-1] == ["workerGroupSpecs"] and _dict(group).get("labels"):
            # A fallback tier starts at zero replicas: only the autoscaler, scaling the group
            # for the gang's label selector, ever gives it nodes.
            needs.append((field_path([*where, "labels"]), "label autoscaling"))
        for i, init in enumerate(_get(group, "template", "spec", "initContainers") or []):
            if isinstance(init, dict) and "restartPolicy" in init:
                needs.append((field_path([*where, "template", "spec", "initContainers", i, "restartPolicy"]), "native sidecar"))
    return needs


# Fields the operator refuses unless one of its feature gates is on (its validation rejects the
# object, so no cluster is made): (where the field is, its path there, the value that needs the gate
# or None for any, the gate, the first release with the gate on by default or None for none to
# 1.7.0). From ray-operator/pkg/features/features.go and controllers/ray/utils/validation.go.
FEATURE_GATED: tuple[tuple[str, str, Any, str, tuple[int, ...] | None], ...] = (
    ("job", "deletionStrategy", None, "RayJobDeletionPolicy", (1, 6, 0)),
    ("worker group", "suspend", True, "RayJobDeletionPolicy", (1, 6, 0)),
    ("cluster", "networkPolicy", None, "RayClusterNetworkPolicy", None),
    ("cluster", "tlsOptions", None, "RayClusterMTLS", None),
    ("cluster", "historyServerOptions", None, "RayClusterHistoryServer", None),
    ("cluster", "gcsFaultToleranceOptions.backend", "rocksdb", "GCSFaultToleranceEmbeddedStorage", None),
)


def _gated_fields(doc: dict[str, Any], kind: str) -> Iterator[tuple[list[str | int], tuple[str, str], str, tuple[int, ...] | None]]:
    """(path, its ``KUBERAY_FIELD_SINCE`` key, gate, on by default since) for each gated field ``doc`` sets."""
    places: list[tuple[str, Any, list[str | int]]] = [("job", _dict(doc.get("spec")), ["spec"])] if kind == "RayJob" else []
    places.append(("cluster", *_cluster_spec(doc, kind)))
    places += [("worker group", group, where) for where, group in _cluster_groups(doc, kind) if "workerGroupSpecs" in where]
    for where, obj, path in places:
        for gated_where, key, value, gate, default_on in FEATURE_GATED:
            got = _get(obj, *key.split("."))
            if gated_where == where and got is not None and (value is None or got == value):
                yield [*path, *key.split(".")], (where, key), gate, default_on


def _feature_gate_findings(doc: dict[str, Any], kind: str, version: tuple[int, ...] | None) -> Iterator[Finding]:
    """A warning for each field the stated operator (the newest, without ``--kuberay-version``)
    refuses with its default feature gates: the fix is the operator's, not the file's."""
    running = "KubeRay" if version is None else f"KubeRay {_version_text(version)}"
    for path, what, gate, default_on in _gated_fields(doc, kind):
        since = KUBERAY_FIELD_SINCE.get(what)
        if version is not None and since is not None and parse_version(since) > version:
            continue  # that operator has no such field: the "drops this field" error says so
        if default_on is not None and (version is None or version >= default_on):
            continue
        off = f"off by default before {_version_text(default_on)}" if default_on else "alpha, off by default"
        yield Finding(field_path(path), f"{running} refuses the object unless the operator runs with its {gate} "
                      f"feature gate on ({off}): enable it (Helm: featureGates, name {gate}, enabled true; "
                      f"or the operator's --feature-gates={gate}=true)", warning=True)


def _operator_findings(doc: dict[str, Any], kind: str, version: tuple[int, ...] | None) -> Iterator[Finding]:
    """What the stated operator (``--kuberay-version``) would drop or not know, and whether the
    file's ``spotfallback/min-kuberay-version`` annotation still covers what it uses."""
    needs = [(path, what, parse_version(KUBERAY_SINCE[what])) for path, what in kuberay_needs(doc, kind)]
    stated = _get(doc, "metadata", "annotations", MIN_KUBERAY_ANNOTATION)
    where = field_path(["metadata", "annotations", MIN_KUBERAY_ANNOTATION])
    minimum: tuple[int, ...] | None = None
    if stated is not None:
        try:
            minimum = parse_version(str(stated), where)
        except ValueError as e:
            yield Finding(where, f"{str(e).partition(': ')[2]}; it says which KubeRay the file needs")
    if minimum is not None:
        path, what, since = max(needs, key=lambda need: need[2])
        if since > minimum:
            yield Finding(where, f"says {stated}, but {path} ({what}) needs KubeRay {_version_text(since)}; set it to {_version_text(since)}")
    yield from _feature_gate_findings(doc, kind, version)
    if version is None:
        return
    running = _version_text(version)
    consequences = {
        "ray.io/v1": f"KubeRay {running} has no ray.io/v1 API",
        "SidecarMode": f"SidecarMode: KubeRay {running} does not know this mode and would never submit the job",
        "group labels": f"KubeRay {running} drops group labels silently: no node gets {MARKET_LABEL}, so no tier finds its workers",
        "label autoscaling": (f"KubeRay {running} does not fully support scaling a worker group for a label selector: "
                              "{group} at zero replicas may never get nodes"),
        "native sidecar": f"KubeRay {running} drops it silently: the sidecar becomes an ordinary init container, which must exit before Ray starts",
    }
    labels_at = {field_path([*where, "labels"]): _dict(_get(group, "labels")) for where, group in _cluster_groups(doc, kind)}
    for path, what, since in needs:
        if since > version:
            first = _version_text(since)
            consequence = consequences.get(what, f"KubeRay {running} drops this field silently")
            labels = labels_at.get(path, {})
            if what == "group labels" and MARKET_LABEL not in labels:
                consequence = (f"KubeRay {running} drops group labels silently: this group's Ray nodes get none of "
                               f"them ({', '.join(labels)}), so no label selector matches them")
            if what == "label autoscaling":
                consequence = consequence.format(group="a tier's group" if MARKET_LABEL in labels else "this group")
            yield Finding(path, f"{consequence} (it first appears in {first}; upgrade the operator to {first} or later)")
    if minimum is not None and minimum > version:
        needed = _version_text(minimum)
        yield Finding(where, f"the file needs KubeRay {needed}, the operator is {running}; upgrade the operator to {needed} or later")


def _removed_field(finding: Finding, kind: str, version: tuple[int, ...] | None) -> Finding:
    """An "unknown field" finding for a field KubeRay removed, said as such: an error from the
    release that removed it on (or with no version stated), a warning for an operator that has it."""
    removed = KUBERAY_REMOVED.get((kind, finding.path))
    if removed is None or not finding.message.startswith("unknown field"):
        return finding
    added, since, fix = removed
    if version is not None and version < parse_version(added):
        return finding  # that operator never had it either
    if version is not None and version < parse_version(since):
        return Finding(finding.path, f"KubeRay {_version_text(version)} still accepts it, but {since} removed it: {fix}", warning=True)
    return Finding(finding.path, f"removed in KubeRay {since} (kubectl refuses it as an unknown field, or the API "
                                 f"server drops it): {fix}")


GROUP_PATH = "spec.template.spec.nodeClassRef.group"


def _nodepool_findings(doc: dict[str, Any], api: str) -> list[Finding]:
    """A Karpenter NodePool: its provider's CRD schema (with its rules on node labels), and the AKS spot taint."""
    if api != karpenter.API_VERSION:
        return [Finding("apiVersion", f"{api!r}: Karpenter 1.1 and later serve NodePools only as {karpenter.API_VERSION} "
                                      f"(the shipped CRDs too), and only those are checked; migrate the NodePool to "
                                      f"{karpenter.API_VERSION} (Karpenter's v1 migration guide)")]
    cloud = karpenter.nodepool_cloud(doc)
    findings: list[Finding] = []
    group = karpenter.nodeclass_group(doc)
    versioned = isinstance(group, str) and "/" in group
    if versioned:
        # `group: karpenter.k8s.aws/v1` (an apiVersion): the CRD's pattern refuses any '/'.
        bare = group.partition("/")[0]
        cloud = karpenter.group_cloud(bare)
        findings.append(Finding(GROUP_PATH, f"{group!r} is an apiVersion, which the API server refuses here: "
                                            f"nodeClassRef.group is the API group alone, {bare!r}"))
    if cloud is None:
        cloud = karpenter.KarpenterCloud.EKS_KARPENTER
        if group is not None:
            findings.append(Finding(GROUP_PATH, f"{short_repr(group)} is neither "
                                    "karpenter.k8s.aws (EKS) nor karpenter.azure.com (AKS): checked against EKS's "
                                    "NodePool schema", warning=True))
    findings += [f for f in _schema_check(karpenter.nodepool_validator(cloud), doc)
                 if not (versioned and f.path == GROUP_PATH)]
    problem = karpenter.aks_spot_taint_problem(doc, cloud)
    if problem:
        findings.append(Finding(karpenter.TAINTS_PATH, problem))
    findings += [Finding(karpenter.TEMPLATE_LABELS_PATH, p) for p in karpenter.template_label_problems(doc, cloud)]
    return findings


# --- entry points ------------------------------------------------------------------------------


def validate_document(doc: Any, kuberay_version: str | None = None) -> tuple[str, list[Finding]]:
    """(what the document is, its findings) for one parsed YAML document; with
    ``kuberay_version``, also what that operator would drop (ValueError if it is no version)."""
    version = parse_version(kuberay_version, "kuberay_version") if kuberay_version else None
    return _validate_normalized(_as_read(doc), version)


def _as_read(doc: Any) -> Any:
    """The document as its reader sees it: the API server, or ``ray up`` for a launcher config."""
    return _normalize(doc, keep_null=_is_launcher_config(doc))


def _is_launcher_config(doc: Any) -> bool:
    """Whether a parsed document is shaped as a Ray cluster-launcher config: a mapping with some of
    its top-level fields and neither apiVersion nor kind."""
    return (isinstance(doc, dict) and not doc.get("apiVersion") and not doc.get("kind")
            and bool({_key(k) for k in doc} & (launcher_schema()["properties"].keys() - {"metadata"})))


def _validate_normalized(doc: Any, version: tuple[int, ...] | None) -> tuple[str, list[Finding]]:
    """``validate_document`` of a document ``_normalize`` has already been through."""
    if not isinstance(doc, dict):
        return "?", [Finding("(top level)", f"expected a mapping, got {_json_type(doc)}")]
    api, kind = doc.get("apiVersion") or None, doc.get("kind") or None  # kubectl takes "" as unset too
    if api is None and kind is None:
        if _is_launcher_config(doc):
            findings = list(_launcher_schema_findings(doc)) + list(_launcher_findings(doc))
            return LAUNCHER_KIND, findings
        return "?", [Finding("(top level)", "neither a Kubernetes object (apiVersion, kind) nor a Ray cluster-launcher config")]
    shape = _object_shape_findings(api, kind)
    if shape:
        return str(kind) if isinstance(kind, str) else "?", shape
    if kind == "NodePool" and isinstance(api, str) and api.startswith("karpenter.sh/"):
        return kind, _nodepool_findings(doc, api)
    if not (isinstance(api, str) and api.startswith("ray.io/")):
        return f"{kind} (not checked)", []
    if kind not in KUBERAY_KINDS:
        return str(kind), [_unknown_ray_kind(str(kind), api)]
    if kind not in KUBERAY_FILES:
        return f"{kind} (not checked)", [Finding("kind", f"{kind!r} is not checked offline; only {' and '.join(KUBERAY_FILES)} are", warning=True)]
    if api != "ray.io/v1":
        return kind, [Finding("apiVersion", f"{api!r}: only ray.io/v1 is checked (v1alpha1 is deprecated); "
                                                   "set apiVersion: ray.io/v1 to have the file checked")]
    if "spec" not in doc:  # the schema leaves spec optional; the operator refuses an object without one
        doc = {**doc, "spec": {}}
    findings = [_removed_field(f, kind, version) for f in _schema_check(kuberay_validator(kind), doc)]
    findings += _metadata_findings(doc, kind)
    annotations = _dict(_get(doc, "metadata", "annotations"))
    if kind == "RayJob":
        findings += _job_findings(doc.get("spec"), annotations)
    else:
        findings += _cluster_findings(doc.get("spec"), ["spec"], annotations)
    findings += _operator_findings(doc, kind, version)
    return kind, findings


def _unknown_ray_kind(kind: str, api: str) -> Finding:
    """A kind the ray.io group does not have: kubectl finds no such resource and refuses the object."""
    by_lower = {k.lower(): k for k in KUBERAY_KINDS}
    close = [by_lower[k] for k in difflib.get_close_matches(kind.lower(), by_lower, n=1)]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return Finding("kind", f"{kind!r} is not a kind of {api.partition('/')[0]} (kubectl: no matches for kind "
                           f"{kind!r} in version {api!r}); KubeRay defines {', '.join(KUBERAY_KINDS)}{hint}")


def _object_shape_findings(api: Any, kind: Any) -> list[Finding]:
    """What kubectl refuses before any schema: a kind or apiVersion that is missing or not a
    string, and a KubeRay kind under another group (the API server has no such kind there)."""
    findings = []
    if kind is None:
        findings.append(Finding("kind", "missing: kubectl refuses an object without one; set the object's kind "
                                        f"(e.g. {' or '.join(KUBERAY_FILES)})"))
    elif not isinstance(kind, str):
        findings.append(Finding("kind", f"expected a string, got {_json_type(kind)}"))
    kuberay = isinstance(kind, str) and kind in KUBERAY_FILES
    group = f"ray.io/v1 for a {kind}" if kuberay else "the kind's group and version"
    if api is None:
        findings.append(Finding("apiVersion", f"missing: kubectl refuses an object without one; set it ({group})"))
    elif not isinstance(api, str):
        findings.append(Finding("apiVersion", f"expected a string, got {_json_type(api)}; set it ({group})"))
    elif kuberay and "/" not in api:
        findings.append(Finding("apiVersion", f"{api!r}: a {kind} is in the ray.io group; set apiVersion: ray.io/v1"))
    return findings


def validate_documents(docs: Iterable[Any], kuberay_version: str | None = None, job: JobConfig | None = None) -> Report:
    """Every document's findings; with ``job``, also whether the file's NodePools serve its ladder."""
    kinds: list[str] = []
    findings: list[Finding] = []
    pools: list[dict[str, Any]] = []
    version = parse_version(kuberay_version, "kuberay_version") if kuberay_version else None
    for i, doc in enumerate(d for d in docs if d is not None):
        doc = _as_read(doc)
        kind, found = _validate_normalized(doc, version)
        kinds.append(kind)
        findings += [Finding(f.path, f.message, f.warning, i) for f in found]
        if kind == "NodePool":
            pools.append(doc)
    if LAUNCHER_KIND in kinds and len(kinds) > 1:
        findings.append(Finding("(file)", f"a cluster-launcher config must be the file's only YAML document (ray up "
                                          f"reads one; this file has {len(kinds)}): put the others in files of their own"))
    if not kinds:
        findings.append(Finding("(top level)", "the file holds no YAML document"))
    elif job is not None:
        if not pools:
            findings.append(Finding("(file)", "--job checks a file's Karpenter NodePools against the ladder; this file "
                                    "has none", warning=True))
        else:
            cloud = next(filter(None, map(karpenter.nodepool_cloud, pools)), karpenter.KarpenterCloud.EKS_KARPENTER)
            findings += [Finding("(job)", problem) for problem in karpenter.ladder_findings(pools, job, cloud)]
    return Report(tuple(kinds), tuple(findings))


def validate_text(text: str, kuberay_version: str | None = None, job: JobConfig | None = None) -> Report:
    """The findings of every document in the YAML ``text`` (see ``validate_documents``)."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected the YAML as a str, got {type(text).__name__}; for a file, call validate_file(path)")
    try:
        docs = load_documents(text)
    except ValueError as e:
        return Report((), (Finding("(file)", str(e)),))
    return validate_documents(docs, kuberay_version, job)


def validate_file(path: str | Path, kuberay_version: str | None = None, job: JobConfig | None = None) -> Report:
    try:
        text = Path(path).read_text("utf-8")
    except OSError as e:
        return Report((), (Finding("(file)", f"cannot read {path}: {e.strerror}"),))
    except UnicodeDecodeError as e:
        return Report((), (Finding("(file)", f"{path} is not UTF-8 text (at byte offset {e.start}); save it as UTF-8"),))
    return validate_text(text, kuberay_version, job)


def assert_valid(doc: Any) -> None:
    """Raise ManifestInvalid if ``doc`` has errors; the generators call this before writing."""
    _, findings = validate_document(doc)
    errors = [f for f in findings if not f.warning]
    if errors:
        raise ManifestInvalid(errors)


def assert_valid_text(text: str) -> None:
    """Raise ManifestInvalid if YAML ``text`` has errors (in any of its documents)."""
    report = validate_text(text)
    if not report.ok:
        raise ManifestInvalid(report.errors)
