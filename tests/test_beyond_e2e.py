"""End to end beyond one-way fallback: climb back, an elastic spot tier, a preemption burst.

One cluster for the module: a head with no CPUs (driver and Train controller), three spot
and two on-demand one-CPU nodes. Capacity is observed every second after each checkpoint
(``SPOTFALLBACK_CAPACITY_POLL_S=1``) so the moves happen within the short runs. Each test
restores the capacity it takes away.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from helpers_e2e import (  # noqa: E402
    TRAIN_CONFIG,
    Background,
    apply_env,
    checkpoints_since,
    kinds,
    unique_name,
    wait_for,
)

pytestmark = pytest.mark.ray

STEPS = 100  # long enough for a move and a restart after it; 0.15 s a step


@pytest.fixture(scope="module")
def cluster():
    apply_env()
    os.environ["SPOTFALLBACK_CAPACITY_POLL_S"] = "1"
    from spotfallback.local import LocalSpotCluster, NodeGroup

    c = LocalSpotCluster([NodeGroup("spot", count=3), NodeGroup("on-demand", count=2)], connect=True)
    c.start()
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture()
def injector(cluster):
    from spotfallback.local import Injector

    inj = Injector(cluster)
    try:
        yield inj
    finally:
        for market in ("spot", "on-demand"):
            inj.give_back(market)
            inj.replenish(market)
        inj.close()


def make_trainer(storage, name, tiers):
    import ray.train
    from examples.ddp_digits import train_fn

    from spotfallback import FallbackTrainer

    return FallbackTrainer(
        train_fn,
        train_loop_config={**TRAIN_CONFIG, "total_steps": STEPS},
        tiers=tiers,
        run_config=ray.train.RunConfig(storage_path=str(storage), name=name),
    )


def acquired(records) -> list[tuple[int, int]]:
    return [(r.tier, r.event.num_workers) for r in records if r.event.kind == "workers_acquired"]


def print_timeline(records) -> None:
    """Seconds from the start for each event but checkpoints (shown with pytest -s)."""
    t0 = records[0].t
    print(" ".join(f"{r.event.kind}@{r.t - t0:.1f}" for r in records if r.event.kind != "checkpoint_committed"))


def actions(records) -> list[str]:
    return [r.decision["action"] for r in records if r.decision and r.decision["action"] != "continue"]


def test_spot_budget_spent_then_climbs_back_when_spot_returns_and_finishes_there(cluster, injector, tmp_path):
    from spotfallback import Tier
    from spotfallback.accounting import summarize

    ladder = [  # the spot gang takes all three spot nodes
        Tier.spot(3, max_preemptions=0, climb_back=True, min_dwell_s=2, price_per_worker_hour=0.9),
        Tier.on_demand(2, price_per_worker_hour=3.06),
    ]
    trainer = make_trainer(tmp_path, unique_name("climb"), ladder)
    driver = Background(trainer.fit)
    ledger = trainer.ledger
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 120, driver)
    injector.preempt_one("spot", notice_s=1.0)  # budget spent, and two spot nodes are left
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=1) >= 2, 120, driver)
    assert "climb_back" not in actions(ledger.read())  # two nodes cannot hold the spot gang
    injector.replenish("spot", count=1)
    result = driver.join(240)
    assert driver.error is None, driver.error

    records = ledger.read()
    assert actions(records) == ["switch_tier", "climb_back", "complete"]
    assert [tier for tier, _ in acquired(records)] == [0, 1, 0]
    climb = next(r for r in records if r.event.kind == "capacity_observed")
    assert (climb.tier, climb.event.tier, climb.event.available_workers) == (1, 0, 3)
    summary = summarize(trainer.ladder, records)
    assert summary.status == "finished" and summary.state.tier == 0
    assert [(f, t) for _, f, t in summary.climbs] == [(1, 0)]
    assert [seg[0] for seg in summary.segments] == [0, 1, 0]
    spot_s = sum(end - start for tier, start, end in summary.segments if tier == 0)
    assert summary.tiers[0].running_s == pytest.approx(spot_s)
    assert summary.tiers[0].spend == pytest.approx(spot_s / 3600 * 3 * 0.9)
    assert summary.tiers[1].spend > 0 and summary.spend == pytest.approx(summary.tiers[0].spend + summary.tiers[1].spend)
    assert result.metrics["step"] == STEPS
    print_timeline(records)


@pytest.mark.slow
def test_elastic_spot_tier_shrinks_on_a_lost_node_and_grows_back(cluster, injector, tmp_path):
    from spotfallback import Tier
    from spotfallback.accounting import summarize

    ladder = [
        Tier.spot((2, 4), max_preemptions=5, min_dwell_s=2, capacity_timeout_s=60, price_per_worker_hour=0.9),
        Tier.on_demand(2, price_per_worker_hour=3.06),
    ]
    trainer = make_trainer(tmp_path, unique_name("elastic"), ladder)
    driver = Background(trainer.fit)
    ledger = trainer.ledger
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 120, driver)
    injector.preempt_one("spot", notice_s=1.0)  # not replaced: the gang goes on with two
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 2 and acquired(rs)[-1][1] == 2, 120, driver)
    injector.replenish("spot", count=1)
    result = driver.join(240)
    assert driver.error is None, driver.error

    records = ledger.read()
    assert acquired(records) == [(0, 3), (0, 2), (0, 3)]  # the cluster holds three spot nodes
    assert actions(records) == ["retry", "resize", "complete"]
    summary = summarize(trainer.ladder, records)
    assert summary.status == "finished" and summary.state.tier == 0 and summary.tiers[1].running_s == 0
    assert [(tier, n) for _, tier, n in summary.resizes] == [(0, 3)]
    worker_s = sum((end - start) * n for (_, start, end), n in zip(summary.segments, (3, 2, 3), strict=True))
    assert summary.tiers[0].spend == pytest.approx(worker_s / 3600 * 0.9)  # paid per worker placed
    assert summary.tiers[0].preemptions == 1
    assert result.metrics["step"] == STEPS
    print_timeline(records)


def test_a_burst_of_preemptions_moves_down_before_the_count_budget_is_spent(cluster, injector, tmp_path):
    from spotfallback import Tier
    from spotfallback.accounting import summarize

    ladder = [
        Tier.spot(2, max_preemptions=5, max_preemption_rate={"count": 2, "window_s": 300}, price_per_worker_hour=0.9),
        Tier.on_demand(2, price_per_worker_hour=3.06),
    ]
    trainer = make_trainer(tmp_path, unique_name("burst"), ladder)
    driver = Background(trainer.fit)
    ledger = trainer.ledger
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 120, driver)
    injector.preempt_one("spot", notice_s=1.0)  # the third spot node takes the restart
    wait_for(ledger, lambda rs: kinds(rs)[-2:] == ["preempted", "workers_acquired"] and checkpoints_since(rs, "workers_acquired") >= 1, 120, driver)
    injector.preempt_one("spot", notice_s=1.0)
    result = driver.join(240)
    assert driver.error is None, driver.error

    records = ledger.read()
    assert actions(records) == ["retry", "switch_tier", "complete"]
    switch = next(r for r in records if r.decision and r.decision["action"] == "switch_tier")
    assert "preemption rate" in switch.decision["reason"]
    summary = summarize(trainer.ladder, records)
    assert summary.tiers[0].preemptions == 2 < 5 and summary.state.tier == 1 and summary.status == "finished"
    assert result.metrics["step"] == STEPS
    print_timeline(records)
