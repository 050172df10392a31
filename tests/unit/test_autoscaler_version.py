"""Autoscaler v1 drops label selectors: the climb's probe and hold send nothing there, and the driver says so once.

Which autoscaler a cluster runs is read from Ray's internal KV; a head without an autoscaler
(Ray's read-only v1 monitor, or none) is not v1. No Ray cluster is started here: the KV is a fake,
and the Ray facts the rule rests on are pinned against the installed Ray.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from spotfallback import Tier
from spotfallback.events import CapacityTimedOut, RunStarted, WorkersAcquired
from spotfallback.policy import FallbackPolicy
from spotfallback.runtime import autoscaler_version
from spotfallback.runtime.autoscaler_version import (
    AUTOSCALER_NAMESPACE,
    V1_STATUS_KEY,
    V1_WARNING,
    V2_ENABLED_KEY,
    classify_autoscaler,
    climb_requests_allowed,
    cluster_autoscaler,
)
from spotfallback.runtime.capacity import CapacityWatch
from spotfallback.runtime.hold import ClimbHold
from spotfallback.runtime.probe import CapacityProbe
from tests.unit.test_probe import FakeClient

NODE_ID = "a3f1" * 14  # a Ray 2.60 node id: 28 bytes, 56 hex digits


def kv(flag: bytes | None = None, status: bytes | None = None) -> Any:
    """A KV getter over the two keys the rule reads; any other read is a bug."""
    values = {(V2_ENABLED_KEY, AUTOSCALER_NAMESPACE): flag, (V1_STATUS_KEY, None): status}

    def get(key: bytes, namespace: bytes | None) -> bytes | None:
        assert (key, namespace) in values, (key, namespace)
        return values[(key, namespace)]

    return get


def v1_status(**summary: Any) -> bytes:
    """The status the v1 monitor writes each round (``Monitor._run``), around Ray's own summary type."""
    from ray.autoscaler._private.autoscaler import AutoscalerSummary

    fields = {"active_nodes": {}, "idle_nodes": None, "pending_nodes": [], "pending_launches": {}, "failed_nodes": [],
              **summary}
    report = dataclasses.asdict(AutoscalerSummary(**fields))
    status = {"gcs_request_time": 0.01, "time": 1.0, "monitor_pid": 42, "autoscaler_report": report,
              "load_metrics_report": {}}
    return json.dumps(status).encode()


def readonly_status() -> bytes:
    """A head started without an autoscaling config: Ray's v1 monitor, read-only, one node type per node."""
    from ray.autoscaler._private.util import format_readonly_node_type

    node_type = format_readonly_node_type(NODE_ID)
    return v1_status(active_nodes={node_type: 1}, node_type_mapping={NODE_ID: node_type})


# -- the rule ----------------------------------------------------------------------------


def test_the_gcs_flag_says_v2_whatever_else_the_kv_holds() -> None:
    assert classify_autoscaler(kv(flag=b"1")) == "v2"
    assert classify_autoscaler(kv(flag=b"1", status=v1_status(active_nodes={"headgroup": 1}))) == "v2"


def test_a_v1_autoscaler_with_node_types_of_its_own_is_v1() -> None:
    kuberay = v1_status(active_nodes={"headgroup": 1, "spot-gpu": 2}, node_type_mapping={"10.0.0.2": "spot-gpu"})
    assert classify_autoscaler(kv(flag=b"0", status=kuberay)) == "v1"
    launching = v1_status(pending_nodes=[["10.0.0.3", "on-demand-gpu", "waiting-for-ssh"]])
    assert classify_autoscaler(kv(flag=b"0", status=launching)) == "v1"
    assert classify_autoscaler(kv(flag=b"0", status=v1_status(pending_launches={"spot-gpu": 1}))) == "v1"
    assert classify_autoscaler(kv(flag=None, status=v1_status(failed_nodes=[["10.0.0.4", "spot-gpu"]]))) == "v1"


