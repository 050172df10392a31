"""An injector on a cluster Ray's autoscaler runs: node faults only; capacity is the cloud's cap.

No cluster is started: these are the refusals, which must come before anything is touched.
The faults themselves run on a real autoscaled cluster in the demo (``spotfallback demo``,
run by the wheel smoke test) and in ``tests/e2e/test_autoscaled_climb_back.py``.
"""

from __future__ import annotations

import pytest

from spotfallback.local import Injector, NodeGroup
from spotfallback.local.autoscaling import AutoscaledGroup, LocalAutoscalingCluster


def _cluster() -> LocalAutoscalingCluster:
    return LocalAutoscalingCluster([AutoscaledGroup(NodeGroup("spot"), max_workers=2)])


def test_automatic_replacement_is_the_autoscalers_job_and_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="replace_after_s.*leave replace_after_s unset"):
        Injector(_cluster(), replace_after_s=1.0)


@pytest.mark.parametrize(
    "change",
    [
        lambda inj: inj.take_capacity("spot"),
        lambda inj: inj.replenish("spot"),
        lambda inj: inj.replay_spot_trace("unused.csv", group="spot"),
    ],
    ids=["take_capacity", "replenish", "replay"],
)
def test_capacity_changes_name_the_caps_instead(change):
    injector = Injector(_cluster())
    with pytest.raises(TypeError, match=r"cluster\.set_capacity\(group, cap\)"):
        change(injector)
    assert injector.log == []  # nothing was recorded, nothing touched
    injector.close()
