"""The short, CI-sized soak: one run of the example job under a replayed spot trace plus chaos.

A real availability trace (tests/fixtures copy of SkyPilot's us-west-2a V100 trace, one tick
every 6 s) preempts and restores the spot nodes while the driver is SIGKILLed once and storage
goes away once. The long version is ``python -m tests.soak --minutes 30`` (see tests/soak.py).
"""

from __future__ import annotations

import os
import random

import pytest

pytest.importorskip("torch")

from helpers_e2e import apply_env  # noqa: E402
from reliability import RUN_CONFIG, Outcome, record, reference_hash  # noqa: E402
from soak import FIXTURES, RETRY_S, soak_run  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    apply_env()
    os.environ["SPOTFALLBACK_STORAGE_RETRY_S"] = str(RETRY_S)
    from spotfallback.local import LocalSpotCluster, NodeGroup

    c = LocalSpotCluster([NodeGroup("spot", count=2), NodeGroup("on-demand", count=2)], connect=True)
    c.start()
    try:
        yield c
    finally:
        c.shutdown()
        os.environ.pop("SPOTFALLBACK_STORAGE_RETRY_S", None)


def test_short_trace_driven_chaos_soak(cluster, tmp_path_factory):
    config = dict(RUN_CONFIG)
    reference = reference_hash(tmp_path_factory.mktemp("ref"), config)
    result = soak_run(
        cluster,
        tmp_path_factory.mktemp("soak"),
        config,
        reference,
        trace=FIXTURES / "us-west-2a_v100_1.json",
        start_tick=1,  # 0, 0, 1, 1, 1, 1, 0, 0, 1: spot gone as soon as the run trains, back 12 s later, ...
        ticks=9,  # ... gone again at 36 s and back at 48 s; then capacity stays, so the run must finish
        rng=random.Random(3),
        driver_kills=1,
        storage_outages=1,
        timeout_s=400,
    )
    assert result.problems == [], result.problems
    assert result.finished and result.identical_weights
    assert result.events_lost == result.checkpoints_lost == result.duplicated_events == 0
    assert result.preemptions >= 1 and result.driver_kills == 1 and result.storage_outages == 1
    record(
        Outcome(
            "trace-driven chaos soak (CI, short)",
            injected=result.injected,
            runs_completed=1,
            runs=1,
            steps_redone=result.steps_redone,
            events_lost=result.events_lost,
            checkpoints_lost=result.checkpoints_lost,
            duplicated_events=result.duplicated_events,
            seconds=result.seconds,
            notes=f"{result.preemptions} preemptions, {result.capacity_gaps} capacity gaps, 1 driver kill, 1 storage outage",
        )
    )
