"""End to end on Ray's autoscaler: fallback on preemptions, capacity timeouts, user bugs.

One autoscaled local cluster for the module: a head with no CPUs (driver and Train controller),
and two node types kept at two one-CPU nodes each, spot and on-demand, as node pools are.
Preempted nodes are replaced by the autoscaler while the cap allows; the injector takes a
market's capacity by capping it at 0. Each test restores the capacity it takes away.
"""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch")

from tests.support.helpers_e2e import (  # noqa: E402
    SLOW_UNDER_LOAD,
    TRAIN_CONFIG,
    Background,
    at_full_speed,
    autoscaled_cluster,
    checkpoints_since,
    kinds,
    restoring_injector,
    unique_name,
    wait_for,
)

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    with autoscaled_cluster() as c:
        yield c


@pytest.fixture()
def injector(cluster):
    with restoring_injector(cluster) as inj:
        yield inj


def make_trainer(storage, name, tiers, **config):
    import ray.train

    from spotfallback import FallbackTrainer
    from spotfallback.examples.ddp_digits import train_fn

    return FallbackTrainer(
        train_fn,
        train_loop_config={**TRAIN_CONFIG, **config},
        tiers=tiers,
        run_config=ray.train.RunConfig(storage_path=str(storage), name=name),
    )


@pytest.fixture(scope="module")
def reference_hash(cluster, tmp_path_factory):
    """Final weights of the job run with no interruption at all."""
    from spotfallback import Tier

    trainer = make_trainer(tmp_path_factory.mktemp("ref"), unique_name("ref"), [Tier.on_demand(2)],
                           **at_full_speed(TRAIN_CONFIG))
    result = trainer.fit()
    assert result.metrics["step"] == TRAIN_CONFIG["total_steps"]
    return result.metrics["weights_sha256"]


@SLOW_UNDER_LOAD
def test_two_preemptions_fall_back_to_on_demand_with_bit_identical_weights(cluster, injector, reference_hash, tmp_path):
    from spotfallback import Tier
    from spotfallback.accounting import summarize

    ladder = [
        Tier.spot(2, max_preemptions=1, capacity_timeout_s=60, price_per_worker_hour=0.9),
        Tier.on_demand(2, max_failures=3, price_per_worker_hour=3.06),
    ]
    trainer = make_trainer(tmp_path, unique_name("fallback"), ladder)
    driver = Background(trainer.fit)
    ledger = trainer.ledger

    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 120, driver)
    injector.preempt_one("spot", notice_s=1.0)
    # The autoscaler replaces the spot node (no replenish needed): the run stays on spot after one preemption.
    wait_for(ledger, lambda rs: kinds(rs)[-2:] == ["preempted", "workers_acquired"] and checkpoints_since(rs, "workers_acquired") >= 1, 120, driver)
    injector.preempt_one("spot", notice_s=1.0)
    result = driver.join(240)
    assert driver.error is None, driver.error

    records = ledger.read()
    assert kinds(records) == [
        "run_started", "workers_acquired", "preempted", "workers_acquired", "preempted", "workers_acquired", "finished",
    ]
    switch = [r for r in records if r.decision and r.decision["action"] == "switch_tier"]
    assert len(switch) == 1 and switch[0].decision["to_tier"] == 1
    assert [r.tier for r in records if r.event.kind == "workers_acquired"] == [0, 0, 1]
    summary = summarize(trainer.ladder, records)
    assert summary.tiers[0].preemptions == 2 and summary.state.tier == 1 and summary.status == "finished"
    # Resumed from the latest checkpoint, and bit-identical to the run that never stopped.
    assert result.metrics["step"] == TRAIN_CONFIG["total_steps"]
    assert result.metrics["weights_sha256"] == reference_hash


def test_capacity_timeout_moves_to_next_tier_within_margin(cluster, injector, reference_hash, tmp_path):
    from spotfallback import Tier

    injector.take_capacity("spot")
    timeout = 8.0
    trainer = make_trainer(
        tmp_path, unique_name("captimeout"), [Tier.spot(2, capacity_timeout_s=timeout), Tier.on_demand(2)]
    )
    result = trainer.fit()
    records = trainer.ledger.read()
    assert kinds(records) == ["run_started", "capacity_timed_out", "workers_acquired", "finished"]
    started, timed_out = records[0].t, records[1].t
    # Never before its timeout. The stated margin (left within 5 s of it) is measured by the
    # benchmark on a quiet machine (docs/benchmarks.md, figure 4); here the wait is cut at the
    # deadline, and what remains is Ray starting the Train controller and workers, which takes
    # half a minute when both workers of a loaded 2-core CI run clusters.
    assert timeout - 0.5 <= timed_out - started <= timeout + 30.0, timed_out - started
    assert records[2].tier == 1
    assert result.metrics["weights_sha256"] == reference_hash


