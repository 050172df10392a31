"""End to end: a preemption notice becomes a Ray drain and a just-in-time checkpoint.

First, the KubeRay sidecar's contract with real ``ray start`` processes: a worker node's
``ray start`` writes the GCS address to its temp dir (``ray_current_cluster``), and the real
``spotfallback notice-agent`` process, configured only by environment variables and pointed
at that directory (the shared emptyDir), finds the cluster and drains the node once.

Then one local cluster on Ray's autoscaler for the rest of the module: a head with no CPUs
(driver and Train controller) and a spot node type kept at three one-CPU nodes, so a run of two
workers that loses one node resumes on the third while the autoscaler replaces the lost one. The job is the DDP example with preemption checks about every second;
rank 0 logs every step it completes (``step_log``), which is how steps redone and seconds
lost are measured.

- notices via the real agent process (a fake AWS IMDSv2 on loopback), on rank 1's node and
  then on rank 0's -> JIT checkpoint each time -> resumed at exactly the next step, weights
  bit-identical;
- kill without notice -> resumed from the last periodic checkpoint (<= interval redone);
- notice shorter than the checkpoint write (the injector's drain, recorded in the ledger
  the agent's way) -> resumed from the previous checkpoint, weights still bit-identical,
  the ledger says the JIT checkpoint missed.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.support.helpers_e2e import (  # noqa: E402
    TRAIN_CONFIG,
    Background,
    at_full_speed,
    autoscaled_cluster,
    restoring_injector,
    unique_name,
    wait_for,
)
from tests.support.ray_procs import clean_env, head_args, ray_node, worker_args  # noqa: E402

pytestmark = pytest.mark.ray

CONFIG = {**TRAIN_CONFIG, "total_steps": 20, "preemption_check_every_s": 1.0, "preemption_hold_s": 30.0}
NOTICE_S = 8  # longer than a step plus a checkpoint write (about 1 s here)


@dataclass(frozen=True)
class Eviction:
    """What one eviction cost, from rank 0's step log."""

    last_before: int  # last step completed before the node went
    resumed_at: int  # first step of the next attempt
    stall_s: float  # last step before -> first step beyond it after the restart
    kill_to_new_s: float  # node killed -> first step beyond last_before

    @property
    def redone(self) -> int:
        return max(0, self.last_before - self.resumed_at + 1)


