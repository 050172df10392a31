"""The one Ray drain every preemption goes through: the notice agent's and the local injector's.

Why one function: Ray Train reacts to *how* a node is drained (reason PREEMPTION and a
deadline make ``ray.train.get_preemption_info()`` fire and charge the failure to
``max_preemption_failures``), so the demo, the tests and production must issue the very
same call or the tests prove nothing about production.
"""

from __future__ import annotations

import time
from typing import Any

from spotfallback.errors import DrainRejectedError

PREEMPTION_REASON = "DRAIN_NODE_REASON_PREEMPTION"


def deadline_ms_for(deadline_s: float | None, now_s: float | None = None) -> int:
    """Ray's deadline field: epoch milliseconds, 0 for "no deadline".

    A deadline already past becomes "now" (plus 1 ms, since 0 would mean none).
    """
    if deadline_s is None:
        return 0
    now_ms = int((time.time() if now_s is None else now_s) * 1000)
    return max(int(deadline_s * 1000), now_ms + 1)


def gcs_client(address: str | None = None) -> Any:
    """A ``ray._raylet.GcsClient`` for ``address``; by default the cluster this process is connected to."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # compiled; its stub omits the class

    if address is None:
        import ray

        address = ray.get_runtime_context().gcs_address
    return GcsClient(address=address)


def drain_for_preemption(gcs: Any, node_id: str, deadline_s: float | None, message: str) -> int:
    """Drain ``node_id`` with reason PREEMPTION until ``deadline_s`` (epoch s); returns the deadline in ms.

    ``gcs`` is a ``ray._raylet.GcsClient`` (or its address). Raises
    ``DrainRejectedError`` when Ray does not accept the drain.
    """
    from ray.core.generated import autoscaler_pb2

    client = gcs_client(gcs) if isinstance(gcs, str) else gcs
    deadline_ms = deadline_ms_for(deadline_s)
    accepted, rejection = client.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value(PREEMPTION_REASON),
        message,
        deadline_ms,
    )
    if not accepted:
        raise DrainRejectedError(f"Ray rejected the drain of node {node_id[:12]}: {rejection}")
    return deadline_ms
