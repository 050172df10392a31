"""What the pure policy's tests share: events run through a ladder, and capacity seen free."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spotfallback.events import CapacityObserved, Decision, Event
from spotfallback.policy import FallbackPolicy, PolicyState


def run(policy: FallbackPolicy, events: Sequence[Event]) -> tuple[PolicyState, list[Decision]]:
    """The state after ``events`` and the decision on each; the ledger's replay must rebuild exactly that state."""
    state, decisions = policy.initial_state(), []
    for event in events:
        step = policy.decide(state, event)
        state = step.state
        decisions.append(step.decision)
    assert policy.replay(events) == state
    return state, decisions


def seen(t: float, tier: int = 0, n: int = 2, remaining: float | None = 36000.0, restart: float = 60.0,
         **fields: Any) -> CapacityObserved:
    """Room for ``n`` workers of ``tier`` seen at ``t`` (``fields``: the observation's other fields)."""
    return CapacityObserved(t, tier=tier, available_workers=n, remaining_work_s=remaining, restart_s=restart, **fields)
