"""Climbing back onto a tier that scaled to zero, on Ray's own autoscaler.

One autoscaled local cluster for the module: spot nodes (none at first, launched only on
request, after a provisioning delay, never beyond a capacity cap the test changes), two
on-demand nodes kept up, and a "reserved" type the ladder never selects, for the cluster's own
check. The run starts while spot has no capacity, times out onto on-demand, and must climb
back once spot capacity returns: only the climb-back probe asks the autoscaler for spot nodes.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.helpers_e2e import (  # noqa: E402
    SLOW_UNDER_LOAD,
    TRAIN_CONFIG,
    Background,
    apply_env,
    checkpoints_since,
    kinds,
    poll_until,
    unique_name,
    wait_for,
)

pytestmark = pytest.mark.ray

DELAY_S = 5.0  # spot's provisioning delay: from launch to a starting node
DWELL_S = 10.0  # spot's min_dwell_s: the earliest climb after the run left it
SPOT_TIMEOUT_S = 6.0
# The controller's capacity look and probe throttles, shortened so the test measures the
# autoscaler and the policy rather than polling intervals.
ENV = {
    # The venv's `spotfallback` on PATH: the head's raylet, hence each Ray job's driver, inherits it.
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    "SPOTFALLBACK_CAPACITY_POLL_S": "1",
    "SPOTFALLBACK_PROBE_POLL_S": "1",
    "SPOTFALLBACK_PROBE_LEAD_S": "3600",  # probe as soon as the run is below spot
}


def ladder() -> list:
    from spotfallback import Tier

    return [
        Tier.spot(
            2,
            capacity_timeout_s=SPOT_TIMEOUT_S,
            climb_back=True,
            min_dwell_s=DWELL_S,
            price_per_worker_hour=1.0,
        ),
        Tier.on_demand(2, price_per_worker_hour=3.0),
    ]


@pytest.fixture(scope="module")
def cluster():
    from spotfallback.local.autoscaling import AutoscaledGroup, LocalAutoscalingCluster
    from spotfallback.local.cluster import NodeGroup

    spot, on_demand = ladder()
    apply_env()
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    c = LocalAutoscalingCluster(
        [
            AutoscaledGroup.for_tier(spot, cap=0, delay_s=DELAY_S),
            AutoscaledGroup.for_tier(on_demand, min_workers=2),
            AutoscaledGroup(NodeGroup("reserved"), max_workers=2, cap=0, delay_s=DELAY_S),
        ],
        connect=True,
        jobs_api=True,  # for the moving driver's look, a Ray job
    )
    try:
        c.start()
        c.wait_for_nodes("on-demand", 2)
        yield c
    finally:
        pids, temp_dir = c.pids(), c.temp_dir
        c.shutdown()
        left = [p for p in pids | mentioning(temp_dir) if running(p)]
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        assert not left, f"processes of the cluster still running: {left}"


def mentioning(text: str | None) -> set[int]:
    """Processes whose command line mentions ``text`` (the cluster's temp dir: its nodes' processes)."""
    import psutil

    out = set()
    for proc in psutil.process_iter(["cmdline"]):
        if text and any(text in part for part in proc.info["cmdline"] or ()):
            out.add(proc.pid)
    return out


def running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_resource_request_launches_nodes_after_the_delay_and_never_beyond_the_cap(cluster):
    from ray.autoscaler.sdk import request_resources

    from spotfallback.local.cluster import MARKET_LABEL
    from spotfallback.runtime.autoscaler_version import cluster_autoscaler

    # What a driver reads from the cluster: autoscaler v2, which keeps a request's label selectors.
    assert cluster_autoscaler() == "v2"
    request_resources(bundles=[{"CPU": 1}] * 2, bundle_label_selectors=[{MARKET_LABEL: "reserved"}] * 2)
    try:
        time.sleep(DELAY_S + 3)
        assert cluster.alive_nodes("reserved") == [], "no capacity: no node"
        cluster.set_capacity("reserved", 1)
        raised = time.monotonic()
        cluster.wait_for_nodes("reserved", 1, timeout_s=60)
        took = time.monotonic() - raised
        assert took >= DELAY_S, took
        time.sleep(DELAY_S + 3)  # a second launch would be up by now
        nodes = cluster.alive_nodes("reserved")
        assert len(nodes) == 1, "the cap holds while two nodes are requested"
        assert nodes[0]["Labels"][MARKET_LABEL] == "reserved"
    finally:
        request_resources(bundles=[])
        cluster.set_capacity("reserved", 0)


def requested(cluster) -> dict[str, int]:
    """Requested bundles by the market their label selector asks for."""
    from spotfallback.local.cluster import MARKET_LABEL

    counts: dict[str, int] = {}
    for _resources, labels in cluster.requested_bundles():
        market = ",".join(labels.get(MARKET_LABEL, ["any"]))
        counts[market] = counts.get(market, 0) + 1
    return counts


@SLOW_UNDER_LOAD
def test_climbs_back_onto_spot_once_the_probe_gets_its_nodes_back(cluster, tmp_path):
    import ray.train

    from spotfallback import FallbackTrainer
    from spotfallback.examples.ddp_digits import train_fn

    # Long enough to climb (about step 20 on a loaded 2-core machine) with room to spare.
    config = {**TRAIN_CONFIG, "total_steps": 120}
    trainer = FallbackTrainer(
        train_fn,
        train_loop_config=config,
        tiers=ladder(),
        run_config=ray.train.RunConfig(storage_path=str(tmp_path), name=unique_name("climb")),
    )
    driver = Background(trainer.fit)
    ledger = trainer.ledger
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=1) >= 1, 180, driver)
    # Below spot, the run asks for on-demand's gang and the probe for spot's, beside it.
    poll_until(lambda: requested(cluster) == {"spot": 2, "on-demand": 2}, 30, lambda: requested(cluster))
    assert cluster.alive_nodes("spot") == [], "spot had no capacity: the autoscaler added no node"
    cluster.set_capacity("spot", 2)
    back = time.time()
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 180, driver)
    # Back on spot: the run's own request is spot's gang; the probe and the climb's hold of on-demand are withdrawn.
    poll_until(lambda: requested(cluster) == {"spot": 2}, 30, lambda: requested(cluster))
    result = driver.join(300)
    assert driver.error is None, driver.error
    poll_until(lambda: requested(cluster) == {}, 30, lambda: requested(cluster))  # the finished run asks for nothing

    records = ledger.read()
    assert kinds(records)[:3] == ["run_started", "capacity_timed_out", "workers_acquired"]
    climbs = [r for r in records if r.decision and r.decision["action"] == "climb_back"]
    assert len(climbs) == 1 and climbs[0].decision["to_tier"] == 0
    moved_down = next(r.event.t for r in records if r.event.kind == "capacity_timed_out")
    # The stated bound: the climb comes no later than the dwell or the provisioning delay after
    # capacity returned (whichever ends later), plus 20 s for the autoscaler's launch retry, a
    # node joining, and the next checkpoint-gated capacity look, on a loaded 2-core machine.
    earliest = max(moved_down + DWELL_S, back + DELAY_S)
    assert earliest - 0.5 <= climbs[0].event.t <= earliest + 20.0, (climbs[0].event.t - back, moved_down - back)
    spot_gang = [r for r in records if r.event.kind == "workers_acquired" and r.tier == 0]
    assert spot_gang and set(spot_gang[-1].info["nodes"]) <= {n["NodeID"] for n in cluster.alive_nodes("spot")}
    assert result.metrics["step"] == config["total_steps"]


@SLOW_UNDER_LOAD
def test_a_climb_that_finds_spot_gone_falls_back_onto_the_on_demand_nodes_it_held(cluster, tmp_path):
    """The climb is decided while spot's nodes are up; they go before its gang is placed. From the
    climb until a gang runs again, the left on-demand gang stays requested beside spot's (the
    climb's hold), so an autoscaled pool keeps those nodes for the fall back; then it is withdrawn."""
    import ray.train

    from spotfallback import FallbackTrainer
    from spotfallback.examples.ddp_digits import train_fn

    cluster.set_capacity("spot", 0)  # the last test's spot nodes, idle, are the cloud's again
    for node in cluster.alive_nodes("spot"):
        cluster.kill_node(node["NodeID"])
    gate = tmp_path / "gate"
    gate.touch()
    config = {**TRAIN_CONFIG, "total_steps": 120, "step_gate": str(gate),
              "preemption_check_every": 1, "preemption_answer_requests": True}
    trainer = FallbackTrainer(
        train_fn,
        train_loop_config=config,
        tiers=ladder(),
        run_config=ray.train.RunConfig(storage_path=str(tmp_path / "runs"), name=unique_name("heldclimb")),
    )
    driver = Background(trainer.fit)
    ledger = trainer.ledger
    try:
        wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=1) >= 1, 180, driver)
        on_demand_nodes = {n["NodeID"] for n in cluster.alive_nodes("on-demand")}
        gate.unlink()  # the gang stops at its next step: the climb waits for the checkpoint it asks for
        cluster.set_capacity("spot", 2)

        def climb(rs: list) -> int | None:
            return next((i for i, r in enumerate(rs) if r.decision and r.decision["action"] == "climb_back"), None)

        at = climb(wait_for(ledger, lambda rs: climb(rs) is not None, 120, driver))
        assert at is not None
        cluster.set_capacity("spot", 0)  # the cloud takes spot back before the climb's gang is placed
        for node in cluster.alive_nodes("spot"):
            cluster.kill_node(node["NodeID"])
        # The gang still runs on on-demand, waiting at the gate: the run asks for spot's gang, nothing is held yet.
        poll_until(lambda: requested(cluster) == {"spot": 2}, 30, lambda: requested(cluster))
        gate.touch()

        def held() -> bool:
            now = requested(cluster)  # read before the ledger: a fall back already there would show in it
            fell_back = any(r.event.kind == "capacity_timed_out" for r in ledger.read()[at:])
            assert not fell_back, f"fell back to on-demand before the hold was seen: {now}"
            return now == {"spot": 2, "on-demand": 2}

        poll_until(held, 60, lambda: requested(cluster))
        records = wait_for(ledger, lambda rs: checkpoints_since(rs, "capacity_timed_out", tier=1) >= 1, 180, driver)
        gang = [r for r in records if r.event.kind == "workers_acquired"][-1]
        assert gang.tier == 1 and set(gang.info["nodes"]) <= on_demand_nodes, "back on the nodes it held"
        # On on-demand again: the run's own request is on-demand's, the hold withdrawn (never both: a second gang).
        poll_until(lambda: requested(cluster).get("on-demand") == 2, 30, lambda: requested(cluster))
        result = driver.join(300)
        assert driver.error is None, driver.error
        assert result.metrics["step"] == config["total_steps"]
    finally:
        gate.touch()
        cluster.set_capacity("spot", 0)
        driver.join(300)


