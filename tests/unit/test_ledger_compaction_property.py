"""Property: a compacted ledger replays to exactly the state and accounting of the same ledger never compacted."""

from __future__ import annotations

import dataclasses
import tempfile

from hypothesis import HealthCheck, given, settings

from spotfallback.accounting import summarize
from spotfallback.events import Event
from spotfallback.policy import FallbackPolicy
from spotfallback.store.ledger import Ledger, LedgerTail
from spotfallback.store.location import resolve_run
from tests.support.ledgers import AGENT_KINDS, MAKERS, drawn_runs
from tests.support.ledgers import THREE_TIERS as LADDER

# The controller's events and the agent's notices, without the run's end or just-in-time checkpoints (the snapshot tests draw those).
steps = drawn_runs(["start", "up", "checkpoint", "preempted", "node_failed", "timed_out", "notice"])


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
            writer = "agent" if kind in AGENT_KINDS else "ctl"
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
