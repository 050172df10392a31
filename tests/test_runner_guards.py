"""What FallbackTrainer refuses before it ever starts Ray: clear errors, nothing lost."""

from __future__ import annotations

import os

import pytest
import ray.train

from spotfallback import FallbackTrainer, Tier
from spotfallback.config import ConfigError
from spotfallback.errors import RunAlreadyFinishedError, RunFailedError
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
