"""The climb-back probe: which tier's nodes to ask the autoscaler for, and when to ask, renew, cancel."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from spotfallback import Tier
from spotfallback.events import (
    CapacityObserved,
    CapacityTimedOut,
    CheckpointCommitted,
    ClimbBack,
    Continue,
    Preempted,
    RunStarted,
    WorkersAcquired,
)
from spotfallback.policy import FallbackPolicy, PolicyState
from spotfallback.runtime.capacity import CapacityWatch
from spotfallback.runtime.probe import (
    CapacityProbe,
    RunEstimates,
    gang_scaling_config,
    probe_target,
)

DWELL = 300.0
T0 = 1000.0  # the run reaches on-demand (tier 1) at T0 + 10


def ladder(**spot: Any) -> list[Tier]:
    options: dict[str, Any] = {
        "climb_back": True,
        "min_dwell_s": DWELL,
        "price_per_worker_hour": 1.0,
        "capacity_timeout_s": 10,
        **spot,
    }
    return [Tier.spot(2, **options), Tier.on_demand(2, price_per_worker_hour=3.0)]


def on_demand_after_timeout(policy: FallbackPolicy) -> PolicyState:
    """Spot had no capacity: the run timed out on it and now runs on on-demand."""
    return policy.replay(
        [
            RunStarted(t=T0),
            CapacityTimedOut(t=T0 + 10, waited_s=10),
            WorkersAcquired(t=T0 + 12, num_workers=2),
        ]
    )


def test_probes_the_spot_tier_once_its_dwell_is_within_the_lead() -> None:
    policy = FallbackPolicy(ladder())
    state = on_demand_after_timeout(policy)
    assert state.tier == 1
    moved = T0 + 10
    assert probe_target(policy, state, moved + DWELL - 61, lead_s=60) is None
    assert probe_target(policy, state, moved + DWELL - 59, lead_s=60) == 0
    assert probe_target(policy, state, moved + 1, lead_s=DWELL) == 0


def test_no_probe_for_a_tier_that_does_not_climb_back_or_costs_as_much() -> None:
    for spot in ({"climb_back": False}, {"price_per_worker_hour": 3.0}):
        policy = FallbackPolicy(ladder(**spot))
        state = on_demand_after_timeout(policy)
        assert probe_target(policy, state, T0 + 10 * DWELL, lead_s=0) is None, spot


def test_no_probe_while_no_gang_runs_or_on_the_top_tier() -> None:
    policy = FallbackPolicy(ladder())
    waiting = policy.replay([RunStarted(t=T0), CapacityTimedOut(t=T0 + 10, waited_s=10)])
    assert waiting.tier == 1 and waiting.running_since is None
    assert probe_target(policy, waiting, T0 + 10 * DWELL, lead_s=0) is None
    on_top = policy.replay([RunStarted(t=T0), WorkersAcquired(t=T0 + 1, num_workers=2)])
    assert probe_target(policy, on_top, T0 + 10 * DWELL, lead_s=0) is None


def test_no_probe_when_the_work_left_does_not_pay_for_the_climb() -> None:
    policy = FallbackPolicy(ladder())
    state = on_demand_after_timeout(policy)
    now = T0 + 10 + DWELL
    little = RunEstimates(remaining_work_s=5.0, restart_s=60.0, checkpoint_interval_s=10.0)
    plenty = RunEstimates(remaining_work_s=3 * 3600.0, restart_s=60.0, checkpoint_interval_s=10.0)
    assert probe_target(policy, state, now, 0, little) is None
    assert probe_target(policy, state, now, 0, plenty) == 0


def test_a_tier_left_for_its_spent_budget_is_probed_as_the_policy_still_climbs_to_it() -> None:
    """With carried budgets the policy climbs back when it pays (the fall back down is costed)."""
    policy = FallbackPolicy(ladder(max_preemptions=0))
    state = policy.replay(
        [
            RunStarted(t=T0),
            WorkersAcquired(t=T0 + 1, num_workers=2),
            Preempted(t=T0 + 10),
            WorkersAcquired(t=T0 + 12, num_workers=2),
        ]
    )
    assert state.tier == 1 and state.stats[0].preemptions == 1
    now = T0 + 10 + DWELL + 1
    climb = policy.decide(state, CapacityObserved(t=now, tier=0, available_workers=2, restart_s=5.0))
    assert isinstance(climb.decision, ClimbBack)
    assert probe_target(policy, state, now, lead_s=0) == 0


def test_an_elastic_tier_is_asked_for_its_full_gang() -> None:
    tiers = [
        Tier.spot((1, 4), climb_back=True, min_dwell_s=DWELL, price_per_worker_hour=1.0, capacity_timeout_s=10),
        Tier.on_demand(2, price_per_worker_hour=3.0),
    ]
    policy = FallbackPolicy(tiers)
    state = policy.replay(
        [RunStarted(t=T0), CapacityTimedOut(t=T0 + 10, waited_s=10), WorkersAcquired(t=T0 + 12, num_workers=2)]
    )
    client = FakeClient()
    CapacityProbe(client, lead_s=0, poll_s=0).update(policy, state, T0 + 10 + DWELL, lambda tier: 0)
    assert client.calls == [("send", dict(tiers[0].label_selector), 4)]


def test_a_climb_the_policy_makes_is_one_the_probe_prepared() -> None:
    """With no lead, the probe asks for exactly the tier the policy climbs to once nodes show up."""
    policy = FallbackPolicy(ladder())
    state = on_demand_after_timeout(policy)
    for dt in (DWELL / 2, DWELL + 1):
        now = T0 + 10 + dt
        step = policy.decide(state, CapacityObserved(t=now, tier=0, available_workers=2, restart_s=5.0))
        climbs = isinstance(step.decision, ClimbBack)
        assert climbs == (probe_target(policy, state, now, lead_s=0) == 0), dt


class FakeClient:
    def __init__(self, requester_id: str = "train-run") -> None:
        self._requester_id = requester_id
        self.calls: list[tuple[str, dict[str, str] | None, int]] = []

    def send_resource_request(self, scaling_config: Any, num_workers: int) -> None:
        self.calls.append(("send", scaling_config.label_selector, num_workers))

    def cancel_resource_request(self) -> None:
        self.calls.append(("cancel", None, 0))


def test_probe_sends_when_empty_renews_while_wanted_and_cancels_on_climb() -> None:
    policy = FallbackPolicy(ladder())
    state = on_demand_after_timeout(policy)
    client = FakeClient()
    probe = CapacityProbe(client, lead_s=DWELL, renew_s=20, poll_s=5)
    spot_selector = dict(policy.tiers[0].label_selector)
    t = T0 + 20
    probe.update(policy, state, t, lambda tier: 0)
    assert client.calls == [("send", spot_selector, 2)]
    probe.update(policy, state, t + 19, lambda tier: 0)
    assert len(client.calls) == 1  # throttled
    probe.update(policy, state, t + 21, lambda tier: 2)  # nodes up: keep them wanted
    assert client.calls[-1] == ("send", spot_selector, 2) and len(client.calls) == 2
    climbed = policy.decide(state, CapacityObserved(t=t + DWELL, tier=0, available_workers=2)).state
    assert climbed.tier == 0
    probe.update(policy, climbed, t + DWELL + 1, lambda tier: 2)
    assert client.calls[-1] == ("cancel", None, 0) and probe.tier is None
    probe.update(policy, climbed, t + DWELL + 2, lambda tier: 2)
    assert len(client.calls) == 3  # nothing more to cancel


def test_probe_follows_the_run_with_a_client_of_the_runs_class_under_its_own_requester_id() -> None:
    policy = FallbackPolicy(ladder())
    rt = SimpleNamespace(
        policy=policy, state=on_demand_after_timeout(policy), lock=threading.RLock(), watch=CapacityWatch(),
        requests=SimpleNamespace(listened=lambda: True),  # the gang answers checkpoint requests
    )
    probe = CapacityProbe(lead_s=1e9, poll_s=0)
    probe.follow(rt, None)  # type: ignore[arg-type]  # before the controller started: nothing
    assert probe.client is None and probe.tier is None
    run_client = FakeClient("train-run")
    probe.follow(rt, run_client, lambda tier: 0)  # type: ignore[arg-type]
    assert isinstance(probe.client, FakeClient) and probe.client is not run_client
    assert probe.client._requester_id == "train-run-climb-probe"
    assert probe.client.calls == [("send", dict(policy.tiers[0].label_selector), 2)] and run_client.calls == []


def test_probe_asks_only_while_a_climb_can_be_decided_soon() -> None:
    """Nodes asked for while no climb can be decided sit idle and billed: a gang that neither
    answers checkpoint requests nor commits periodically never asks; one that commits every 10
    minutes asks from the lead before its next commit, and withdraws once that moment has passed."""
    policy = FallbackPolicy(ladder(min_dwell_s=0))
    state = on_demand_after_timeout(policy)
    watch = CapacityWatch()
    rt = SimpleNamespace(policy=policy, state=state, lock=threading.RLock(), watch=watch,
                         requests=SimpleNamespace(listened=lambda: False))
    run_client = FakeClient("train-run")
    probe = CapacityProbe(lead_s=120, poll_s=0, renew_s=20)

    def follow_at(t: float) -> list[tuple[str, dict[str, str] | None, int]]:
        probe.follow(rt, run_client, lambda tier: 0, now=t)  # type: ignore[arg-type]
        assert probe.client is not None
        return probe.client.calls

    assert follow_at(T0 + 100) == []  # just-in-time checkpoints only: nothing to climb at
    for t in (T0 + 600, T0 + 1200):
        watch.record(CheckpointCommitted(t=t), Continue())
    assert follow_at(T0 + 1200 + 10) == [("send", dict(policy.tiers[0].label_selector), 2)]  # just committed
    assert follow_at(T0 + 1200 + 60) == [("send", dict(policy.tiers[0].label_selector), 2), ("cancel", None, 0)]
    assert len(follow_at(T0 + 1800 - 121)) == 2  # more than the lead before the next commit
    assert follow_at(T0 + 1800 - 119)[-1][0] == "send"  # the lead before it
    assert follow_at(T0 + 1800 + 30)[-1][0] == "send"  # a late commit is still awaited
    assert follow_at(T0 + 2400 + 1)[-1][0] == "cancel"  # a whole interval late: no longer
    rt.requests = SimpleNamespace(listened=lambda: True)
    assert follow_at(T0 + 2400 + 2)[-1][0] == "send"  # answers requests: a climb any time


def test_a_gang_the_cloud_fills_only_in_part_gives_its_nodes_back_and_asks_again_later() -> None:
    """Three of eight nodes for an hour are three idle, billed nodes: given back after the patience,
    asked for again after as long, then twice as long; a gang that fits keeps its request."""
    policy = FallbackPolicy(ladder())
    state = on_demand_after_timeout(policy)
    client = FakeClient()
    probe = CapacityProbe(client, lead_s=DWELL, renew_s=20, poll_s=5, patience_s=600)
    t = T0 + 20
    part = lambda tier: 1  # noqa: E731 - one of the gang's two workers
    probe.update(policy, state, t, part)
    assert [c[0] for c in client.calls] == ["send"]
    for dt in range(20, 600, 20):
        probe.update(policy, state, t + dt, part)
    assert "cancel" not in [c[0] for c in client.calls]  # within the patience: renewed
    probe.update(policy, state, t + 600, part)
    assert client.calls[-1][0] == "cancel" and probe.tier is None
    sent = len(client.calls)
    probe.update(policy, state, t + 1199, part)
    assert len(client.calls) == sent  # quiet for as long as it waited
    probe.update(policy, state, t + 1200, part)
    assert client.calls[-1][0] == "send"
    probe.update(policy, state, t + 1800, part)
    assert client.calls[-1][0] == "cancel"
    probe.update(policy, state, t + 1800 + 1199, part)
    assert client.calls[-1][0] == "cancel"  # twice as long now
    probe.update(policy, state, t + 1800 + 1200, part)
    assert client.calls[-1][0] == "send"
    for dt in range(20, 1300, 20):  # the whole gang came: kept wanted past the patience
        probe.update(policy, state, t + 3000 + dt, lambda tier: 2)
    assert client.calls[-1][0] == "send" and probe.tier == 0


def test_while_the_first_pool_gives_only_part_of_a_gang_the_next_one_is_asked_for() -> None:
    """spot-a short of its gang for good: its request is withdrawn, and spot-b's (another pool with
    room) is sent meanwhile, rather than no request at all while spot-a waits out its quiet."""
    options: dict[str, Any] = {"climb_back": True, "min_dwell_s": 0, "price_per_worker_hour": 1.0, "capacity_timeout_s": 10}
    policy = FallbackPolicy([Tier.spot(2, name="spot-a", label_selector={"pool": "a"}, **options),
                             Tier.spot(2, name="spot-b", label_selector={"pool": "b"}, **options),
                             Tier.on_demand(2, price_per_worker_hour=3.0)])
    state = policy.replay([RunStarted(t=T0), CapacityTimedOut(t=T0 + 10, waited_s=10),
                           CapacityTimedOut(t=T0 + 20, waited_s=10), WorkersAcquired(t=T0 + 22, num_workers=2)])
    assert state.tier == 2
    client = FakeClient()
    probe = CapacityProbe(client, lead_s=0, renew_s=20, poll_s=5, patience_s=600)
    counts = {"a": 1, "b": 0}

    def capacity(tier: Tier) -> int:
        return counts[tier.label_selector["pool"]]

    def pools() -> list[str | None]:
        return [(c[1] or {}).get("pool") if c[0] == "send" else "cancel" for c in client.calls]

    t = T0 + 30
    probe.update(policy, state, t, capacity)
    probe.update(policy, state, t + 600, capacity)  # spot-a still one node short: given back
    probe.update(policy, state, t + 605, capacity)
    assert pools() == ["a", "cancel", "b"]
    probe.update(policy, state, t + 1200, capacity)  # spot-a's quiet is over: asked again, spot-b withdrawn
    assert pools()[-2:] == ["cancel", "a"]


def test_probe_is_not_sent_while_the_tier_already_has_room() -> None:
    policy = FallbackPolicy(ladder())
    state = on_demand_after_timeout(policy)
    client = FakeClient()
    probe = CapacityProbe(client, lead_s=DWELL, renew_s=20, poll_s=5)
    looked: list[str] = []

    def capacity(tier: Tier) -> int:
        looked.append(tier.name)
        return 2

    probe.update(policy, state, T0 + 20, capacity)
    probe.update(policy, state, T0 + 21, capacity)  # within poll_s: no second look
    assert client.calls == [] and looked == ["spot"]


def test_gang_scaling_config_carries_the_tiers_selector_and_size() -> None:
    tier = Tier.spot(3, resources_per_worker={"CPU": 2})
    config = gang_scaling_config(tier)
    assert config.num_workers == 3 and config.label_selector == dict(tier.label_selector)
    assert config.resources_per_worker == {"CPU": 2}


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_unusable_probe_settings_fall_back_to_defaults(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SPOTFALLBACK_PROBE_RENEW_S", value)
    assert CapacityProbe(FakeClient()).renew_s == 20.0


def test_a_commit_is_in_sight_from_the_lead_before_it_to_an_interval_past_it() -> None:
    """The one rule the probe and the moving driver's looks share: nodes only where a climb can come."""
    from spotfallback.policy import commit_in_sight

    # Committed 10 s ago (within the 30 s after a commit): a climb can be decided now.
    assert commit_in_sight(990.0, None, 0.0, 1000.0, lead_s=120, after_s=30)
    # Commits every 600 s, the last at 1000: in sight from 1480 (the lead) to 2200 (a whole interval late).
    for now, seen in ((1479.0, False), (1480.0, True), (1600.0, True), (2200.0, True), (2201.0, False)):
        assert commit_in_sight(1000.0, 600.0, 0.0, now, lead_s=120, after_s=30) is seen, now
    # No interval known, or the last commit was the gang's before (it moved since): nothing to time by.
    assert not commit_in_sight(1000.0, None, 0.0, 1500.0, lead_s=120, after_s=30)
    assert not commit_in_sight(1000.0, 600.0, 1100.0, 1550.0, lead_s=120, after_s=30)
    assert not commit_in_sight(None, 600.0, 0.0, 1550.0, lead_s=120, after_s=30)
