"""A hand-built run ledger with hand-computable numbers, shared by the status, report and CLI tests.

    t=0 start, 30 workers up on spot, checkpoints every 600 s (steps 10..60 at 630..3630),
    3830 preempted (200 s redone), 3900 up again on spot, checkpoints at 4500/5100/5700,
    5800 preempted -> on-demand (100 s redone), 6000 up on on-demand, checkpoints every
    600 s (steps 100..140), 9000 finished.
"""

from __future__ import annotations

from spotfallback.config import Tier, make_ladder
from spotfallback.events import (
    CheckpointCommitted,
    Finished,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run

SPOT_PRICE, OD_PRICE = 0.92, 3.06  # per worker-hour; 2 workers per tier
LADDER = make_ladder([
    Tier.spot(2, max_preemptions=1, price_per_worker_hour=SPOT_PRICE),
    Tier.on_demand(2, price_per_worker_hour=OD_PRICE),
])
T0 = 1_700_000_000.0


def run_events() -> list:
    evs = [RunStarted(T0), WorkersAcquired(T0 + 30, num_workers=2)]
    evs += [CheckpointCommitted(T0 + 30 + 600 * k, step=10 * k) for k in range(1, 7)]
    evs += [Preempted(T0 + 3830), WorkersAcquired(T0 + 3900, num_workers=2)]
    evs += [CheckpointCommitted(T0 + 3900 + 600 * k, step=60 + 10 * k) for k in range(1, 4)]
    evs += [Preempted(T0 + 5800), WorkersAcquired(T0 + 6000, num_workers=2)]
    evs += [CheckpointCommitted(T0 + 6000 + 600 * k, step=90 + 10 * k) for k in range(1, 6)]
    return [*evs, Finished(T0 + 9000)]


def write_ledger(storage, events, name: str = "r1", ladder=LADDER) -> tuple:
    location = resolve_run(str(storage), name)
    ledger = Ledger(location, writer="test")
    ledger.ensure_dirs()
    ledger.write_meta(ladder, {"name": name})
    policy = FallbackPolicy(ladder)
    state = policy.initial_state()
    for ev in events:
        step = policy.decide(state, ev)
        info = {"metrics": {"step": ev.step, "loss": 0.5}} if isinstance(ev, CheckpointCommitted) else None
        ledger.append(ev, state.tier, step.decision.to_json(), info)
        state = step.state
    return location, ledger