# A notice longer than a node's provisioning plus one restart, even on a loaded 2-core CI (where
# 40 and 60 s were not: the gang was training again 2 and 4 s after the deadline); AWS gives 120 s.
NOTICE_S = 90.0


@SLOW_UNDER_LOAD
def test_the_replacement_is_launched_at_the_notice_and_the_gang_moves_before_the_node_goes(cluster, tmp_path):
    """The replacement is launched at the notice (no spare node is up: Ray Train's request for
    the tier's gang stops counting the draining node), provisioning overlaps the notice while
    the gang trains on, and once the new node is there the gang takes its just-in-time
    checkpoint and restarts off the draining node: training again before the node's deadline."""
    import ray.train

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.examples.ddp_digits import train_fn
    from spotfallback.notices.drain import drain_for_preemption, gcs_client
    from spotfallback.notices.jit import jit_failure_config

    cluster.set_capacity("spot", 3)
    tiers = [Tier.spot(2, max_preemptions=2, capacity_timeout_s=300, price_per_worker_hour=1.0),
             Tier.on_demand(2, price_per_worker_hour=3.0)]
    config = {**TRAIN_CONFIG, "total_steps": 150, "preemption_check_every_s": 1.0, "preemption_hold_s": 60.0}
    trainer = FallbackTrainer(
        train_fn,
        train_loop_config=config,
        tiers=tiers,
        run_config=ray.train.RunConfig(storage_path=str(tmp_path), name=unique_name("move"),
                                       failure_config=jit_failure_config()),
    )
    driver = Background(trainer.fit)
    ledger = trainer.ledger
    records = wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 240, driver)
    gang = [r for r in records if r.event.kind == "workers_acquired"][-1].info["nodes"]
    spot_before = {n["NodeID"] for n in cluster.alive_nodes("spot")}
    assert set(gang) == spot_before and len(gang) == 2, "the gang holds every spot node: no spare is up"
    doomed = gang[-1]
    deadline = time.time() + NOTICE_S
    drain_for_preemption(gcs_client(), doomed, deadline, "a spot notice, from the test")

    records = wait_for(ledger, lambda rs: sum(r.event.kind == "workers_acquired" for r in rs) >= 2, NOTICE_S + 60, driver)
    jit = [r for r in records if r.event.kind == "jit_checkpoint"]
    assert [r.event.outcome for r in jit] == ["started", "reported", "moved"], kinds(records)
    # The gang trained through the notice and saved once the replacement was there: no sooner
    # than its provisioning delay after the notice, long before the save's lead was reached.
    started = jit[0]
    assert started.info["trained_on_calls"] > 0, started.info
    assert started.t >= deadline - NOTICE_S + DELAY_S, f"saved {started.t - (deadline - NOTICE_S):.1f} s after the notice"
    assert started.t < deadline - NOTICE_S / 2, f"saved only {deadline - started.t:.1f} s before the deadline"
    new_gang = [r for r in records if r.event.kind == "workers_acquired"][-1]
    assert new_gang.tier == 0 and doomed not in new_gang.info["nodes"]
    assert set(new_gang.info["nodes"]) - spot_before, "the gang moved onto the replacement node"
    preempted = next(r for r in records if r.event.kind == "preempted")
    assert preempted.decision["action"] == "retry" and "moved off the draining node(s) early" in preempted.event.detail
    assert new_gang.t < deadline, f"training again {new_gang.t - deadline:.1f} s after the node's deadline"
    moved = next(r.t for r in jit if r.event.outcome == "moved")
    print(f"\nnotice {NOTICE_S:g} s: moved {deadline - moved:.1f} s and the new gang started {deadline - new_gang.t:.1f} s "
          "before the deadline")
    result = driver.join(300)
    assert driver.error is None, driver.error
    assert result.metrics["step"] == config["total_steps"]