@SLOW_UNDER_LOAD
def test_every_tier_unavailable_ends_with_clear_error_and_keeps_checkpoints(cluster, injector, tmp_path):
    from spotfallback import Tier
    from spotfallback.errors import LadderExhaustedError

    name = unique_name("exhausted")
    ladder = [
        Tier.spot(2, name="spot-a", max_preemptions=3, capacity_timeout_s=4),
        Tier.on_demand(2, capacity_timeout_s=4),
    ]
    trainer = make_trainer(tmp_path, name, ladder)
    driver = Background(trainer.fit)
    wait_for(trainer.ledger, lambda rs: checkpoints_since(rs, "workers_acquired") >= 1, 120, driver)
    injector.take_capacity("on-demand", notice_s=None)
    injector.take_capacity("spot", notice_s=0.0)
    driver.join(120)
    assert isinstance(driver.error, LadderExhaustedError), driver.error
    message = str(driver.error)
    assert "spot-a" in message and "on-demand" in message and "capacity_timeout_s=4" in message
    checkpoints = sorted(p for p in os.listdir(tmp_path / name) if p.startswith("checkpoint_"))
    assert checkpoints, "checkpoints must survive the run giving up"

    # Capacity returns: the run resumes from its checkpoint when asked to, and finishes. The
    # resumed driver may change a tier's settings (not its name): spot now waits longer.
    injector.give_back("spot")
    deadline = time.monotonic() + 60
    while len(cluster.nodes("spot")) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    before = time.time()
    resumed = make_trainer(tmp_path, name, [ladder[0].model_copy(update={"capacity_timeout_s": 120}), ladder[1]])
    resumed.retry_failed = True
    result = resumed.fit()
    assert result.metrics["step"] == TRAIN_CONFIG["total_steps"]
    assert set(checkpoints) <= set(os.listdir(tmp_path / name))
    assert any(r.event.kind == "run_started" and r.event.reset and r.t >= before for r in resumed.ledger.read())


@SLOW_UNDER_LOAD
def test_application_error_is_retried_on_spot_and_raised_never_moved(cluster, tmp_path):
    from spotfallback import Tier

    trainer = make_trainer(
        tmp_path,
        unique_name("apperror"),
        [Tier.spot(2, max_failures=2), Tier.on_demand(2)],
        raise_at_step=7,
    )
    with pytest.raises(ValueError, match="injected application error at step 7") as info:
        trainer.fit()
    assert any("max_failures=2" in note for note in getattr(info.value, "__notes__", []))
    records = trainer.ledger.read()
    assert [r.event.kind for r in records if r.event.kind == "application_failed"] == ["application_failed"] * 3
    assert all(r.tier == 0 for r in records)
    assert not any(r.decision and r.decision["action"] == "switch_tier" for r in records)
    assert records[-1].decision["action"] == "give_up" and records[-1].decision["cause"] == "application"


@SLOW_UNDER_LOAD
def test_driver_sigkill_after_tier_switch_resumes_on_the_right_tier(cluster, injector, reference_hash, tmp_path):
    """`kill -9` the driver mid-run, run the same command again: same tier, same counts, same weights."""
    import json
    import signal
    import subprocess
    import sys

    import yaml

    from spotfallback.accounting import summarize
    from spotfallback.config import JobConfig
    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import resolve_run
    from tests.support.helpers_e2e import REPO

    name = unique_name("driverkill")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({
        "name": name,
        "storage_path": str(tmp_path / "runs"),
        "entrypoint": "spotfallback.examples.ddp_digits:train_fn",
        "train_loop_config": TRAIN_CONFIG,
        "ray_address": cluster.address,
        "tiers": [
            {"name": "spot", "market": "spot", "num_workers": 2, "max_preemptions": 0, "capacity_timeout_s": 60},
            {"name": "on-demand", "market": "on-demand", "num_workers": 2},
        ],
    }))
    job = JobConfig.from_yaml(job_file)
    ledger = Ledger(resolve_run(job.storage_path, job.name))
    command = [sys.executable, "-m", "spotfallback.cli", "run", str(job_file)]

    def start(tag: str) -> subprocess.Popen:
        out = open(tmp_path / f"{tag}.out", "w")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)

    first = start("first")
    try:
        wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 120)
        injector.preempt_one("spot", notice_s=1.0)
        wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=1) >= 1, 120)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()

    second = start("second")
    try:
        n_before = len(ledger.read())
        wait_for(ledger, lambda rs: len(rs) > n_before and any(r.event.kind == "run_started" for r in rs[n_before:]), 60)
        # A second live driver on the same run is refused with a clear error.
        third = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert third.returncode == 5, third.stderr
        assert "another driver is running this run" in third.stderr
        assert second.wait(300) == 0, (tmp_path / "second.out").read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()

    final = json.loads((tmp_path / "second.out").read_text().strip().splitlines()[-1])
    assert final["status"] == "finished"
    assert final["metrics"]["weights_sha256"] == reference_hash

    records = ledger.read()
    starts = [i for i, r in enumerate(records) if r.event.kind == "run_started"]
    assert len(starts) == 2 and records[starts[1]].event.previous_seen is not None
    resumed = records[starts[1]:]
    assert all(r.tier == 1 for r in resumed), "the resumed driver must stay on the tier the ledger says"
    summary = summarize(job.ladder, records)
    assert summary.status == "finished" and summary.tiers[0].preemptions == 1 and summary.state.tier == 1
