"""End to end on the local spot cluster: a preemption notice becomes a just-in-time checkpoint.

One cluster for the module: a head with no CPUs (driver and Train controller) and three
one-CPU spot nodes, so a run of two workers that loses one node resumes on the third. The
job is the DDP example with preemption checks about every second; rank 0 logs every step
it completes (``step_log``), which is how steps redone and seconds lost are measured.

- notice via the real agent (a fake AWS IMDSv2 on loopback, drain through the shared call)
  -> JIT checkpoint -> resumed at exactly the next step, weights bit-identical;
- kill without notice -> resumed from the last periodic checkpoint (<= interval redone);
- notice shorter than the checkpoint write (injector's drain) -> resumed from the previous
  checkpoint, weights still bit-identical, the ledger says the JIT checkpoint missed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers_e2e import TRAIN_CONFIG, Background, apply_env, unique_name, wait_for  # noqa: E402

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


def eviction(steps: list[dict[str, Any]], kill_t: float) -> Eviction:
    first_pid = steps[0]["pid"]
    before = [s for s in steps if s["pid"] == first_pid]
    after = [s for s in steps if s["pid"] != first_pid]
    assert before and after, steps  # (a surviving rank 0 may finish one more step after the kill)
    last = before[-1]
    new = next(s for s in after if s["step"] > last["step"])
    return Eviction(last["step"], after[0]["step"], new["t"] - last["t"], new["t"] - kill_t)


@pytest.fixture(scope="module")
def cluster():
    apply_env()
    from spotfallback.local import LocalSpotCluster, NodeGroup

    c = LocalSpotCluster([NodeGroup("spot", count=3)], connect=True)
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
        inj.close()
        inj.replenish("spot")


def make_trainer(storage: Path, name: str, **config: Any) -> Any:
    import ray.train
    from examples.ddp_digits import train_fn

    from spotfallback import FallbackTrainer, Tier
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
    trainer = make_trainer(tmp_path_factory.mktemp("ref"), unique_name("ref"))
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


def test_notice_from_the_agent_loses_no_step_and_resumes_bit_identical(cluster, injector, reference_hash, tmp_path):
    from spotfallback.notices.agent import AwsPoller, LedgerRecorder, NoticeAgent, RayDrain
    from spotfallback.notices.runlog import RunLog
    from test_notice_agent import FakeAws, iso

    trainer = make_trainer(tmp_path, unique_name("jit"))
    driver = Background(trainer.fit)
    started_at_step(trainer, 7, driver)
    # Rank 1's node: the preempted rank is not the writer and is alive to the deadline.
    node = node_of_rank(cluster, trainer, 1)
    imds = FakeAws()
    try:
        deadline = int(time.time()) + NOTICE_S
        imds.instance_action = json.dumps({"action": "terminate", "time": iso(deadline)}).encode()
        agent = NoticeAgent(
            AwsPoller(imds.url),
            RayDrain(cluster.gcs_address, node.node_id),
            record=LedgerRecorder(RunLog(trainer.location), node.node_id),
        )
        assert [n.key for n in agent.poll_once()] == [f"aws:terminate:{iso(deadline)}"]
        agent.poll_once()  # the same notice again: no second drain
        assert len(agent.drained) == 1
        assert cluster.draining_nodes()[node.node_id] == deadline * 1000
    finally:
        imds.close()
    time.sleep(max(0.0, deadline - time.time()))
    injector.kill(node)  # the cloud takes the VM at the deadline
    kill_t = time.time()
    result = driver.join(240)
    assert driver.error is None, driver.error

    cost = eviction(read_steps(Path(trainer.train_loop_config["step_log"])), kill_t)
    print(f"\nwith {NOTICE_S}s notice: {cost} redone={cost.redone}")
    records = trainer.ledger.read()
    assert cost.redone == 0 and cost.resumed_at == cost.last_before + 1, timeline(records)
    assert result.metrics["step"] == CONFIG["total_steps"]
    assert result.metrics["weights_sha256"] == reference_hash

    (notice,) = events(records, "preemption_notice")
    assert (notice.event.source, notice.event.drained, notice.event.deadline_s) == ("aws", True, float(deadline))
    assert notice.event.node_id == node.node_id and notice.decision == {"action": "continue"}
    jit = [(r.event.outcome, r.event.step) for r in events(records, "jit_checkpoint")]
    assert jit == [("started", cost.last_before), ("reported", cost.last_before)]
    assert cost.last_before in [r.event.step for r in events(records, "checkpoint_committed")]
    kinds = [r.event.kind for r in records if r.event.kind in ("preempted", "node_failed", "workers_acquired")]
    assert kinds == ["workers_acquired", "preempted", "workers_acquired"]  # a preemption, not a failure


@pytest.mark.slow
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
    assert 0 < cost.redone <= CONFIG["checkpoint_every"]
    assert (cost.resumed_at - 1) % CONFIG["checkpoint_every"] == 0  # a periodic checkpoint
    assert result.metrics["weights_sha256"] == reference_hash
    records = trainer.ledger.read()
    assert events(records, "node_failed") and not events(records, "jit_checkpoint")


def test_notice_shorter_than_the_write_falls_back_to_the_previous_checkpoint(cluster, injector, reference_hash, tmp_path):
    trainer = make_trainer(tmp_path, unique_name("short"), jit_checkpoint_delay_s=6.0)
    driver = Background(trainer.fit)
    started_at_step(trainer, 7, driver)
    # Rank 0, the writer, is on the preempted node: no grace period can save its write.
    injector.preempt(node_of_rank(cluster, trainer, 0), notice_s=3.0)  # drain, 3 s, kill
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
    committed_before = [r.event.step for r in records if r.event.kind == "checkpoint_committed" and r.t < jit[0].t]
    assert cost.resumed_at == committed_before[-1] + 1  # the previous checkpoint
    assert f"from the checkpoint of step {committed_before[-1]}" in missed.detail
    assert started.step not in [r.event.step for r in records if r.event.kind == "checkpoint_committed"]
    assert records.index(jit[1]) > records.index(events(records, "preempted")[0])
