"""The short, CI-sized soak: one run of the example job under a replayed spot trace plus chaos.

A real availability trace (tests/fixtures copy of SkyPilot's us-west-2a V100 trace, one tick
every 9 s) sets the spot capacity of a cluster on Ray's autoscaler: it preempts the spot nodes
above the cap and lets the autoscaler launch them again, including a capacity gap longer than
the spot tier's capacity timeout, while the S3 endpoint goes away once and the driver is
SIGKILLed as the run moves to on-demand. The long version is
``python -m tests.support.soak --minutes 10`` (see tests/support/soak.py).
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")

from tests.support.helpers_e2e import SLOW_UNDER_LOAD, autoscaled_cluster  # noqa: E402
from tests.support.reliability import RUN_CONFIG, Outcome, record, reference_hash  # noqa: E402
from tests.support.soak import CAPACITY_TIMEOUT_S, FIXTURES, RETRY_S, soak_run  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster(s3):
    # On Ray's autoscaler: the trace sets the spot cap tick by tick, the autoscaler launches
    # nodes up to it (the node types are kept at two nodes each, as node pools are).
    with autoscaled_cluster(env={"SPOTFALLBACK_STORAGE_RETRY_S": str(RETRY_S)}) as c:
        yield c


@SLOW_UNDER_LOAD
def test_short_trace_driven_chaos_soak(cluster, s3, tmp_path_factory):
    config = dict(RUN_CONFIG)
    reference = reference_hash(tmp_path_factory.mktemp("ref"), config)
    result = soak_run(
        cluster,
        s3,
        tmp_path_factory.mktemp("soak"),
        config,
        reference,
        trace=FIXTURES / "us-west-2a_v100_1.json",
        # Ticks 21-30 of the trace, 9 s each: 0, 1, 0 x 7, 1. Spot is gone as soon as the run
        # trains, back 9 s later, then gone for 63 s: past the spot tier's 20 s capacity timeout
        # even when, on a loaded machine, the gang's restart on the short-lived nodes and its
        # failure there take half a minute before the wait starts, so the run must move to
        # on-demand to finish (at 6 s a tick, 42 s of gap, the wait sometimes never timed out).
        start_tick=21,
        ticks=10,
        tick_s=9.0,
        rng=random.Random(3),
        driver_kills=1,
        # The driver dies as the run leaves spot for on-demand, not inside the gap: a new
        # driver would wait its own full capacity timeout, past the gap's end.
        kill_on="capacity_timed_out",
        storage_outages=1,
        timeout_s=400,
    )
    assert result.problems == [], result.problems
    assert result.finished and result.identical_weights
    assert result.events_lost == result.checkpoints_lost == result.duplicated_events == 0
    assert result.preemptions >= 1 and result.driver_kills == 1 and result.storage_outages == 1
    assert result.capacity_gaps >= 1 and result.capacity_timeouts >= 1 and result.tier_moves == 1, result
    record(
        Outcome(
            "trace-driven chaos soak (CI, short, on S3)",
            injected=result.injected,
            runs_completed=1,
            runs=1,
            steps_redone=result.steps_redone,
            events_lost=result.events_lost,
            checkpoints_lost=result.checkpoints_lost,
            duplicated_events=result.duplicated_events,
            seconds=result.seconds,
            notes=f"{result.preemptions} preemptions, {result.capacity_gaps} capacity gaps "
            f"({result.capacity_timeouts} past the {CAPACITY_TIMEOUT_S:g} s capacity timeout: moved to on-demand), "
            "1 driver kill, 1 S3 outage",
        )
    )
