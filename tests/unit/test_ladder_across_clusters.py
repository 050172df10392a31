"""A ladder across Ray clusters, without Ray: its validation, the policy's move off a lost cluster,
what a driver on one cluster refuses, and the mover against clusters that never answer.

The last test is real on its side: a mover with local storage whose clusters' Jobs API
addresses refuse every connection, so each cluster is declared lost after its timeout.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from spotfallback.config import JobConfig, Ladder, Tier
from spotfallback.errors import EXIT_LADDER_EXHAUSTED, ConfigError
from spotfallback.events import (
    CheckpointCommitted,
    ClusterUnreachable,
    Continue,
    GiveUp,
    RunStarted,
    SwitchTier,
    WorkersAcquired,
    event_from_json,
)
from spotfallback.policy import FallbackPolicy, PolicyState
from spotfallback.runtime.probe import probe_target

A = {"address": "http://head-a:8265", "name": "a", "region": "us-east-1"}
B = {"address": "http://head-b:8265", "name": "b", "region": "us-west-2"}


def ladder(*clusters: dict[str, object] | None, **spot: object) -> Ladder:
    """spot on the first cluster, spot on the second, on-demand on the third."""
    first, second, third = clusters
    return Ladder(tiers=(
        Tier.spot(1, name="spot-1", cluster=first, **spot),
        Tier.spot(1, name="spot-2", cluster=second),
        Tier.on_demand(1, name="on-demand", cluster=third),
    ))


# -- validation -------------------------------------------------------------------------------


def test_a_ladder_names_a_cluster_on_every_tier_or_on_none() -> None:
    assert not ladder(None, None, None).across_clusters
    lad = ladder(A, B, A)
    assert lad.across_clusters and [lad.cluster_key(i) for i in range(3)] == ["a", "b", "a"]
    assert lad.same_cluster(0, 2) and not lad.same_cluster(0, 1)
    with pytest.raises(ValidationError, match=r"tiers\[2\] \(on-demand\): name a cluster"):
        ladder(A, B, None)


def test_one_cluster_name_means_one_address_and_back() -> None:
    with pytest.raises(ValidationError, match="cluster 'a' has two addresses"):
        ladder(A, {**B, "name": "a"}, A)
    with pytest.raises(ValidationError, match="is named both 'a' and 'b'"):
        ladder(A, {**A, "name": "b"}, A)


def test_a_cluster_is_named_after_its_address_by_default_and_the_address_is_checked() -> None:
    lad = ladder({"address": "http://10.0.0.1:8265/"}, B, B)
    assert lad.cluster_key(0) == "10.0.0.1:8265" and lad.tiers[0].cluster.address == "http://10.0.0.1:8265"
    with pytest.raises(ValidationError, match=r"must be the Ray Jobs API's http\(s\)://host:port"):
        ladder({"address": "head-a:8265"}, B, B)
    with pytest.raises(ValidationError, match="unreachable_timeout_s"):
        ladder({**A, "unreachable_timeout_s": 0}, B, B)


def test_elastic_tiers_stay_out_of_a_ladder_across_clusters() -> None:
    with pytest.raises(ValidationError, match="elastic tiers .* not supported in a ladder across clusters"):
        Ladder(tiers=(Tier.spot((1, 2), cluster=A), Tier.on_demand(1, cluster=B)))


def test_a_ladder_without_clusters_is_stored_as_before() -> None:
    assert "cluster" not in Tier.spot(1).model_dump()
    assert Tier.spot(1, cluster=A).model_dump()["cluster"]["name"] == "a"


def test_a_job_file_with_a_bad_cluster_names_the_field() -> None:
    data = {"name": "r", "storage_path": "/tmp/x", "entrypoint": "m:f",
            "tiers": [{"name": "s", "market": "spot", "num_workers": 1, "cluster": {"adress": "http://h:1"}}]}
    with pytest.raises(ValidationError) as e:
        JobConfig.model_validate(data)
    assert "adress" in str(e.value)


@pytest.mark.parametrize(("storage_path", "a", "b", "refused"), [
    ("./runs", A, B, True),  # another directory on each machine
    ("~/runs", A, B, True),
    ("runs", {"address": "http://127.0.0.1:8265"}, B, True),
    ("/mnt/nfs/runs", A, B, False),  # a file system mounted on all of them
    ("s3://ml-runs/runs", A, B, False),
    ("./runs", {"address": "http://127.0.0.1:8265"}, {"address": "http://localhost:8266"}, False),  # local clusters
])
def test_a_ladder_across_clusters_needs_one_store_every_machine_reads(tmp_path, storage_path, a, b, refused) -> None:
    data = {"name": "r", "storage_path": storage_path, "entrypoint": "m:f",
            "tiers": [t.model_dump(exclude_unset=True) for t in ladder(a, b, a).tiers]}
    if not refused:
        assert JobConfig.model_validate(data).storage_path == storage_path
        return
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: storage_path: '{re.escape(storage_path)}' is a path on each machine"
                                          r".*\(s3://, gs://, abfs://\), or an absolute path of a file system mounted"):
        JobConfig.from_yaml(path)


# -- the policy -------------------------------------------------------------------------------


def test_a_lost_cluster_sends_the_run_to_the_next_tier_on_another_cluster() -> None:
    policy = FallbackPolicy(ladder(A, A, B))  # the second tier is on the lost cluster too: skipped
    state = policy.initial_state()
    for e in (RunStarted(0), WorkersAcquired(10), CheckpointCommitted(50)):
        state = policy.decide(state, e).state
    step = policy.decide(state, ClusterUnreachable(t=80, cluster="a", waited_s=20))
    assert isinstance(step.decision, SwitchTier) and (step.decision.from_tier, step.decision.to_tier) == (0, 2)
    assert "cluster 'a' did not answer for 20s" in step.decision.reason
    # The gang there is lost with its work since the last commit; no budget of the tier is charged.
    assert step.state.lost_s == 30 and step.state.stats[0].preemptions == 0 and step.state.running_since is None


def test_a_lost_last_cluster_exhausts_the_ladder() -> None:
    policy = FallbackPolicy(ladder(A, B, B))
    state = policy.decide(policy.initial_state(), RunStarted(0)).state
    state = policy.decide(state, ClusterUnreachable(t=5, cluster="a", waited_s=5)).state
    step = policy.decide(state, ClusterUnreachable(t=9, cluster="b", waited_s=4))
    assert isinstance(step.decision, GiveUp) and step.decision.cause == "exhausted"


def test_news_of_a_cluster_the_run_is_not_on_changes_nothing() -> None:
    policy = FallbackPolicy(ladder(A, B, B))
    state = policy.decide(policy.initial_state(), RunStarted(0)).state
    step = policy.decide(state, ClusterUnreachable(t=5, cluster="b", waited_s=5))
    assert step.decision == Continue() and step.state == state


def test_the_event_round_trips_through_the_ledger_format() -> None:
    event = ClusterUnreachable(t=1.5, cluster="a", waited_s=20.0)
    assert event_from_json(event.to_json()) == event


def test_the_climb_probe_never_asks_another_cluster_for_nodes() -> None:
    def policy(first: dict[str, object]) -> FallbackPolicy:
        return FallbackPolicy([
            Tier.spot(1, name="spot-1", cluster=first, climb_back=True, min_dwell_s=0, price_per_worker_hour=0.3),
            Tier.on_demand(1, name="on-demand", cluster=B, price_per_worker_hour=1.0),
        ])

    def on_demand(p: FallbackPolicy) -> PolicyState:
        state = p.initial_state()
        for e in (RunStarted(0), WorkersAcquired(1), ClusterUnreachable(t=2, cluster=p.ladder.cluster_key(0) or "", waited_s=1),
                  WorkersAcquired(3)):
            state = p.decide(state, e).state
        return state

    across, within = policy(A), policy(B)
    # Lost cluster a: running on cluster b, below a climbable, cheaper tier on cluster a: not probed
    # by the driver on cluster b, but looked at by the moving driver.
    assert on_demand(across).tier == 1 and probe_target(across, on_demand(across), now=1000.0, lead_s=0.0) is None
    assert probe_target(across, on_demand(across), now=1000.0, lead_s=0.0, across=True) == 0
    # The same ladder within one cluster (left spot-1 some other way) would probe it.
    state = within.initial_state()
    for e in (RunStarted(0), WorkersAcquired(1)):
        state = within.decide(state, e).state
    state = replace(state, tier=1, tier_since=2.0, tier_history=(0, 1), running_since=3.0)
    assert probe_target(within, state, now=1000.0, lead_s=0.0) == 0
    assert probe_target(within, state, now=1000.0, lead_s=0.0, across=True) is None


def test_a_look_travels_as_one_command_and_comes_back_as_one_line() -> None:
    """The mover's look at another cluster: the command the Ray job runs, and the line it reads back."""
    import shlex

    from spotfallback.clusters.looks import look_command, look_result, parse_look

    tier = Tier.spot(2, name="spot-a", cluster=A, resources_per_worker={"CPU": 2}, climb_back=True)
    argv = shlex.split(look_command(tier, "spotfallback-climb-look-run", 150.0))
    assert argv[:2] == ["spotfallback", "look-capacity"] and argv[argv.index("--wait-s") + 1] == "150"
    assert Tier.model_validate_json(argv[argv.index("--tier-json") + 1]) == tier
    log = "Ray noise\n{\"not\": \"it\"}\n" + look_result(tier, 1) + "\n"
    assert parse_look(log, tier) == 1
    assert parse_look(log, Tier.spot(2, name="other")) is None and parse_look("", tier) is None
    assert parse_look('{"type": "capacity", "tier": "spot-a", "available_workers": true}', tier) is None


