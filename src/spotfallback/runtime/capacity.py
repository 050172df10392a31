"""When to look at capacity, and what the run has measured: what a climb or a resize needs.

Capacity itself (``notices.placement.tier_capacity``) is the number of workers the alive,
non-draining nodes matching a tier's label selector could hold, counted from their total
resources: the question is "could this tier's gang be placed", and the current gang's own
nodes count for an elastic tier. Observations are made at most every
``SPOTFALLBACK_CAPACITY_POLL_S`` seconds, and only shortly after a checkpoint commit (so a move
loses little work), except the higher tiers' while the gang answers checkpoint requests
(``notices/requests.py``): a climb then asks for its own checkpoint first.
"""

from __future__ import annotations

import logging

from spotfallback.config import Tier, env_seconds
from spotfallback.events import CheckpointCommitted, Decision, Event
from spotfallback.notices.placement import tier_capacity
from spotfallback.policy import (
    CLIMB_AFTER_CHECKPOINT_S,
    MOVE_ACTIONS,
    RestartClock,
    commit_in_sight,
    committed_since,
)

logger = logging.getLogger("spotfallback")


class CapacityWatch:
    """The run's own measurements the policy weighs a move with, and the observation throttle.

    ``remaining_work_s`` comes from the training function: report it as a metric with a
    checkpoint (``{"remaining_work_s": ...}``); without it the policy treats the remaining
    work as unknown and climbs whenever the higher tier is cheaper. Reported with every
    report as well, it also tells how far the running gang has got since its last commit.
    """

    def __init__(self) -> None:
        self.poll_s = env_seconds("SPOTFALLBACK_CAPACITY_POLL_S", 10.0)
        self.after_checkpoint_s = env_seconds("SPOTFALLBACK_CLIMB_AFTER_CHECKPOINT_S", CLIMB_AFTER_CHECKPOINT_S)
        self.last_poll = float("-inf")
        self.checkpoints: list[float] = []
        self.remaining_work_s: float | None = None  # at the latest commit: where a new gang resumes
        self.latest: tuple[float, float] | None = None  # (when, remaining_work_s) of the running gang's latest report
        self.restart = RestartClock()

    @property
    def restart_s(self) -> float:
        """The run's latest restart (a default until it has measured one)."""
        return self.restart.restart_s

    @property
    def checkpoint_interval_s(self) -> float:
        if len(self.checkpoints) < 2:
            return 0.0
        return self.checkpoints[-1] - self.checkpoints[-2]

    def record(self, event: Event, decision: Decision) -> None:
        """Learn from every event the runtime applies (called under its lock)."""
        if isinstance(event, CheckpointCommitted):
            self.checkpoints = [*self.checkpoints[-1:], event.t]
            if event.remaining_work_s is not None:
                self.remaining_work_s = event.remaining_work_s
                self.latest = (event.t, event.remaining_work_s)
        self.restart = self.restart.after(event, decision.action)
        if decision.action in MOVE_ACTIONS:
            self.checkpoints = []  # checkpoints of the stopped gang say nothing about the next
            self.latest = None  # the next gang resumes from the latest commit

    def due(self, now: float, running_since: float | None, any_time: bool = False) -> bool:
        """Observe now? Not too often, and only after a checkpoint of the running gang unless ``any_time``."""
        if now - self.last_poll < self.poll_s or running_since is None:
            return False
        if not any_time and not self.after_commit(now, running_since):
            return False
        self.last_poll = now
        return True

    def after_commit(self, now: float, running_since: float) -> bool:
        """Whether the running gang committed a checkpoint in the last ``after_checkpoint_s``."""
        last = self.checkpoints[-1] if self.checkpoints else None
        return committed_since(last, running_since, now, self.after_checkpoint_s)

    def commit_expected_within(self, now: float, running_since: float, lead_s: float) -> bool:
        """``policy.commit_in_sight`` for the running gang, whose interval is known once it has committed twice."""
        measured = len(self.checkpoints) >= 2 and self.checkpoints[-2] >= running_since
        return commit_in_sight(self.checkpoints[-1] if self.checkpoints else None,
                               self.checkpoint_interval_s if measured else None,
                               running_since, now, lead_s, self.after_checkpoint_s)

    def reported(self, t: float, remaining_work_s: float | None) -> None:
        """A report of the running gang without a checkpoint: how much work it has left now."""
        if remaining_work_s is not None:
            self.latest = (t, remaining_work_s)

    def remaining_now_s(self, now: float, running_since: float) -> float | None:
        """The work left now, for a checkpoint taken now: the running gang's latest report less the time since.

        Before the gang's first report, the latest commit's less the time since the gang started
        (its restore counted as progress: a function that reports only with checkpoints, and
        writes none, would otherwise never be seen to progress).
        """
        if self.latest is not None and self.latest[0] >= running_since:
            at, left = self.latest
        elif self.remaining_work_s is not None:
            at, left = running_since, self.remaining_work_s
        else:
            return None
        return max(0.0, left - max(0.0, now - at))


def start_size(tier: Tier) -> int:
    """Gang size for a new worker group: elastic tiers take what is there, at least their minimum."""
    if not tier.is_elastic:
        return tier.num_workers
    return max(tier.fewest_workers, tier_capacity(tier))
