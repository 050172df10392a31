"""A simulated spot cluster on one machine and a fault injector for it (demo and tests).

``LocalSpotCluster`` starts real Ray nodes labelled like cloud capacity ahead of time;
``autoscaling.LocalAutoscalingCluster`` lets Ray's own autoscaler launch them on request,
after a provisioning delay and within a capacity cap, as a cloud does. ``Injector`` preempts
(drain, then kill), kills, takes capacity away and replays availability traces on either (on
the autoscaled one, capacity changes are caps).
"""

from spotfallback.local.cluster import (
    GROUP_LABEL,
    MARKET_LABEL,
    REGION_LABEL,
    ZONE_LABEL,
    LocalNode,
    LocalSpotCluster,
    NodeGroup,
    NodeStatus,
)
from spotfallback.local.injector import Injection, Injector, Replay

__all__ = [
    "GROUP_LABEL",
    "MARKET_LABEL",
    "REGION_LABEL",
    "ZONE_LABEL",
    "Injection",
    "Injector",
    "LocalNode",
    "LocalSpotCluster",
    "NodeGroup",
    "NodeStatus",
    "Replay",
]