def _records(p: FallbackPolicy, events: list) -> list:
    """Ledger records of ``events`` as a driver writes them: each with the policy's decision."""
    from spotfallback.events import LedgerRecord

    out, state = [], p.initial_state()
    for i, e in enumerate(events):
        step = p.decide(state, e)
        out.append(LedgerRecord(id=str(i), writer="w", tier=state.tier, event=e, decision=step.decision.to_json()))
        state = step.state
    return out


def test_the_restart_a_climb_is_priced_with_is_the_runs_latest_move() -> None:
    from spotfallback.clusters.mover import LedgerFold
    from spotfallback.policy import DEFAULT_RESTART_S

    p = FallbackPolicy(ladder(A, A, B, max_preemptions=0))

    def restart_s(events: list) -> float:
        records = _records(p, events)
        return LedgerFold(p).update(records, records)[1].restart_s

    started = [RunStarted(0), WorkersAcquired(5)]
    assert restart_s(started) == DEFAULT_RESTART_S  # no move measured yet
    lost = ClusterUnreachable(t=100, cluster="a", waited_s=30)
    assert restart_s([*started, lost]) == DEFAULT_RESTART_S  # moved, not yet up
    assert restart_s([*started, lost, WorkersAcquired(190)]) == 90.0


def test_the_mover_folds_in_only_new_records_and_all_again_when_one_comes_before_them() -> None:
    from spotfallback.clusters.mover import LedgerFold

    p = FallbackPolicy(ladder(A, A, B, max_preemptions=0))
    records = _records(p, [RunStarted(0), WorkersAcquired(5), CheckpointCommitted(60, remaining_work_s=900),
                           ClusterUnreachable(t=100, cluster="a", waited_s=30), WorkersAcquired(190)])
    whole = LedgerFold(p).update(records, records)
    fold = LedgerFold(p)
    fold.update(records[:2], records[:2])
    assert fold.update(records, records[2:]) == whole and fold.count == len(records)

    class Counting(FallbackPolicy):
        decided = 0

        def decide(self, state, event):
            Counting.decided += 1
            return super().decide(state, event)

    counting = Counting(p.ladder)
    fold = LedgerFold(counting)
    fold.update(records[:3], records[:3])
    assert fold.update(records, records[3:]) == whole and Counting.decided == len(records)  # each record once
    late = [records[0], records[3], records[1], records[2], records[4]]  # one that sorts before folded ones
    fold = LedgerFold(counting)
    fold.update([records[0], records[1], records[2]], [records[0], records[1], records[2]])
    Counting.decided = 0
    state, clock = fold.update(late, [records[3], records[4]])
    assert Counting.decided == len(late) and (state, clock) == LedgerFold(p).update(late, late)


