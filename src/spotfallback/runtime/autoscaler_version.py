"""Which autoscaler a Ray cluster runs: the climb's own resource requests go to autoscaler v2 only.

Why: the climb-back probe (``runtime/probe.py``) and the climb's hold (``runtime/hold.py``) ask
Ray Train's autoscaling coordinator for a tier's gang *on that tier's nodes*: its label
selector. Ray 2.60 hands label selectors to autoscaler v2 only; under v1,
``ray.autoscaler.sdk.request_resources`` keeps each bundle's resources and drops its selector
(``ray/autoscaler/_private/commands.py``, ``request_resources``), so v1 launches whatever node
type fits: an on-demand GPU node for a request meant for spot, idle and billed, for a climb that
cannot happen on it. So on v1 they send nothing. The run's own request is Ray Train's, sent as
Ray sends it, and the ladder itself works through Ray's scheduler on any cluster.

A cluster whose autoscaler launches nothing is not v1 here: a head started without an
autoscaling config (``ray start --head``, ``ray.init()``, ``ray.cluster_utils.Cluster``,
``spotfallback.local.LocalSpotCluster``) runs Ray's v1 monitor read-only, and a request there
changes nothing, so the probe and the hold stay on.

How it is told, from the cluster's internal KV (Ray 2.60):

- the GCS writes ``__autoscaler_v2_enabled`` (``"1"`` or ``"0"``, its ``RAY_enable_autoscaler_v2``)
  in namespace ``__autoscaler`` as it starts: what Ray's own ``is_autoscaler_v2`` reads, and what
  decides which monitor a head starts and which one KubeRay's autoscaler container runs;
- the v1 monitor writes its status (what ``ray status`` prints) under ``__autoscaling_status``
  every round; the read-only one reports every node as a node type of its own,
  ``node_<node id>``, a v1 autoscaler with a config reports its config's node types. The v2
  monitor writes no such key.

``classify_autoscaler`` is the pure rule, over any KV getter; ``cluster_autoscaler`` reads the
connected cluster once per process and cluster and logs the one warning for v1.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Literal

logger = logging.getLogger("spotfallback")

AutoscalerKind = Literal["v2", "v1", "none", "unknown"]
# (key, namespace) -> the value, or None when the key is not set.
KvGet = Callable[[bytes, bytes | None], bytes | None]

# ray._raylet.GCS_AUTOSCALER_V2_ENABLED_KEY and GCS_AUTOSCALER_STATE_NAMESPACE (src/ray/common/constants.h).
V2_ENABLED_KEY = b"__autoscaler_v2_enabled"
AUTOSCALER_NAMESPACE = b"__autoscaler"
# ray._private.ray_constants.DEBUG_AUTOSCALING_STATUS, in the default namespace.
V1_STATUS_KEY = b"__autoscaling_status"
# The read-only v1 monitor's node types: ray.autoscaler._private.util.format_readonly_node_type.
_READONLY_NODE_TYPE = re.compile(r"node_[0-9a-f]{16,}")
# One KV read at the driver's start; a GCS that does not answer in this long leaves it unknown.
KV_TIMEOUT_S = 5.0

V1_WARNING = (
    "[spotfallback] this Ray cluster runs autoscaler v1, which drops the label selectors of resource "
    "requests: a request for a tier's gang would launch any node type that fits (an on-demand node for a "
    "spot tier), idle and billed. So the climb-back probe and the climb's hold send no requests here: the "
    "ladder still works through Ray's scheduler, but no nodes are asked for to climb back onto a tier "
    "whose pool has scaled to zero, nor kept for a climb that fails. Run autoscaler v2: on "
    "KubeRay, enableInTreeAutoscaling: true and autoscalerOptions.version: v2 in the RayCluster (KubeRay "
    "1.4 or later; what `spotfallback manifest kuberay` writes); with `ray up`, leave "
    "RAY_UP_enable_autoscaler_v2 unset or 1 (Ray's default since 2.50, which the files `spotfallback "
    "manifest cluster-launcher` writes rely on); with `ray start`, RAY_enable_autoscaler_v2=1 on the head."
)


def classify_autoscaler(kv_get: KvGet) -> AutoscalerKind:
    """What autoscaler the cluster behind ``kv_get`` runs.

    ``"v2"``: autoscaler v2. ``"v1"``: a v1 autoscaler that launches nodes. ``"none"``: nothing that
    launches nodes (a read-only v1 monitor, or none at all). ``"unknown"``: the KV does not say
    (a v1 monitor that has not reported a round yet, an unreadable status).
    """
    flag = kv_get(V2_ENABLED_KEY, AUTOSCALER_NAMESPACE)
    if flag == b"1":
        return "v2"
    status = kv_get(V1_STATUS_KEY, None)
    if status is None:  # no v1 monitor has reported: a head started with --no-monitor, or none yet
        return "none" if flag == b"0" else "unknown"
    types = v1_node_types(status)
    if not types:
        return "unknown"
    return "none" if all(_READONLY_NODE_TYPE.fullmatch(t) for t in types) else "v1"


def v1_node_types(status: bytes) -> set[str]:
    """The node types a v1 monitor's status names (its ``autoscaler_report``); empty when it names
    none or cannot be read."""
    try:
        report = json.loads(status).get("autoscaler_report")
    except (ValueError, AttributeError):
        return set()
    if not isinstance(report, dict):
        return set()
    types: set[str] = set()
    for field in ("active_nodes", "idle_nodes", "pending_launches"):  # node type -> count
        value = report.get(field)
        if isinstance(value, dict):
            types.update(k for k in value if isinstance(k, str))
    for field in ("pending_nodes", "failed_nodes"):  # [ip, node type, ...] each
        value = report.get(field)
        for entry in value if isinstance(value, list) else ():
            if isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[1], str):
                types.add(entry[1])
    mapping = report.get("node_type_mapping")  # node ip -> node type
    if isinstance(mapping, dict):
        types.update(v for v in mapping.values() if isinstance(v, str))
    return types


def climb_requests_allowed(kind: AutoscalerKind) -> bool:
    """Whether the probe, the hold and the mover's looks may ask a cluster with this autoscaler for nodes."""
    return kind != "v1"


