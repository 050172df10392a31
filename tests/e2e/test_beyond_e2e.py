"""End to end beyond one-way fallback: climb back, an elastic spot tier, a preemption burst.

One cluster for the module: a head with no CPUs (driver and Train controller), three spot
and two on-demand one-CPU nodes. Capacity is observed every second after each checkpoint
(``SPOTFALLBACK_CAPACITY_POLL_S=1``) so the moves happen within the short runs. Each test
leaves the cluster as it found it: nodes taken away come back, nodes added go. Two tests of
the controller shell's own logic need no cluster.
"""

from __future__ import annotations

import itertools
import time

import pytest

pytest.importorskip("torch")

from tests.support.helpers_e2e import (  # noqa: E402
    SLOW_UNDER_LOAD,
    TRAIN_CONFIG,
    Background,
    checkpoints_since,
    kinds,
    local_cluster,
    restoring_injector,
    unique_name,
    wait_for,
)

pytestmark = pytest.mark.ray

# Long enough for a move and a restart after it: about 0.5 s a step here, as each report
# waits for the controller's poll (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.5).
STEPS = 100


@pytest.fixture(scope="module")
def cluster():
    from spotfallback.local import NodeGroup

    groups = [NodeGroup("spot", count=3), NodeGroup("on-demand", count=2)]
    with local_cluster(groups, env={"SPOTFALLBACK_CAPACITY_POLL_S": "1"}) as c:
        yield c


@pytest.fixture()
def injector(cluster):
    with restoring_injector(cluster) as inj:
        yield inj
    for group in cluster.groups.values():  # the newest nodes beyond the module's sizes
        for node in cluster.nodes(group=group.name)[group.count :]:
            cluster.remove_node(node, graceful=True)  # an idle node scaled down, not a failure