def test_look_capacity_refuses_a_bad_tier_and_a_missing_cluster_in_one_line(cli, monkeypatch) -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(cli, ["look-capacity", "--tier-json", '{"name": "spot", "num_workers": 0}',
                                      "--requester", "r"])
    [line] = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and line.startswith("error: --tier-json: ") and "num_workers" in line, result.output

    import ray

    def no_cluster(**_: object) -> None:  # what ray.init(address="auto") raises where no cluster runs
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to.")

    monkeypatch.setattr(ray, "init", no_cluster)
    tier = Tier.spot(1, name="spot-a", cluster=A)
    result = CliRunner().invoke(cli, ["look-capacity", "--tier-json", tier.model_dump_json(), "--requester", "r"])
    [line] = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and line.startswith("error: no Ray cluster to look at here"), result.output


def test_a_look_asks_the_autoscaler_for_the_gang_and_leaves_the_request_up() -> None:
    """A gang that fits already is asked for again: its nodes came for an earlier look's request,
    which would otherwise expire, and the autoscaler remove them, before the climb."""
    from spotfallback.runtime.probe import look_capacity

    class Client:
        _requester_id = "look"
        sent: list[int] = []
        cancelled = 0

        def __init__(self, requester_id: str = "look") -> None:
            pass

        def send_resource_request(self, scaling_config: object, num_workers: int) -> None:
            Client.sent.append(num_workers)

        def cancel_resource_request(self) -> None:
            Client.cancelled += 1

    tier = Tier.spot(2, name="spot-1", cluster=A)
    assert look_capacity(tier, "look", 60.0, capacity=lambda t: 2, client=Client()) == 2 and Client.sent == [2]
    Client.sent.clear()
    counts = iter([0, 0, 1, 2])
    slept: list[float] = []
    assert look_capacity(tier, "look", 60.0, poll_s=5.0, capacity=lambda t: next(counts), client=Client(),
                         sleep=slept.append) == 2
    assert Client.sent == [2] and slept == [5.0, 5.0, 5.0] and Client.cancelled == 0
    # No wait: what is there is the answer, and nothing is asked for.
    assert look_capacity(tier, "look", 0.0, capacity=lambda t: 1, client=Client()) == 1 and Client.sent == [2]


