"""The fast engine applies the cost cap as the policy does, run by run (on the policy engine's draws)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotfallback.config import CostCap, Ladder, Tier
from spotfallback.sim.job import JobSpec, wall_to_finish
from spotfallback.sim.simulate import simulate
from spotfallback.sim.world import RateModel
from tests.unit.test_simulator import assert_engines_agree, assert_same_runs, scenarios


@st.composite
def capped_scenarios(draw):
    """The engines' agreement scenarios, with a cost cap on some of the tiers above the last."""
    ladder, job, world, seed = draw(scenarios())
    work = float(wall_to_finish(job.work_h, job.tau_h, job.checkpoint_cost_h))
    tiers = list(ladder.tiers)
    for i in range(len(tiers) - 1):
        if draw(st.integers(0, 3)):  # mostly capped: the rule must fire often to be compared
            cap = CostCap(
                work_h=work * draw(st.sampled_from([0.6, 0.9, 1.0])),
                restart_h=draw(st.sampled_from([0.0, job.restart_overhead_h])),
                first_commit_h=draw(st.sampled_from([0.0, 0.5, 2.0])),
                factor=draw(st.sampled_from([1.0, 1.2])),
            )
            tiers[i] = tiers[i].model_copy(update={"cost_cap": cap})
    return Ladder(tiers=tuple(tiers)), job, world, seed


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(capped_scenarios())
def test_fast_engine_matches_policy_engine_with_cost_caps(scenario):
    assert_engines_agree(*scenario)


def test_fast_engine_matches_policy_engine_where_the_cost_cap_moves_runs():
    """A spot tier preempted often: the cap sends some runs to on-demand early, in both engines alike."""
    job = JobSpec(work_h=7.5, checkpoint_interval_h=0.3, checkpoint_cost_h=0.02, restart_overhead_h=0.1,
                  provisioning_delay_h=0.05, jit_checkpoint=False)
    cap = CostCap(work_h=float(wall_to_finish(7.5, 0.3, 0.02)), restart_h=0.1, first_commit_h=0.42)
    spot = Tier(name="spot", market="spot", num_workers=2, max_preemptions=-1, capacity_timeout_s=None,
                price_per_worker_hour=0.5, cost_cap=cap)
    ladder = Ladder(tiers=(spot, Tier.on_demand(2, price_per_worker_hour=1.0)))
    world = [RateModel(preemptions_per_node_hour=0.6), RateModel()]
    fast = simulate(ladder, job, world, runs=200, seed=1, engine="fast")
    assert_same_runs(fast, simulate(ladder, job, world, runs=200, seed=1, engine="policy"))
    free = simulate(Ladder(tiers=(spot.model_copy(update={"cost_cap": None}), ladder.tiers[1])), job, world, runs=200,
                    seed=1, engine="fast")
    assert (fast.final_tier == 1).sum() > (free.final_tier == 1).sum() == 0
