"""What FallbackTrainer refuses before it ever starts Ray: clear errors, nothing lost."""

from __future__ import annotations

import os

import pytest
import ray.train

from spotfallback import FallbackTrainer, Tier
from spotfallback.errors import ConfigError, RunAlreadyFinishedError, RunFailedError
from spotfallback.events import Finished, NodeFailed, RunStarted, WorkersAcquired


def noop(config):
    pass


LADDER = [Tier.spot(1, max_preemptions=0, max_failures=0), Tier.on_demand(1, max_failures=0)]


def trainer(tmp_path, name="run", tiers=LADDER, **kw):
    return FallbackTrainer(noop, tiers=tiers, run_config=ray.train.RunConfig(storage_path=str(tmp_path), name=name), lease_ttl_s=5, **kw)


def seed_ledger(t: FallbackTrainer, events) -> None:
    t.ledger.ensure_dirs()
    t.ledger.write_meta(t.ladder)
    state = t.policy.initial_state()
    for e in events:
        step = t.policy.decide(state, e)
        t.ledger.append(e, state.tier, step.decision.to_json())
        state = step.state


def test_a_finished_run_is_not_silently_resumed(tmp_path):
    t = trainer(tmp_path)
    seed_ledger(t, [RunStarted(1), WorkersAcquired(2), Finished(3)])
    before = sorted(os.listdir(t.ledger.directory))
    with pytest.raises(RunAlreadyFinishedError, match="already finished.*new run name"):
        t.fit()
    assert sorted(os.listdir(t.ledger.directory)) == before  # nothing written, nothing lost


def test_a_failed_run_resumes_only_when_asked(tmp_path):
    t = trainer(tmp_path)
    seed_ledger(t, [RunStarted(1), NodeFailed(2), NodeFailed(3)])
    with pytest.raises(RunFailedError, match="retry_failed=True"):
        t.fit()


def test_resuming_with_another_ladder_is_refused(tmp_path):
    t = trainer(tmp_path)
    seed_ledger(t, [RunStarted(1)])
    other = trainer(tmp_path, tiers=[Tier.on_demand(1, name="od-only")])
    with pytest.raises(ConfigError, match="tiers: run .* was started with tiers"):
        other.fit()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tiers": []}, "tiers: the ladder is empty"),
        ({"tiers": [Tier.spot(1)], "run_config": ray.train.RunConfig(storage_path="/tmp", name="../x")}, "name: run name"),
        ({"tiers": [Tier.spot(1)], "backend": "jax"}, "backend: 'jax' .*is not supported"),
    ],
)
def test_bad_arguments_name_the_field(tmp_path, kwargs, match):
    kwargs.setdefault("run_config", ray.train.RunConfig(storage_path=str(tmp_path), name="ok"))
    with pytest.raises(ConfigError, match=match):
        FallbackTrainer(noop, **kwargs)


def test_a_ray_generated_name_warns_that_the_run_cannot_resume(tmp_path, caplog):
    FallbackTrainer(noop, tiers=[Tier.spot(1)], run_config=ray.train.RunConfig(storage_path=str(tmp_path)))
    assert "will not find this run" in caplog.text


def test_preflight_refuses_before_anything_starts_and_writes_nothing(tmp_path):
    from spotfallback.errors import DriverAlreadyRunningError
    from spotfallback.store.lease import DriverLease

    t = trainer(tmp_path)
    t.preflight()  # a new run: nothing to refuse, and nothing written
    assert not os.path.exists(t.location.run_dir)
    seed_ledger(t, [RunStarted(1), WorkersAcquired(2), Finished(3)])
    before = sorted(os.listdir(t.location.state_dir))
    with pytest.raises(RunAlreadyFinishedError):
        t.preflight()
    with pytest.raises(ConfigError, match="was started with tiers"):
        trainer(tmp_path, tiers=[Tier.on_demand(1, name="od-only")]).preflight()
    other = trainer(tmp_path, name="live")
    seed_ledger(other, [RunStarted(1)])
    with DriverLease(other.location, ttl_s=30), \
            pytest.raises(DriverAlreadyRunningError, match="another driver is running this run"):
        trainer(tmp_path, name="live").preflight()  # the lease holder is another driver, alive
    assert sorted(os.listdir(t.location.state_dir)) == before