# -- a driver on one cluster ------------------------------------------------------------------


def test_a_driver_of_a_ladder_across_clusters_needs_its_cluster() -> None:
    from spotfallback.runtime.trainer import check_on_cluster

    lad = ladder(A, B, B)
    with pytest.raises(ConfigError, match="runs across Ray clusters"):
        check_on_cluster(lad, None)
    with pytest.raises(ConfigError, match=r"on_cluster: 'c' is not a cluster of this ladder; its clusters are \['a', 'b'\]"):
        check_on_cluster(lad, "c")
    assert check_on_cluster(lad, "b") == "b"
    assert check_on_cluster(ladder(None, None, None), None) is None
    with pytest.raises(ConfigError, match=r"on_cluster: 'a' names a cluster, but no tier of this ladder does .*leave it out"):
        check_on_cluster(ladder(None, None, None), "a")


# -- the mover against clusters that never answer ---------------------------------------------


def test_clusters_that_never_answer_are_each_left_after_their_timeout(tmp_path: Path) -> None:
    from spotfallback.clusters import ClusterMover
    from tests.support.s3server import free_port

    dead = [{"address": f"http://127.0.0.1:{free_port()}", "name": n, "unreachable_timeout_s": 1.0} for n in ("a", "b")]
    job = JobConfig.model_validate({
        "name": "nowhere", "storage_path": str(tmp_path), "entrypoint": "m:f",
        "tiers": [{"name": "spot", "market": "spot", "num_workers": 1, "cluster": dead[0]},
                  {"name": "on-demand", "market": "on-demand", "num_workers": 1, "cluster": dead[1]}],
    })
    lines: list[str] = []
    t0 = time.monotonic()
    outcome = ClusterMover(job, poll_s=0.2, lease_ttl_s=5, say=lines.append).run()
    assert time.monotonic() - t0 < 30
    assert outcome.exit_code == EXIT_LADDER_EXHAUSTED
    assert "cluster 'a' did not answer" in outcome.message and "cluster 'b' did not answer" in outcome.message
    kinds = [r.event.kind for r in ClusterMover(job).ledger.read()]
    assert kinds == ["cluster_unreachable", "cluster_unreachable"]
    # Run again: the run gave up, so the mover says so at once, as `run` does.
    assert ClusterMover(job, poll_s=0.2).run().exit_code == EXIT_LADDER_EXHAUSTED


