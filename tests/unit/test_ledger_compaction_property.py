"""Property: a compacted ledger replays to exactly the state and accounting of the same ledger never compacted."""

from __future__ import annotations

import dataclasses
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotfallback.accounting import summarize
from spotfallback.config import Tier, make_ladder
from spotfallback.events import (
    CapacityTimedOut,
    CheckpointCommitted,
    Event,
    NodeFailed,
    Preempted,
    PreemptionNotice,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy
from spotfallback.store.ledger import Ledger, LedgerTail
from spotfallback.store.location import resolve_run

LADDER = make_ladder([
    Tier.spot(2, max_preemptions=2, price_per_worker_hour=1.0),
    Tier.spot(2, max_preemptions=1, max_failures=1, price_per_worker_hour=1.5, name="spot-b"),
    Tier.on_demand(2, price_per_worker_hour=3.0),
])

MAKERS = {
    "start": lambda t, k: RunStarted(t),
    "up": lambda t, k: WorkersAcquired(t, num_workers=2),
    "checkpoint": lambda t, k: CheckpointCommitted(t, step=k),
    "preempted": lambda t, k: Preempted(t),
    "node_failed": lambda t, k: NodeFailed(t),
    "timed_out": lambda t, k: CapacityTimedOut(t, waited_s=60.0),
    # From a node's notice agent, whose clock may be behind the controller's.
    "notice": lambda t, k: PreemptionNotice(t, node_id=f"n{k}"),
}

steps = st.lists(
    st.tuples(
        st.sampled_from(sorted(MAKERS)),
        st.floats(min_value=0.001, max_value=600.0),  # gap to the previous event
        st.floats(min_value=0.0, max_value=3000.0),  # how far behind a notice agent's clock is
        st.one_of(st.none(), st.integers(min_value=1, max_value=6)),  # compact here, in chunks of this many
    ),
    min_size=1,
    max_size=40,
)


def _stripped(records):
    """Records without their random ids (the twin ledgers draw their own)."""
    return [dataclasses.replace(r, id="") for r in records]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_a_compacted_ledger_replays_exactly_like_the_full_ledger(steps):
    policy = FallbackPolicy(LADDER)
    with tempfile.TemporaryDirectory() as root:
        compacted = {w: Ledger(resolve_run(root, "compacted"), writer=w, compact_every=0) for w in ("ctl", "agent")}
        full = {w: Ledger(resolve_run(root, "full"), writer=w, compact_every=0) for w in ("ctl", "agent")}
        for ledger in (*compacted.values(), *full.values()):
            ledger.ensure_dirs()
        tail = LedgerTail(resolve_run(root, "compacted"))
        state, t = policy.initial_state(), 1_700_000_000.0
        for k, (kind, gap, lag, compact_every) in enumerate(steps):
            t += gap
            writer = "agent" if kind == "notice" else "ctl"
            event: Event = MAKERS[kind](t - lag if writer == "agent" else t, k)
            step = policy.decide(state, event)
            for ledgers in (compacted, full):
                ledgers[writer].append(event, state.tier, step.decision.to_json())
            state = step.state
            if compact_every is not None:
                compacter = Ledger(resolve_run(root, "compacted"), writer="drv", compact_every=compact_every)
                compacter.compact()
                tail.poll()
        expected = Ledger(resolve_run(root, "full")).read()
        got = Ledger(resolve_run(root, "compacted")).read()
        assert _stripped(got) == _stripped(expected)
        assert _stripped(tail.poll()) == _stripped(expected)
        now = t + 3600.0
        assert policy.replay(r.event for r in got) == policy.replay(r.event for r in expected)
        a, b = summarize(LADDER, got, now=now), summarize(LADDER, expected, now=now)
        assert (a.state, a.tiers, a.status, a.checkpoints, a.segments, a.spend) == (
            b.state, b.tiers, b.status, b.checkpoints, b.segments, b.spend
        )
