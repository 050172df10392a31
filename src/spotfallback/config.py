"""Validated configuration: capacity tiers and the ladder they form.

Pure: no Ray, no I/O beyond parsing a YAML string handed in. Every error names the field
and says how to fix it, because a bad ladder found mid-run costs real money.
"""

from __future__ import annotations

import datetime
import difflib
import ipaddress
import json
import math
import os
import re
import shlex
import typing
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from spotfallback.errors import ConfigError

MARKET_LABEL = "ray.io/market-type"
SPOT = "spot"
ON_DEMAND = "on-demand"
RESERVED = "reserved"

# The largest count or number of seconds most Kubernetes fields (int32) hold.
INT32_MAX = 2**31 - 1
# The longest duration a job file may give (10 years): longer than any run, and short enough
# for every timer (a wait past threading.TIMEOUT_MAX, about 292 years, is an OverflowError).
MAX_DURATION_S = 10 * 365 * 24 * 3600
MAX_DURATION_H = MAX_DURATION_S / 3600
# A job's durations when neither the command line nor a plan gives them (``plan`` and ``backtest``
# options, a hand-written ``plan.job``): a large model's write, its restore, a cloud's node start, AWS's notice.
DEFAULT_CHECKPOINT_COST_S = 300.0
DEFAULT_RESTART_OVERHEAD_S = 360.0
DEFAULT_PROVISIONING_DELAY_S = 180.0
DEFAULT_NOTICE_S = 120.0


def env_seconds(name: str, default: float) -> float:
    """A duration a ``SPOTFALLBACK_*`` environment variable tunes: ``default`` when it is unset, not
    a number, negative or infinite (a knob a shell reads while the run goes on must never stop it)."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


# The most workers a tier may have: Kubernetes counts a group's replicas in 32 bits.
MAX_WORKERS = INT32_MAX

# Ray holds a resource amount as a whole number of 1/10000ths in 64 bits (RESOURCE_UNIT_SCALING),
# and refuses a request finer than that step; a test checks agreement with the Ray installed.
RESOURCE_STEP = 1e-4
RESOURCE_MAX = (2**63 - 1) * RESOURCE_STEP

# Same syntax Ray enforces for node labels and label selectors (ray/_private/label_utils.py):
# Kubernetes-style keys with an optional DNS prefix, values of at most 63 characters, and
# selector values that may be negated (`!v`) or sets (`in(a,b)`, `!in(a,b)`).
# Kept here so the config module stays importable without Ray; a test checks agreement.
_LABEL = r"([a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?)"
_LABEL_RE = re.compile(rf"^{_LABEL}$")
_PREFIX_RE = re.compile(rf"^({_LABEL}?(\.{_LABEL}?)*)$")
_SELECTOR_VALUE_RE = re.compile(rf"^!?(?:in)?\({_LABEL}(?:, ?{_LABEL})*\)$|^!?{_LABEL}$")
_TIER_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


def label_key_error(key: str) -> str | None:
    """Why Ray would reject ``key`` as a label key, or None if it is valid."""
    if "/" in key:
        prefix, name = key.rsplit("/", 1)
        if len(prefix) > 253 or not _PREFIX_RE.fullmatch(prefix):
            return f"label key prefix {prefix!r} must be DNS labels separated by dots"
    else:
        name = key
    if len(name) > 63 or not _LABEL_RE.fullmatch(name):
        return (
            f"label key name {name!r} must be 1-63 characters, start and end alphanumeric, "
            "with only '-', '_', '.' between"
        )
    return None


def label_value_error(value: str) -> str | None:
    """Why Kubernetes (and Ray) would reject ``value`` as a node label's value, or None if it is valid."""
    if value == "" or _LABEL_RE.fullmatch(value):
        return None
    return f"label value {value!r} must be empty or 1-63 characters, start and end alphanumeric, with only '-', '_', '.' between"


def label_selector_value_error(value: str) -> str | None:
    """Why Ray would reject ``value`` in a label selector, or None if it is valid."""
    if value == "" or _SELECTOR_VALUE_RE.fullmatch(value):
        return None
    return (
        f"label selector value {value!r} must be a label value (1-63 characters, alphanumeric "
        "at both ends), optionally negated with '!' or a set like 'in(a,b)' / '!in(a,b)'"
    )


def selector_matches(value: str, label: str) -> bool:
    """Whether a node whose label is ``label`` matches the selector value ``value`` ('a', '!a',
    'in(a,b)', '!in(a,b)')."""
    negated = value.startswith("!")
    body = value.removeprefix("!")
    values = [v.strip() for v in body[body.index("(") + 1:-1].split(",")] if body.endswith(")") else [body]
    return (label in values) != negated


def labels_error(labels: Mapping[str, str], value_error: Callable[[str], str | None]) -> str | None:
    """The first problem of ``labels`` (keys as ``label_key_error`` says, values as ``value_error``), or None."""
    for key, value in labels.items():
        if problem := label_key_error(key) or value_error(value):
            return problem
    return None


# How deep train_loop_config may nest: far past any real config, well inside the recursion limit of the
# YAML and JSON writers the job passes through.
MAX_CONFIG_DEPTH = 100

# The URI schemes of storage the runs can use: pyarrow's filesystems, and Azure's names for its own.
STORAGE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "az", "hdfs", "file")


GCS_SCHEMES = ("gs", "gcs")
# The URI options pyarrow's own GCS URIs take (``FileSystem.from_uri``), and nothing else.
GCS_URI_OPTIONS = ("endpoint_override", "scheme", "retry_limit_seconds", "project_id")
_GCS_BUCKET = re.compile(r"(?=.{3,222}$)[a-z0-9][a-z0-9._-]*[a-z0-9]")


def gcs_uri_error(uri: str) -> str | None:
    """What makes ``gs://BUCKET/PREFIX[?OPTIONS]`` one no run can open (None: none): a bucket name
    Cloud Storage never gives, or an option pyarrow's GCS filesystem does not take."""
    parsed = urllib.parse.urlsplit(uri)
    bucket = parsed.netloc
    if not _GCS_BUCKET.fullmatch(bucket) or ".." in bucket:
        return f"{bucket!r} is not a bucket name (3-63 lowercase letters, digits, '-', '_', '.'); expected gs://BUCKET/PREFIX"
    unknown = sorted(set(urllib.parse.parse_qs(parsed.query, keep_blank_values=True)) - set(GCS_URI_OPTIONS))
    if unknown:
        return f"unknown URI option {unknown[0]!r}; gs:// URIs take {', '.join(GCS_URI_OPTIONS)}"
    return None