def test_the_bill_and_the_timeline_count_the_gang_a_lost_cluster_took_with_it() -> None:
    """Accounting and the timeline's intervals agree: the work since the last commit is lost, the wait is the next tier's."""
    from spotfallback.accounting import summarize
    from spotfallback.events import Finished, LedgerRecord
    from spotfallback.view.intervals import run_intervals

    lad = Ladder(tiers=(Tier.spot(1, cluster=A, price_per_worker_hour=1.0), Tier.on_demand(1, cluster=B, price_per_worker_hour=3.0)))
    policy = FallbackPolicy(lad)
    events = [RunStarted(0), WorkersAcquired(10), CheckpointCommitted(50), ClusterUnreachable(t=80, cluster="a", waited_s=20),
              RunStarted(90), WorkersAcquired(100), Finished(160)]
    state, records = policy.initial_state(), []
    for i, e in enumerate(events):
        step = policy.decide(state, e)
        records.append(LedgerRecord(id=str(i), writer="w", tier=state.tier, event=e, decision=step.decision.to_json()))
        state = step.state
    summary = summarize(lad, records)
    spot, od = summary.tiers
    assert (spot.running_s, spot.lost_s, spot.preemptions, spot.failures) == (70, 30, 0, 0)
    assert (od.running_s, od.waiting_s) == (60, 20)
    waiting, redone, _ = run_intervals(records, 160)
    assert redone == [(0, 50, 80)] and (1, 80, 90) in waiting


def test_a_look_that_ends_without_a_result_counts_no_capacity_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from spotfallback.clusters.looks import LOOK_KEY, CapacityLooks, look_result

    class Jobs:
        """What the looks use of one cluster's Jobs API."""

        def __init__(self) -> None:
            self.submitted: list[tuple[str, str, str]] = []
            self.state, self.log = "RUNNING", "/bin/sh: 1: spotfallback: not found"

        def submit(self, submission_id: str, entrypoint: str, run_uri: str, env: object = None, *, key: str) -> str:
            self.submitted.append((submission_id, run_uri, key))
            return submission_id

        def job(self, submission_id: str) -> object:
            from spotfallback.clusters.jobs import RunJob

            return RunJob(submission_id, self.state, 0.0)

        def logs(self, submission_id: str) -> str:
            return self.log

    jobs = Jobs()
    looks = CapacityLooks({"a": jobs}, "s3://bucket/runs/r", "r")  # type: ignore[dict-item]
    tier = Tier.spot(1, name="spot-1", cluster=A)
    looks.start(0, tier, "a", now=0.0)
    assert jobs.submitted[0][1:] == ("s3://bucket/runs/r", LOOK_KEY) and looks.collect(tier) is None  # still running
    jobs.state = "FAILED"
    with caplog.at_level(logging.WARNING, logger="spotfallback"):
        assert looks.collect(tier) == 0 and looks.pending is None
        looks.start(0, tier, "a", now=1.0)
        assert looks.collect(tier) == 0
    said = [r.getMessage() for r in caplog.records if "without a result" in r.getMessage()]
    assert len(said) == 1 and "spotfallback: not found" in said[0] and "FAILED" in said[0]
    jobs.state, jobs.log = "SUCCEEDED", "noise\n" + look_result(tier, 1)
    looks.start(0, tier, "a", now=2.0)
    assert looks.collect(tier) == 1


