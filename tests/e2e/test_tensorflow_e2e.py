"""End to end on the local spot cluster: a Keras (MultiWorkerMirroredStrategy) job falls back and resumes exactly.

The TensorFlow twin of ``test_fallback_e2e``'s first test. One cluster for the module (a
head with no CPUs, two spot and two on-demand one-CPU nodes), shut down at the end.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tensorflow", reason="TensorFlow is the optional extra: pip install -e '.[tensorflow]'")

from tests.support.helpers_e2e import (  # noqa: E402
    SLOW_UNDER_LOAD,
    Background,
    checkpoints_since,
    kinds,
    local_cluster,
    unique_name,
    wait_for,
)

pytestmark = pytest.mark.ray

# 30 steps, a checkpoint every 5: long enough to preempt between checkpoints.
TF_CONFIG = {"total_steps": 30, "checkpoint_every": 5, "step_delay_s": 0.15, "seed": 7}


@pytest.fixture(scope="module")
def cluster():
    with local_cluster() as c:
        yield c


def make_trainer(storage, name, tiers, **config):
    import ray.train

    from spotfallback import FallbackTrainer
    from spotfallback.examples.keras_digits import train_fn

    # No backend argument: the example declares SPOTFALLBACK_BACKEND = "tensorflow".
    return FallbackTrainer(
        train_fn,
        train_loop_config={**TF_CONFIG, **config},
        tiers=tiers,
        run_config=ray.train.RunConfig(storage_path=str(storage), name=name),
    )


def run_kinds(records):
    """Ledger kinds without checkpoints and just-in-time records (a short notice may leave a 'missed' one)."""
    return [k for k in kinds(records) if k != "jit_checkpoint"]


def read_trace(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@SLOW_UNDER_LOAD
def test_keras_job_preempted_twice_falls_back_and_matches_uninterrupted_run(cluster, tmp_path):
    """The second preemption has a 6 s notice: the job saves a just-in-time checkpoint and loses no step."""
    from spotfallback import Tier
    from spotfallback.local import Injector

    # The uninterrupted reference, on on-demand.
    reference = make_trainer(tmp_path / "ref", unique_name("tf-ref"), [Tier.on_demand(2)], trace_file=str(tmp_path / "ref.jsonl"))
    assert reference.backend == "tensorflow"
    ref_result = reference.fit()
    assert ref_result.metrics["step"] == TF_CONFIG["total_steps"]
    assert ref_result.metrics["accuracy"] > 0.5, ref_result.metrics
    assert [a["start"] for a in read_trace(tmp_path / "ref.jsonl")] == [1]

    ladder = [
        Tier.spot(2, max_preemptions=1, capacity_timeout_s=60, price_per_worker_hour=0.9),
        Tier.on_demand(2, max_failures=3, price_per_worker_hour=3.06),
    ]
    trace = tmp_path / "fallback.jsonl"
    trainer = make_trainer(
        tmp_path / "run", unique_name("tf-fallback"), ladder, trace_file=str(trace), preemption_check_every=2
    )
    injector = Injector(cluster)
    try:
        driver = Background(trainer.fit)
        ledger = trainer.ledger
        wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 180, driver)
        injector.preempt_one("spot", notice_s=1.0)
        injector.replenish("spot")  # a replacement spot node: one preemption keeps the run on spot
        wait_for(
            ledger,
            lambda rs: run_kinds(rs)[-2:] == ["preempted", "workers_acquired"] and checkpoints_since(rs, "workers_acquired") >= 1,
            180,
            driver,
        )
        injector.preempt_one("spot", notice_s=6.0)
        result = driver.join(240)
        assert driver.error is None, driver.error
    finally:
        injector.give_back("spot")
        injector.replenish("spot")
        injector.close()

    records = ledger.read()
    assert run_kinds(records) == [
        "run_started", "workers_acquired", "preempted", "workers_acquired", "preempted", "workers_acquired", "finished",
    ]
    assert [r.tier for r in records if r.event.kind == "workers_acquired"] == [0, 0, 1]
    switch = [r for r in records if r.decision and r.decision["action"] == "switch_tier"]
    assert len(switch) == 1 and switch[0].decision["to_tier"] == 1

    # Each attempt started at the step after the last checkpoint committed before its preemption.
    committed_before = []
    last = 0
    for r in records:
        if r.event.kind == "checkpoint_committed":
            last = r.event.step
        elif r.event.kind == "preempted":
            committed_before.append(last)
    attempts = read_trace(trace)
    assert len(committed_before) == 2 and all(s > 0 for s in committed_before), committed_before
    assert [a["start"] for a in attempts] == [1, committed_before[0] + 1, committed_before[1] + 1], (attempts, committed_before)
    assert [a["restored"] for a in attempts] == [False, True, True]
    # The 6 s notice was enough: the last attempt resumed right after the just-in-time checkpoint.
    jit = [r.event for r in records if r.event.kind == "jit_checkpoint"]
    reported = [e.step for e in jit if e.outcome == "reported"]
    assert reported and attempts[2]["start"] == reported[-1] + 1, (jit, attempts)

    # Same final weights, bit for bit, as the run that never stopped.
    assert result.metrics["step"] == TF_CONFIG["total_steps"]
    assert result.metrics["weights_sha256"] == ref_result.metrics["weights_sha256"]
    assert result.metrics["accuracy"] == ref_result.metrics["accuracy"]
