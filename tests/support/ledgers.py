"""A hand-built run ledger with hand-computable numbers, shared by the status, report and CLI tests.

    t=0 start, 30 workers up on spot, checkpoints every 600 s (steps 10..60 at 630..3630),
    3830 preempted (200 s redone), 3900 up again on spot, checkpoints at 4500/5100/5700,
    5800 preempted -> on-demand (100 s redone), 6000 up on on-demand, checkpoints every
    600 s (steps 100..140), 9000 finished.

Also what the ledger's property tests draw runs from: a ladder with a tier of each kind, an
event of each kind, and drawn runs that compact at drawn points.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import typer
from hypothesis import strategies as st

from spotfallback.config import Ladder, Tier, make_ladder
from spotfallback.events import (
    CapacityTimedOut,
    CheckpointCommitted,
    Event,
    Finished,
    JitCheckpoint,
    LedgerRecord,
    NodeFailed,
    Preempted,
    PreemptionNotice,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy
from spotfallback.store import ledger as ledger_module
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run

SPOT_PRICE, OD_PRICE = 0.92, 3.06  # per worker-hour; 2 workers per tier


def spot_then_on_demand(spot_price: float, on_demand_price: float) -> Ladder:
    """Two workers on spot with one preemption to spare, then on-demand: the smallest ladder that falls back."""
    return make_ladder([
        Tier.spot(2, max_preemptions=1, price_per_worker_hour=spot_price),
        Tier.on_demand(2, price_per_worker_hour=on_demand_price),
    ])


LADDER = spot_then_on_demand(SPOT_PRICE, OD_PRICE)
T0 = 1_700_000_000.0

# Two spot tiers with different budgets before on-demand: every move the policy makes on a preemption.
THREE_TIERS = make_ladder([
    Tier.spot(2, max_preemptions=2, price_per_worker_hour=1.0),
    Tier.spot(2, max_preemptions=1, max_failures=1, price_per_worker_hour=1.5, name="spot-b"),
    Tier.on_demand(2, price_per_worker_hour=3.0),
])

# An event of each kind at time t (k: its place in the run, for steps and names).
MAKERS: dict[str, Callable[[float, int], Event]] = {
    "start": lambda t, k: RunStarted(t),
    "up": lambda t, k: WorkersAcquired(t, num_workers=2),
    "checkpoint": lambda t, k: CheckpointCommitted(t, step=k, path=f"/ckpt/checkpoint_{k:06d}"),
    "preempted": lambda t, k: Preempted(t),
    "node_failed": lambda t, k: NodeFailed(t),
    "timed_out": lambda t, k: CapacityTimedOut(t, waited_s=60.0),
    "finished": lambda t, k: Finished(t),
    # From a node's notice agent, whose clock may be behind the controller's.
    "notice": lambda t, k: PreemptionNotice(t, node_id=f"n{k}"),
    "jit": lambda t, k: JitCheckpoint(t, outcome="reported", attempt=f"a{k}"),
}
AGENT_KINDS = frozenset({"notice", "jit"})  # written by a node's agent, the others by the controller

Step = tuple[str, float, float, int | None]


def drawn_runs(kinds: Sequence[str]) -> st.SearchStrategy[list[Step]]:
    """Runs of the given kinds of event: (kind, gap to the previous event, how far behind an agent's
    clock is, None or the chunk size to compact in right after it)."""
    return st.lists(
        st.tuples(
            st.sampled_from(sorted(kinds)),
            st.floats(min_value=0.001, max_value=600.0),
            st.floats(min_value=0.0, max_value=3000.0),
            st.one_of(st.none(), st.integers(min_value=1, max_value=6)),
        ),
        min_size=1,
        max_size=40,
    )


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


def counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ledger object read from now on, by path: what a reader costs on a long run."""
    read: list[str] = []
    real = ledger_module.read_objects

    def counting(fs, paths, **kw):
        read.extend(paths)
        return real(fs, paths, **kw)

    monkeypatch.setattr(ledger_module, "read_objects", counting)
    return read


def drawn_records(kinds: list[tuple[str, float]]) -> list[LedgerRecord]:
    """Records as a run writes them: each on the tier the policy had it on, with its decision."""
    policy, out = FallbackPolicy(THREE_TIERS), []
    state, t = policy.initial_state(), T0
    for k, (kind, gap) in enumerate(kinds):
        t += gap
        step = policy.decide(state, MAKERS[kind](t, k))
        out.append(LedgerRecord(id=str(k), writer="ctl", tier=state.tier, event=MAKERS[kind](t, k),
                                decision=step.decision.to_json()))
        state = step.state
    return out


def write_drawn_run(root: str, steps, name: str = "run") -> tuple[Ledger, float]:
    """The run written by a controller and an agent (its clock behind), compacted at the drawn points."""
    location = resolve_run(root, name)
    writers = {w: Ledger(location, writer=w, compact_every=0) for w in ("ctl", "agent")}
    writers["ctl"].ensure_dirs()
    writers["ctl"].write_meta(THREE_TIERS, {"name": name, "progress_totals": {"total_steps": 100}})
    policy = FallbackPolicy(THREE_TIERS)
    state, t = policy.initial_state(), T0
    for k, (kind, gap, lag, compact_every) in enumerate(steps):
        t += gap
        writer = "agent" if kind in AGENT_KINDS else "ctl"
        event: Event = MAKERS[kind](t - lag if writer == "agent" else t, k)
        step = policy.decide(state, event)
        info = {"metrics": {"step": k}} if kind == "checkpoint" else None
        writers[writer].append(event, state.tier, step.decision.to_json(), info)
        state = step.state
        if compact_every is not None:
            Ledger(location, writer="drv", compact_every=compact_every).compact()
    return Ledger(location), t


def write_long_run(root: str, events: int, every: int) -> tuple[Ledger, float]:
    """A run that checkpoints every two minutes, compacted every ``every`` events."""
    steps = [("start", 1.0, 0.0, None), ("up", 30.0, 0.0, None)]
    steps += [("checkpoint", 120.0, 0.0, every if k % every == every - 1 else None) for k in range(events - 2)]
    return write_drawn_run(root, steps)


def cli_app(register: Callable[[typer.Typer], None]) -> typer.Typer:
    """A typer app with one spotfallback command, called by its name as in the real CLI."""
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # two commands: typer then keeps the command's name
    return app
