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

Both looks read the ledger from its snapshot (``Ledger.read_view``: the stored replay and the
events after it), never the whole of it: the notice check holds up the just-in-time checkpoint,
and the wait for the move polls every quarter second, so on a run weeks long a full read each
time would cost seconds of the notice.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from spotfallback.config import Ladder, Tier
from spotfallback.events import CheckpointCommitted, LedgerRecord, Preempted
from spotfallback.notices.runlog import RunLog
from spotfallback.policy import FallbackPolicy, PolicyState
from spotfallback.store.ledger import Ledger, LedgerView
from spotfallback.store.ledger_snapshot import LedgerSnapshot

logger = logging.getLogger("spotfallback")

PROVISION_ALLOWANCE_S = 300.0  # how long past the deadline the replacement request stays up at most
CLOCK_SKEW_S = 30.0  # nodes' clocks may differ this much


@dataclass(frozen=True)
class NextGang:
    """The gang the run restarts with after this preemption.

    ``new_workers``: the workers the notice must ask the autoscaler for. On another tier the
    whole gang. On the same tier none: the others' nodes stay, and Ray Train's standing request
    for the tier's gang (the controller's) already asks for the preempted ranks once their node
    drains (Ray's autoscaler stops counting a draining node); asking again would count them
    twice, and a pool whose ``max_workers`` is the gang's size would then launch nothing.
    """

    tier: int
    num_workers: int
    new_workers: int


def next_gang(
    ladder: Ladder, records: Sequence[LedgerRecord], now: float, *, start: PolicyState | None = None
) -> NextGang | None:
    """The policy's next gang if the notice's preemption happened ``now`` (None: the run gives up). Pure.

    ``start``: the policy state before ``records`` (a snapshot's replay; None: the run's start).
    """
    policy = FallbackPolicy(ladder)
    state = policy.replay((r.event for r in records), start)
    decision = policy.decide(state, Preempted(t=now, detail="preemption notice")).decision
    tier_index = getattr(decision, "to_tier", getattr(decision, "tier", None))
    if decision.action not in ("retry", "switch_tier") or tier_index is None:
        return None
    tier = ladder.tiers[tier_index]
    size = tier.fewest_workers if tier.is_elastic else tier.num_workers
    return NextGang(tier=tier_index, num_workers=size, new_workers=0 if tier_index == state.tier else size)


def _counts(commits: Iterable[tuple[float, int | None]], since: float, step: int | None) -> bool:
    """Whether one of the commits (time, step) is of ``step`` or later than ``since`` (see ``committed_since``)."""
    for t, committed_step in commits:
        if step is not None and committed_step == step and t >= since - CLOCK_SKEW_S:
            return True
        if (step is None or committed_step is None) and t >= since:
            return True
    return False


def committed_since(records: Sequence[LedgerRecord], since: float, step: int | None) -> bool:
    """Whether a checkpoint (of ``step``, when both name one) was committed at or after ``since``. Pure.

    ``since`` is this node's clock and the commit is stamped by the controller's, so a commit
    of the very step counts within ``CLOCK_SKEW_S`` before it.
    """
    return _counts(((r.event.t, r.event.step) for r in records if isinstance(r.event, CheckpointCommitted)), since, step)


def snapshot_committed_since(snapshot: LedgerSnapshot, since: float, step: int | None) -> bool | None:
    """``committed_since`` over the events a snapshot covers, from what it keeps; None: it cannot tell. Pure.

    The snapshot keeps its latest commits (its carry's checkpoints and the last event, which
    the carry holds back). Commits are named by their time, so the ones it dropped are older
    than any it kept: they matter only when even the oldest kept one is recent enough to count.
    """
    carry = snapshot.carry
    kept = [(t, s) for t, s, _ in carry.summary.checkpoints]
    pending = carry.pending
    if pending is not None and isinstance(pending.event, CheckpointCommitted):
        kept.append((pending.event.t, pending.event.step))
    if _counts(kept, since, step):
        return True
    dropped = carry.summary.checkpoint_count > len(carry.summary.checkpoints)
    if dropped and min((t for t, _ in kept), default=math.inf) >= since - CLOCK_SKEW_S:
        return None
    return False


class Placement:
    """The cluster as a move sees it: what a tier could hold now, and the autoscaler request.

    Ray's GCS by default; tests pass functions.
    """

    def __init__(
        self,
        capacity: Callable[[Tier], int] | None = None,
        request: Callable[[Tier, int, float, str], bool] | None = None,
    ) -> None:
        if capacity is None or request is None:
            from spotfallback.notices.placement import request_gang, tier_capacity

            capacity, request = capacity or tier_capacity, request or request_gang
        self.capacity = capacity
        self.request = request


class Move:
    """Rank 0's side of one announced eviction in a spotfallback run."""

    def __init__(
        self, log: RunLog, ladder: Ladder, gang: NextGang, placement: Placement, reader: Ledger | None = None
    ) -> None:
        self.log, self.ladder, self.gang, self.placement = log, ladder, gang, placement
        self.tier = ladder.tiers[gang.tier]
        # Its own reader: it keeps the loose events it has read, so each poll fetches only new ones.
        self._reader = reader or Ledger(log.location, compact_every=0)

    @classmethod
    def at_notice(cls, log: RunLog, notice: Any, deadline_s: float | None, placement: Placement) -> Move | None:
        """Work out the next gang and ask for its new nodes now; None if the run would not go on."""
        ladder = log.ledger.read_ladder()
        if ladder is None:
            return None
        reader = Ledger(log.location, compact_every=0)
        view = reader.read_view(ladder)
        now = time.time()
        gang = next_gang(ladder, view.tail, now, start=view.start_state)
        if gang is None:
            return None
        move = cls(log, ladder, gang, placement, reader)
        from spotfallback.notices.placement import replacement_requester

        until = (deadline_s or now) - now + PROVISION_ALLOWANCE_S  # withdrawn sooner, as the new gang starts
        if gang.new_workers and placement.request(move.tier, gang.new_workers, until,
                                                  replacement_requester(log.location.name)):
            logger.warning(
                "asked the autoscaler for %d replacement worker(s) on tier %r at the notice",
                gang.new_workers, move.tier.name,
            )
        return move

    def ready(self, since: float, step: int | None) -> bool:
        """Go now? The checkpoint taken on the notice is committed and the next gang fits elsewhere."""
        if not self._committed(self._reader.read_view(self.ladder), since, step):
            return False
        return self.fits()

    def fits(self) -> bool:
        """Could the next gang be placed off the draining node(s) now (its replacement is up)?"""
        return self.placement.capacity(self.tier) >= self.gang.num_workers

    def _committed(self, view: LedgerView, since: float, step: int | None) -> bool:
        if committed_since(view.tail, since, step):
            return True
        if view.snapshot is None:
            return False
        covered = snapshot_committed_since(view.snapshot, since, step)
        if covered is None:  # more recent commits than the snapshot keeps: only the whole ledger can tell
            return committed_since(self._reader.read(), since, step)
        return covered
