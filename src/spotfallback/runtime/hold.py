"""Keeping the nodes a climb leaves until the gang it climbs to is up: the climb's hold.

Why: the run's resource request follows the run's tier, so once a climb is decided nothing asks
for the nodes of the gang it leaves, and an autoscaled pool removes them once idle (the files
``spotfallback manifest`` writes: after 60 s). A climb can still fail: the higher tier's capacity
goes again before its gang is placed, and the run falls back after that tier's capacity
timeout, onto a pool that no longer has the nodes it just left, and waits minutes for new ones.
So, from the climb until a gang runs again, a request for the left gang stands under its own
requester id (``<run's requester id>-climb-hold``) beside the run's own, withdrawn as soon as a
gang has started, the run is back at or below the left tier (its own request covers it), the
climb's capacity timeout has passed, or ``hold_s`` has: held nodes are idle and billed. On a
cluster whose autoscaler is v1 the hold is inert: v1 drops the request's label selector and
would launch any node type that fits (``runtime/autoscaler_version.py``).
"""

from __future__ import annotations

import logging
import math
import time

from spotfallback.config import Tier, env_seconds
from spotfallback.runtime.probe import DEFAULT_PROBE_RENEW_S, RequestClient, gang_scaling_config

logger = logging.getLogger("spotfallback")

# The longest a left gang is held: a climb onto a tier without a capacity timeout could wait for good.
DEFAULT_CLIMB_HOLD_S = 600.0
# Past the climb tier's capacity timeout, the time the fall back takes to ask for the left gang itself.
HOLD_GRACE_S = 60.0


class ClimbHold:
    """One resource request for the gang that ran last, while the run waits for a gang above it.

    ``inert``: never sends anything (the cluster's autoscaler would launch the wrong nodes for it).
    """

    def __init__(self, client: RequestClient | None = None, *, hold_s: float | None = None,
                 renew_s: float = DEFAULT_PROBE_RENEW_S, inert: bool = False) -> None:
        self.client = client
        self.inert = inert
        self._hold_s = hold_s  # unset: from the environment where it runs, the Train controller
        self.renew_s = renew_s
        self.gang: tuple[int, Tier, int] | None = None  # the tier index, tier and size of the gang that ran last
        self.held_since: float | None = None  # when the current hold began (None: not holding)
        self.sent_at = -math.inf
        self.spent = False  # held as long as allowed: not again until a gang runs

    @property
    def hold_s(self) -> float:
        return env_seconds("SPOTFALLBACK_CLIMB_HOLD_S", DEFAULT_CLIMB_HOLD_S) if self._hold_s is None else self._hold_s

    def gang_running(self, index: int, tier: Tier, num_workers: int) -> None:
        """A gang runs on tier ``index``: nothing to hold any longer; this is the gang a climb would leave."""
        self.cancel()
        self.gang, self.spent = (index, tier, num_workers), False

    def follow(self, run_tier: int, climb_tier: Tier, run_client: RequestClient | None, now: float | None = None) -> None:
        """Hold, renew or withdraw for the run now on tier ``run_tier`` (``climb_tier``), waiting for its gang."""
        if self.inert:
            return
        if self.gang is None or run_tier >= self.gang[0] or run_client is None or self.spent:
            self.cancel()
            return
        if self.client is None:
            self.client = type(run_client)(f"{run_client._requester_id}-climb-hold")
        now = time.time() if now is None else now
        index, tier, num_workers = self.gang
        limit = self.hold_s
        if climb_tier.capacity_timeout_s is not None:
            limit = min(limit, climb_tier.capacity_timeout_s + HOLD_GRACE_S)
        if self.held_since is None:
            self.held_since = now
            logger.info("[spotfallback] keeping %r's %d nodes for up to %.0fs, until %r's gang is up: a climb that "
                        "fails falls back onto them", tier.name, num_workers, limit, climb_tier.name)
        elif now - self.held_since >= limit:
            logger.info("[spotfallback] %r's gang is still not up after %.0fs: %r's nodes are given back",
                        climb_tier.name, now - self.held_since, tier.name)
            self.cancel()
            self.spent = True
            return
        if now - self.sent_at >= self.renew_s:
            self.client.send_resource_request(gang_scaling_config(tier), num_workers)
            self.sent_at = now

    def cancel(self) -> None:
        """Withdraw the hold, if one is out."""
        if self.held_since is None:
            return
        self.held_since, self.sent_at = None, -math.inf
        if self.client is not None:
            self.client.cancel_resource_request()