@SLOW_UNDER_LOAD
def test_an_elastic_spot_gang_starts_with_the_node_the_cloud_has_and_grows_when_the_autoscaler_adds_one(cluster, tmp_path):
    """An elastic tier's gang takes what there is, and its resource request (the tier's maximum)
    keeps asking for the rest: once the cloud has room the autoscaler launches the node, and
    the controller's capacity look grows the gang onto it, on the same tier."""
    import ray.train

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.examples.ddp_digits import train_fn

    # A run of the test before that failed goes on to its end, holding its resource request.
    poll_until(lambda: not requested(cluster), 240, lambda: requested(cluster))
    cluster.set_capacity("spot", 1)
    for node in cluster.alive_nodes("spot"):  # left by the tests before, idle: the cloud takes them back
        cluster.kill_node(node["NodeID"])
    tiers = [Tier.spot((1, 2), max_preemptions=2, min_dwell_s=2, capacity_timeout_s=300, price_per_worker_hour=1.0),
             Tier.on_demand(2, price_per_worker_hour=3.0)]
    # The run must still be training on one worker when the gang grows (DELAY_S, then the next
    # checkpoint's capacity look); the bound below allows 60 s after the room for a loaded
    # machine, where each of the 240 steps (0.15 s of sleep) is slower too. A growth after the
    # run ended fails the test, never passes it wrongly.
    config = {**TRAIN_CONFIG, "total_steps": 240}
    trainer = FallbackTrainer(
        train_fn,
        train_loop_config=config,
        tiers=tiers,
        run_config=ray.train.RunConfig(storage_path=str(tmp_path), name=unique_name("elastic")),
    )
    driver = Background(trainer.fit)
    ledger = trainer.ledger
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 180, driver)
    # One node is all the cloud has; the run's request asks for the tier's two.
    assert [(r.tier, r.event.num_workers) for r in ledger.read() if r.event.kind == "workers_acquired"] == [(0, 1)]
    assert requested(cluster) == {"spot": 2}
    cluster.set_capacity("spot", 2)
    room = time.time()
    wait_for(ledger, lambda rs: sum(r.event.kind == "workers_acquired" for r in rs) >= 2, 120, driver)
    result = driver.join(300)
    assert driver.error is None, driver.error

    records = ledger.read()
    print("\n" + " ".join(f"{r.event.kind}@{r.t - room:.1f}" for r in records if r.event.kind != "checkpoint_committed"))
    assert [(r.tier, r.event.num_workers) for r in records if r.event.kind == "workers_acquired"] == [(0, 1), (0, 2)]
    grow = next(r for r in records if r.decision and r.decision["action"] == "resize")
    assert grow.event.available_workers == 2 and grow.decision["num_workers"] == 2
    # The node's launch and start, then the next checkpoint-gated capacity look, on a loaded 2-core machine.
    assert room + DELAY_S - 0.5 <= grow.event.t <= room + DELAY_S + 60.0, grow.event.t - room
    assert result.metrics["step"] == config["total_steps"]