def test_a_plain_head_is_not_v1() -> None:
    """``ray start --head`` / ``ray.init()`` / ``cluster_utils.Cluster``: the read-only monitor launches nothing."""
    assert classify_autoscaler(kv(flag=b"0", status=readonly_status())) == "none"
    assert classify_autoscaler(kv(flag=b"0")) == "none"  # --no-monitor: no v1 monitor at all


def test_what_the_kv_does_not_settle_is_unknown() -> None:
    assert classify_autoscaler(kv()) == "unknown"
    assert classify_autoscaler(kv(flag=b"0", status=v1_status())) == "unknown"  # no node seen yet
    no_report = json.dumps({"time": 1.0, "load_metrics_report": {}}).encode()
    for status in (no_report, b"not json", b"[1, 2]", b'{"autoscaler_report": "?"}'):
        assert classify_autoscaler(kv(flag=b"0", status=status)) == "unknown", status


def test_only_v1_stops_the_climbs_requests() -> None:
    assert not climb_requests_allowed("v1")
    assert all(climb_requests_allowed(kind) for kind in ("v2", "none", "unknown"))


def test_the_keys_and_shapes_are_rays() -> None:
    import ray._raylet
    from ray._private import ray_constants
    from ray.autoscaler._private import commands, monitor
    from ray.autoscaler._private.autoscaler import AutoscalerSummary
    from ray.autoscaler._private.util import format_readonly_node_type
    from ray.autoscaler.v2 import utils as v2_utils

    assert ray._raylet.GCS_AUTOSCALER_V2_ENABLED_KEY.encode() == V2_ENABLED_KEY  # type: ignore[attr-defined]
    assert ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode() == AUTOSCALER_NAMESPACE  # type: ignore[attr-defined]
    assert ray_constants.DEBUG_AUTOSCALING_STATUS.encode() == V1_STATUS_KEY
    assert '== b"1"' in inspect.getsource(v2_utils.is_autoscaler_v2)  # Ray's own reading of the flag
    assert monitor.BASE_READONLY_CONFIG["provider"]["type"] == "readonly"  # a head without a config
    assert "DEBUG_AUTOSCALING_STATUS" in inspect.getsource(monitor.Monitor._run)
    assert format_readonly_node_type(NODE_ID) == f"node_{NODE_ID}"
    assert {"active_nodes", "idle_nodes", "pending_nodes", "pending_launches", "failed_nodes",
            "node_type_mapping"} <= {f.name for f in dataclasses.fields(AutoscalerSummary)}
    # Why v1 is refused: its request keeps the resources and drops the label selectors.
    assert 'to_request_v1 = [req["resources"] for req in to_request]' in inspect.getsource(commands.request_resources)


# -- the shell: read once, warn once -----------------------------------------------------


@pytest.fixture()
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autoscaler_version, "_kinds", {})


