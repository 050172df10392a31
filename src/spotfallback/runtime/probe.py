"""Asking the autoscaler for a higher tier's nodes while the run waits below it: the climb-back probe.

Why: the climb back is decided on capacity observed on existing nodes (``tier_capacity``). A
tier whose node pool scales to zero when unused (spot, ``minReplicas: 0``) never has nodes
unless someone asks for them, so without a request the run would stay on the dearer tier for
good. While the run is down the ladder, the controller keeps a resource request for the gang
of the best tier it could climb back to, under its own requester id beside the run's own
request. When the cloud has capacity again the autoscaler adds those nodes, and the usual
observation and the policy's climb rules (dwell, price, flapping) decide the climb itself.

``policy.probe_target`` is the pure rule (which tier, if any); ``CapacityProbe`` sends, renews and
cancels the request. A probe costs money (the nodes come up before the run uses them), so only
a tier the policy would climb to once its nodes are there is probed (the pure policy is asked,
with a hypothetical observation of the tier's full gang), and only from ``lead_s`` before its
climb dwell ends. On a cluster whose autoscaler is v1 the probe is inert: v1 drops the
request's label selector and would launch any node type that fits (``runtime/autoscaler_version.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from ray.train.v2.api.config import ScalingConfig

from spotfallback.config import Tier, env_seconds
from spotfallback.notices.placement import tier_capacity
from spotfallback.policy import FallbackPolicy, PolicyState, RunEstimates, probe_target
from spotfallback.runtime.autoscaler_version import climb_requests_allowed, cluster_autoscaler
from spotfallback.runtime.ladder import LadderRuntime

logger = logging.getLogger("spotfallback")

# A new cloud VM takes about two minutes from request to a joined Ray node.
DEFAULT_PROBE_LEAD_S = 120.0
# Ray's coordinator drops a request after 180 s; renew well before, as Ray Train does (20 s).
DEFAULT_PROBE_RENEW_S = 20.0
# How often to look whether the probed tier's nodes are already there (a GCS node-table read).
DEFAULT_PROBE_POLL_S = 5.0
# How long a request may stay short of the whole gang before its nodes are given back: a cloud
# that has only part of a gang's capacity would otherwise keep those nodes up, idle and billed.
# Asked again after as long, doubling each time, up to MAX_PROBE_QUIET_S.
DEFAULT_PROBE_PATIENCE_S = 600.0
MAX_PROBE_QUIET_S = 4 * 3600.0


def gang_scaling_config(tier: Tier) -> ScalingConfig:
    """``tier``'s gang as the autoscaler should see it: size, resources per worker, label selector."""
    return ScalingConfig(
        num_workers=tier.num_workers,  # an elastic tier's maximum: new capacity grows the gang
        use_gpu=tier.use_gpu,
        resources_per_worker=tier.resources_per_worker,
        label_selector=dict(tier.label_selector) or None,
    )


class RequestClient(Protocol):
    """What the probe needs of Ray Train's ``TrainAutoscalingCoordinatorClient``.

    One client per requester id: the probe's request sits beside the run's own, under
    ``<run's requester id>-climb-probe``, so sending or cancelling one leaves the other.
    """

    _requester_id: str

    def __init__(self, requester_id: str) -> None: ...

    def send_resource_request(self, scaling_config: Any, num_workers: int) -> None: ...

    def cancel_resource_request(self) -> None: ...


