"""An injector on a cluster Ray's autoscaler runs: refusals that come before anything is touched.

No cluster is started here. The capacity changes themselves (caps, preemptions, traces) run on a
real autoscaled cluster in ``tests/e2e/test_injector_autoscaled.py``, the node faults in the demo
and in ``tests/e2e/test_autoscaled_climb_back.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from spotfallback.local import Injector, NodeGroup
from spotfallback.local.autoscaling import AutoscaledGroup, LocalAutoscalingCluster
from spotfallback.sim.traces import SpotTrace


def _cluster() -> LocalAutoscalingCluster:
    return LocalAutoscalingCluster([AutoscaledGroup(NodeGroup("spot"), max_workers=2)])


def test_automatic_replacement_is_the_autoscalers_job_and_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="replace_after_s.*leave replace_after_s unset"):
        Injector(_cluster(), replace_after_s=1.0)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda inj: inj.take_capacity("on-demand"), "no node group of market 'on-demand'; groups: \\['spot'\\]"),
        (lambda inj: inj.replenish("gpu"), "no node group of market 'gpu'"),
        (lambda inj: inj.replay_spot_trace(SpotTrace("t", 60.0, np.array([1])), group="nope"),
         "no node group named 'nope'; groups: \\['spot'\\]"),
    ],
    ids=["take_capacity", "replenish", "replay"],
)
def test_an_unknown_market_or_group_is_refused_naming_the_ones_there_are(change, error):
    injector = Injector(_cluster())
    with pytest.raises(KeyError, match=error):
        change(injector)
    assert injector.log == []  # nothing was recorded, nothing touched
    injector.close()


def test_the_configured_cap_is_the_cap_else_every_node_type_may_be_full():
    assert AutoscaledGroup(NodeGroup("spot"), max_workers=3, cap=1).configured_cap == 1
    assert AutoscaledGroup(NodeGroup("spot"), max_workers=3).configured_cap == 3


def test_a_negative_cap_is_refused_before_the_capacity_file_is_touched():
    with pytest.raises(ValueError, match=r"set_capacity\('spot', -1\): the cap is a node count, >= 0"):
        _cluster().set_capacity("spot", -1)


def test_scaling_to_a_negative_count_is_refused_naming_the_count():
    injector = Injector(_cluster())
    with pytest.raises(ValueError, match=r"scale_to\('spot', -1\): count is a node count, >= 0"):
        injector.scale_to("spot", -1)
    injector.close()
