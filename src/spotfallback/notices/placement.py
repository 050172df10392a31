"""Could a tier's gang be placed now, and asking the autoscaler for one: read from Ray's GCS.

Capacity is the number of workers the alive, non-draining nodes matching a tier's label
selector could hold, counted from their total resources: the question is "could this tier's
gang be placed", so the resources a gang about to be stopped holds count as free. Draining
nodes never count: Ray places nothing new on them. The controller uses it to climb and to
size elastic gangs; a worker that has just taken its just-in-time checkpoint uses it to
decide whether to move at once or hold until its node goes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import ray

from spotfallback.config import Tier
from spotfallback.notices.drain import gcs_client

logger = logging.getLogger("spotfallback")

REPLACEMENT_REQUESTER = "spotfallback-replacement"  # with the run's name: one request per run
COORDINATOR_NAME = "AutoscalingCoordinator"  # Ray Train's detached actor (its name and namespace)


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Ray's label selector semantics: ``v``, ``!v``, ``in(a,b)`` and ``!in(a,b)``."""
    for key, want in selector.items():
        have = labels.get(key)
        negate = want.startswith("!")
        body = want[1:] if negate else want
        if body.startswith("in(") or body.startswith("("):
            options = {v.strip() for v in body[body.index("(") + 1 : -1].split(",")}
        else:
            options = {body}
        if (have in options) == negate:
            return False
    return True


def workers_on_node(resources: dict[str, float], per_worker: dict[str, float]) -> int:
    needs = [resources.get(k, 0.0) // v for k, v in per_worker.items() if v > 0]
    return int(min(needs)) if needs else 0


def tier_capacity(tier: Tier) -> int:
    """How many of ``tier``'s workers its alive, non-draining matching nodes could hold (capped)."""
    try:
        gcs = gcs_client()
        draining = set(gcs.get_draining_nodes())
        nodes = ray.nodes()
    except Exception:  # a refinement: no count means no move, never a broken caller
        logger.debug("could not count capacity", exc_info=True)
        return 0
    per_worker = tier.worker_resources()
    total = 0
    for node in nodes:
        if not node.get("Alive") or node.get("NodeID") in draining:
            continue
        if selector_matches(tier.label_selector, node.get("Labels") or {}):
            total += workers_on_node(node.get("Resources") or {}, per_worker)
    return min(total, tier.num_workers)


def replacement_requester(run_name: str) -> str:
    """The requester id of a run's replacement request: its own, so runs sharing a cluster never
    withdraw each other's."""
    return f"{REPLACEMENT_REQUESTER}-{run_name}"


def withdraw_replacement(run_client: Any, run_name: str) -> None:
    """Cancel the run's replacement request (if any) through a coordinator client of the run's
    client's class, as the new gang starts.

    Why: the request was for the new gang's nodes; once the gang starts, Ray Train's own
    request for it (the controller's) covers them. Left up, the two would count that gang
    twice until the request expired, and Ray's autoscaler (v2) launches nothing for a request
    a pool's ``max_workers`` cannot hold, not even a later replacement.
    """
    if run_client is not None:
        type(run_client)(replacement_requester(run_name)).cancel_resource_request()


def request_gang(tier: Tier, num_workers: int, expire_after_s: float, requester: str = REPLACEMENT_REQUESTER) -> bool:
    """Ask the autoscaler for ``num_workers`` of ``tier``'s workers on its nodes, for a while.

    Goes through the autoscaling coordinator Ray Train itself uses, under its own requester
    id, so it adds to the running gang's request instead of replacing it; it expires on its
    own. On a cluster without an autoscaler it changes nothing. False if it could not be sent
    (also when Ray Train has sent no request yet, so there is no coordinator to add to).
    """
    if num_workers <= 0:
        return False
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            ResourceRequestPriority,
        )

        # Ray Train's controller created it; one made here would be pinned to this (maybe draining) node.
        coordinator = ray.get_actor(COORDINATOR_NAME, namespace=COORDINATOR_NAME)
        bundles: Sequence[dict[str, float]] = [tier.worker_resources()] * num_workers
        selectors = [dict(tier.label_selector)] * num_workers if tier.label_selector else None
        ray.get(
            coordinator.request_resources.remote(
                requester_id=requester,
                resources=list(bundles),
                label_selectors=selectors,
                expire_after_s=max(1.0, expire_after_s),
                priority=ResourceRequestPriority.HIGH,
            ),
            timeout=5,
        )
        return True
    except Exception as e:  # the request only saves time; the restart asks again anyway
        logger.warning("could not ask the autoscaler for the replacement workers: %s", e)
        return False
