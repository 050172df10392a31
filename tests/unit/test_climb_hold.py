"""The climb's hold: the nodes of the gang a climb leaves stay requested until a gang runs again."""

from __future__ import annotations

from spotfallback import Tier
from spotfallback.runtime.hold import DEFAULT_CLIMB_HOLD_S, HOLD_GRACE_S, ClimbHold
from tests.unit.test_probe import FakeClient

SPOT = Tier.spot(2, capacity_timeout_s=1800, climb_back=True)
ON_DEMAND = Tier.on_demand(2)
OD_SELECTOR = dict(ON_DEMAND.label_selector)


def held_on_demand() -> tuple[ClimbHold, FakeClient]:
    """A gang of 2 ran on on-demand (tier 1), then the run climbed to spot (tier 0) at t=0."""
    hold = ClimbHold(hold_s=600, renew_s=20)
    run_client = FakeClient("train-run")
    hold.gang_running(1, ON_DEMAND, 2)
    hold.follow(0, SPOT, run_client, now=0.0)
    return hold, run_client


def test_a_climb_keeps_the_left_gang_under_its_own_requester_id_and_renews_it() -> None:
    hold, run_client = held_on_demand()
    assert hold.client is not None and hold.client._requester_id == "train-run-climb-hold"
    assert hold.client.calls == [("send", OD_SELECTOR, 2)] and run_client.calls == []
    hold.follow(0, SPOT, run_client, now=10.0)
    assert len(hold.client.calls) == 1  # not yet due
    hold.follow(0, SPOT, run_client, now=25.0)
    assert hold.client.calls[-1] == ("send", OD_SELECTOR, 2) and len(hold.client.calls) == 2


def test_the_hold_ends_when_a_gang_runs_again() -> None:
    hold, run_client = held_on_demand()
    hold.gang_running(0, SPOT, 2)  # the climb's gang is up
    assert hold.client is not None and hold.client.calls[-1] == ("cancel", None, 0)
    hold.follow(0, SPOT, run_client, now=30.0)
    assert len(hold.client.calls) == 2  # spot is now the gang that ran: nothing above it to hold for


def test_a_failed_climb_back_on_the_held_tier_withdraws_the_hold() -> None:
    """The run's own request covers the tier again: the two together would be a second gang."""
    hold, run_client = held_on_demand()
    hold.follow(1, ON_DEMAND, run_client, now=1800.0)
    assert hold.client is not None and hold.client.calls[-1] == ("cancel", None, 0) and hold.held_since is None


def test_the_hold_is_given_back_after_the_climbs_capacity_timeout_or_its_own_limit() -> None:
    hold = ClimbHold(hold_s=600, renew_s=20)
    run_client = FakeClient("train-run")
    hold.gang_running(1, ON_DEMAND, 2)
    quick = Tier.spot(2, capacity_timeout_s=30, climb_back=True)
    hold.follow(0, quick, run_client, now=0.0)
    hold.follow(0, quick, run_client, now=30 + HOLD_GRACE_S - 1)
    assert hold.client is not None and hold.client.calls[-1][0] == "send"
    hold.follow(0, quick, run_client, now=30 + HOLD_GRACE_S)
    assert hold.client.calls[-1] == ("cancel", None, 0)
    calls = len(hold.client.calls)
    hold.follow(0, quick, run_client, now=30 + HOLD_GRACE_S + 100)
    assert len(hold.client.calls) == calls, "not asked again until a gang has run"

    forever = Tier.spot(2, climb_back=True)  # no capacity timeout: the hold's own limit
    hold.gang_running(1, ON_DEMAND, 2)
    hold.follow(0, forever, run_client, now=1000.0)
    hold.follow(0, forever, run_client, now=1000.0 + 599)
    assert hold.client.calls[-1][0] == "send"
    hold.follow(0, forever, run_client, now=1600.0)
    assert hold.client.calls[-1] == ("cancel", None, 0)


def test_no_hold_without_a_climb() -> None:
    hold = ClimbHold(renew_s=20)
    run_client = FakeClient("train-run")
    hold.follow(0, SPOT, run_client, now=0.0)  # no gang has run yet: the first start
    hold.gang_running(0, SPOT, 2)
    hold.follow(1, ON_DEMAND, run_client, now=10.0)  # a move down: the run's own request asks for its tier
    hold.follow(0, SPOT, None, now=20.0)  # before the controller has a client
    assert hold.client is None
    assert ClimbHold().hold_s == DEFAULT_CLIMB_HOLD_S


def test_an_elastic_gang_is_held_at_the_size_it_ran() -> None:
    elastic = Tier.on_demand((2, 4))
    hold = ClimbHold(renew_s=20)
    run_client = FakeClient("train-run")
    hold.gang_running(1, elastic, 3)
    hold.follow(0, SPOT, run_client, now=0.0)
    assert hold.client is not None and hold.client.calls == [("send", dict(elastic.label_selector), 3)]