def make_trainer(storage, name, tiers, **config):
    import ray.train

    from spotfallback import FallbackTrainer
    from spotfallback.examples.ddp_digits import train_fn

    return FallbackTrainer(
        train_fn,
        train_loop_config={**TRAIN_CONFIG, "total_steps": STEPS, **config},
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


def committed_on(tier: int, commits: int):
    """A ledger condition: the run has committed ``commits`` checkpoints on ``tier`` since its gang there came up."""
    return lambda rs: checkpoints_since(rs, "workers_acquired", tier=tier) >= commits


def fall_then_climb_back(injector, trainer, driver, notice_s: float = 1.0, on_spot=committed_on(0, 1),
                         on_demand=committed_on(1, 2), linger_s: float = 0.0,
                         moves: tuple[str, ...] = ("switch_tier", "climb_back", "complete")):
    """The spot gang (all three spot nodes) is preempted with its budget spent, waits on on-demand while
    two spot nodes cannot hold it, and climbs back once the third is replenished: (records, result).

    ``on_spot`` / ``on_demand``: ledger conditions that say the run is on each, ``linger_s`` after them;
    ``moves``: the policy's decisions other than continue, in order.
    """
    ledger = trainer.ledger
    wait_for(ledger, on_spot, 120, driver)
    time.sleep(linger_s)
    injector.preempt_one("spot", notice_s=notice_s)
    wait_for(ledger, on_demand, 120, driver)
    time.sleep(linger_s)
    assert "climb_back" not in actions(ledger.read())  # two nodes cannot hold the spot gang
    injector.replenish("spot", count=1)
    result = driver.join(240)
    assert driver.error is None, driver.error
    records = ledger.read()
    assert actions(records) == list(moves)
    assert [tier for tier, _ in acquired(records)] == [0, 1, 0]
    return records, result


# ----------------------------------------------------------------- the controller shell, no cluster needed


def test_the_remaining_work_a_checkpoint_reports_reaches_the_policy_only_when_usable():
    from spotfallback.runtime.hooks import remaining_work

    assert remaining_work({"step": 5, "remaining_work_s": 90}) == 90.0
    for unusable in ({}, {"remaining_work_s": -1.0}, {"remaining_work_s": float("nan")}, {"remaining_work_s": True}, {"remaining_work_s": "90"}):
        assert remaining_work(unusable) is None


def test_the_autoscaler_is_asked_for_the_current_tiers_gang_on_its_nodes(tmp_path):
    """What Ray's coordinator forwards to the autoscaler follows the run down (and up) the ladder."""
    from dataclasses import replace

    from ray.train._internal.autoscaling_coordinator_client import build_train_resource_request
    from ray.train.v2.api.config import ScalingConfig

    from spotfallback import Tier
    from spotfallback.config import make_ladder
    from spotfallback.policy import FallbackPolicy
    from spotfallback.runtime.hooks import TierScalingPolicy
    from spotfallback.runtime.ladder import RunSpec
    from spotfallback.store.location import resolve_run

    ladder = make_ladder([Tier.spot((2, 4)), Tier.on_demand(2)])
    spec = RunSpec(
        key=unique_name("requests"),
        tiers=tuple(t.model_dump(mode="json") for t in ladder.tiers),
        state=FallbackPolicy(ladder).initial_state(),
        location=resolve_run(str(tmp_path), "requests"),
        writer="test",
    )
    policy = TierScalingPolicy(ScalingConfig(num_workers=4), spec)
    sent: list[tuple[list, list | None]] = []

    class Coordinator:  # records what Ray's client would send, in the form Ray sends it
        def send_resource_request(self, config, num_workers):
            sent.append(build_train_resource_request(config, num_workers))

        def maybe_send_resource_request(self, config, num_workers):
            pass  # Ray's client: at most every 20 s, the same request again

    policy._coordinator_client = Coordinator()
    policy._send_resource_request()  # the controller starts
    policy._maybe_send_resource_request()
    rt = policy._runtime()
    rt.state = replace(rt.state, tier=1)  # the run moved down the ladder
    policy._maybe_send_resource_request()
    spot, on_demand = {"ray.io/market-type": "spot"}, {"ray.io/market-type": "on-demand"}
    assert sent == [([{"CPU": 1.0}] * 4, [spot] * 4), ([{"CPU": 1.0}] * 2, [on_demand] * 2)]


# ----------------------------------------------------------------- on the cluster


@SLOW_UNDER_LOAD
def test_a_plain_local_cluster_is_not_taken_for_autoscaler_v1(cluster):
    """A head without an autoscaling config runs Ray's v1 monitor read-only: the climb's requests stay on."""
    import ray

    from spotfallback.runtime.autoscaler_version import (
        V1_STATUS_KEY,
        classify_autoscaler,
        kv_getter,
        v1_node_types,
    )

    get = kv_getter(ray.get_runtime_context().gcs_address)
    deadline = time.monotonic() + 60
    while not v1_node_types(get(V1_STATUS_KEY, None) or b"") and time.monotonic() < deadline:
        time.sleep(1)  # the monitor writes its status every few seconds
    assert v1_node_types(get(V1_STATUS_KEY, None) or b""), "Ray's read-only v1 monitor wrote no status"
    assert classify_autoscaler(get) == "none"


def test_spot_budget_spent_then_climbs_back_when_spot_returns_and_finishes_there(cluster, injector, tmp_path):
    from spotfallback import Tier
    from spotfallback.accounting import summarize

    ladder = [  # the spot gang takes all three spot nodes
        Tier.spot(3, max_preemptions=0, climb_back=True, min_dwell_s=2, price_per_worker_hour=0.9),
        Tier.on_demand(2, price_per_worker_hour=3.06),
    ]
    trainer = make_trainer(tmp_path, unique_name("climb"), ladder)
    records, result = fall_then_climb_back(injector, trainer, Background(trainer.fit))
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


def test_the_example_reports_the_work_left_at_its_own_pace_with_each_checkpoint(cluster, tmp_path):
    """What a deadline guard judges the run by: the steps left at this attempt's pace, none once done."""
    from spotfallback import Tier

    steps = 20
    trainer = make_trainer(tmp_path, unique_name("remaining"), [Tier.on_demand(2)], total_steps=steps,
                           remaining_work=True)
    result = trainer.fit()
    commits = [r.event for r in trainer.ledger.read() if r.event.kind == "checkpoint_committed"]
    assert [c.step for c in commits] == [5, 10, 15, 20]
    assert commits[-1].remaining_work_s == 0.0 and result.metrics["remaining_work_s"] == 0.0
    for c in commits[:-1]:  # each step takes its delay (0.15 s) and a wait for the controller's poll
        assert 0.15 < c.remaining_work_s / (steps - c.step) < 5.0


@SLOW_UNDER_LOAD
def test_a_guard_reserve_leaves_spot_early_and_pays_for_the_climb_back(cluster, injector, tmp_path):
    from spotfallback import Tier

    # 3 min of work due in 1 h, slack rule only, no budget and no timeout: after the preemption the guard
    # alone waits for spot (a retry), until the slack is down to the margin and the reserve, 180 s after
    # the start (no progress is reported, so the slack shrinks as time passes; a loaded 2-core CI has
    # taken over 90 s to reach the preemption, and then left at once). The lost node is not
    # replaced, so the run leaves for on-demand there. The climb back needs only the margin and two
    # restarts of slack, and spends the reserve: its gang is given the margin (2 min) to come up, where
    # the reserve alone would send the run straight back down.
    work_h, deadline_h, margin_h, leave_after_s = 0.05, 1.0, 120 / 3600, 180.0
    guard = {"deadline_h": deadline_h, "work_h": work_h, "pace": 0.0, "margin_h": margin_h,
             "reserve_h": round(deadline_h - work_h - margin_h - leave_after_s / 3600, 6)}
    ladder = [
        Tier.spot(3, max_preemptions=-1, capacity_timeout_s=None, climb_back=True, min_dwell_s=2,
                  deadline_guard=guard, price_per_worker_hour=0.9),
        Tier.on_demand(2, price_per_worker_hour=3.06),
    ]
    trainer = make_trainer(tmp_path, unique_name("reserve"), ladder)
    records, result = fall_then_climb_back(injector, trainer, Background(trainer.fit),
                                           moves=("retry", "switch_tier", "climb_back", "complete"))
    started = records[0].t
    switch = next(r for r in records if r.decision and r.decision["action"] == "switch_tier")
    assert switch.event.kind == "capacity_timed_out" and f"reserve_h={guard['reserve_h']:g}" in switch.decision["reason"]
    assert switch.t - started == pytest.approx(leave_after_s, abs=5.0)
    assert result.metrics["step"] == STEPS
    print_timeline(records)


@SLOW_UNDER_LOAD
def test_without_periodic_checkpoints_the_climb_back_asks_the_gang_for_one_and_loses_no_work(cluster, injector, tmp_path):
    from spotfallback import Tier

    ladder = [
        Tier.spot(3, max_preemptions=0, climb_back=True, min_dwell_s=2, price_per_worker_hour=0.9),
        Tier.on_demand(2, price_per_worker_hour=3.06),
    ]
    # Checkpoints only just in time: on the notice, and when the controller asks for one.
    trainer = make_trainer(tmp_path, unique_name("askclimb"), ladder, checkpoint_every=10**6,
                           preemption_check_every=1, preemption_answer_requests=True)
    driver = Background(trainer.fit)
    records, result = fall_then_climb_back(  # no checkpoints to wait for: some steps after each start
        injector, trainer, driver, 10.0, linger_s=5.0,
        on_spot=lambda rs: [t for t, _ in acquired(rs)] == [0],
        on_demand=lambda rs: [t for t, _ in acquired(rs)] == [0, 1],
    )
    decided = [r.decision["action"] if r.decision else None for r in records]
    switch, climb = decided.index("switch_tier"), decided.index("climb_back")
    back = max(i for i, r in enumerate(records) if r.event.kind == "workers_acquired")
    asked = [r for r in records[climb:back] if r.event.kind == "checkpoint_committed"]
    on_demand = [r for r in records[switch:climb] if r.event.kind == "checkpoint_committed"]
    assert len(asked) == 1 and not on_demand  # the one checkpoint on on-demand is the one the climb asked for
    # The steps on on-demand were kept: past the notice's checkpoint, or past step 0 where a loaded
    # machine let the preemption come before the notice's save could finish.
    jit = [r.event.step for r in records[:switch] if r.event.kind == "checkpoint_committed"]
    assert asked[0].event.step > max(jit, default=0)
    assert result.metrics["step"] == STEPS
    print_timeline(records)


@SLOW_UNDER_LOAD
def test_elastic_spot_tier_shrinks_on_a_lost_node_and_grows_back(cluster, injector, tmp_path):
    from spotfallback import Tier
    from spotfallback.accounting import summarize

    ladder = [
        Tier.spot((2, 4), max_preemptions=5, min_dwell_s=2, capacity_timeout_s=60, price_per_worker_hour=0.9),
        Tier.on_demand(2, price_per_worker_hour=3.06),
    ]
    injector.replenish("spot", count=1)  # a fourth spot node: the tier starts at its maximum
    # The global batch stays 48 whatever the world size: 12 per rank with 4, 16 with 3.
    trainer = make_trainer(tmp_path, unique_name("elastic"), ladder, global_batch_size=48)
    driver = Background(trainer.fit)
    ledger = trainer.ledger
    wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 120, driver)
    assert acquired(ledger.read()) == [(0, 4)]
    injector.preempt_one("spot", notice_s=1.0)  # not replaced: the gang goes on with three
    wait_for(ledger, lambda rs: len(acquired(rs)) == 2, 120, driver)
    injector.replenish("spot", count=1)  # capacity returns while the smaller gang trains
    result = driver.join(240)
    assert driver.error is None, driver.error

    records = ledger.read()
    print_timeline(records)
    assert acquired(records) == [(0, 4), (0, 3), (0, 4)]
    assert actions(records) == ["retry", "resize", "complete"]
    grow = next(i for i, r in enumerate(records) if r.decision and r.decision["action"] == "resize")
    assert records[grow].event.available_workers == 4 and records[grow].decision["num_workers"] == 4
    assert checkpoints_since(records[: grow + 1], "workers_acquired") >= 1  # three trained first
    # Every checkpoint's metrics: the world size and the per-rank batch the example chose.
    sizes = [(r.info["metrics"]["world_size"], r.info["metrics"]["batch_size"]) for r in records if r.event.kind == "checkpoint_committed"]
    assert [w for w, _ in itertools.groupby(w for w, _ in sizes)] == [4, 3, 4]
    assert {w * b for w, b in sizes} == {48}
    summary = summarize(trainer.ladder, records)
    assert summary.status == "finished" and summary.state.tier == 0 and summary.tiers[1].running_s == 0
    assert [(tier, n) for _, tier, n in summary.resizes] == [(0, 4)]
    worker_s = sum((end - start) * n for (_, start, end), n in zip(summary.segments, (4, 3, 4), strict=True))
    assert summary.tiers[0].spend == pytest.approx(worker_s / 3600 * 0.9)  # paid per worker placed
    assert summary.tiers[0].preemptions == 1
    assert result.metrics["step"] == STEPS and result.metrics["world_size"] == 4


@SLOW_UNDER_LOAD
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
