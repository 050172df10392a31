"""The injector's capacity changes on Ray's autoscaler: caps the autoscaler launches against.

One autoscaled local cluster for the module, one spot node type (at most 2 nodes, a short
provisioning delay) and no run: a standing resource request for two spot bundles plays the
run that asks for nodes. Each test starts from two spot nodes up and leaves them so.
"""

from __future__ import annotations

import time

import pytest

from tests.support.helpers_e2e import apply_env, restoring_injector

pytestmark = pytest.mark.ray

DELAY_S = 2.0
SETTLE_S = DELAY_S + 6.0  # a launch the cap allowed would have a node up by now


@pytest.fixture(scope="module")
def cluster():
    from ray.autoscaler.sdk import request_resources

    from spotfallback.local.autoscaling import AutoscaledGroup, LocalAutoscalingCluster
    from spotfallback.local.cluster import MARKET_LABEL, NodeGroup

    apply_env()
    with LocalAutoscalingCluster([AutoscaledGroup(NodeGroup("spot"), max_workers=2, delay_s=DELAY_S)], connect=True) as c:
        request_resources(bundles=[{"CPU": 1}] * 2, bundle_label_selectors=[{MARKET_LABEL: "spot"}] * 2)
        wait_for_spot(c, 2)
        yield c


@pytest.fixture()
def injector(cluster):
    with restoring_injector(cluster, markets=("spot",)) as inj:
        yield inj
    wait_for_spot(cluster, 2)


def spot_ids(cluster) -> list[str]:
    return [n.node_id for n in cluster.nodes("spot")]


def wait_for_spot(cluster, count: int) -> list[str]:
    """The spot node ids once ``count`` are up (the type's maximum here: never more)."""
    return [n.node_id for n in cluster.wait_for_nodes("spot", count, timeout_s=60)]


def test_taking_capacity_caps_the_market_at_zero_preempts_its_nodes_and_giving_it_back_relaunches(cluster, injector):
    before = spot_ids(cluster)
    removed = injector.take_capacity("spot", notice_s=0.0)
    assert sorted(n.node_id for n in removed) == sorted(before)
    assert cluster.capacity("spot") == 0
    assert [e.action for e in injector.log] == ["take-capacity", "cap", "drain", "drain", "preempt", "preempt"]
    assert cluster.nodes("spot") == []
    time.sleep(SETTLE_S)
    assert cluster.alive_nodes("spot") == [], "the request still stands, but the cloud has no room"
    injector.replenish("spot")
    assert cluster.capacity("spot") == 0 and injector.actions("add-refused"), "replenishing a taken market is refused"

    assert injector.give_back("spot") == []  # nodes come from the autoscaler, not from here
    assert cluster.capacity("spot") == 2
    back = wait_for_spot(cluster, 2)
    assert not set(back) & set(before), "new nodes, launched for the standing request"


def test_a_spot_trace_sets_the_cap_tick_by_tick_and_preempts_the_nodes_above_it(cluster, injector):
    import numpy as np

    from spotfallback.sim.traces import SpotTrace

    ticks: list[tuple[int, int, int]] = []
    trace = SpotTrace("scarce", gap_seconds=3600.0, available=np.array([1, 0, 2]))
    oldest = spot_ids(cluster)[0]
    injector.replay_spot_trace(trace, time_scale=3600.0, notice_s=0.0, block=True,
                               on_tick=lambda *t: ticks.append(t))
    assert [(tick, target) for tick, target, _ in ticks] == [(0, 1), (1, 0), (2, 2)]
    assert [running for _, _, running in ticks[:2]] == [1, 0], "nodes above the cap are preempted"
    caps = [e.detail.split(":")[0] for e in injector.actions("cap")]
    assert caps == ["spot cap 1", "spot cap 0", "spot cap 2"]
    assert injector.actions("preempt")[0].node_id != oldest, "the newest node goes first"
    wait_for_spot(cluster, 2)  # the last tick's room is filled on request


def test_a_node_trace_preempts_the_node_mapped_to_a_removed_trace_node_and_maps_the_next_launch(cluster, injector):
    from spotfallback.sim.traces import NodeEvent, NodeTrace

    first, second = spot_ids(cluster)
    trace = NodeTrace("churn", (
        NodeEvent(0.0, "add", "a"), NodeEvent(0.0, "add", "b"),
        NodeEvent(1.0, "remove", "b"),
        NodeEvent(2.0, "add", "c"),
        NodeEvent(2.0 + SETTLE_S + 10.0, "remove", "c"),
    ))
    seen: list[tuple[float, int]] = []
    injector.replay_node_trace(trace, time_scale=1.0, notice_s=0.0, block=True, on_event=lambda *e: seen.append(e))
    preempted = [e.node_id for e in injector.actions("preempt")]
    assert preempted[0] == second, "b was mirrored onto the second node"
    assert first not in preempted, "a stays"
    assert len(preempted) == 2 and preempted[1] not in (first, second), "c took the node launched after it came"
    assert [e.detail.split(":")[0] for e in injector.actions("cap")] == ["spot cap 1", "spot cap 2", "spot cap 1"]
    assert [running for _, running in seen] == [1, 1, 1], "c's node comes after the event, on request"


def test_scaling_a_market_to_a_count_sets_the_cap_there_and_preempts_the_newest_above_it(cluster, injector):
    oldest, newest = spot_ids(cluster)
    assert injector.scale_to("spot", 1, notice_s=None) == 1
    assert cluster.capacity("spot") == 1
    assert [e.node_id for e in injector.actions("kill")] == [newest]
    assert spot_ids(cluster) == [oldest]
    assert injector.scale_to("spot", 2) == 1, "the cap is raised; the node comes from the autoscaler, on request"
    assert cluster.capacity("spot") == 2
    wait_for_spot(cluster, 2)