def read_steps(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def attempts(steps: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rank 0's steps cut into attempts (a new worker process starts a new attempt)."""
    out: list[list[dict[str, Any]]] = []
    for s in steps:
        if not out or out[-1][0]["pid"] != s["pid"]:
            out.append([])
        out[-1].append(s)
    return out


def eviction(steps: list[dict[str, Any]], kill_t: float, index: int = 0) -> Eviction:
    """The cost of the ``index``-th eviction: attempt ``index`` ended by it, the next resumed."""
    runs = attempts(steps)
    assert len(runs) > index + 1, steps  # (a surviving rank 0 may finish one more step after the kill)
    last = runs[index][-1]
    after = runs[index + 1]
    new = next(s for s in after if s["step"] > last["step"])
    return Eviction(last["step"], after[0]["step"], new["t"] - last["t"], new["t"] - kill_t)


# ----------------------------------------------------------------------------- the sidecar's contract


def agent_env(**extra: str) -> dict[str, str]:
    """This process's environment minus any Ray address, plus the sidecar's variables."""
    return clean_env(**extra)


def agent_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "spotfallback.cli", "notice-agent", *args]


def assert_drained(client: Any, node_id: str, deadline_s: int, notice_time: str) -> None:
    """The GCS shows ``node_id`` drained for the notice: still draining with its deadline, or,
    since an idle raylet that is drained shuts itself down, gone for a drain (preemption)."""
    from ray.core.generated import gcs_pb2

    reasons = gcs_pb2.GcsNodeInfo.DESCRIPTOR.fields_by_name["death_info"].message_type.enum_types_by_name["Reason"]
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
    deadline = time.monotonic() + 30
    while True:
        draining = {k.hex() if isinstance(k, bytes) else k: v for k, v in client.get_draining_nodes().items()}
        info = {nid.hex(): i for nid, i in client.get_all_node_info(timeout=10).items()}[node_id]
        if node_id in draining:
            assert draining[node_id] == deadline_s * 1000  # the cloud's deadline, in Ray's terms
            return
        if info.state != alive:
            assert reasons.values_by_number[info.death_info.reason].name == "AUTOSCALER_DRAIN_PREEMPTED"
            assert notice_time in info.death_info.reason_message, info.death_info.reason_message
            return
        assert time.monotonic() < deadline, f"node {node_id[:12]} neither draining nor drained"
        time.sleep(0.2)


def test_ray_start_on_a_worker_writes_the_address_the_sidecar_agent_drains_with(tmp_path):
    from ray._raylet import GcsClient
    from ray.core.generated import gcs_pb2

    from tests.support.metadata_fakes import FakeAws, iso

    # Short paths: Ray's socket paths live under the temp dir and must stay under 108 bytes.
    head_tmp, pod_tmp = tempfile.mkdtemp(prefix="sfh-"), tempfile.mkdtemp(prefix="sfp-")
    imds = FakeAws()
    try:
        # The worker pod's own /tmp/ray: the emptyDir the sidecar shares.
        with (
            ray_node(lambda: head_args(head_tmp), head_tmp, log=tmp_path / "head.log") as (_, gcs),
            ray_node(lambda: worker_args(gcs, pod_tmp), pod_tmp, log=tmp_path / "worker.log") as (worker, written),
        ):
            assert written == gcs  # what `auto` discovery in the sidecar reads
            client = GcsClient(address=gcs)
            alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
            deadline = time.monotonic() + 60  # the worker may still be registering
            while True:
                nodes = {nid.hex(): info for nid, info in client.get_all_node_info(timeout=10).items() if info.state == alive}
                if len(nodes) == 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert len(nodes) == 2, nodes
            (worker_id,) = [n for n, info in nodes.items() if not info.is_head_node]

            sidecar = {"RAY_TMPDIR": pod_tmp, "SPOTFALLBACK_CLOUD": "aws", "SPOTFALLBACK_METADATA_URL": imds.url}
            # Head and worker share this machine's address: the agent cannot tell which is its own.
            ambiguous = subprocess.run(agent_cmd("--once"), env=agent_env(**sidecar), capture_output=True, text=True, timeout=120)
            assert ambiguous.returncode == 2, ambiguous.stderr
            assert "2 live Ray nodes have this machine's address" in ambiguous.stderr
            assert "--node-id (or SPOTFALLBACK_NODE_ID)" in ambiguous.stderr

            deadline_s = int(time.time()) + 40
            imds.instance_action = json.dumps({"action": "terminate", "time": iso(deadline_s)}).encode()
            agent = subprocess.Popen(
                agent_cmd("--interval", "0.2"),
                env=agent_env(**sidecar, SPOTFALLBACK_NODE_ID=worker_id),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            try:
                assert agent.stdout is not None
                line = json.loads(agent.stdout.readline())
                assert (line["source"], line["drained"], line["deadline_s"]) == ("aws", True, float(deadline_s))
                polls = sum(1 for r in imds.requests if r[1].endswith("instance-action"))
                while sum(1 for r in imds.requests if r[1].endswith("instance-action")) < polls + 5:
                    assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
                    time.sleep(0.1)  # the same notice, polled 5 more times
            finally:
                agent.send_signal(signal.SIGTERM)  # outside Kubernetes SIGTERM stops the agent
                out, err = agent.communicate(timeout=30)
            assert agent.returncode == 0, err
            assert out.strip() == ""  # no second notice line: drained once
            assert_drained(client, worker_id, deadline_s, iso(deadline_s))
    finally:
        imds.close()
        shutil.rmtree(head_tmp, ignore_errors=True)
        shutil.rmtree(pod_tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- the autoscaled local cluster


@pytest.fixture(scope="module")
def cluster():
    from spotfallback.local import NodeGroup

    with autoscaled_cluster([NodeGroup("spot", count=3)]) as c:
        yield c


@pytest.fixture()
def injector(cluster):
    with restoring_injector(cluster, markets=("spot",)) as inj:
        yield inj


def make_trainer(storage: Path, name: str, **config: Any) -> Any:
    import ray.train

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.examples.ddp_digits import train_fn
    from spotfallback.notices.jit import jit_failure_config

    return FallbackTrainer(
        train_fn,
        train_loop_config={**CONFIG, "step_log": str(storage / f"{name}.steps"), **config},
        tiers=[Tier.spot(2, max_preemptions=3, max_failures=3)],
        run_config=ray.train.RunConfig(storage_path=str(storage), name=name, failure_config=jit_failure_config()),
    )


def started_at_step(trainer: Any, step: int, driver: Background, timeout: float = 120) -> None:
    """Wait until rank 0 has completed ``step`` (and a checkpoint exists to fall back on)."""
    log = Path(trainer.train_loop_config["step_log"])
    wait_for(
        trainer.ledger,
        lambda rs: log.exists() and any(s["step"] >= step for s in read_steps(log)),
        timeout,
        driver,
    )


def node_of_rank(cluster: Any, trainer: Any, rank: int) -> Any:
    """The spot node hosting ``rank`` (rank 0 logs its node; rank 1 is on the other busy one)."""
    rank0 = read_steps(Path(trainer.train_loop_config["step_log"]))[-1]["node"]
    if rank == 0:
        return cluster.node(rank0)
    busy = [n for n, count in cluster.train_workers_per_node().items() if count and n != rank0]
    assert len(busy) == 1, busy
    return cluster.node(busy[0])


@pytest.fixture(scope="module")
def reference_hash(cluster, tmp_path_factory):
    """Final weights of the same job when nothing happens."""
    trainer = make_trainer(tmp_path_factory.mktemp("ref"), unique_name("ref"), **at_full_speed(CONFIG))
    result = trainer.fit()
    assert result.metrics["step"] == CONFIG["total_steps"]
    return result.metrics["weights_sha256"]


def timeline(records: list[Any]) -> str:
    """The ledger, one line per record, for failure messages."""
    t0 = records[0].t if records else 0.0
    lines = []
    for r in records:
        ev = r.event
        what = {k: v for k, v in ev.to_json().items() if k not in ("kind", "t") and v not in ("", None)}
        lines.append(f"{r.t - t0:7.2f}s tier {r.tier} {ev.kind} {what}")
    return "\n".join(lines)


def events(records: list[Any], kind: str) -> list[Any]:
    return [r for r in records if r.event.kind == kind]


@contextlib.contextmanager
def notice_agent(cluster: Any, trainer: Any, node: Any) -> Iterator[tuple[Any, subprocess.Popen[str]]]:
    """The real ``spotfallback notice-agent`` for ``node``, polling a fake IMDSv2 twice a second.

    Configured as the sidecar is, by environment only (RAY_ADDRESS: every local node shares
    one IP, so the node id is given). Yields (fake IMDS, process) once the agent is watching.
    """
    from tests.support.metadata_fakes import FakeAws

    imds = FakeAws()
    env = agent_env(
        RAY_ADDRESS=cluster.gcs_address,
        SPOTFALLBACK_NODE_ID=node.node_id,
        SPOTFALLBACK_CLOUD="aws",
        SPOTFALLBACK_METADATA_URL=imds.url,
        SPOTFALLBACK_RUN=trainer.location.uri(),
    )
    proc = subprocess.Popen(agent_cmd("--interval", "0.5"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # Ray found, node resolved: polling now
            if "watching aws notices" in line:
                break
        else:
            raise AssertionError(f"the agent exited {proc.wait()} before watching")
        yield imds, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        imds.close()


def announce_and_take(
    cluster: Any, injector: Any, trainer: Any, node: Any, driver: Background, ready: Any
) -> tuple[int, float]:
    """The cloud's way: the agent watches first; once ``ready(steps)`` holds, a spot notice
    NOTICE_S ahead, which the agent drains once; the VM goes at the deadline.

    Returns (deadline, kill time). The agent starts before the notice (its start, a few
    seconds of imports and GCS lookups, must not eat the notice). The workers hold at the run's
    ``step_gate`` while it starts, so that the run's remaining steps are not eaten either: on a
    loaded machine the start takes longer than they do.
    """
    from tests.support.metadata_fakes import iso

    log = Path(trainer.train_loop_config["step_log"])
    gate = Path(trainer.train_loop_config["step_gate"])
    gate.unlink()
    with notice_agent(cluster, trainer, node) as (imds, proc):
        gate.touch()
        wait_for(trainer.ledger, lambda rs: ready(read_steps(log)), 120, driver)
        deadline = int(time.time()) + NOTICE_S
        imds.instance_action = json.dumps({"action": "terminate", "time": iso(deadline)}).encode()
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        assert (line["key"], line["drained"], line["deadline_s"]) == (f"aws:terminate:{iso(deadline)}", True, deadline)
        assert cluster.draining_nodes()[node.node_id] == deadline * 1000  # the cloud's deadline
        polls = sum(1 for r in imds.requests if r[1].endswith("instance-action"))
        while sum(1 for r in imds.requests if r[1].endswith("instance-action")) < polls + 3:
            time.sleep(0.1)  # the same notice polled again...
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert out.strip() == ""  # ...is not drained (or printed) again
    time.sleep(max(0.0, deadline - time.time()))
    injector.kill(node)  # the cloud takes the VM at the deadline
    return deadline, time.time()


def test_notices_from_the_agent_on_either_rank_lose_no_step_and_resume_bit_identical(cluster, injector, reference_hash, tmp_path):
    """Rank 1's node first (its rank is not the writer), then rank 0's (the writer's).

    Slower steps (``step_delay_s``: a sleep, the weights do not depend on it) leave room for
    two notices, each seen within a few steps, in the 20 steps of the reference run.
    """
    gate = tmp_path / "gate"
    gate.touch()
    trainer = make_trainer(tmp_path, unique_name("jit"), step_delay_s=0.5, step_gate=str(gate))
    log = Path(trainer.train_loop_config["step_log"])
    driver = Background(trainer.fit)
    started_at_step(trainer, 1, driver)
    node1 = node_of_rank(cluster, trainer, 1)
    deadline1, kill1 = announce_and_take(cluster, injector, trainer, node1, driver, lambda st: st[-1]["step"] >= 4)
    injector.replenish("spot")  # the cloud replaces the VM: a spare for the second eviction
    wait_for(trainer.ledger, lambda rs: len(attempts(read_steps(log))) >= 2, 180, driver)
    node0 = node_of_rank(cluster, trainer, 0)
    resumed = attempts(read_steps(log))[1][0]["step"]
    deadline0, kill0 = announce_and_take(cluster, injector, trainer, node0, driver, lambda st: st[-1]["step"] >= resumed + 2)
    result = driver.join(240)
    assert driver.error is None, driver.error

    steps = read_steps(log)
    costs = [eviction(steps, kill1, 0), eviction(steps, kill0, 1)]
    print(f"\nwith {NOTICE_S}s notice, rank 1 then rank 0: {costs} redone={[c.redone for c in costs]}")
    records = trainer.ledger.read()
    for cost in costs:
        assert cost.redone == 0 and cost.resumed_at == cost.last_before + 1, timeline(records)
    assert result.metrics["step"] == CONFIG["total_steps"]
    assert result.metrics["weights_sha256"] == reference_hash

    notices = [(r.event.source, r.event.drained, r.event.deadline_s, r.event.node_id) for r in events(records, "preemption_notice")]
    assert notices == [("aws", True, float(deadline1), node1.node_id), ("aws", True, float(deadline0), node0.node_id)]
    assert all(r.decision == {"action": "continue"} for r in events(records, "preemption_notice"))
    jit = [(r.event.outcome, r.event.step) for r in events(records, "jit_checkpoint")]
    # A spare spot node was up each time: the gang left once its checkpoint was committed.
    assert jit == [(o, c.last_before) for c in costs for o in ("started", "reported", "moved")], timeline(records)
    moved = [r.t for r in events(records, "jit_checkpoint") if r.event.outcome == "moved"]
    assert all(t < deadline for t, deadline in zip(moved, (deadline1, deadline0), strict=True))
    print(f"node killed -> first new step: {[round(c.kill_to_new_s, 1) for c in costs]} s (negative: before the node went)")
    committed = [r.event.step for r in events(records, "checkpoint_committed")]
    assert all(c.last_before in committed for c in costs)
    kinds = [r.event.kind for r in records if r.event.kind in ("preempted", "node_failed", "workers_acquired")]
    assert kinds == ["workers_acquired", "preempted"] * 2 + ["workers_acquired"]  # preemptions, not failures


def test_kill_without_notice_redoes_at_most_the_checkpoint_interval(cluster, injector, reference_hash, tmp_path):
    trainer = make_trainer(tmp_path, unique_name("kill"))
    driver = Background(trainer.fit)
    started_at_step(trainer, 8, driver)
    node = injector.kill_one("spot")
    kill_t = time.time()
    assert node is not None
    result = driver.join(240)
    assert driver.error is None, driver.error

    cost = eviction(read_steps(Path(trainer.train_loop_config["step_log"])), kill_t)
    print(f"\nwithout notice: {cost} redone={cost.redone}")
    records = trainer.ledger.read()
    # Where the kill lands decides how much is redone (0 right after a checkpoint's commit, up
    # to the interval): the run resumes from the newest checkpoint the controller had committed
    # when it decided the failure (the ledger is written in the controller's order).
    failed = records.index(events(records, "node_failed")[0]) if events(records, "node_failed") else len(records)
    committed = [r.event.step for r in records[:failed] if r.event.kind == "checkpoint_committed"]
    assert cost.resumed_at == committed[-1] + 1, timeline(records)
    assert cost.redone <= CONFIG["checkpoint_every"]
    assert result.metrics["weights_sha256"] == reference_hash
    assert events(records, "node_failed") and not events(records, "jit_checkpoint"), timeline(records)
    assert not events(records, "preemption_notice") and not events(records, "application_failed")


def test_notice_shorter_than_the_write_falls_back_to_the_previous_checkpoint(cluster, injector, reference_hash, tmp_path):
    # The notice must be long enough for the workers to see it (Ray's drain poll, the health
    # check, the next check(): about 2.5 s, more under load) and shorter than the write.
    trainer = make_trainer(tmp_path, unique_name("short"), jit_checkpoint_delay_s=10.0)
    injector.record_notices(trainer.location)  # the injector's notice goes in the ledger, as the agent's
    driver = Background(trainer.fit)
    started_at_step(trainer, 7, driver)
    # Rank 0, the writer, is on the preempted node: no grace period can save its write.
    node = injector.preempt(node_of_rank(cluster, trainer, 0), notice_s=6.0)  # drain, 6 s, kill
    kill_t = time.time()
    result = driver.join(240)
    assert driver.error is None, driver.error

    cost = eviction(read_steps(Path(trainer.train_loop_config["step_log"])), kill_t)
    print(f"\nnotice shorter than the write: {cost} redone={cost.redone}")
    assert result.metrics["weights_sha256"] == reference_hash  # nothing corrupted
    records = trainer.ledger.read()
    jit = events(records, "jit_checkpoint")
    assert [r.event.outcome for r in jit] == ["started", "missed"]
    started, missed = jit[0].event, jit[1].event
    assert started.attempt == missed.attempt and started.step == missed.step == cost.last_before
    # The previous checkpoint: the last one committed before the write was missed. Under load a
    # periodic checkpoint begun before the notice can commit while the just-in-time write runs.
    committed_before = [r.event.step for r in records[:records.index(jit[1])]
                        if r.event.kind == "checkpoint_committed" and r.event.step != started.step]
    assert cost.resumed_at == committed_before[-1] + 1
    assert f"from the checkpoint of step {committed_before[-1]}" in missed.detail
    # The just-in-time write never committed (a periodic checkpoint of the same step, redone after
    # the resume, may commit later: under load the notice can land on a checkpoint step).
    during = records[records.index(jit[0]):records.index(jit[1])]
    assert started.step not in [r.event.step for r in during if r.event.kind == "checkpoint_committed"]
    assert records.index(jit[1]) > records.index(events(records, "preempted")[0])
    (notice,) = events(records, "preemption_notice")
    assert (notice.event.source, notice.event.drained, notice.event.node_id) == ("injector", True, node.node_id)
    drained_at = injector.actions("drain")[-1].wall_time
    assert notice.event.deadline_s == pytest.approx(drained_at + 6.0, abs=1.0) and notice.t < jit[0].t
