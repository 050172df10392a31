"""Checkpoint requests: the channel, the gang that answers them, and the controller's climb that waits for one.

No Ray: the key-value store is a dict, ranks are threads with real barriers (as in
``test_jit.py``), and the controller's runtime counts capacity through a stand-in.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from spotfallback.config import Ladder, Tier
from spotfallback.errors import JitHoldExpiredError
from spotfallback.events import CheckpointCommitted, RunStarted, WorkersAcquired
from spotfallback.notices.jit import PreemptionWatch
from spotfallback.notices.requests import CheckpointRequest, CheckpointRequests
from spotfallback.policy import FallbackPolicy
from spotfallback.runtime import ladder as ladder_module
from spotfallback.runtime.ladder import LadderRuntime, RunSpec
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run
from tests.support.ranks import FakeSession, Group, as_ranks


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


class BrokenStore:
    def get(self, key: str) -> bytes | None:
        raise ConnectionError("GCS unreachable")

    def put(self, key: str, value: bytes) -> None:
        raise ConnectionError("GCS unreachable")

    def delete(self, key: str) -> None:
        raise ConnectionError("GCS unreachable")


# ----------------------------------------------------------------------------- the channel


def test_a_request_is_pending_until_withdrawn_and_carries_its_wait_as_a_deadline():
    now = [1000.0]
    store = DictStore()
    controller = CheckpointRequests("run-a", store, clock=lambda: now[0])
    gang = CheckpointRequests("run-a", store)
    assert gang.pending() is None
    rid = controller.ask("climbing back to 'spot'", wait_s=90)
    request = gang.pending()
    assert request == CheckpointRequest(id=rid, reason="climbing back to 'spot'", asked_at=1000.0, deadline_ms=1_090_000)
    assert CheckpointRequests("run-b", store).pending() is None  # keyed by the run
    controller.withdraw()
    assert gang.pending() is None


def test_the_controller_learns_whether_the_gang_answers_and_forgets_it_for_a_new_gang():
    now = [0.0]
    store = DictStore()
    controller = CheckpointRequests("run", store, clock=lambda: now[0])
    assert not controller.listened()
    CheckpointRequests("run", store).listen()
    assert not controller.listened()  # looked up again only after a while
    now[0] += 10
    assert controller.listened()
    controller.ask("climb", wait_s=60)
    controller.new_gang()
    assert not controller.listened() and CheckpointRequests("run", store).pending() is None


def test_a_broken_store_or_a_garbled_request_is_no_request_and_no_error():
    broken = CheckpointRequests("run", BrokenStore())
    broken.listen()
    broken.ask("climb", wait_s=60)
    broken.withdraw()
    broken.new_gang()
    assert broken.pending() is None and not broken.listened()
    store = DictStore()
    store.put("checkpoint-request/run", b"{not json")
    assert CheckpointRequests("run", store).pending() is None
    store.put("checkpoint-request/run", b'{"id": "x"}')
    assert CheckpointRequests("run", store).pending() is None


# ----------------------------------------------------------------------------- the gang


def test_every_rank_answers_a_request_at_the_same_call_then_saves_and_holds():
    store = DictStore()
    controller = CheckpointRequests("run", store)
    group = Group(2)
    answered: dict[int, tuple[int, Any]] = {}
    saved: list[int] = []

    def rank_main(rank: int) -> None:
        session = FakeSession(group, rank)
        watch = PreemptionWatch(every_steps=1, session=session, max_hold_s=0.2, record=False, answer_requests=True,
                                requests=CheckpointRequests("run", store) if rank == 0 else None)
        session.watch = watch
        for call in range(1, 50):
            if rank == 0 and call == 7:
                controller.ask("climbing back to 'spot'", wait_s=0.3)
            got = watch.check()
            if got:
                answered[rank] = (call, got)
                with pytest.raises(JitHoldExpiredError, match="requested checkpoint"):
                    watch.save_and_move(lambda: saved.append(rank), step=call)
                return

    as_ranks(2, rank_main)
    # Rank 0 reads the request at its next ask and every rank gets it from the broadcast.
    assert answered[0][0] == answered[1][0] in (7, 8)
    assert all(isinstance(got, CheckpointRequest) for _, got in answered.values())
    assert sorted(saved) == [0, 1]


def test_a_watch_that_does_not_answer_requests_never_sees_them():
    store = DictStore()
    CheckpointRequests("run", store).ask("climb", wait_s=60)
    session = FakeSession(Group(1), 0)
    watch = PreemptionWatch(every_steps=1, session=session, record=False,
                            requests=CheckpointRequests("run", store))
    session.watch = watch
    assert all(watch.check() is None for _ in range(10))
    assert store.get("checkpoint-listener/run") is None  # nor says it would


# ----------------------------------------------------------------------------- the controller


@pytest.fixture()
def runtime(tmp_path, monkeypatch):
    """A run on on-demand (tier 1) below a spot tier it may climb back to, whose capacity is back."""
    tiers = (Tier.spot(2, climb_back=True, min_dwell_s=0, price_per_worker_hour=0.3),
             Tier.on_demand(2, price_per_worker_hour=1.0))
    location = resolve_run(str(tmp_path), "climb-run")
    ledger = Ledger(location, writer="drv")
    ledger.ensure_dirs()
    ledger.write_meta(Ladder(tiers=tiers))
    policy = FallbackPolicy(Ladder(tiers=tiers))
    state = policy.initial_state()
    state = policy.decide(state, RunStarted(t=0.0)).state
    spec = RunSpec(key=f"climb-{tmp_path.name}", tiers=tuple(t.model_dump() for t in tiers),
                   state=state, location=location, writer="ctl")
    rt = LadderRuntime(spec)
    rt.state = replace(rt.state, tier=1)  # the run fell to on-demand
    rt.watch.poll_s = 0.0
    store = DictStore()
    rt.requests = CheckpointRequests("climb-run", store)
    monkeypatch.setattr(ladder_module, "tier_capacity", lambda tier: tier.num_workers)
    rt.apply(WorkersAcquired(t=time.time() - 60, num_workers=2))
    return rt, store


def test_without_a_gang_that_answers_the_controller_looks_only_after_a_checkpoint(runtime):
    rt, _ = runtime
    assert rt.decide_while_running() is None and rt.state.tier == 1  # no commit yet: no look
    rt.apply(CheckpointCommitted(t=time.time(), path="p", step=5))
    tier, workers = rt.decide_while_running()
    assert (tier.name, workers, rt.state.tier) == (rt.policy.tiers[0].name, 2, 0)


def test_a_gang_that_answers_is_asked_for_a_checkpoint_and_moved_once_it_is_committed(runtime):
    rt, store = runtime
    CheckpointRequests("climb-run", store).listen()
    assert rt.decide_while_running() is None  # the climb is decided, the gang asked to save first
    assert rt.state.tier == 0 and rt.climbing is not None
    request = CheckpointRequests("climb-run", store).pending()
    assert request is not None and "climbing back" in request.reason
    assert rt.decide_while_running() is None  # still writing
    rt.apply(CheckpointCommitted(t=time.time(), path="p", step=9))
    tier, workers = rt.decide_while_running()
    assert (tier.name, workers) == (rt.policy.tiers[0].name, 2)
    assert rt.climbing is None and CheckpointRequests("climb-run", store).pending() is None


def test_a_climb_whose_checkpoint_never_comes_moves_when_the_wait_ends(runtime, monkeypatch):
    rt, store = runtime
    CheckpointRequests("climb-run", store).listen()
    monkeypatch.setattr(ladder_module, "REQUEST_WAIT_S", 0.2)
    assert rt.decide_while_running() is None and rt.climbing is not None
    time.sleep(0.3)
    tier, _ = rt.decide_while_running()
    assert tier.name == rt.policy.tiers[0].name and rt.climbing is None
