"""The local spot cluster and its injector do to Ray what a cloud would.

One cluster for the module (head with no CPUs, two spot nodes labelled with a region and zone,
one on-demand node); each test leaves two spot nodes running for the next.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

os.environ["RAY_TRAIN_V2_ENABLED"] = "1"

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from spotfallback import Tier  # noqa: E402
from spotfallback.local import (  # noqa: E402
    GROUP_LABEL,
    MARKET_LABEL,
    REGION_LABEL,
    ZONE_LABEL,
    Injector,
    LocalSpotCluster,
    NodeGroup,
)
from spotfallback.sim.traces import load_node_trace, load_spot_trace  # noqa: E402
from tests.support.helpers_e2e import poll_until  # noqa: E402

pytestmark = pytest.mark.ray
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPOT = NodeGroup("spot", count=2, region="us-west-2", zone="us-west-2a")


@pytest.fixture(scope="module")
def cluster():
    c = LocalSpotCluster([SPOT, NodeGroup("on-demand", count=1)], connect=True)
    try:
        c.start()
        yield c
    finally:
        c.shutdown()


@pytest.fixture()
def injector(cluster):
    inj = Injector(cluster)
    try:
        yield inj
    finally:
        inj.close()  # stops timed actions and replays; explicit calls still work
        inj.give_back("spot")
        inj.replenish("spot")


@ray.remote(num_cpus=1)
class Busy:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def niceness(self) -> int:
        return os.nice(0)


@ray.remote(num_cpus=1)
class RayTrainWorker:  # the class name Ray Train V2 gives its worker actors
    def ready(self) -> bool:
        return True


def _pin(cls, node_id: str):
    actor = cls.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote()
    ray.get(actor.__ray_ready__.remote(), timeout=60)
    return actor


# ----------------------------------------------------------------- no cluster needed


def test_groups_follow_the_ladder() -> None:
    tiers = [
        Tier.spot(
            2,
            label_selector={
                MARKET_LABEL: "spot",
                REGION_LABEL: "us-east-1",
                ZONE_LABEL: "!us-east-1c",
            },
        ),
        Tier.on_demand(1, resources_per_worker={"CPU": 2, "mem_gb": 4}),
    ]
    spot, on_demand = LocalSpotCluster.for_ladder(tiers).groups.values()
    assert (spot.count, spot.cpus, spot.market) == (2, 1.0, "spot")
    # Plain selector values become node labels; a negation describes no node.
    assert spot.node_labels() == {
        GROUP_LABEL: "spot",
        MARKET_LABEL: "spot",
        REGION_LABEL: "us-east-1",
    }
    assert (on_demand.count, on_demand.cpus, dict(on_demand.resources)) == (1, 2.0, {"mem_gb": 4})
    assert on_demand.node_labels()[MARKET_LABEL] == "on-demand"
    with pytest.raises(ValueError, match="label"):
        NodeGroup("spot", labels={"bad key!": "x"})


# ----------------------------------------------------------------- on the cluster


def test_nodes_carry_their_labels_and_the_head_has_no_cpus(cluster) -> None:
    assert cluster.start_seconds is not None and cluster.start_seconds < 60
    statuses = cluster.node_statuses()
    spot = cluster.nodes("spot")
    assert len(spot) == 2 and len(cluster.nodes("on-demand")) == 1
    for node in spot:
        labels = statuses[node.node_id].labels  # what Ray itself schedules against
        assert labels[MARKET_LABEL] == "spot" and labels[GROUP_LABEL] == "spot"
        assert labels[REGION_LABEL] == "us-west-2" and labels[ZONE_LABEL] == "us-west-2a"
    (od,) = cluster.nodes("on-demand")
    assert statuses[od.node_id].labels[MARKET_LABEL] == "on-demand"
    head = next(n for n in ray.nodes() if n["NodeID"] == cluster.head_node_id)
    assert head["Resources"].get("CPU", 0) == 0

    actor = Busy.options(label_selector={MARKET_LABEL: "on-demand"}).remote()
    try:
        assert ray.get(actor.node.remote(), timeout=60) == od.node_id
        # Not Ray's nice 15: on one shared machine any busy process would starve training.
        assert ray.get(actor.niceness.remote(), timeout=60) == 0
    finally:
        ray.kill(actor)


def test_preemption_is_a_drain_then_a_kill_and_a_plain_kill_is_not(cluster, injector) -> None:
    preempted, failed = cluster.nodes("spot")
    a, b = _pin(Busy, preempted.node_id), _pin(Busy, failed.node_id)

    sent = time.time()
    injector.preempt(preempted, notice_s=2.0, block=False)
    status = cluster.node_status(preempted)
    # During the notice the node still runs, drained, with the deadline Ray Train polls for.
    assert status.alive and status.draining
    assert sent + 1.5 <= status.drain_deadline_ms / 1000 <= sent + 3.0
    injector.kill(failed)

    dead = cluster.wait_for_node_dead(preempted, timeout_s=30)
    assert time.time() - sent >= 2.0
    assert dead.death_reason == "AUTOSCALER_DRAIN_PREEMPTED" and "preemption" in dead.death_message
    with pytest.raises(ray.exceptions.ActorDiedError) as died:
        ray.get(a.node.remote(), timeout=30)
    assert died.value.preempted

    dead = cluster.wait_for_node_dead(failed, timeout_s=30)
    assert dead.death_reason == "UNEXPECTED_TERMINATION"
    with pytest.raises(ray.exceptions.ActorDiedError) as died:
        ray.get(b.node.remote(), timeout=30)
    assert not died.value.preempted

    assert [(e.action, e.node_id) for e in injector.log] == [
        ("drain", preempted.node_id),
        ("kill", failed.node_id),
        ("preempt", preempted.node_id),
    ]
    assert cluster.nodes("spot") == []


def test_replacements_come_back_unless_capacity_is_taken(cluster, injector) -> None:
    injector.replace_after_s = 0.2
    victim = cluster.nodes("spot")[0]
    injector.kill(victim)
    poll_until(lambda: len(cluster.nodes("spot")) == 2, 30, lambda: "replacement node", every=0.1)
    assert victim not in cluster.nodes("spot")

    removed = injector.take_capacity("spot")
    assert len(removed) == 2 and cluster.nodes("spot") == []
    assert injector.replenish("spot") == []
    assert injector.actions("add-refused")
    assert len(cluster.nodes("on-demand")) == 1  # other markets untouched
    assert len(injector.give_back("spot")) == 2
    assert len(cluster.nodes("spot")) == 2

    injector.take_capacity("spot", duration_s=1.0)  # comes back on its own
    assert cluster.nodes("spot") == []
    poll_until(lambda: len(cluster.nodes("spot")) == 2, 30, lambda: "capacity given back", every=0.1)
    actions = [e.action for e in injector.log]
    assert actions.count("take-capacity") == 2 and actions.count("give-back") == 2
    assert not injector.errors


def test_preempt_one_picks_the_node_running_a_train_worker(cluster, injector) -> None:
    busy = cluster.nodes("spot")[1]
    worker = _pin(RayTrainWorker, busy.node_id)
    try:
        assert cluster.train_workers_per_node() == {busy.node_id: 1}
        assert injector.pick("spot") == busy
    finally:
        ray.kill(worker)
    assert injector.pick("on-demand") == cluster.nodes("on-demand")[0]
    assert injector.pick("reserved") is None


def test_spot_trace_window_sets_the_number_of_live_nodes(cluster, injector) -> None:
    trace = load_spot_trace(FIXTURES / "us-west-2a_v100_1.json")
    ticks: list[tuple[int, int, int]] = []
    # 600 s ticks at 1200x: a tick every half second; 2 nodes per available instance.
    replay = injector.replay_spot_trace(
        trace,
        "spot",
        time_scale=1200,
        start_tick=0,
        ticks=5,
        nodes_per_unit=2,
        on_tick=lambda i, target, running: ticks.append((i, target, running)),
    )
    assert replay.wait(60)
    expected = [min(2 * int(v), 2) for v in trace.available[:5]]
    assert len(set(expected)) > 1  # the window does change availability
    assert [t for _, t, _ in ticks] == expected
    assert [r for _, _, r in ticks] == expected
    assert len(cluster.nodes("spot")) == expected[-1]


def test_node_trace_window_removes_the_nodes_it_names(cluster, injector) -> None:
    trace = load_node_trace(FIXTURES / "aws-p3-trace.csv")
    mirrored = {"node1", "node2"}  # the first two nodes of the trace, mapped on our two
    gone_at = min(e.t_s for e in trace.events if e.action == "remove" and e.node in mirrored)
    seen: list[tuple[float, int]] = []
    replay = injector.replay_node_trace(
        trace,
        "spot",
        time_scale=1000,
        end_s=gone_at,
        max_nodes=2,
        on_event=lambda t, running: seen.append((t, running)),
    )
    assert replay.wait(60)
    assert seen and all(running == 2 for t, running in seen if t < gone_at)
    expected_left = 2 - sum(1 for e in trace.events if e.t_s == gone_at and e.node in mirrored)
    assert seen[-1] == (gone_at, expected_left) and expected_left < 2
    assert len(cluster.nodes("spot")) == expected_left


def test_shutdown_stops_every_process(cluster) -> None:
    import psutil  # vendored by Ray

    pids = cluster.pids()
    assert len(pids) > 10  # head daemons, 3 raylets, their agents and workers
    temp_dir = cluster.temp_dir
    cluster.shutdown()

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    poll_until(lambda: not any(alive(p) for p in pids), 15, lambda: "every Ray process gone", every=0.1)
    assert temp_dir is not None and not Path(temp_dir).exists()
    assert not cluster.running
