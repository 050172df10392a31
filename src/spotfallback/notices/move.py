"""Leaving a draining node at once: which gang comes next, asking for it, and when to go.

After its just-in-time checkpoint a gang on a draining node has nothing left to do there:
holding until the node goes bills the whole gang idle for the rest of the notice (two
minutes on AWS), and only then does the restart ask for new capacity. So at the notice the
replacement is asked for (provisioning overlaps the notice), and once the checkpoint is
committed and the next gang fits on nodes that are not draining, rank 0 ends the attempt
(``GangMovedError``); the failure policy counts it as the preemption and Ray Train restarts
the gang at once. Where nothing fits before the node goes, the gang holds, as before.

Which gang comes next is the pure policy's answer to this preemption (``next_gang``), the
same rule the controller will apply when the attempt ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spotfallback.config import Ladder, Tier
from spotfallback.events import CheckpointCommitted, LedgerRecord, Preempted
from spotfallback.notices.runlog import RunLog
from spotfallback.policy import FallbackPolicy

logger = logging.getLogger("spotfallback")

PROVISION_ALLOWANCE_S = 300.0  # how long past the deadline the replacement request stays up
CLOCK_SKEW_S = 30.0  # nodes' clocks may differ this much


@dataclass(frozen=True)
class NextGang:
    """The gang the run restarts with after this preemption.

    ``new_workers`` need new nodes: on the same tier only the preempted ranks (the others'
    nodes stay), on another tier the whole gang.
    """

    tier: int
    num_workers: int
    new_workers: int


def next_gang(ladder: Ladder, records: Sequence[LedgerRecord], now: float, preempted_ranks: int) -> NextGang | None:
    """The policy's next gang if the notice's preemption happened ``now`` (None: the run gives up). Pure."""
    policy = FallbackPolicy(ladder)
    state = policy.replay(r.event for r in records)
    decision = policy.decide(state, Preempted(t=now, detail="preemption notice")).decision
    tier_index = getattr(decision, "to_tier", getattr(decision, "tier", None))
    if decision.action not in ("retry", "switch_tier") or tier_index is None:
        return None
    tier = ladder.tiers[tier_index]
    size = tier.fewest_workers if tier.is_elastic else tier.num_workers
    new = min(size, max(1, preempted_ranks)) if tier_index == state.tier else size
    return NextGang(tier=tier_index, num_workers=size, new_workers=new)


def committed_since(records: Sequence[LedgerRecord], since: float, step: int | None) -> bool:
    """Whether a checkpoint (of ``step``, when both name one) was committed at or after ``since``. Pure.

    ``since`` is this node's clock and the commit is stamped by the controller's, so a commit
    of the very step counts within ``CLOCK_SKEW_S`` before it.
    """
    for rec in records:
        ev = rec.event
        if not isinstance(ev, CheckpointCommitted):
            continue
        if step is not None and ev.step == step and ev.t >= since - CLOCK_SKEW_S:
            return True
        if (step is None or ev.step is None) and ev.t >= since:
            return True
    return False


class Placement:
    """The cluster as a move sees it: what a tier could hold now, and the autoscaler request.

    Ray's GCS by default; tests pass functions.
    """

    def __init__(
        self,
        capacity: Callable[[Tier], int] | None = None,
        request: Callable[[Tier, int, float], bool] | None = None,
    ) -> None:
        if capacity is None or request is None:
            from spotfallback.notices.placement import request_gang, tier_capacity

            capacity, request = capacity or tier_capacity, request or request_gang
        self.capacity = capacity
        self.request = request


class Move:
    """Rank 0's side of one announced eviction in a spotfallback run."""

    def __init__(self, log: RunLog, ladder: Ladder, gang: NextGang, placement: Placement) -> None:
        self.log, self.ladder, self.gang, self.placement = log, ladder, gang, placement
        self.tier = ladder.tiers[gang.tier]

    @classmethod
    def at_notice(cls, log: RunLog, notice: Any, deadline_s: float | None, placement: Placement) -> Move | None:
        """Work out the next gang and ask for its new nodes now; None if the run would not go on."""
        ladder = log.ledger.read_ladder()
        if ladder is None:
            return None
        now = time.time()
        gang = next_gang(ladder, log.read(), now, len(getattr(notice, "preempted_ranks", ()) or ()))
        if gang is None:
            return None
        move = cls(log, ladder, gang, placement)
        until = (deadline_s or now) - now + PROVISION_ALLOWANCE_S
        if placement.request(move.tier, gang.new_workers, until):
            logger.warning(
                "asked the autoscaler for %d replacement worker(s) on tier %r at the notice",
                gang.new_workers, move.tier.name,
            )
        return move

    def ready(self, since: float, step: int | None) -> bool:
        """Go now? The checkpoint taken on the notice is committed and the next gang fits elsewhere."""
        if not committed_since(self.log.read(), since, step):
            return False
        return self.placement.capacity(self.tier) >= self.gang.num_workers
