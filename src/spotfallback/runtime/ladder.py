"""The runtime of one run inside Ray Train's controller: the policy, its state, the ledger writer.

Every hook of a run (failure policy, scaling policy, callbacks) shares one ``LadderRuntime``,
found by the run's key, so events are applied under one lock and written to the ledger before
their decision is acted on. While a gang runs, ``decide_while_running`` feeds the pure policy
capacity observations of higher tiers (climbing back) and of an elastic tier (growing).

Why here and not in a thread: Ray Train's controller already asks its scaling policy, on every
loop while the worker group runs, whether to resize it, and a ``ResizeDecision`` makes the
controller stop the group and start a new one from the latest checkpoint, asking the
``on_controller_start_worker_group`` hook for its label selector. So a climb back is: count
the higher tier's capacity, hand the count to the pure policy as ``CapacityObserved``, and
on ``ClimbBack`` (the runtime has already moved to the higher tier) answer with a
``ResizeDecision`` of that tier's size. Elastic growth is the same with ``Resize``, and a
shrunk gang that its tier's deadline guard sends down gets a ``SwitchTier`` answered the same way.

A gang that answers checkpoint requests (``notices/requests.py``) has its higher tiers'
capacity watched all the time, not only just after its periodic checkpoints: on ``ClimbBack``
the runtime asks it for a checkpoint and answers with the ``ResizeDecision`` once that
checkpoint is committed (or the wait for it ends), so the climb loses no work.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from ray.train.v2._internal.constants import (
    DEFAULT_WORKER_GROUP_START_TIMEOUT_S,
    WORKER_GROUP_START_TIMEOUT_S_ENV_VAR,
)

from spotfallback.config import Ladder, Tier
from spotfallback.events import CapacityObserved, ClimbBack, Decision, Event, Resize, SwitchTier
from spotfallback.notices.placement import tier_capacity
from spotfallback.notices.requests import CheckpointRequests
from spotfallback.policy import FallbackPolicy, PolicyState
from spotfallback.runtime.capacity import CapacityWatch, start_size
from spotfallback.store.heartbeat import DEFAULT_INTERVAL_S, HeartbeatThrottle
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import RunLocation

logger = logging.getLogger("spotfallback")

# How often a capacity wait wakes up to re-check its deadline when there is none nearer.
_MAX_START_WAIT_S = float(os.environ.get(WORKER_GROUP_START_TIMEOUT_S_ENV_VAR, DEFAULT_WORKER_GROUP_START_TIMEOUT_S))
# How long a climb waits for the checkpoint it asked for before it stops the gang anyway.
REQUEST_WAIT_S = float(os.environ.get("SPOTFALLBACK_CHECKPOINT_REQUEST_WAIT_S", "300"))


@dataclass(frozen=True)
class PendingClimb:
    """A climb decided while the gang writes the checkpoint it was asked for."""

    tier: Tier
    num_workers: int
    asked_at: float


@dataclass(frozen=True)
class RunSpec:
    """What the controller-side hooks need; pickled into the controller with each hook."""

    key: str
    tiers: tuple[dict[str, Any], ...]
    state: PolicyState
    location: RunLocation
    writer: str
    cluster: str | None = None  # the cluster this driver runs on, in a ladder across clusters
    heartbeat_interval_s: float = DEFAULT_INTERVAL_S  # read by the driver, so a bad value is refused there


class LadderRuntime:
    """The policy, its current state and the ledger writer, shared by all hooks of one run."""

    def __init__(self, spec: RunSpec):
        self.policy = FallbackPolicy(Ladder(tiers=tuple(Tier.model_validate(t) for t in spec.tiers)))
        self.state = spec.state
        self.ledger = Ledger(spec.location, writer=spec.writer)
        self.cluster = spec.cluster
        self.lock = threading.RLock()
        self.worker_nodes: list[str] = []
        self.heartbeat = HeartbeatThrottle(spec.heartbeat_interval_s)  # latest metrics for `run`/`status` progress
        self.watch = CapacityWatch()  # measurements for climbing back / elastic growth
        self.requests = CheckpointRequests(spec.location.name)
        self.climbing: PendingClimb | None = None

    @property
    def tier(self) -> Tier:
        return self.policy.tiers[self.state.tier]

    def off_cluster(self) -> bool:
        """Whether the policy has moved the run to a tier on another Ray cluster than this one's:
        the controller then stops, and the driver that moves the run takes it there."""
        return self.cluster is not None and self.policy.ladder.cluster_key(self.state.tier) != self.cluster

    def apply(self, event: Event, info: dict[str, Any] | None = None) -> Decision:
        with self.lock:
            tier = self.state.tier
            step = self.policy.decide(self.state, event)
            # A capacity observation that changes nothing is not worth a ledger object.
            if not (isinstance(event, CapacityObserved) and step.state == self.state):
                self.ledger.append(event, tier, step.decision.to_json(), info)
            self.state = step.state
            self.watch.record(event, step.decision)
            return step.decision

    def reported(self, t: float, remaining_work_s: float | None) -> None:
        """A report without a checkpoint: the running gang's remaining work, for a climb's test."""
        with self.lock:
            self.watch.reported(t, remaining_work_s)

    def start_timeout_s(self, now: float) -> float:
        """How long the next placement-group wait may block: until the capacity deadline."""
        deadline = self.policy.capacity_deadline(self.state)
        if deadline is None:
            return _MAX_START_WAIT_S
        return max(0.5, min(_MAX_START_WAIT_S, deadline - now))

    def decide_while_running(self) -> tuple[Tier, int] | None:
        """Feed capacity observations to the policy; (new tier, gang size) when it says move."""
        now = time.time()
        with self.lock:
            if self.climbing is not None:
                return self._climb_when_saved(now)
            state = self.state
            if state.running_since is None:
                return None
            tiers = self.policy.tiers
            cur = state.tier
            climbs = [j for j in range(cur) if tiers[j].climb_back and self.policy.ladder.same_cluster(j, cur)]
            on_request = bool(climbs) and self.requests.listened()
            after_commit = self.watch.after_commit(now, state.running_since)
            if not self.watch.due(now, state.running_since, any_time=on_request):
                return None
            targets = climbs if after_commit or on_request else []
            if after_commit and tiers[cur].is_elastic and state.workers < tiers[cur].num_workers:
                targets.append(cur)
            for j in targets:
                available = tier_capacity(tiers[j])
                ask = on_request and j < cur
                event = CapacityObserved(
                    t=now,
                    tier=j,
                    available_workers=available,
                    remaining_work_s=self.watch.remaining_now_s(now, state.running_since) if ask
                    else self.watch.remaining_work_s,
                    restart_s=self.watch.restart_s,
                    checkpoint_interval_s=self.watch.checkpoint_interval_s,
                )
                decision = self.apply(event, {"tier": tiers[j].name})
                if isinstance(decision, ClimbBack):
                    size = max(tiers[j].fewest_workers, available)
                    if ask:
                        self.requests.ask(f"climbing back to {tiers[j].name!r}", REQUEST_WAIT_S)
                        self.climbing = PendingClimb(tiers[j], size, now)
                        logger.info("[spotfallback] climbing back from %r to %r once the gang has saved a checkpoint: %s",
                                    tiers[cur].name, tiers[j].name, decision.reason)
                        return None
                    logger.info("[spotfallback] climbing back from %r to %r: %s", tiers[cur].name, tiers[j].name, decision.reason)
                    return tiers[j], size
                if isinstance(decision, Resize):
                    logger.info("[spotfallback] resizing %r to %d workers", tiers[cur].name, decision.num_workers)
                    return tiers[cur], decision.num_workers
                if isinstance(decision, SwitchTier):  # a shrunk gang's deadline guard: behind schedule
                    to = tiers[decision.to_tier]
                    logger.info("[spotfallback] leaving %r for %r: %s", tiers[cur].name, to.name, decision.reason)
                    return to, start_size(to)
        return None

    def _climb_when_saved(self, now: float) -> tuple[Tier, int] | None:
        """The pending climb's move, once the checkpoint asked for is committed or the wait for it is over."""
        climb = self.climbing
        assert climb is not None
        saved = any(t >= climb.asked_at for t in self.watch.checkpoints)
        if not saved and now - climb.asked_at < REQUEST_WAIT_S:
            return None
        if not saved:
            logger.warning("[spotfallback] no checkpoint was committed within %.0fs of the request: climbing back "
                           "to %r from the last one", REQUEST_WAIT_S, climb.tier.name)
        self.end_climb()
        return climb.tier, climb.num_workers

    def end_climb(self) -> None:
        """The pending climb is over (moved, or the gang it was for has gone): nothing waits for a checkpoint."""
        if self.climbing is not None:
            self.requests.withdraw()
            self.climbing = None


_RUNTIMES: dict[str, LadderRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def runtime_for(spec: RunSpec) -> LadderRuntime:
    with _RUNTIMES_LOCK:
        rt = _RUNTIMES.get(spec.key)
        if rt is None:
            rt = _RUNTIMES[spec.key] = LadderRuntime(spec)
        return rt