def storage_uri_error(storage_path: str) -> str | None:
    """What is wrong with a storage path or URI (None: a path or URI runs can use): a control
    character (a pasted newline: the path reaches shell commands and pod specs), a scheme pyarrow
    (and so Ray) cannot open, or no bucket (``s3://`` alone would list every bucket) or a space in it,
    and on GCS what ``gcs_uri_error`` refuses."""
    if any(ord(c) < 32 or ord(c) == 127 for c in storage_path):
        return f"{storage_path!r} holds a control character (a newline or tab?); give the path on one line"
    if "://" not in storage_path:
        scheme, sep, rest = storage_path.partition(":/")
        if sep and scheme.lower() in STORAGE_SCHEMES:
            # 's3:/bucket/runs' would be a local directory named 's3:'; pyarrow reads no such URI.
            root = "/" if scheme.lower() == "file" else ""
            return f"{storage_path!r} is missing a '/': write {scheme.lower() + '://' + root + rest.lstrip('/')!r}"
        return None
    scheme, _, rest = storage_path.partition("://")
    if scheme not in STORAGE_SCHEMES:
        if scheme.lower() in STORAGE_SCHEMES:  # pyarrow, and so Ray, reads schemes in lower case only
            return f"write the scheme in lower case: {scheme.lower() + '://'!r}, not {scheme + '://'!r}"
        return (f"{scheme + '://'!r} is not storage Ray Train can write to; give a local or NFS path, or a URI "
                f"of {', '.join(s + '://' for s in STORAGE_SCHEMES)}")
    if scheme == "file":
        return None
    # HDFS alone reads ``hdfs:///path`` as the default file system; elsewhere the first part is the bucket.
    where = rest.split("?", 1)[0]
    bucket = (where.strip("/") if scheme == "hdfs" else where).split("/", 1)[0]
    if not bucket:
        return f"{storage_path!r} names no bucket; give {scheme}://BUCKET/PREFIX"
    if any(c.isspace() for c in bucket):
        return f"bucket {bucket!r} of {storage_path!r} has a space, which no bucket name has; give {scheme}://BUCKET/PREFIX"
    return gcs_uri_error(storage_path) if scheme in GCS_SCHEMES else None


def _number_kind(annotation: Any) -> str | None:
    """'a whole number' or 'a number' where a field holds one (alone or beside None), else None."""
    args = set(typing.get_args(annotation)) or {annotation}
    return "a number" if float in args else "a whole number" if int in args else None


class NumbersNotBooleans(BaseModel):
    """A model whose numbers refuse booleans: pydantic takes true and false as 1 and 0, and YAML
    reads yes/no/on/off as them, so ``price_per_worker_hour: yes`` would be a price of 1."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool) and info.field_name is not None:
            kind = _number_kind(cls.model_fields[info.field_name].annotation)
            if kind is not None:
                raise ValueError(f"expected {kind}, got {str(v).lower()} (YAML reads yes/no/on/off as true/false)")
        return v


class PreemptionRate(NumbersNotBooleans):
    """Leave a tier when ``count`` preemptions fall within any ``window_s`` seconds.

    A burst says the spot market is unstable right now; waiting for the count budget to be
    spent would pay for several more restarts first.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    count: int = Field(ge=1, description="Preemptions inside the window that make the run leave.")
    window_s: float = Field(gt=0, le=MAX_DURATION_S, description="Length of the sliding window in seconds.")


