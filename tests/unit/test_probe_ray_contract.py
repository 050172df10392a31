"""What the climb-back probe and the autoscaled local cluster rely on in Ray 2.60, pinned.

A rename or re-signature here would make the probe send nothing (or to the wrong requester)
and the local autoscaled cluster launch nothing, silently; these fail first.
"""

from __future__ import annotations

import inspect
import json


def names(func: object) -> list[str]:
    return list(inspect.signature(func).parameters)  # type: ignore[arg-type]


def test_the_probe_client_is_ray_trains_coordinator_client_keyed_by_requester_id() -> None:
    from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
        AUTOSCALING_REQUESTS_EXPIRE_TIME_S,
        TrainAutoscalingCoordinatorClient,
    )
    from ray.train.v2._internal.execution.scaling_policy.scaling_policy import ScalingPolicy

    from spotfallback.runtime.probe import DEFAULT_PROBE_RENEW_S

    assert names(TrainAutoscalingCoordinatorClient.__init__) == ["self", "requester_id"]
    assert TrainAutoscalingCoordinatorClient("train-x")._requester_id == "train-x"
    assert names(TrainAutoscalingCoordinatorClient.send_resource_request) == ["self", "scaling_config", "num_workers"]
    assert names(TrainAutoscalingCoordinatorClient.cancel_resource_request) == ["self"]
    # The run's own client, whose class and requester id the probe's copies, lives here.
    assert "_coordinator_client = TrainAutoscalingCoordinatorClient" in inspect.getsource(ScalingPolicy.after_controller_start)
    assert DEFAULT_PROBE_RENEW_S < AUTOSCALING_REQUESTS_EXPIRE_TIME_S
    # A look (the moving driver's, on another cluster) makes its own client and leaves its request
    # to expire: it stays up at least this long after the look, longer than the mover takes to
    # look again, so the nodes are still wanted when the run climbs onto them.
    from spotfallback.clusters.mover import DEFAULT_LOOK_EVERY_S

    assert AUTOSCALING_REQUESTS_EXPIRE_TIME_S - DEFAULT_PROBE_RENEW_S > DEFAULT_LOOK_EVERY_S


def test_the_fake_provider_the_capped_one_extends() -> None:
    from ray._private.parameter import RayParams
    from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
    from ray.autoscaler._private.providers import _NODE_PROVIDERS
    from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

    from spotfallback.local.autoscaling import CappedFakeProvider

    assert "external" in _NODE_PROVIDERS and TAG_RAY_USER_NODE_TYPE == "ray-user-node-type"
    create = ["self", "node_config", "tags", "count", "resources", "labels"]
    assert names(FakeMultiNodeProvider.create_node_with_resources_and_labels) == create
    assert names(FakeMultiNodeProvider._create_node_with_resources_and_labels) == create
    assert names(CappedFakeProvider.create_node_with_resources_and_labels) == create
    assert names(FakeMultiNodeProvider.__init__) == ["self", "provider_config", "cluster_name"]
    source = inspect.getsource(FakeMultiNodeProvider)
    assert "self.lock" in source and "self._nodes[next_id]" in source and "provider_config.get(\"gcs_address\"" in source
    assert {"autoscaling_config", "gcs_server_port", "env_vars", "labels"} <= set(names(RayParams.__init__))


def test_the_autoscaling_config_passes_rays_schema(tmp_path) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    from spotfallback import Tier
    from spotfallback.local.autoscaling import AutoscaledGroup, LocalAutoscalingCluster

    cluster = LocalAutoscalingCluster([AutoscaledGroup.for_tier(Tier.spot(2), cap=0, delay_s=1.0)])
    cluster._temp_dir = str(tmp_path)  # the config names the control file inside it
    config = json.loads(json.dumps(cluster.autoscaling_config("127.0.0.1:1")))
    validate_config(prepare_config(config))
    spot = config["available_node_types"]["spot"]
    assert spot["labels"]["ray.io/market-type"] == "spot" and spot["min_workers"] == 0
