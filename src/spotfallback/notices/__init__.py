"""Preemption notices: cloud metadata -> Ray node drain -> just-in-time checkpoint.

``agent``: ``NoticeAgent`` and the AWS / GCP / Azure / Kubernetes pollers behind
``spotfallback notice-agent``. ``drain``: the one drain call shared with the local injector.
``health``: each agent's health record in the run's storage, which `spotfallback status` shows.
``jit``: ``PreemptionWatch`` for training functions. ``requests``: the controller's checkpoint requests
that a watch with ``answer_requests`` answers. Nothing here imports Ray at import time.
"""

from spotfallback.notices.agent import LedgerRecorder, NoticeAgent, RayDrain
from spotfallback.notices.drain import drain_for_preemption
from spotfallback.notices.health import AgentHealth, AgentState, HealthReporter, read_agents
from spotfallback.notices.jit import PreemptionWatch, jit_failure_config, missed_jit_checkpoints
from spotfallback.notices.metadata import (
    AwsPoller,
    AzurePoller,
    GcpPoller,
    Notice,
    PollResult,
    SigtermPoller,
    detect_cloud,
    make_poller,
)
from spotfallback.notices.requests import CheckpointRequest, CheckpointRequests
from spotfallback.notices.runlog import RunLog

__all__ = [
    "AgentHealth",
    "AgentState",
    "AwsPoller",
    "AzurePoller",
    "CheckpointRequest",
    "CheckpointRequests",
    "GcpPoller",
    "HealthReporter",
    "LedgerRecorder",
    "Notice",
    "NoticeAgent",
    "PollResult",
    "PreemptionWatch",
    "RayDrain",
    "RunLog",
    "SigtermPoller",
    "detect_cloud",
    "drain_for_preemption",
    "jit_failure_config",
    "make_poller",
    "missed_jit_checkpoints",
    "read_agents",
]