class DeadlineGuard(NumbersNotBooleans):
    """Use a tier only while the run keeps pace with its deadline (Uniform Progress, *Can't Be Late*, NSDI '24).

    A count budget or a fixed capacity timeout cannot tell a run with hours of slack from one
    about to miss its deadline; the straight line from start to deadline can. The run is on
    schedule while its progress is at least ``pace`` times the line's; it leaves the tier
    (after a failure, or while waiting for capacity) once it is more than ``margin_h`` behind
    schedule, or once its slack (time to the deadline beyond the remaining work) is down to
    ``margin_h``; it climbs back (``climb_back``) only when ahead of schedule by two restarts
    with more than ``margin_h`` slack left. ``pace=0`` keeps the slack rule alone (wait for
    this tier as long as the deadline allows). Progress comes from the ``remaining_work_s``
    metric reported with checkpoints; until one arrives the whole ``work_h`` is left.

    A new gang's progress is safe only once it commits, so while waiting for capacity the
    guard gives up ``first_commit_h`` earlier than it would leave, and climbs back only with
    that much more ahead: a gang that comes up at the cut-off and is lost just before its
    first commit, or one lost just before any later commit, still leaves ``margin_h`` of slack
    for the move to the next tier (which ``margin_h`` must cover: its provisioning and restore).

    Once the run has left for a reliable tier its slack stops shrinking, and stops growing:
    a guard that left at ``margin_h`` can never climb back, however long capacity returns
    before the deadline. ``reserve_h`` keeps slack for that: the guard leaves (after a failure,
    or while waiting) ``reserve_h`` earlier, and a climb may spend it (it still needs the
    margin, two restarts and the lead). A climb's gang is given ``margin_h`` to come up (a
    move's provisioning and restore), and a gang that runs is judged on the margin alone, so a
    climb is not undone before its gang has started. Each return costs its restarts, so a run
    comes back only as often as the reserve allows.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    deadline_h: float = Field(gt=0, le=MAX_DURATION_H, description="Deadline in hours after the run first started.")
    work_h: float = Field(
        gt=0, le=MAX_DURATION_H, description="Wall hours this tier's gang needs for the whole job uninterrupted, checkpoints included."
    )
    pace: float = Field(
        default=1.0, ge=0, le=1, description="Share of the start-to-deadline line to keep; 0 = slack rule only."
    )
    margin_h: float = Field(
        default=0.5, ge=0, le=MAX_DURATION_H, description="Hours behind schedule tolerated, and slack kept for the move to the next tier."
    )
    first_commit_h: float = Field(
        default=0.0,
        ge=0, le=MAX_DURATION_H,
        description="Hours a new gang risks before its progress is safe: restore + interval + write (restore + the "
        "just-in-time save's lead when the notice holds a checkpoint). Waiting for capacity stops this much earlier; a "
        "climb needs it ahead.",
    )
    reserve_h: float = Field(
        default=0.0,
        ge=0, le=MAX_DURATION_H,
        description="Slack kept for climbing back: the guard leaves this much earlier than margin_h alone, so a run "
        "on the next tier can still return when capacity does (with climb_back; 0 = leave at the margin).",
    )

    @model_validator(mode="after")
    def _work_fits_deadline(self) -> DeadlineGuard:
        # The slack would be negative from the start: the guard would leave the tier before it ever ran.
        if self.work_h > self.deadline_h:
            raise ValueError(
                f"work_h ({self.work_h:g} h) is more than deadline_h ({self.deadline_h:g} h): this tier could not finish "
                "the job by the deadline even uninterrupted, so the guard would leave it at once; give work_h as this "
                "tier's uninterrupted wall hours and deadline_h as the hours the run has, or drop the guard"
            )
        return self


class CostCap(NumbersNotBooleans):
    """Use a cheaper tier only while the run can still cost no more than the last tier alone.

    Spot spend is worth it only for the progress it buys. The run stays on this tier while
    its spend so far, one more lost attempt here (``first_commit_h`` of this tier's gang) and
    the rest of the work on the last tier (with one restart) stay within ``factor`` times the
    last tier running the whole job (``work_h`` plus ``restart_h``); otherwise it moves
    straight to the last tier, and climbs back here only while that still holds. Checked where
    the run decides anyway (after a failure, on leaving a tier, before a climb), with the
    ``remaining_work_s`` reported with checkpoints; until one arrives it does nothing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    work_h: float = Field(
        gt=0, le=MAX_DURATION_H, description="Wall hours the last tier's gang needs for the whole job uninterrupted, checkpoints included."
    )
    restart_h: float = Field(default=0.0, ge=0, le=MAX_DURATION_H, description="Billed hours of a start before training resumes (restore).")
    first_commit_h: float = Field(
        default=0.0,
        ge=0, le=MAX_DURATION_H,
        description="Billed hours a gang on this tier can lose in one interruption: restore + interval + write.",
    )
    factor: float = Field(
        default=1.0, ge=1.0, description="Multiple of the last tier's cost allowed; below 1 the run could never start here."
    )


class Toleration(BaseModel):
    """A Kubernetes toleration for a tier's pods (the core/v1 fields, as written in a pod spec)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1, description="The taint's key, e.g. 'nvidia.com/gpu'.")
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = Field(default=None, description="With operator Equal: the taint's value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint effect tolerated; None = all."
    )

    @model_validator(mode="after")
    def _value_fits_operator(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("value: an Exists toleration takes no value; use operator: Equal")
        if self.operator == "Equal" and self.value is None:
            raise ValueError("value: an Equal toleration needs the taint's value")
        return self

    def as_pod_field(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class TierPlacement(NumbersNotBooleans):
    """Which machines a tier's pool is on a real cluster, beyond its market and zone.

    Only the deployment files read it (``spotfallback manifest``): Ray finds a tier's workers by
    its ``label_selector``, Kubernetes and the cluster launcher by these. A GPU type named in the
    label selector (``ray.io/accelerator-type``) is mapped to each cloud's own node label where the
    cloud has one; elsewhere name the machines here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_type: str | None = Field(
        default=None,
        min_length=1,
        description="Instance type / VM size / machine type of the pool, e.g. 'p4d.24xlarge', 'Standard_NC24ads_A100_v4'.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Kubernetes node labels the tier's pods require, e.g. {'cloud.google.com/gke-nodepool': 'a100-spot'}.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Extra Kubernetes tolerations (taints of the pool's own making)."
    )

    @field_validator("node_selector")
    @classmethod
    def _check_node_selector(cls, v: dict[str, str]) -> dict[str, str]:
        if problem := labels_error(v, label_value_error):
            raise ValueError(f"Kubernetes would reject this node selector: {problem}")
        return v


_BEYOND_DEFAULTS: dict[str, Any] = {
    "min_workers": None,
    "climb_back": False,
    "min_dwell_s": 600.0,
    "climb_budgets": "carry",
    "max_preemption_rate": None,
    "deadline_guard": None,
    "expected_cost_exit": False,
    "cost_cap": None,
    "cluster": None,
}


class ClusterRef(NumbersNotBooleans):
    """The Ray cluster a tier runs on, reached through its Ray Jobs API (the dashboard's address).

    A Ray cluster lives in one region: naming clusters lets a ladder go on in another region
    or cloud when a whole cluster runs out of capacity or stops answering. The run moves
    between clusters as Ray jobs; its ledger and checkpoints stay in the one storage path.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    address: str = Field(description="The cluster's Ray Jobs API, e.g. 'http://head-us-east-1:8265'.")
    name: str | None = Field(default=None, description="Short name in the ledger and `status`; default: host:port of the address.")
    region: str | None = Field(default=None, description="Where the cluster runs, e.g. 'us-east-1' (shown in `status` and `report`).")
    unreachable_timeout_s: float = Field(
        default=120.0,
        gt=0, le=MAX_DURATION_S,
        description="Leave the cluster's tiers once its Jobs API has not answered for this long (a region outage).",
    )
    token_env: str | None = Field(
        default=None,
        description="The environment variable that holds this cluster's Ray authentication token (Ray's token "
                    "authentication), sent as its bearer token; the token itself never enters the job file or "
                    "the ledger. Default: Ray's own (RAY_AUTH_TOKEN), the same for every cluster.",
    )

    @field_validator("address")
    @classmethod
    def _check_address(cls, v: str) -> str:
        if not re.fullmatch(r"https?://[^/\s]+/?", v):
            raise ValueError(f"address {v!r} must be the Ray Jobs API's http(s)://host:port, e.g. 'http://head:8265'")
        return v.rstrip("/")

    @field_validator("token_env")
    @classmethod
    def _check_token_env(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"token_env {v!r} must be the name of an environment variable (letters, digits, '_'), "
                             "e.g. 'RAY_TOKEN_WEST'; not the token itself")
        return v

    @field_validator("name")
    @classmethod
    def _check_cluster_name(cls, v: str | None) -> str | None:
        if v is not None and not _LABEL_RE.fullmatch(v):
            raise ValueError(f"cluster name {v!r} must be 1-63 letters, digits, '-', '_' or '.', alphanumeric at both ends")
        return v

    @property
    def key(self) -> str:
        """How the ledger, the Ray job ids and ``status`` name the cluster."""
        return self.name or self.address.split("://", 1)[1]

    @property
    def on_this_machine(self) -> bool:
        """Whether the address is a loopback one (local clusters, the tests): the driver's relative
        paths are the cluster's too."""
        host = urllib.parse.urlsplit(self.address).hostname or ""
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def shared_storage_error(storage_path: str, clusters: typing.Iterable[ClusterRef]) -> str | None:
    """Why ``storage_path`` cannot be the one store of a ladder across ``clusters``, or None.

    The driver and every cluster read the one ledger and set of checkpoints there: a relative
    (or ``~``) path names a different directory on each machine, so unless every cluster is on
    this machine it needs object storage, or an absolute path of a file system mounted on all.
    """
    if "://" in storage_path or os.path.isabs(storage_path) or all(c.on_this_machine for c in clusters):
        return None
    return (f"{storage_path!r} is a path on each machine, and a ladder across clusters keeps one ledger and one set "
            "of checkpoints that the driver and every cluster read; give object storage every cluster reaches "
            "(s3://, gs://, abfs://), or an absolute path of a file system mounted on all of them")


# Spellings of the markets spotfallback knows, and the market each means.
_MARKET_SPELLINGS = {"spot": SPOT, "preemptible": SPOT, "on-demand": ON_DEMAND, "ondemand": ON_DEMAND, "reserved": "reserved"}


class Tier(NumbersNotBooleans):
    """One rung of the fallback ladder: where the workers run and when to give up on it.

    Budgets follow Ray's ``FailureConfig`` convention: ``max_preemptions=1`` tolerates one
    preemption (the run restarts on this tier) and leaves the tier at the second; ``-1``
    stays forever.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # an infinite price is no price

    name: str = Field(description="Unique name of the tier, e.g. 'spot-us-east-1a'.")
    market: str = Field(description="Capacity market: 'spot', 'on-demand', 'reserved' or any label value.")
    label_selector: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Ray label selector for this tier's workers; {'ray.io/market-type': market} plus the keys given "
            "(a selector naming ray.io/market-type itself is kept as written)."
        ),
    )
    num_workers: int = Field(gt=0, le=MAX_WORKERS, description="Training workers on this tier.")
    resources_per_worker: dict[str, float] | None = Field(
        default=None, description="Ray resources per worker, e.g. {'CPU': 4, 'GPU': 1}."
    )
    use_gpu: bool = False
    max_preemptions: int = Field(
        default=-1, ge=-1, description="Preemptions tolerated before leaving the tier; -1 = forever."
    )
    max_failures: int = Field(
        default=3,
        ge=-1,
        description=(
            "Node losses without notice tolerated before leaving the tier, and application "
            "errors retried on it before the run fails; -1 = forever."
        ),
    )
    capacity_timeout_s: float | None = Field(
        default=600.0,
        gt=0, le=MAX_DURATION_S,
        description="Longest wait for this tier's workers (at start and after each failure); null = forever.",
    )
    price_per_worker_hour: float = Field(default=0.0, ge=0, description="Price of one worker for one hour.")
    placement: TierPlacement = Field(
        default_factory=TierPlacement,
        description="The pool's machines on a real cluster (instance type, node labels, tolerations); deployment files only.",
    )
    # -- beyond one-way fallback: climbing back, elastic tiers, guards; the defaults keep a ladder one-way and rigid --
    min_workers: int | None = Field(
        default=None,
        gt=0,
        le=MAX_WORKERS,
        description=(
            "Elastic tier: run with as few as this many workers (up to num_workers) instead of "
            "waiting for lost nodes; also given as num_workers: [min, max]. None = fixed size."
        ),
    )
    climb_back: bool = Field(
        default=False, description="The run may return to this tier from a lower one when its capacity is back."
    )
    min_dwell_s: float = Field(
        default=600.0,
        ge=0, le=MAX_DURATION_S,
        description="Climb back to (or grow on) this tier only after this long on the current tier and size.",
    )
    climb_budgets: Literal["carry", "fresh"] = Field(
        default="carry", description="On a climb back: keep this tier's preemption/failure counts, or start fresh."
    )
    max_preemption_rate: PreemptionRate | None = Field(
        default=None, description="Leave after `count` preemptions within `window_s` seconds; None = counts only."
    )
    deadline_guard: DeadlineGuard | None = Field(
        default=None,
        description="Leave (and climb back to) this tier by the run's progress against its deadline; None = off.",
    )
    expected_cost_exit: bool = Field(
        default=False,
        description=(
            "After a failure, leave when staying for the remaining work is expected to cost more than the next "
            "tier (observed interruption rate, measured restart time and checkpoint interval)."
        ),
    )
    cost_cap: CostCap | None = Field(
        default=None,
        description=(
            "Leave for the last tier once this tier's spend could make the run cost more than the last tier alone: "
            "a bound on spot waste that never delays the run but gives up on spot that might still have paid, so it "
            "raises the mean spend (docs/planner.md); None = off."
        ),
    )
    cluster: ClusterRef | None = Field(
        default=None,
        description=(
            "The Ray cluster this tier runs on (its Jobs API address); None = the cluster the run is on. "
            "Name one on every tier or on none (docs/clusters.md)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _default_selector(cls, data: Any) -> Any:
        """The tier's market label is always part of its selector: keys a user names are added to it.

        Without it, a spot tier's selector naming only a zone would also take that zone's on-demand nodes.
        A selector that names the market label itself (``in(spot,reserved)``, ``!on-demand``) is kept as written.
        """
        if not (isinstance(data, Mapping) and isinstance(data.get("market"), str) and data["market"]):
            return data
        selector = data.get("label_selector")
        if not selector:
            return {**data, "label_selector": {MARKET_LABEL: data["market"]}}
        if isinstance(selector, Mapping) and MARKET_LABEL not in selector:
            return {**data, "label_selector": {MARKET_LABEL: data["market"], **selector}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _elastic_range(cls, data: Any) -> Any:
        """``num_workers=(min, max)`` is Ray's elastic spelling; store it as min_workers/num_workers."""
        if isinstance(data, Mapping) and isinstance(data.get("num_workers"), list | tuple):
            pair = data["num_workers"]
            if len(pair) != 2 or "min_workers" in data:
                raise ValueError("num_workers must be an integer or a [min, max] pair (without min_workers)")
            data = dict(data)
            data["min_workers"], data["num_workers"] = pair
        return data

    @model_serializer(mode="wrap")
    def _omit_unused_beyond(self, handler: Any) -> Any:
        """Leave the fields beyond one-way fallback out while unused, so stored ladders and generated files stay as before."""
        data = handler(self)
        if isinstance(data, dict):
            for key, default in _BEYOND_DEFAULTS.items():
                if key in data and data[key] == default:
                    del data[key]
        return data

    @model_validator(mode="after")
    def _check_elastic(self) -> Tier:
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must not exceed num_workers ({self.num_workers})")
        return self

    @model_validator(mode="after")
    def _check_market_selector(self) -> Tier:
        # The tier's market is how the run knows its nodes are spot (budgets, notices); a selector
        # on the market label that leaves it out would put the tier on other nodes under its name.
        value = self.label_selector.get(MARKET_LABEL)
        if value is not None and not selector_matches(value, self.market):
            raise ValueError(f"label_selector.{MARKET_LABEL}: {value!r} does not select the tier's market "
                             f"{self.market!r}; leave the key out (the market sets it) or include {self.market!r}")
        return self

    @model_validator(mode="after")
    def _check_gpu(self) -> Tier:
        # Ray Train's ScalingConfig refuses it at the run's start, after the cluster is up; say it here.
        gpus = (self.resources_per_worker or {}).get("GPU")
        if gpus and not self.use_gpu:
            raise ValueError(f"resources_per_worker asks for {gpus:g} GPU but use_gpu is false; set use_gpu: true "
                             "(Ray Train refuses GPUs without it, and the deploy files would pick a CPU image)")
        return self

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _TIER_NAME_RE.fullmatch(v):
            raise ValueError(
                f"tier name {v!r} must be 1-42 lowercase letters, digits or '-', starting and "
                "ending with a letter or digit (it becomes a Kubernetes group name)"
            )
        return v

    @field_validator("market")
    @classmethod
    def _check_market(cls, v: str) -> str:
        if not v or not _LABEL_RE.fullmatch(v):
            raise ValueError(
                f"market {v!r} must be a label value such as 'spot' or 'on-demand' "
                "(1-63 characters, alphanumeric at both ends)"
            )
        # Another spelling of a market spotfallback knows would be a market of its own: no spot
        # budgets or notices, no node selection in the deployment files.
        meant = _MARKET_SPELLINGS.get(v.lower().replace("_", "-"))
        if meant is not None and v != meant:
            raise ValueError(f"market {v!r}: did you mean {meant!r}? (markets are lower case; GCP's preemptible VMs are 'spot')")
        if meant is None and (close := difflib.get_close_matches(v.lower(), (SPOT, ON_DEMAND), n=1, cutoff=0.75)):
            # A misspelt 'spot' would run as a market of its own, with no spot budgets or notices.
            raise ValueError(f"market {v!r}: did you mean {close[0]!r}? (a market of your own needs a name unlike "
                             f"{SPOT!r} and {ON_DEMAND!r})")
        return v

    @field_validator("label_selector")
    @classmethod
    def _check_selector(cls, v: dict[str, str]) -> dict[str, str]:
        if problem := labels_error(v, label_selector_value_error):
            raise ValueError(f"Ray would reject this label selector: {problem}")
        return v

    @field_validator("resources_per_worker")
    @classmethod
    def _check_resources(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None:
            for key, amount in v.items():
                if not key.strip():
                    raise ValueError("a resource with an empty name; name it as the nodes do, e.g. 'CPU', 'GPU' or 'TPU'")
                if amount < 0:
                    raise ValueError(f"resource {key!r} must not be negative (got {amount})")
                if 0 < amount < RESOURCE_STEP or amount > RESOURCE_MAX:
                    raise ValueError(f"resource {key!r}: {amount:g} is not an amount Ray can hold; give 0, or "
                                     f"{RESOURCE_STEP:g} (Ray's smallest step) up to {RESOURCE_MAX:.3g}")
                upper = next((ray_name for ray_name in ("CPU", "GPU", "memory") if key.lower() == ray_name.lower()), None)
                if upper is not None and key != upper:
                    raise ValueError(f"resource {key!r}: Ray's name is {upper!r}; {key!r} would be a custom resource no node has")
        return v

    @classmethod
    def spot(cls, num_workers: int | tuple[int, int], *, name: str = "spot", **kwargs: Any) -> Tier:
        """A spot tier; tolerates 3 preemptions unless told otherwise."""
        kwargs.setdefault("max_preemptions", 3)
        return cls._of_market(SPOT, num_workers, name, kwargs)

    @classmethod
    def on_demand(cls, num_workers: int | tuple[int, int], *, name: str = "on-demand", **kwargs: Any) -> Tier:
        """An on-demand tier: the usual last rung."""
        return cls._of_market(ON_DEMAND, num_workers, name, kwargs)

    @classmethod
    def _of_market(cls, market: str, num_workers: int | tuple[int, int], name: str, kwargs: dict[str, Any]) -> Tier:
        if "market" in kwargs:  # Tier.spot(market="on-demand") would be an on-demand tier named spot
            raise ConfigError(f"market: Tier.{'spot' if market == SPOT else 'on_demand'} makes "
                              f"{'a spot' if market == SPOT else 'an on-demand'} tier; "
                              f"build Tier(market={kwargs['market']!r}, ...) for another market")
        return cls.model_validate({"name": name, "market": market, "num_workers": num_workers, **kwargs})

    @property
    def is_spot(self) -> bool:
        return self.market == SPOT

    @property
    def is_elastic(self) -> bool:
        return self.min_workers is not None and self.min_workers < self.num_workers

    @property
    def fewest_workers(self) -> int:
        """Smallest gang the tier runs with: ``min_workers`` when elastic, else ``num_workers``."""
        return self.min_workers if self.min_workers is not None else self.num_workers

    def worker_resources(self) -> dict[str, float]:
        """Resources of one worker as Ray Train requests them (its ``ScalingConfig``'s rule):
        zero amounts dropped, and ``use_gpu`` adds one GPU unless a count is given; with no
        ``resources_per_worker``, one GPU (and no CPU) or one CPU."""
        if self.resources_per_worker is None:
            res = {"GPU": 1.0} if self.use_gpu else {"CPU": 1.0}
        else:
            res = {key: float(amount) for key, amount in self.resources_per_worker.items() if amount != 0}
        if self.use_gpu:
            res.setdefault("GPU", 1.0)
        return res

    def price_per_hour(self) -> float:
        return self.num_workers * self.price_per_worker_hour

    @property
    def where(self) -> str | None:
        """The tier's cluster and region, as `status` and `report` show them (None: the run's own cluster)."""
        if self.cluster is None:
            return None
        return f"cluster {self.cluster.key}" + (f", {self.cluster.region}" if self.cluster.region else "")


class Ladder(BaseModel):
    """An ordered list of tiers: the run starts on the first and walks down (back up only to `climb_back` tiers)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tiers: tuple[Tier, ...] = Field(min_length=1)

    @field_validator("tiers")
    @classmethod
    def _check_tiers(cls, tiers: tuple[Tier, ...]) -> tuple[Tier, ...]:
        names = [t.name for t in tiers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tier names must be unique; repeated: {', '.join(dupes)}")
        if len({t.use_gpu for t in tiers}) > 1:
            gpu = ", ".join(f"tiers[{i}] ({t.name})" for i, t in enumerate(tiers) if t.use_gpu)
            raise ValueError(f"all tiers must agree on use_gpu (Ray sets up devices once per run); only {gpu} set it")
        problem = cluster_ladder_error(tiers)
        if problem:
            raise ValueError(problem)
        return tiers

    @property
    def across_clusters(self) -> bool:
        """Whether the tiers name the Ray clusters they run on (the run moves between them as Ray jobs)."""
        return self.tiers[0].cluster is not None

    @property
    def clusters(self) -> dict[str, ClusterRef]:
        """The clusters the tiers name, by key, in ladder order (empty: no tier names one)."""
        return {t.cluster.key: t.cluster for t in self.tiers if t.cluster is not None} if self.across_clusters else {}

    def cluster_key(self, tier: int) -> str | None:
        cluster = self.tiers[tier].cluster
        return None if cluster is None else cluster.key

    @property
    def cluster_keys(self) -> list[str | None]:
        """Each cluster's key once, in ladder order; ``[None]`` for a ladder on one cluster."""
        return list(dict.fromkeys(self.cluster_key(i) for i in range(len(self.tiers))))

    def same_cluster(self, a: int, b: int) -> bool:
        """Whether tiers ``a`` and ``b`` run on one Ray cluster: a gang can only move (climb, resize) within one."""
        return self.cluster_key(a) == self.cluster_key(b)

    def same_nodes(self) -> list[tuple[int, int]]:
        """Pairs of tiers ``(a, b)``, ``a < b``, whose workers select the same nodes: one cluster, one
        market, the same label selector and placement. A fall from one to the other stays in the
        pool whose capacity just failed."""
        def pool(i: int) -> tuple[str, str, str]:
            t = self.tiers[i]
            return t.market, json.dumps(dict(t.label_selector), sort_keys=True), t.placement.model_dump_json()
        n = len(self.tiers)
        return [(a, b) for a in range(n) for b in range(a + 1, n) if self.same_cluster(a, b) and pool(a) == pool(b)]

    def __len__(self) -> int:
        return len(self.tiers)

    def __getitem__(self, i: int) -> Tier:
        return self.tiers[i]


def cluster_ladder_error(tiers: tuple[Tier, ...]) -> str | None:
    """What makes ``tiers`` unusable across clusters, or None.

    Every tier names a cluster or none does (a tier without one would have nowhere to be
    submitted); one name means one address; and elastic tiers stay within one cluster's run
    (their guard moves the gang while it runs, which a move between clusters cannot).
    """
    named = [i for i, t in enumerate(tiers) if t.cluster is not None]
    if not named:
        return None
    if len(named) != len(tiers):
        missing = ", ".join(f"tiers[{i}] ({t.name})" for i, t in enumerate(tiers) if t.cluster is None)
        return f"{missing}: name a cluster (cluster: {{address: ...}}) on every tier, or on none"
    by_key: dict[str, str] = {}
    by_address: dict[str, str] = {}
    for i, t in enumerate(tiers):
        c = t.cluster
        assert c is not None
        if by_key.setdefault(c.key, c.address) != c.address:
            return (f"tiers[{i}] ({t.name}): cluster {c.key!r} has two addresses, {by_key[c.key]!r} and "
                    f"{c.address!r}; give each cluster its own name")
        if by_address.setdefault(c.address, c.key) != c.key:
            return (f"tiers[{i}] ({t.name}): {c.address!r} is named both {by_address[c.address]!r} and {c.key!r}; "
                    "one cluster takes one name")
        if t.is_elastic:
            return f"tiers[{i}] ({t.name}): elastic tiers (min_workers) are not supported in a ladder across clusters; drop min_workers"
    return None


def _models() -> dict[str, type[BaseModel]]:
    """The configuration models by name (a ValidationError's ``title``), for field suggestions."""
    found = [globals().get(n) for n in ("Tier", "Ladder", "ClusterRef", "PreemptionRate", "DeadlineGuard", "CostCap", "PlannedJob", "PlanPrediction", "JobConfig")]
    return {m.__name__: m for m in found if isinstance(m, type) and issubclass(m, BaseModel)}


def _sub_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (directly, in a tuple/list, or optional), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if arg is not Ellipsis and (found := _sub_model(arg)) is not None:
            return found
    return None


def _model_at(root: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model that holds the field at ``loc`` (list indexes skipped); None when unknown."""
    model = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        model = _sub_model(field.annotation) if field is not None else None
    return model


def _known_fields(model: type[BaseModel] | None = None) -> list[str]:
    """The field names valid where an unknown one was found (every model's when unknown)."""
    models = [model] if model is not None else list(_models().values())
    return sorted({name for m in models for name in m.model_fields})


def _unknown_field_message(key: str, model: type[BaseModel] | None) -> str:
    """'did you mean' among the fields valid at that place; else say where the field belongs."""
    close = difflib.get_close_matches(key, _known_fields(model), n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    if model is not None:
        # A field of a nested model written one level too high (e.g. num_workers at the top).
        for name, field in model.model_fields.items():
            sub = _sub_model(field.annotation)
            if sub is not None and key in sub.model_fields:
                where = f"each entry of {name!r}" if typing.get_origin(field.annotation) in (tuple, list) else repr(name)
                return f"unknown field here; {key!r} belongs under {where}"
    return "unknown field; remove it or check its spelling"


def format_validation_error(err: ValidationError, root: str = "") -> str:
    """One line per problem: ``field.path: what is wrong``.

    Unknown fields get a suggestion from the fields valid at *that* place (a tier's typo is
    matched against tier fields only). A list's "too short after validation" line that only
    echoes its items' own errors is left out: the items' lines say what to fix.
    """
    items = err.errors()
    model = _models().get(err.title)
    unknown = {
        tuple(i["loc"]): _unknown_field_message(str(i["loc"][-1]), _model_at(model, tuple(i["loc"])[:-1]) if model else None)
        for i in items
        if i["type"] == "extra_forbidden"
    }
    # "did you mean 'x'?" already says that 'x' is missing: one line for the one mistake.
    suggested = {loc[:-1] + (m.split("'")[1],) for loc, m in unknown.items() if "did you mean" in m}
    lines = []
    for item in items:
        where = tuple(item["loc"])
        if item["type"] == "too_short" and any(
            tuple(other["loc"])[: len(where)] == where and len(other["loc"]) > len(where) for other in items
        ):
            continue
        if item["type"] == "missing" and where in suggested:
            continue
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" if i else str(p) for i, p in enumerate(where))
        if root:
            loc = f"{root}.{loc}" if loc else root
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = unknown[where]
        elif item["type"] == "missing":
            msg = "required field is missing; add it"
        elif item["type"] == "string_type" and (read_as := _yaml_reading(item.get("input"))):
            msg = f"expected text, got {read_as}: put it in quotes"
        elif item["type"] in _SHAPES:
            msg = f"expected {_SHAPES[item['type']]}, got {_kind_of(item.get('input'))}"
        elif item["type"] == "less_than_equal" and (item.get("ctx") or {}).get("le") in (MAX_DURATION_S, MAX_DURATION_H):
            unit = "seconds" if item["ctx"]["le"] == MAX_DURATION_S else "hours"
            msg = f"{item['input']} is more than 10 years; give at most {item['ctx']['le']:.0f} {unit}"
        elif item["type"] == "too_short":
            least = (item.get("ctx") or {}).get("min_length", 1)
            msg = f"empty; give at least {least} item{'s' if least != 1 else ''}"
        msg = msg.removeprefix("Value error, ")
        named = re.match(r"(\w+): ", msg) if not where else None
        if named and model is not None and named[1] in model.model_fields:  # a check across fields names the one to fix
            loc, msg = f"{root}.{named[1]}" if root else named[1], msg[named.end():]
        lines.append(f"{loc or '(top level)'}: {msg}")
    return "\n".join(lines)


# What a field of each container type takes, as a job file's author writes it.
_SHAPES = {
    "tuple_type": "a list (in YAML, '- item' lines or [a, b])",
    "list_type": "a list (in YAML, '- item' lines or [a, b])",
    "dict_type": "a mapping (in YAML, 'key: value' lines or {key: value})",
}


def _kind_of(value: Any) -> str:
    """A value's kind in a job file's words: a mapping, a list, text, nothing."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return f"text {value!r}" if len(value) <= 40 else "text"
    return repr(value)


def _yaml_reading(value: Any) -> str | None:
    """What YAML made of an unquoted scalar that was meant as text (``2024-01-01`` is a date,
    ``yes`` a boolean, ``12`` a number), or None for anything else."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (YAML reads yes/no/on/off/true/false as a boolean)"
    if isinstance(value, datetime.date):
        return f"{value.isoformat()} (YAML reads it as a date)"
    if isinstance(value, int | float):
        return f"{value!r} (YAML reads it as a number)"
    return None


def validation_config_error(source: str, err: ValidationError) -> ConfigError:
    """``source: field: problem`` on one line for one problem; a line per problem under ``source:`` for more."""
    text = format_validation_error(err)
    return ConfigError(f"{source}: {text}" if "\n" not in text else f"{source}:\n{text}")


def make_ladder(tiers: Any) -> Ladder:
    """Build a ladder from Tier objects or plain dicts, raising ConfigError with field paths."""
    if isinstance(tiers, Ladder):
        return tiers
    if tiers is None or (hasattr(tiers, "__len__") and len(tiers) == 0):
        raise ConfigError("tiers: the ladder is empty; give at least one tier, e.g. [Tier.on_demand(num_workers=2)]")
    if isinstance(tiers, Tier):  # a model iterates as its fields, which would read as twenty broken tiers
        raise ConfigError(f"tiers: expected a list of tiers, got one Tier ({tiers.name!r}); give it as a list: [tier]")
    if isinstance(tiers, str | bytes | Mapping | BaseModel) or not hasattr(tiers, "__iter__"):  # a str/dict would iterate as tiers
        raise ConfigError(f"tiers: expected a list of Tier objects or dicts, got {type(tiers).__name__}")
    try:
        return Ladder(tiers=tuple(tiers))
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


# What YAML aliases may expand a document to (values), past ten times the document's own:
# a file that aliases its way past that is a bomb, not a configuration.
ALIAS_EXPANSION_LIMIT = 100_000


def check_yaml_aliases(root: yaml.Node) -> None:
    """Refuse a YAML document whose aliases refer to their own node or expand it without bound.

    PyYAML would build the first (and a reader then loops) and expand the second for ever, so
    both are refused before anything is built (kubectl refuses "excessive aliasing" too). The
    graph is walked iteratively: a deep document needs no deep stack.
    """
    expanded: dict[int, int] = {}  # node id -> nodes it expands to, itself included
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        children = _child_nodes(node)
        if closing:
            open_nodes.discard(id(node))
            expanded[id(node)] = 1 + sum(expanded[id(c)] for c in children)
            continue
        if id(node) in expanded:
            continue
        if id(node) in open_nodes:
            raise yaml.constructor.ConstructorError(
                None, None, "an alias refers to a node that holds it (a structure without end); "
                "write that part out instead", node.start_mark)
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children)
    limit = max(ALIAS_EXPANSION_LIMIT, 10 * len(expanded))
    if expanded[id(root)] > limit:
        raise yaml.constructor.ConstructorError(
            None, None, f"its aliases expand this document to more than {limit:,} values (from {len(expanded):,} "
            "written); write the repeated parts out, or alias fewer of them", root.start_mark)


def _child_nodes(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


class StrictYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping and aliases that refer to
    their own node or expand without bound (``check_yaml_aliases``).

    YAML lets the last of two keys win without a word, so a job file with two ``tiers:`` would run
    a ladder its author did not read (kubectl refuses both too). Merge keys (``<<: *base``) are
    not keys of their own: the mapping's own keys override what they merge, as YAML says.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        check_yaml_aliases(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue  # an unhashable key: the base class says what is wrong with it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice in one mapping; keep one", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_mapping(text: str, source: str = "<string>") -> dict[str, Any]:
    """Parse YAML that must be a mapping (no key twice); errors say where."""
    try:
        data = yaml.load(text, Loader=StrictYamlLoader)  # a SafeLoader: no arbitrary objects
    except RecursionError:
        raise ConfigError(f"{source}: not readable YAML: its values nest deeper than the YAML reader can follow") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{source}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if data is None:
        raise ConfigError(f"{source}: empty; expected a mapping with a 'tiers' key")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with a 'tiers' key, got {type(data).__name__}")
    return data


def ladder_from_yaml(text_or_path: str | Path) -> Ladder:
    """Read a ladder from YAML (``tiers: [...]``); unknown fields are errors."""
    text = str(text_or_path).strip()
    path = Path(text_or_path) if text and not text.startswith(("tiers", "{")) else None
    if path is not None and path.is_dir():
        raise ConfigError(f"{path}: a folder, not a ladder file; give the path of a YAML file with 'tiers:'")
    if path is not None and not path.exists() and _names_a_file(text_or_path):
        raise ConfigError(f"{path}: no such ladder file; give the path of a YAML file with 'tiers:', or the YAML text itself")
    if path is not None and path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the ladder file: {e}") from None
        data = load_yaml_mapping(text, str(path))
        source = str(path)
    else:
        data = load_yaml_mapping(str(text_or_path))
        source = "<string>"
    unknown = sorted(set(data) - {"tiers"})
    if unknown:
        raise ConfigError(f"{source}: {unknown[0]}: unknown field; the ladder file holds only 'tiers'")
    try:
        return Ladder.model_validate({"tiers": data.get("tiers")})
    except ValidationError as e:
        raise ConfigError(f"{source}:\n" + format_validation_error(e)) from None


def _names_a_file(text_or_path: str | Path) -> bool:
    """Whether a ladder argument can only be a file's name: a Path, or one line without the ':' every ladder's YAML has."""
    if isinstance(text_or_path, Path):
        return True
    text = text_or_path.strip()
    return bool(text) and "\n" not in text and not text.startswith("#") and (":" not in text or text.endswith((".yaml", ".yml")))


_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,127}$")


def run_name_error(name: str) -> str | None:
    """Why ``name`` cannot be a run name (it becomes one path segment under storage_path)."""
    if not isinstance(name, str) or not _RUN_NAME_RE.fullmatch(name) or ".." in name:
        return (
            f"run name {name!r} must be 1-128 characters of letters, digits, '.', '_', '=' or '-', "
            "start with a letter or digit, and contain no '/' or '..' (it must not leave storage_path)"
        )
    return None


class PlannedJob(NumbersNotBooleans):
    """The job a plan was made for, so ``spotfallback backtest`` replays the same job from the file alone.

    Durations in hours, as in the planner's request; the notice in seconds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    work_h: float = Field(gt=0, le=MAX_DURATION_H, description="Training hours on an uninterrupted gang.")
    checkpoint_cost_h: float = Field(ge=0, le=MAX_DURATION_H, description="Hours to write one checkpoint.")
    restart_overhead_h: float = Field(ge=0, le=MAX_DURATION_H, description="Billed hours of every start before training moves (restore).")
    provisioning_delay_h: float = Field(default=DEFAULT_PROVISIONING_DELAY_S / 3600, ge=0, le=MAX_DURATION_H,
                                        description="Hours to get workers once capacity exists.")
    notice_s: float = Field(default=DEFAULT_NOTICE_S, ge=0, le=MAX_DURATION_S, description="Preemption notice in seconds.")
    jit_checkpoint: bool = Field(default=True, description="The gang checkpoints on a preemption notice.")
    move_restart_h: float = Field(default=0.0, ge=0, le=MAX_DURATION_H, description="Extra billed hours of a start on another cluster.")
    move_cost: float = Field(default=0.0, ge=0, description="Cost of each move to another cluster (checkpoint egress).")

    @model_validator(mode="after")
    def _durations_in_hours(self) -> PlannedJob:
        # A write, restore or node start of over a day that outlasts the whole job is a number of
        # seconds written where hours belong (300 for a 5-minute write): replayed, it would be 300 hours.
        for name in ("checkpoint_cost_h", "restart_overhead_h", "provisioning_delay_h", "move_restart_h"):
            hours = getattr(self, name)
            if hours > 24 and hours > self.work_h:
                raise ValueError(
                    f"{name} is {hours:g} hours, longer than the job's work_h ({self.work_h:g} h): durations under "
                    f"plan.job are in hours ({hours:g} s would be {hours / 3600:.4g} h); give it in hours, or run "
                    "`spotfallback plan --write-yaml` to write them")
        return self


class PlanPrediction(NumbersNotBooleans):
    """What ``spotfallback plan`` predicted for this job, kept so ``report`` can set it beside the outcome.

    Written into the job file by ``spotfallback plan --write-yaml``; the run records it in its
    metadata when it starts, so a later ``report`` finds it without the job file.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    spend: float = Field(ge=0, description="Expected spend of the whole run, in the tiers' price unit.")
    wall_h: float = Field(gt=0, le=MAX_DURATION_H, description="Expected wall time of the whole run, in hours.")
    p90_wall_h: float | None = Field(default=None, gt=0, le=MAX_DURATION_H, description="90th percentile of the wall time, hours.")
    deadline_h: float | None = Field(default=None, gt=0, le=MAX_DURATION_H, description="The deadline the plan was made for, hours.")
    on_time_probability: float | None = Field(default=None, ge=0, le=1, description="Share of simulated runs that met the deadline.")
    checkpoint_interval_h: float | None = Field(default=None, gt=0, le=MAX_DURATION_H, description="Recommended checkpoint interval (tau), hours.")
    checkpoint_on_request: bool = Field(
        default=False,
        description="The plan assumed the training function answers checkpoint requests (PreemptionWatch("
        "answer_requests=True)), so its climbs back come between checkpoints.",
    )
    made_with: str = Field(default="", description="What the plan was made from: trace or rate model, job size, number of runs.")
    trace_counts: Literal["available", "preempted"] = Field(
        default="available",
        description="What the ticks of the plan's SkyPilot JSON traces counted (`plan --trace-counts`); `backtest` "
        "reads its traces the same way unless told otherwise.",
    )
    job: PlannedJob | None = Field(
        default=None, description="The job the plan was made for; `backtest` replays it unless told otherwise."
    )


class JobConfig(NumbersNotBooleans):
    """Everything `spotfallback run job.yaml` needs: where the run lives, what it trains, the ladder.

    ``ray_address``: ``local`` starts an embedded local spot cluster shaped after the ladder
    (the demo and tests), ``auto`` joins the cluster this machine belongs to, anything else
    is passed to ``ray.init(address=...)``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Unique run name; the same name resumes the run.")
    storage_path: str = Field(description="Durable storage root: a local/NFS path or s3://, gs:// URI.")
    entrypoint: str = Field(description="Training function as 'package.module:function' or 'path/file.py:function'.")
    train_loop_config: dict[str, Any] = Field(default_factory=dict)
    backend: str = Field(
        default="torch",
        description="Training backend: 'torch' or 'tensorflow'; when omitted, the entrypoint's "
        "SPOTFALLBACK_BACKEND declaration, else 'torch'.",
    )
    ray_address: str = Field(default="local")
    tiers: tuple[Tier, ...] = Field(min_length=1)
    plan: PlanPrediction | None = Field(default=None, description="The planner's prediction, when the ladder came from `spotfallback plan`.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        problem = run_name_error(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("train_loop_config")
    @classmethod
    def _finite_numbers(cls, v: dict[str, Any]) -> dict[str, Any]:
        # The job reaches the cluster and the run's record as JSON, where NaN and infinity have no
        # spelling: pydantic would write null, and the train function would read None.
        def check(value: Any, where: str, depth: int) -> None:
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{where} is {value}, which JSON cannot carry (the job reaches the cluster as "
                                 "JSON); give it as a string such as 'nan' and convert it in the train function")
            if depth > MAX_CONFIG_DEPTH and isinstance(value, Mapping | list | tuple) and value:
                # The job is written as YAML and JSON on its way to the cluster, which recursion limits.
                raise ValueError(f"{where.split('.')[0].split('[')[0]!r} nests deeper than {MAX_CONFIG_DEPTH} levels; "
                                 "flatten it (or pass the structure as a file the train function reads)")
            if isinstance(value, Mapping):
                for key, item in value.items():
                    check(item, f"{where}.{key}", depth + 1)
            elif isinstance(value, list | tuple):
                for i, item in enumerate(value):
                    check(item, f"{where}[{i}]", depth + 1)

        for key, value in v.items():
            check(value, str(key), 1)
        return v

    @field_validator("storage_path")
    @classmethod
    def _check_storage_path(cls, v: str) -> str:
        # Ray Train reads an empty storage path as its default, ~/ray_results: a run's checkpoints
        # and ledger would land on the driver's disk, not on the durable storage the job meant.
        if not v.strip():
            raise ValueError("empty; give the durable storage root the run's checkpoints and ledger "
                             "go to: a local or NFS path (e.g. ./runs) or an s3:// or gs:// URI")
        problem = storage_uri_error(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("entrypoint")
    @classmethod
    def _check_entrypoint(cls, v: str) -> str:
        module, sep, func = v.rpartition(":")
        importable = module.endswith(".py") or all(part.isidentifier() for part in module.split("."))
        if not sep or not module or not func.isidentifier() or not importable:
            raise ValueError(f"entrypoint {v!r} must look like 'package.module:function' or 'file.py:function'")
        return v

    @field_validator("ray_address")
    @classmethod
    def _check_ray_address(cls, v: str) -> str:
        # ray.init(address="") would start a cluster of its own on the driver, not the one the job meant.
        if not v.strip() or v != v.strip():
            raise ValueError(f"{v!r}: give 'local' (an embedded local cluster), 'auto' (the cluster this "
                             "machine belongs to) or the head's host:port, without spaces")
        return v

    @field_validator("backend")
    @classmethod
    def _check_backend(cls, v: str) -> str:
        if v not in ("torch", "tensorflow"):
            raise ValueError(f"backend {v!r} is not supported; use 'torch' or 'tensorflow'")
        return v

    @field_validator("tiers")
    @classmethod
    def _check_tiers(cls, tiers: tuple[Tier, ...]) -> tuple[Tier, ...]:
        try:
            Ladder(tiers=tiers)
        except ValidationError as e:  # the ladder's own message, not a nested 'tiers.tiers' report
            raise ValueError("; ".join(i["msg"].removeprefix("Value error, ") for i in e.errors())) from None
        return tiers

    @model_validator(mode="after")
    def _one_store_across_clusters(self) -> JobConfig:
        if problem := shared_storage_error(self.storage_path, self.ladder.clusters.values()):
            raise ValueError(f"storage_path: {problem}")
        return self

    @property
    def ladder(self) -> Ladder:
        return Ladder(tiers=self.tiers)

    def run_command(self, *options: str, ray_address: str | None = None) -> str:
        """The shell command that runs this job with ``spotfallback run`` (``options`` after the job).

        The job travels as one shell-quoted JSON argument, so the command is self-contained;
        running it again resumes the run (same ``name`` and ``storage_path``). Only the fields the
        job sets are written, as in its job file: a field left to its default (``backend``, taken
        from the entrypoint's declaration, which the generating machine may not be able to import)
        is decided where the job runs, exactly as `spotfallback run job.yaml` would decide it.
        ``ray_address`` replaces the job's own.
        """
        job = self if ray_address is None else self.model_copy(update={"ray_address": ray_address})
        text = json.dumps(job.model_dump(mode="json", exclude_unset=True), sort_keys=True, separators=(",", ":"))
        return shlex.join(["spotfallback", "run", "--job-json", text, *options])

    @classmethod
    def from_yaml(cls, path: str | Path) -> JobConfig:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the job file: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: the job file is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
        data = load_yaml_mapping(text, str(path))
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise validation_config_error(str(path), e) from None
