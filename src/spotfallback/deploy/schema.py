"""The schemas a generated file must satisfy, shipped as package data, and a JSON Schema
validator that also knows the Kubernetes extensions plain JSON Schema ignores.

The KubeRay CRD schema alone accepts a misspelt ``backofLimit``: Kubernetes *prunes* unknown
fields silently, so a typo there is a setting that quietly never applies. ``make_strict``
closes every object that lists its properties, which turns such typos into errors.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft7Validator, ValidationError, validators
from jsonschema.protocols import Validator

KUBERAY_FILES = {"RayJob": "rayjob.v1.json", "RayCluster": "raycluster.v1.json"}
LAUNCHER_FILE = "cluster-launcher.schema.json"

# Keys whose values are schemas (or maps/lists of schemas); everything else is data.
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf")
_SCHEMA_ONE = ("items", "additionalProperties", "not")

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}

# ObjectMeta as the API server accepts it: the CRD leaves `metadata` open (the server checks it
# itself), so without this a misspelt `metadata.lables` would pass offline.
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": _STR_MAP,
        "annotations": _STR_MAP,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
        "managedFields": {"type": "array", "items": {"type": "object"}},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": "string"},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "selfLink": {"type": "string"},
    },
}


def _walk_schemas(schema: Any) -> Iterator[dict[str, Any]]:
    """Every schema node below (and including) ``schema``, never descending into data."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key in _SCHEMA_MAPS:
        for sub in (schema.get(key) or {}).values():
            yield from _walk_schemas(sub)
    for key in _SCHEMA_LISTS:
        for sub in schema.get(key) or ():
            yield from _walk_schemas(sub)
    for key in _SCHEMA_ONE:
        yield from _walk_schemas(schema.get(key))


def extract_crd_schema(crd: Mapping[str, Any], version: str = "v1") -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one served version of a CRD, without its descriptions."""
    for entry in crd.get("spec", {}).get("versions", []):
        if entry.get("name") == version:
            schema = copy.deepcopy(entry["schema"]["openAPIV3Schema"])
            for node in _walk_schemas(schema):
                node.pop("description", None)
            return schema
    raise KeyError(f"CRD {crd.get('metadata', {}).get('name')!r} has no version {version!r}")


def make_strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Copy of ``schema`` where every object listing its properties rejects unknown fields,
    and the top-level ``metadata`` is a real ObjectMeta."""
    strict = copy.deepcopy(dict(schema))
    for node in _walk_schemas(strict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
    if "metadata" in strict.get("properties", {}):
        strict["properties"]["metadata"] = copy.deepcopy(OBJECT_META)
    return strict


def _data(name: str, subdir: str) -> dict[str, Any]:
    text = resources.files("spotfallback").joinpath("data", subdir, name).read_text("utf-8")
    return json.loads(text)


@cache
def _kuberay_raw(kind: str) -> dict[str, Any]:
    return _data(KUBERAY_FILES[kind], "kuberay")["schema"]


@cache
def kuberay_schema(kind: str, *, strict: bool = True) -> dict[str, Any]:
    """The shipped v1 schema of ``kind`` ('RayJob' or 'RayCluster'), strict by default."""
    raw = _kuberay_raw(kind)
    return make_strict(raw) if strict else raw


@cache
def launcher_schema() -> dict[str, Any]:
    """Ray's own cluster-launcher config schema (``ray/autoscaler/ray-schema.json``)."""
    return _data(LAUNCHER_FILE, "ray")["schema"]


# --- Kubernetes structural-schema extensions as jsonschema keywords -------------------------


def _list_type(validator: Any, list_type: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """``x-kubernetes-list-type``: 'set' items and 'map' keys must be unique, as the API server checks."""
    if not validator.is_type(instance, "array"):
        return
    if list_type == "set":
        seen: list[Any] = []
        for i, item in enumerate(instance):
            if item in seen:
                yield ValidationError(f"duplicate entry {item!r} in a set", path=[i])
            seen.append(item)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        item_props = (schema.get("items") or {}).get("properties", {})
        firsts: dict[tuple[Any, ...], int] = {}
        for i, item in enumerate(instance):
            if not isinstance(item, dict):
                continue
            values = tuple(item.get(k, item_props.get(k, {}).get("default")) for k in keys)
            if None in values:
                continue  # a missing key field is reported by `required`
            if values in firsts:
                what = ", ".join(f"{k}={v!r}" for k, v in zip(keys, values, strict=True))
                yield ValidationError(
                    f"duplicate entry ({what}); entry [{firsts[values]}] already has it",
                    path=[i, keys[0]] if len(keys) == 1 else [i],
                )
            else:
                firsts[values] = i


def _format(validator: Any, fmt: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """int32/int64 are range checks in Kubernetes; other formats are not checked offline."""
    bounds = _INT_RANGES.get(fmt)
    if bounds and validator.is_type(instance, "integer") and not bounds[0] <= instance <= bounds[1]:
        yield ValidationError(f"{instance} is out of range for {fmt}")


def _required(validator: Any, required: list[str], instance: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """A required field with a ``default`` may be left out: the API server applies defaults before it validates."""
    if not validator.is_type(instance, "object"):
        return
    props = schema.get("properties") or {}
    for name in required:
        if name not in instance and "default" not in (props.get(name) or {}):
            yield ValidationError(f"{name!r} is a required property")


KubernetesValidator = validators.extend(
    Draft7Validator, {"x-kubernetes-list-type": _list_type, "format": _format, "required": _required}
)


@cache
def kuberay_validator(kind: str, *, strict: bool = True) -> Validator:
    return KubernetesValidator(kuberay_schema(kind, strict=strict))


@cache
def launcher_validator() -> Validator:
    return Draft7Validator(launcher_schema())