class CapacityProbe:
    """Keeps one resource request, for the tier ``probe_target`` names, in step with the run.

    Sent when a tier becomes the target and has no room for its gang yet, renewed every
    ``renew_s`` while it stays the target (also once its nodes are up: cancelled, the
    autoscaler would remove them as idle before the climb), cancelled as soon as it is not
    the target (the run climbed, fell further, stopped, or the tier is no longer wanted), and
    withdrawn for a while when ``patience_s`` after it was sent the gang still does not fit
    (the nodes that came are given back; asked again after as long, doubling each time), while
    the next tier the run could climb to is asked for instead.

    ``inert``: never sends anything (the cluster's autoscaler would launch the wrong nodes for it).
    """

    def __init__(
        self,
        client: RequestClient | None = None,
        *,
        lead_s: float | None = None,
        renew_s: float | None = None,
        poll_s: float | None = None,
        patience_s: float = DEFAULT_PROBE_PATIENCE_S,
        inert: bool = False,
    ) -> None:
        self.client = client
        self.inert = inert
        # Unset ones come from the environment where the probe runs: the Train controller.
        self._lead_s, self._renew_s, self._poll_s = lead_s, renew_s, poll_s
        self.patience_s = patience_s
        self.tier: int | None = None  # the tier whose gang is requested now
        self.sent_at = -math.inf
        self.checked_at = -math.inf
        self.asked_at = -math.inf  # when the current request was first sent
        # Per tier: (no request before, the next quiet's length), after a request that never got the whole gang.
        self.quiet: dict[int, tuple[float, float]] = {}
        self.run_tier: int | None = None  # the run's tier at the last update

    @property
    def lead_s(self) -> float:
        """How long before a tier's climb dwell ends its nodes are asked for."""
        return env_seconds("SPOTFALLBACK_PROBE_LEAD_S", DEFAULT_PROBE_LEAD_S) if self._lead_s is None else self._lead_s

    @property
    def renew_s(self) -> float:
        return env_seconds("SPOTFALLBACK_PROBE_RENEW_S", DEFAULT_PROBE_RENEW_S) if self._renew_s is None else self._renew_s

    @property
    def poll_s(self) -> float:
        return env_seconds("SPOTFALLBACK_PROBE_POLL_S", DEFAULT_PROBE_POLL_S) if self._poll_s is None else self._poll_s

    def follow(
        self,
        rt: LadderRuntime,
        run_client: RequestClient | None,
        capacity: Callable[[Tier], int] = tier_capacity,
        now: float | None = None,
    ) -> None:
        """``update`` for the run's state now, counting capacity on the live cluster.

        ``run_client`` is the run's own coordinator client (None until the controller has
        started, when no request is sent yet); the probe's client is one of the same class.
        """
        if run_client is None or self.inert:
            return
        if self.client is None:
            self.client = type(run_client)(f"{run_client._requester_id}-climb-probe")
        now = time.time() if now is None else now
        with rt.lock:
            state, watch = rt.state, rt.watch
            estimates = RunEstimates(watch.remaining_work_s, watch.restart_s, watch.checkpoint_interval_s)
            # Nodes asked for while no climb can be decided would sit idle, billed: ask only while the gang
            # answers checkpoint requests, or from ``lead_s`` before its next periodic commit.
            in_sight = state.running_since is not None and (
                watch.commit_expected_within(now, state.running_since, self.lead_s) or rt.requests.listened())
        self.update(rt.policy, state, now, capacity, estimates, climb_in_sight=in_sight)

    def update(
        self,
        policy: FallbackPolicy,
        state: PolicyState,
        now: float,
        capacity: Callable[[Tier], int],
        estimates: RunEstimates = RunEstimates(),
        *,
        climb_in_sight: bool = True,
    ) -> None:
        """Send, renew or cancel the request for the run's state at ``now``; none while no climb can be
        decided soon (``climb_in_sight`` false: ``follow`` says when); nothing at all when ``inert``."""
        if self.inert:
            return
        if state.tier != self.run_tier:  # the run moved: what kept the last requests quiet is past
            self.run_tier, self.quiet = state.tier, {}
        passed_over = frozenset(t for t, (until, _) in self.quiet.items() if now < until and t != self.tier)
        target = (probe_target(policy, state, now, self.lead_s, estimates, passed_over=passed_over)
                  if climb_in_sight else None)
        if self.tier is not None and target != self.tier:
            self.cancel()
        if target is None:
            return
        tier = policy.tiers[target]
        if self.tier == target:
            if now - self.asked_at >= self.patience_s and now - self.checked_at >= self.poll_s:
                self.checked_at = now
                if capacity(tier) < tier.fewest_workers:
                    quiet_s = self.quiet.get(target, (0.0, self.patience_s))[1]
                    logger.info("[spotfallback] %r's gang did not fit within %.0fs of asking: its nodes are given back, "
                                "asked for again in %.0fs", tier.name, self.patience_s, quiet_s)
                    self.cancel()
                    self.quiet[target] = (now + quiet_s, min(2 * quiet_s, MAX_PROBE_QUIET_S))
                    return
                self.asked_at = now  # it fits: the climb is the observation's to decide
            if now - self.sent_at >= self.renew_s:
                self._send(target, tier, now)
            return
        if now - self.checked_at < self.poll_s:
            return
        self.checked_at = now
        if capacity(tier) >= tier.fewest_workers:
            return  # its nodes are there: the capacity observation decides the climb
        logger.info("[spotfallback] asking the autoscaler for %r's gang to climb back onto", tier.name)
        self._send(target, tier, now)
        self.asked_at = now

    def _send(self, index: int, tier: Tier, now: float) -> None:
        assert self.client is not None
        self.client.send_resource_request(gang_scaling_config(tier), tier.num_workers)
        self.tier, self.sent_at = index, now

    def cancel(self) -> None:
        """Withdraw the request, if one is out."""
        if self.tier is None:
            return
        self.tier, self.sent_at = None, -math.inf
        if self.client is not None:
            self.client.cancel_resource_request()


def look_capacity(
    tier: Tier,
    requester_id: str,
    wait_s: float,
    *,
    poll_s: float = 2.0,
    capacity: Callable[[Tier], int] = tier_capacity,
    client: RequestClient | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """How many of ``tier``'s workers this cluster can place, asking its autoscaler for them first.

    The look the moving driver runs on a higher tier's cluster (a Ray job) while the run is on
    another cluster: what a driver's ``CapacityProbe`` and capacity observation do within their
    own cluster. When the gang does not fit yet, its resources are requested under
    ``requester_id`` (renewed every ``DEFAULT_PROBE_RENEW_S``) and the count taken again every
    ``poll_s`` until it fits or ``wait_s`` has passed. The request is left to expire on its own
    (Ray's 180 s), not withdrawn: nodes that came up for it must still be there when the run
    climbs onto them. On a cluster whose autoscaler is v1 nothing is asked (v1 drops the label
    selector and would launch any node type that fits): the count now is the answer.
    """
    available = capacity(tier)
    if wait_s <= 0:
        return available
    if client is None:
        if not climb_requests_allowed(cluster_autoscaler()):
            logger.info("[spotfallback] not asking this cluster's autoscaler (v1) for %r's gang: %d of its workers "
                        "fit now", tier.name, available)
            return available
        from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
            TrainAutoscalingCoordinatorClient,
        )

        client = TrainAutoscalingCoordinatorClient(requester_id)
    if available >= tier.fewest_workers:
        # Nodes an earlier look asked for: asked for again, so that they are still there for the climb.
        client.send_resource_request(gang_scaling_config(tier), tier.num_workers)
        return available
    deadline = time.monotonic() + wait_s
    sent = -math.inf
    while True:
        now = time.monotonic()
        if now - sent >= DEFAULT_PROBE_RENEW_S:
            client.send_resource_request(gang_scaling_config(tier), tier.num_workers)
            sent = now
        sleep(min(poll_s, max(deadline - now, 0.0)))
        available = capacity(tier)
        if available >= tier.fewest_workers or time.monotonic() >= deadline:
            return available