# -- the mover against clusters that answer oddly ---------------------------------------------


class FakeJobs:
    """One cluster's Jobs API as the mover uses it, scripted: ``unreachable`` makes every call fail as
    an outage does; ``lose_answers`` submissions reach the cluster but their answers are lost."""

    def __init__(self, ref: object) -> None:
        from spotfallback.clusters.jobs import RunJob

        self.ref = ref
        self.name = ref.key  # type: ignore[attr-defined]
        self.unreachable = False
        self.lose_answers = 0
        self.jobs: dict[str, RunJob] = {}
        self.submitted: list[str] = []
        self.next_status = "RUNNING"
        self.session_name: str | None = f"session-{self.name}"  # each its own cluster

    def _answer(self) -> None:
        from spotfallback.errors import ClusterUnreachableError

        if self.unreachable:
            raise ClusterUnreachableError(f"cluster {self.name!r}: cannot answer: down")

    def session(self) -> str | None:
        self._answer()
        return self.session_name

    def jobs_of(self, run_uri: str) -> list[object]:
        self._answer()
        return list(self.jobs.values())

    def active_job(self, run_uri: str) -> object | None:
        active = [j for j in self.jobs_of(run_uri) if j.active]  # type: ignore[attr-defined]
        return active[-1] if active else None

    def submit(self, submission_id: str, entrypoint: str, run_uri: str, env: object = None, *, key: str = "") -> str:
        from spotfallback.clusters.jobs import RunJob
        from spotfallback.errors import ClusterUnreachableError

        self._answer()
        self.submitted.append(submission_id)
        if submission_id not in self.jobs:
            self.jobs[submission_id] = RunJob(submission_id, "SUCCEEDED", time.time(), time.time())  # a quick job
        if self.lose_answers:
            self.lose_answers -= 1
            raise ClusterUnreachableError(f"cluster {self.name!r}: cannot submit the run: Read timed out")
        return submission_id

    def status(self, submission_id: str) -> str:
        self._answer()
        return self.jobs[submission_id].status

    def job(self, submission_id: str) -> object:
        self._answer()
        return self.jobs[submission_id]

    def stop(self, submission_id: str) -> None:
        self._answer()

    def logs(self, submission_id: str) -> str:
        self._answer()
        return ""


def _mover_job(tmp_path: Path, timeout_s: float = 60.0) -> JobConfig:
    clusters = [{"address": f"http://head-{n}:8265", "name": n, "unreachable_timeout_s": timeout_s} for n in ("a", "b")]
    return JobConfig.model_validate({
        "name": "odd", "storage_path": str(tmp_path), "entrypoint": "m:f",
        "tiers": [{"name": "spot", "market": "spot", "num_workers": 1, "cluster": clusters[0]},
                  {"name": "on-demand", "market": "on-demand", "num_workers": 1, "cluster": clusters[1]}],
    })


def _fake_mover(job: JobConfig, lines: list[str]) -> tuple[object, dict[str, FakeJobs]]:
    from spotfallback.clusters import ClusterMover

    mover = ClusterMover(job, poll_s=0.05, lease_ttl_s=3, say=lines.append)
    fakes = {key: FakeJobs(jobs.ref) for key, jobs in mover.clusters.items()}
    mover.clusters.update(fakes)  # type: ignore[arg-type]
    return mover, fakes


