"""A simulated spot cluster on one machine and a fault injector for it (demo and tests).

``LocalSpotCluster`` starts real Ray nodes labelled like cloud capacity; ``Injector``
preempts (drain, then kill), kills, takes capacity away and replays availability traces.
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