def test_the_driver_reads_the_kv_once_per_cluster_and_warns_once_on_v1(
    fresh_cache: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reads: list[tuple[str, bytes]] = []
    clusters = {"10.0.0.1:6379": kv(flag=b"0", status=v1_status(active_nodes={"headgroup": 1})),
                "10.0.0.2:6379": kv(flag=b"1")}
    address = "10.0.0.1:6379"

    def getter(at: str) -> Any:
        def get(key: bytes, namespace: bytes | None) -> bytes | None:
            reads.append((at, key))
            return clusters[at](key, namespace)  # type: ignore[no-any-return]
        return get

    monkeypatch.setattr(autoscaler_version, "_connected_address", lambda: address)
    monkeypatch.setattr(autoscaler_version, "kv_getter", getter)
    with caplog.at_level(logging.DEBUG, logger="spotfallback"):
        assert cluster_autoscaler() == "v1"
        assert cluster_autoscaler() == "v1"
        address = "10.0.0.2:6379"  # the same process drives another cluster
        assert cluster_autoscaler() == "v2"
    assert reads == [("10.0.0.1:6379", V2_ENABLED_KEY), ("10.0.0.1:6379", V1_STATUS_KEY), ("10.0.0.2:6379", V2_ENABLED_KEY)]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [V1_WARNING]
    for fix in ("autoscalerOptions.version: v2", "enableInTreeAutoscaling", "RAY_enable_autoscaler_v2=1",
                "RAY_UP_enable_autoscaler_v2"):
        assert fix in V1_WARNING


def test_no_cluster_or_a_failing_read_is_unknown_and_quiet(
    fresh_cache: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(autoscaler_version, "_connected_address", lambda: None)
    assert cluster_autoscaler() == "unknown" and autoscaler_version._kinds == {}  # asked again once connected

    def broken(address: str) -> Any:
        raise ConnectionError("GCS is gone")

    monkeypatch.setattr(autoscaler_version, "_connected_address", lambda: "10.0.0.9:6379")
    monkeypatch.setattr(autoscaler_version, "kv_getter", broken)
    with caplog.at_level(logging.DEBUG, logger="spotfallback"):
        assert cluster_autoscaler() == "unknown"
    assert all(r.levelno <= logging.DEBUG for r in caplog.records) and caplog.records

    def not_connected() -> str:
        raise RuntimeError("Ray has not been started yet")

    monkeypatch.setattr(autoscaler_version, "_connected_address", not_connected)
    assert cluster_autoscaler() == "unknown"


# -- the probe and the hold under v1 -------------------------------------------------------


DWELL = 300.0
T0 = 1000.0


def below_spot() -> tuple[FallbackPolicy, Any]:
    """Spot had no capacity: the run timed out onto on-demand, and spot is the tier to climb back to."""
    policy = FallbackPolicy([
        Tier.spot(2, climb_back=True, min_dwell_s=DWELL, price_per_worker_hour=1.0, capacity_timeout_s=10),
        Tier.on_demand(2, price_per_worker_hour=3.0),
    ])
    state = policy.replay([RunStarted(t=T0), CapacityTimedOut(t=T0 + 10, waited_s=10),
                           WorkersAcquired(t=T0 + 12, num_workers=2)])
    return policy, state


def test_an_inert_probe_sends_nothing_where_an_active_one_asks() -> None:
    policy, state = below_spot()
    spot = dict(policy.tiers[0].label_selector)
    for inert, expected in ((False, [("send", spot, 2)] * 3 + [("cancel", None, 0)]), (True, [])):
        client = FakeClient()
        probe = CapacityProbe(client, lead_s=DWELL, renew_s=20, poll_s=0, inert=inert)
        for dt in (20, 45, 70):  # asked, then renewed every 20 s
            probe.update(policy, state, T0 + dt, lambda tier: 0)
        probe.cancel()
        assert client.calls == expected, inert


def test_under_v1_the_scaling_policy_neither_probes_nor_holds(tmp_path: Any) -> None:
    from ray.train.v2.api.config import ScalingConfig

    from spotfallback.runtime.hooks import TierScalingPolicy
    from spotfallback.runtime.ladder import RunSpec
    from spotfallback.store.location import resolve_run

    policy, state = below_spot()
    spec = RunSpec(key="autoscaler-v1", tiers=tuple(t.model_dump(mode="json") for t in policy.tiers), state=state,
                   location=resolve_run(str(tmp_path), "autoscaler-v1"), writer="test")
    rt = SimpleNamespace(policy=policy, state=state, lock=threading.RLock(), watch=CapacityWatch(),
                         requests=SimpleNamespace(listened=lambda: True))  # a climb could be decided any time
    for kind, asks in (("v1", False), ("v2", True), ("none", True), ("unknown", True)):
        scaling = TierScalingPolicy(ScalingConfig(num_workers=2), spec, autoscaler=kind)  # type: ignore[arg-type]
        probe, hold = scaling._probe, scaling._hold
        probe._lead_s, probe._poll_s = 1e9, 0.0
        run_client = FakeClient("train-run")
        probe.follow(rt, run_client, lambda tier: 0, now=T0 + 20)  # type: ignore[arg-type]
        hold.gang_running(1, policy.tiers[1], 2)  # the on-demand gang ran, then the run climbs to spot
        hold.follow(0, policy.tiers[0], run_client, now=T0 + 30)
        sent = [c for client in (probe.client, hold.client) if client is not None for c in client.calls]
        assert run_client.calls == []
        if asks:
            assert [c[0] for c in sent] == ["send", "send"], kind
        else:
            assert probe.client is None and hold.client is None and sent == [], kind
            probe.cancel()
            hold.cancel()
            assert probe.client is None and hold.client is None


def test_an_inert_hold_keeps_nothing() -> None:
    policy, _ = below_spot()
    run_client = FakeClient("train-run")
    hold = ClimbHold(hold_s=600, renew_s=20, inert=True)
    hold.gang_running(1, policy.tiers[1], 2)
    for t in (0.0, 25.0, 50.0):
        hold.follow(0, policy.tiers[0], run_client, now=t)
    hold.gang_running(0, policy.tiers[0], 2)
    assert hold.client is None and hold.held_since is None and run_client.calls == []


def test_the_driver_hands_the_controller_what_it_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """``fit`` reads the cluster once Ray is connected (the train function's ray.put) and builds the
    scaling policy for it."""
    from ray.train.v2.api.config import FailureConfig

    from spotfallback.runtime import trainer as trainer_module
    from spotfallback.runtime.hooks import TierScalingPolicy

    order: list[str] = []
    handed: dict[str, Any] = {}

    class Base:  # what LadderTrainer uses of Ray's DataParallelTrainer
        scaling_config = None
        run_config = SimpleNamespace(failure_config=FailureConfig())
        train_run_context = validation_config = None

        def _get_train_func(self) -> Any:
            return lambda: None

        def _create_default_callbacks(self) -> list[Any]:
            return []

        def _initialize_and_run_controller(self, **kwargs: Any) -> Any:
            handed.update(kwargs)
            return SimpleNamespace(error=None)

    def put(fn: Any) -> str:
        order.append("put")
        return "ref"

    def found() -> str:
        order.append("read")
        return "v1"

    monkeypatch.setattr(trainer_module, "ObjectRefWrapper", put)
    monkeypatch.setattr(trainer_module, "cluster_autoscaler", found)
    ladder_trainer = trainer_module._ladder_trainer_class(Base)()
    ladder_trainer._spotfallback_spec = SimpleNamespace()
    ladder_trainer.fit()
    scaling = handed["scaling_policy"]
    assert order == ["put", "read"] and handed["train_fn_ref"] == "ref"
    assert isinstance(scaling, TierScalingPolicy) and scaling._probe.inert and scaling._hold.inert


# -- the moving driver's look on another cluster --------------------------------------------


@pytest.mark.parametrize(("kind", "asks"), [("v1", False), ("none", True)])
def test_a_look_on_a_v1_cluster_asks_nothing_and_reports_what_fits_now(
    monkeypatch: pytest.MonkeyPatch, kind: str, asks: bool
) -> None:
    from ray.train.v2._internal.execution.scaling_policy import (
        autoscaling_coordinator_client as coordinator,
    )

    from spotfallback.runtime import probe as probe_module
    from spotfallback.runtime.probe import look_capacity

    made: list[FakeClient] = []

    def client(requester_id: str) -> FakeClient:
        made.append(FakeClient(requester_id))
        return made[-1]

    monkeypatch.setattr(coordinator, "TrainAutoscalingCoordinatorClient", client)
    monkeypatch.setattr(probe_module, "cluster_autoscaler", lambda: kind)
    counts = iter([1, 2])
    tier = Tier.spot(2)
    assert look_capacity(tier, "look", 60.0, capacity=lambda t: next(counts), sleep=lambda s: None) == (2 if asks else 1)
    assert [c.calls for c in made] == ([[("send", dict(tier.label_selector), 2)]] if asks else [])