def test_a_job_stopped_from_outside_ends_the_mover_with_the_run_kept(tmp_path: Path) -> None:
    """An operator's `ray job stop` is not fought with a new submission: the mover says so and stops."""
    from spotfallback.clusters.jobs import RunJob

    lines: list[str] = []
    mover, fakes = _fake_mover(_mover_job(tmp_path), lines)
    fakes["a"].jobs["x"] = RunJob("x", "STOPPED", time.time(), time.time())
    fakes["a"].jobs["y"] = RunJob("y", "RUNNING", time.time())  # the run's job, followed until someone stops it

    def stopped_after_a_look(submission_id: str) -> str:
        fakes["a"].jobs[submission_id] = replace(fakes["a"].jobs[submission_id], status="STOPPED")
        return "STOPPED"

    fakes["a"].status = stopped_after_a_look  # type: ignore[method-assign]
    outcome = mover.run()  # type: ignore[attr-defined]
    assert outcome.exit_code == 1 and "stopped from outside the mover" in outcome.message, outcome
    assert fakes["a"].submitted == [] and "run the same command to resume it" in outcome.message


def test_a_submission_whose_answer_was_lost_is_sent_again_under_its_own_id(tmp_path: Path) -> None:
    lines: list[str] = []
    mover, fakes = _fake_mover(_mover_job(tmp_path), lines)
    fakes["a"].lose_answers = 2
    status, _ = mover._run_on("a", retry=False)  # type: ignore[attr-defined]
    assert status == "SUCCEEDED"
    assert len(fakes["a"].submitted) == 3 and len(set(fakes["a"].submitted)) == 1 and len(fakes["a"].jobs) == 1
    # The next submission, once one has gone through, is a new job.
    mover._run_on("a", retry=False)  # type: ignore[attr-defined]
    assert len(fakes["a"].jobs) == 2


def test_a_silent_cluster_whose_driver_renews_its_lease_is_waited_for_not_left(tmp_path: Path) -> None:
    """The mover's own network down (or the dashboard), the run training on: no move until the lease lapses."""
    import threading

    from spotfallback.store.lease import DriverLease

    lines: list[str] = []
    job = _mover_job(tmp_path, timeout_s=0.3)
    mover, fakes = _fake_mover(job, lines)
    fakes["a"].unreachable = fakes["b"].unreachable = True
    driver = DriverLease(mover.location, ttl_s=3)  # type: ignore[attr-defined]
    driver.acquire()  # the run's driver on cluster a, alive and renewing
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(mover.run()), daemon=True)  # type: ignore[attr-defined]
    thread.start()
    try:
        time.sleep(2.0)
        assert [r.event.kind for r in mover.ledger.read()] == []  # type: ignore[attr-defined]
        assert any("renews its lease: waiting" in line for line in lines), lines
    finally:
        driver.release()  # the driver died with its cluster: the lease is free
    thread.join(30)
    assert outcome and outcome[0].exit_code == EXIT_LADDER_EXHAUSTED  # type: ignore[attr-defined]
    assert [r.event.kind for r in mover.ledger.read()] == ["cluster_unreachable", "cluster_unreachable"]  # type: ignore[attr-defined]


def test_on_one_machine_the_jobs_get_the_movers_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray job starts where its cluster was started, not in the mover's directory."""
    from spotfallback.clusters.mover import _paths_of_this_machine

    monkeypatch.chdir(tmp_path)
    local = {"address": "http://127.0.0.1:8265", "name": "a"}
    data = {"name": "r", "storage_path": "./runs", "entrypoint": "train.py:fn",
            "tiers": [{"name": "spot", "market": "spot", "num_workers": 1, "cluster": local},
                      {"name": "on-demand", "market": "on-demand", "num_workers": 1, "cluster": local}]}
    job = _paths_of_this_machine(JobConfig.model_validate(data))
    assert (job.storage_path, job.entrypoint) == (str(tmp_path / "runs"), f"{tmp_path / 'train.py'}:fn")
    assert json.loads(job.run_command().split("--job-json ")[1].split(" --")[0].strip("'"))["storage_path"] == str(tmp_path / "runs")
    remote = {**data, "storage_path": "s3://b/runs", "tiers": [{**t, "cluster": A} for t in data["tiers"]]}  # type: ignore[attr-defined]
    kept = _paths_of_this_machine(JobConfig.model_validate(remote))
    assert (kept.storage_path, kept.entrypoint) == ("s3://b/runs", "train.py:fn")  # the cluster's own file, in its image