def look(looks, tier, wait_s: float) -> tuple[int, float]:
    """One look at ``tier`` as the moving driver makes it: `spotfallback look-capacity` as a Ray job,
    submitted through the cluster's Jobs API, its count read from the job's log. (count, seconds)"""
    t0 = time.monotonic()
    looks.start(0, tier, "a", now=time.time(), wait_s=wait_s)
    found: list[int] = []

    def ended() -> bool:
        count = looks.collect(tier)
        if count is not None:
            found.append(count)
        return bool(found)

    poll_until(ended, timeout=wait_s + 60, every=1.0)
    return found[0], time.monotonic() - t0


def test_a_look_from_the_moving_driver_gets_the_gang_from_the_autoscaler(cluster):
    """The look the moving driver runs on a higher tier's cluster: a Ray job there, through its
    Jobs API. The gang does not fit, so it asks Ray's autoscaler for it through Ray Train's
    coordinator under the run's own requester id and counts the nodes that come; where the cloud
    has none, it counts none once its wait is over."""
    from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
        TrainAutoscalingCoordinatorClient,
    )

    from spotfallback import Tier
    from spotfallback.clusters.jobs import ClusterJobs
    from spotfallback.clusters.looks import CapacityLooks
    from spotfallback.config import ClusterRef

    tier = Tier(name="reserved", market="reserved", num_workers=2)
    looks = CapacityLooks({"a": ClusterJobs(ClusterRef(address=cluster.jobs_address, name="a"))},
                          run_uri="file:///tmp/runs/looked-at", run_name="looked-at")
    cluster.set_capacity("reserved", 0)  # the cloud has no reserved node: none launched, none left up
    poll_until(lambda: cluster.alive_nodes("reserved") == [], timeout=90, last=lambda: cluster.alive_nodes("reserved"))
    try:
        count, took = look(looks, tier, wait_s=10.0)
        assert count == 0 and took >= 10.0 and cluster.alive_nodes("reserved") == []
        cluster.set_capacity("reserved", 2)
        count, _ = look(looks, tier, wait_s=120.0)
        assert count == 2 and len(cluster.alive_nodes("reserved")) == 2
        assert requested(cluster).get("reserved", 0) >= 2  # left up for the climb: it expires on its own
    finally:
        TrainAutoscalingCoordinatorClient(looks.requester_id).cancel_resource_request()
        cluster.set_capacity("reserved", 0)