# -- the Ray shell ------------------------------------------------------------------------

_kinds: dict[str, AutoscalerKind] = {}  # per GCS address: one process may drive several clusters in turn
_lock = threading.Lock()


def _connected_address() -> str | None:
    """The GCS address of the cluster this process is connected to; None when not connected."""
    import ray

    if not ray.is_initialized():
        return None
    address: str = ray.get_runtime_context().gcs_address
    return address


def kv_getter(address: str) -> KvGet:
    """Reads of the internal KV of the cluster at ``address``."""
    from spotfallback.notices.drain import gcs_client

    gcs = gcs_client(address)
    return lambda key, namespace: gcs.internal_kv_get(key, namespace=namespace, timeout=KV_TIMEOUT_S)


def cluster_autoscaler() -> AutoscalerKind:
    """The connected cluster's autoscaler, read from its internal KV once per process and cluster.

    Logs ``V1_WARNING`` once, when a cluster is first found on v1. ``"unknown"`` when this process
    is not connected to Ray (not remembered: read once it is) or on any error (logged at debug
    level; the probe and the hold then work as they would without this check).
    """
    try:
        address = _connected_address()
    except Exception:
        logger.debug("could not tell which cluster this process is connected to", exc_info=True)
        return "unknown"
    if address is None:
        return "unknown"
    with _lock:
        kind = _kinds.get(address)
        if kind is not None:
            return kind
        try:
            kind = classify_autoscaler(kv_getter(address))
        except Exception:
            logger.debug("could not read the cluster's autoscaler from its internal KV", exc_info=True)
            kind = "unknown"
        _kinds[address] = kind
    if kind == "v1":
        logger.warning(V1_WARNING)
    else:
        logger.debug("the cluster at %s runs autoscaler: %s", address, kind)
    return kind
