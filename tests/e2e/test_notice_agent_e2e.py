"""End to end: the real ``spotfallback notice-agent`` process against a local Ray cluster and a
loopback fake of the GCE metadata server, with what the agent did read back from Ray.

- GCP host maintenance: ``instance/maintenance-event`` turns ``TERMINATE_ON_HOST_MAINTENANCE``
  while ``instance/preempted`` stays ``FALSE`` (a GPU or Spot VM about 60 s before the host
  stops it): the agent drains the node with reason PREEMPTION and that deadline, which the GCS
  then holds for the node; the ledger and the health record call it host maintenance. A live
  migration (``MIGRATE_ON_HOST_MAINTENANCE``) drains nothing.
- A sidecar that starts before Ray, in a pod: it waits (its health record says so) and starts
  watching once ``ray start`` writes the address file, instead of giving up.

One cluster for the module: a head without CPUs and one one-CPU spot node, kept busy by an
actor so that a drained node stays draining (an idle drained raylet shuts itself down).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotfallback.notices.health import AgentState, read_agents
from spotfallback.notices.metadata import GCP_MAINTENANCE_NOTICE_S
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run
from tests.support.helpers_e2e import local_cluster
from tests.support.metadata_fakes import FakeGcp

MAINTENANCE = "/computeMetadata/v1/instance/maintenance-event"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from spotfallback.local import NodeGroup

    with local_cluster([NodeGroup("spot", count=1)]) as c:
        yield c


@pytest.fixture(scope="module")
def busy_node(cluster: Any) -> Iterator[Any]:
    """The spot node, with an actor holding its one CPU (so a drain does not end it at once)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    (node,) = cluster.nodes("spot")

    @ray.remote(num_cpus=1)
    class Busy:
        def ping(self) -> str:
            return "ok"

    actor = Busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
    assert ray.get(actor.ping.remote(), timeout=60) == "ok"
    yield node
    ray.kill(actor)


@pytest.fixture()
def gcp() -> Iterator[FakeGcp]:
    fake = FakeGcp()
    yield fake
    fake.close()


def agent_env(**extra: str) -> dict[str, str]:
    unset = ("RAY_ADDRESS", "SPOTFALLBACK_NODE_ID", "KUBERNETES_SERVICE_HOST", "SPOTFALLBACK_IN_POD", "SPOTFALLBACK_RAY_WAIT_S")
    return {**{k: v for k, v in os.environ.items() if k not in unset}, "SPOTFALLBACK_HEALTH_EVERY_S": "0.5", **extra}


@contextlib.contextmanager
def agent(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """The real agent process, polling five times a second; stopped (SIGTERM, then kill) by pid."""
    command = [sys.executable, "-m", "spotfallback.cli", "notice-agent", "--interval", "0.2"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_for_line(proc: subprocess.Popen[str], needle: str) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        if needle in line:
            return
    raise AssertionError(f"the agent exited {proc.wait()} before saying {needle!r}")


def agent_record(run: Any, state: AgentState, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        agents, _ = read_agents(run)
        if agents and agents[0].state is state:
            return agents[0]
        assert time.monotonic() < deadline, f"no agent record in state {state}: {agents}"
        time.sleep(0.1)


def test_a_sidecar_started_before_ray_waits_in_its_pod_then_watches(cluster, busy_node, gcp, tmp_path):
    """The pod's /tmp/ray (RAY_TMPDIR) has no address file yet: no Ray. The agent waits, says so
    in its health record, and starts watching once the file appears, as `ray start` writes it."""
    run = resolve_run(str(tmp_path / "runs"), "sidecar-1")
    pod_tmp = tmp_path / "pod-tmp"
    env = agent_env(
        RAY_TMPDIR=str(pod_tmp),
        KUBERNETES_SERVICE_HOST="10.0.0.1",
        SPOTFALLBACK_NODE_ID=busy_node.node_id,
        SPOTFALLBACK_CLOUD="gcp",
        SPOTFALLBACK_METADATA_URL=gcp.url,
        SPOTFALLBACK_RUN=run.uri(),
    )
    with agent(env) as proc:
        waiting = agent_record(run, AgentState.WAITING_FOR_RAY)
        deadline = time.monotonic() + 60
        while "ray_current_cluster" not in waiting.detail:
            assert time.monotonic() < deadline, waiting
            waiting = agent_record(run, AgentState.WAITING_FOR_RAY)
        (pod_tmp / "ray").mkdir(parents=True)
        Path(pod_tmp, "ray", "ray_current_cluster").write_text(cluster.gcs_address)  # `ray start` is up
        wait_for_line(proc, "watching gcp notices")
        watching = agent_record(run, AgentState.WATCHING)
        assert watching.node_id == busy_node.node_id and watching.since >= waiting.since
    assert agent_record(run, AgentState.STOPPED).detail == "stopped (SIGTERM)"


def test_gcp_host_maintenance_drains_the_node_with_sixty_seconds_and_a_migration_does_not(cluster, busy_node, gcp, tmp_path):
    run = resolve_run(str(tmp_path / "runs"), "maintenance-1")
    env = agent_env(
        RAY_ADDRESS=cluster.gcs_address,
        SPOTFALLBACK_NODE_ID=busy_node.node_id,  # every local node shares this machine's address
        SPOTFALLBACK_CLOUD="gcp",
        SPOTFALLBACK_METADATA_URL=gcp.url,
        SPOTFALLBACK_RUN=run.uri(),
    )
    with agent(env) as proc:
        wait_for_line(proc, "watching gcp notices")
        gcp.maintenance = b"MIGRATE_ON_HOST_MAINTENANCE"  # a live migration: the VM keeps running
        asked = sum(1 for r in gcp.requests if r[1] == MAINTENANCE)
        while sum(1 for r in gcp.requests if r[1] == MAINTENANCE) < asked + 5:
            assert proc.poll() is None
            time.sleep(0.05)
        assert busy_node.node_id not in cluster.draining_nodes()

        seen = time.time()
        gcp.maintenance = b"TERMINATE_ON_HOST_MAINTENANCE"  # preempted stays FALSE
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        assert (line["source"], line["action"], line["drained"]) == ("gcp", "host-maintenance", True)
        assert seen + GCP_MAINTENANCE_NOTICE_S - 1 <= line["deadline_s"] <= time.time() + GCP_MAINTENANCE_NOTICE_S
        # Ray holds the drain with the maintenance's deadline: Ray Train's workers see it as a preemption notice.
        assert cluster.draining_nodes()[busy_node.node_id] == int(line["deadline_s"] * 1000)
        record = agent_record(run, AgentState.DRAINED)
        assert record.deadline_s == line["deadline_s"] and record.node_id == busy_node.node_id
        assert "TERMINATE_ON_HOST_MAINTENANCE" in record.detail

    notices = [r.event for r in Ledger(run).read() if r.event.kind == "preemption_notice"]
    assert [(e.source, e.action, e.drained, e.node_id) for e in notices] == [("gcp", "host-maintenance", True, busy_node.node_id)]
    assert gcp.value == b"FALSE"