def test_a_cluster_token_is_named_by_its_variable_and_a_missing_one_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    from spotfallback.clusters.jobs import ClusterJobs
    from spotfallback.config import ClusterRef

    with pytest.raises(ValidationError, match="token_env 'abc def' must be the name of an environment variable"):
        ClusterRef(address="http://head:8265", token_env="abc def")
    monkeypatch.delenv("RAY_TOKEN_WEST", raising=False)
    jobs = ClusterJobs(ClusterRef(address="http://head-west:8265", name="west", token_env="RAY_TOKEN_WEST"))
    with pytest.raises(ConfigError, match="cluster 'west': token_env: the environment variable RAY_TOKEN_WEST .* is not set"):
        jobs.jobs_of("s3://b/runs/r")


def test_a_mover_whose_lease_another_took_stops(tmp_path: Path) -> None:
    """A mover cut off past its lease (a laptop asleep) while another took the run over: two would fight."""
    import threading

    from spotfallback.clusters.jobs import RunJob
    from spotfallback.clusters.mover import MOVER_LEASE_FILE
    from spotfallback.errors import DriverLeaseLostError

    lines: list[str] = []
    mover, fakes = _fake_mover(_mover_job(tmp_path), lines)
    fakes["a"].jobs["y"] = RunJob("y", "RUNNING", time.time())  # the run trains on cluster a
    raised: list[BaseException] = []

    def run() -> None:
        try:
            mover.run()  # type: ignore[attr-defined]
        except BaseException as e:  # noqa: BLE001 - what the thread ended with is the test's
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    path = Path(mover.location.path(MOVER_LEASE_FILE))  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while not any("following job y" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    other = {"token": "other", "host": "elsewhere", "pid": 1, "renewed_at": time.time(), "expires_at": time.time() + 60}
    path.write_text(json.dumps(other))
    thread.join(15)
    assert raised and isinstance(raised[0], DriverLeaseLostError), raised
    assert "another mover (host elsewhere, pid 1) took run" in str(raised[0]) and raised[0].exit_code == 5
    assert json.loads(path.read_text())["token"] == "other"  # the other mover's lease is left to it


def test_two_addresses_of_one_cluster_are_refused_before_any_job(tmp_path: Path) -> None:
    """One session behind two addresses: the mover would stop the run's own job as another cluster's."""
    from spotfallback.errors import ConfigError

    lines: list[str] = []
    mover, fakes = _fake_mover(_mover_job(tmp_path), lines)
    fakes["b"].session_name = fakes["a"].session_name
    with pytest.raises(ConfigError, match=r"^tiers: clusters 'a' \(http://head-a:8265\) and 'b' \(http://head-b:8265\) "
                                          r"are one Ray cluster \(session session-a\): give the tiers on one cluster"):
        mover.run()  # type: ignore[attr-defined]
    assert fakes["a"].submitted == fakes["b"].submitted == []
    # A cluster that does not answer, or does not say its session, is not held against the others.
    fakes["b"].session_name = None
    fakes["a"].unreachable = True
    mover._check_one_address_each()  # type: ignore[attr-defined]


def test_a_clusters_session_is_read_from_its_jobs_api_version(tmp_path: Path) -> None:
    import http.server
    import json
    import threading

    from spotfallback.clusters.jobs import ClusterJobs
    from spotfallback.config import ClusterRef

    answers = {"session_name": "session_2026-12-07_17-00-00_1234_1"}

    class Version(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x", **answers}).encode()
            self.send_response(200 if self.path == "/api/version" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Version)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        jobs = ClusterJobs(ClusterRef(address=f"http://127.0.0.1:{server.server_address[1]}", name="a"))
        assert jobs.session() == "session_2026-12-07_17-00-00_1234_1"
        answers.pop("session_name")  # an older head that does not say
        assert jobs.session() is None
    finally:
        server.shutdown()
        server.server_close()