def test_the_run_keeps_its_plan_and_progress_total_for_status_and_report(tmp_path):
    from spotfallback.config import PlanPrediction

    plan = PlanPrediction(spend=12.5, wall_h=3.0, deadline_h=5.0, made_with="trace aws-spot, 200 runs")
    t = FallbackTrainer(noop, train_loop_config={"total_steps": 60, "lr": 0.1, "num_epochs": True},
                        tiers=LADDER, run_config=ray.train.RunConfig(storage_path=str(tmp_path), name="p"), plan=plan)
    t.ledger.ensure_dirs()
    t._check_stored_ladder()
    meta = t.ledger.read_meta()
    assert PlanPrediction.model_validate(meta["plan"]) == plan
    assert meta["progress_totals"] == {"total_steps": 60}  # a bool is no total
    # A run started before its job file had a plan gets it on the next accepted start; a plan
    # already recorded is never replaced.
    bare = trainer(tmp_path, name="bare")
    bare.ledger.ensure_dirs()
    bare._check_stored_ladder()
    assert "plan" not in bare.ledger.read_meta()
    later = trainer(tmp_path, name="bare", plan=plan)
    later._complete_meta()
    assert later.ledger.read_meta()["plan"]["spend"] == 12.5
    trainer(tmp_path, name="bare", plan=plan.model_copy(update={"spend": 99.0}))._complete_meta()
    assert later.ledger.read_meta()["plan"]["spend"] == 12.5


def test_from_yaml_builds_the_trainer_the_run_command_would(tmp_path):
    (tmp_path / "mytrain.py").write_text("def train_fn(config):\n    pass\n")
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: y1\nstorage_path: {tmp_path / 'runs'}\nentrypoint: {tmp_path / 'mytrain.py'}:train_fn\n"
        "train_loop_config: {total_steps: 7}\nplan: {spend: 1.5, wall_h: 0.5}\n"
        "tiers:\n  - {name: spot, market: spot, num_workers: 2, max_preemptions: 1}\n"
        "  - {name: on-demand, market: on-demand, num_workers: 1}\n"
    )
    t = FallbackTrainer.from_yaml(job, retry_failed=True)
    assert t.train_loop_per_worker.__name__ == "train_fn" and t.train_loop_config == {"total_steps": 7}
    assert [x.name for x in t.ladder.tiers] == ["spot", "on-demand"] and t.ladder[0].max_preemptions == 1
    assert t.location.uri() == f"{tmp_path / 'runs'}/y1" and t.retry_failed and t.plan.spend == 1.5
    job.write_text(job.read_text().replace("train_fn\n", "missing_fn\n", 1))
    with pytest.raises(ConfigError, match="entrypoint: module 'mytrain' has no function 'missing_fn'"):
        FallbackTrainer.from_yaml(job)


def test_a_relative_storage_path_reaches_rays_controller_as_the_absolute_one(tmp_path, monkeypatch):
    """`storage_path: ./runs` (the `spotfallback init` default) once failed in Ray's controller."""
    from spotfallback.store.retry import ray_run_config

    monkeypatch.chdir(tmp_path)
    t = FallbackTrainer(noop, tiers=LADDER, run_config=ray.train.RunConfig(storage_path="./runs", name="rel"))
    handed = ray_run_config(t.run_config, t.location)  # what the controller gets
    storage = handed.storage_context  # what the controller builds first (pyarrow.fs.FileSystem.from_uri)
    assert storage.storage_fs_path == str(tmp_path / "runs") == t.location.storage_path
    assert t.location.uri() == str(tmp_path / "runs" / "rel")


def test_a_plan_given_as_a_mapping_is_read_as_the_plans_prediction_or_refused_by_name(tmp_path):
    """A job file's plan: is a mapping; given as one in Python it failed inside fit(), after the lease."""
    from spotfallback.config import PlanPrediction

    t = trainer(tmp_path, plan={"spend": 1.0, "wall_h": 2.0})
    assert isinstance(t.plan, PlanPrediction) and t.meta_extra()["plan"]["spend"] == 1.0
    with pytest.raises(ConfigError, match=r"^plan\.spend: "):
        trainer(tmp_path, name="b", plan={"spend": "a lot", "wall_h": 2.0})
    with pytest.raises(ConfigError, match=r"^plan: expected a PlanPrediction"):
        trainer(tmp_path, name="c", plan=3)
