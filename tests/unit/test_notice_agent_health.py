"""The notice agent's health record: its states, its writer, and the real agent process keeping it.

An agent that cannot do its job (no Ray node yet, a metadata service that does not answer,
Azure Scheduled Events switching on) must say so where a user looks (`spotfallback status`),
and in a pod, whose containers are not restarted, it must keep waiting for its Ray node
instead of exiting. No Ray cluster: the processes run where Ray never comes up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from spotfallback.notices.agent import NoticeAgent
from spotfallback.notices.health import (
    AGENTS_DIR,
    AgentHealth,
    AgentState,
    HealthReporter,
    agent_name,
    health_path,
    read_agents,
)
from spotfallback.notices.metadata import AzurePoller, Notice
from spotfallback.store.location import resolve_run
from tests.support.faultyfs import FaultControl, faulty_filesystem
from tests.support.metadata_fakes import FakeAzure, FakeGcp

T = 1_000_000.0


def notice(deadline: float, action: str = "preempt") -> Notice:
    return Notice("gcp", f"gcp:{action}", action, deadline, detail="instance/preempted is TRUE")


# ----------------------------------------------------------------------------- states (pure)


def test_states_follow_the_agents_life_and_since_marks_each_change():
    h = AgentHealth.starting("pod-a", "gcp", T, every_s=30)
    assert (h.state, h.since, h.detail) == (AgentState.WAITING_FOR_RAY, T, "starting")
    h = h.waiting_for_ray(T + 5, "no Ray address")
    h = h.waiting_for_ray(T + 9, "no live Ray node has this machine's address")
    assert (h.state, h.since, h.t) == (AgentState.WAITING_FOR_RAY, T, T + 9)  # still the same wait
    h = h.watching(T + 10, "ab" * 28)
    assert (h.state, h.since, h.node_id) == (AgentState.WATCHING, T + 10, "ab" * 28)
    h = h.after_poll(T + 12, ["gcp preempted: connection refused"], [], [], [])
    h = h.after_poll(T + 14, ["gcp preempted: timed out"], [], [], [])
    assert (h.state, h.since, h.detail) == (AgentState.METADATA_FAILING, T + 12, "gcp preempted: timed out")
    h = h.after_poll(T + 16, [], [], [], [])
    assert (h.state, h.since) == (AgentState.WATCHING, T + 16)
    h = h.after_poll(T + 18, [], ["enabling Scheduled Events: answering"], [], [])
    assert h.state is AgentState.ENABLING
    n = notice(T + 48)
    h = h.after_poll(T + 20, [], [], [n], [n])
    assert (h.state, h.since, h.deadline_s, h.notices) == (AgentState.DRAINED, T + 20, T + 48, 1)
    h = h.after_poll(T + 22, ["gcp preempted: timed out"], [], [], [])
    assert (h.state, h.t) == (AgentState.DRAINED, T + 22)  # a drained node stays drained
    h = h.stopped(T + 30, "stopped (SIGTERM)")
    assert (h.state, h.since, h.detail) == (AgentState.STOPPED, T + 30, "stopped (SIGTERM)")


def test_stale_after_three_missed_beats_and_gone_once_a_drained_node_passed_its_deadline():
    h = AgentHealth.starting("pod-a", "aws", T, every_s=30).watching(T, "cd" * 28)
    assert not h.stale(T + 90) and h.stale(T + 91) and not h.gone_with_node(T + 91)
    assert not h.stopped(T, "stopped (SIGTERM)").stale(T + 10_000)  # a stopped agent is not missing
    n = notice(T + 120, "terminate")
    drained = h.after_poll(T, [], [], [n], [n])
    assert drained.stale(T + 100) and not drained.gone_with_node(T + 100)  # before the deadline: a dead agent
    assert drained.gone_with_node(T + 121)


def test_record_names_are_the_host_and_the_node_when_given():
    assert agent_name("worker-pod-7x2") == "worker-pod-7x2"
    assert agent_name("vm 1/a", "0123456789abcdef") == "vm_1_a-0123456789ab"


# ----------------------------------------------------------------------------- the writer


def _wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _stored(location: Any, agent: str) -> dict[str, Any]:
    with location.fs.open_input_stream(health_path(location, agent)) as f:
        return json.loads(f.readall())


def test_reporter_writes_each_change_at_once_beats_between_and_closes_with_the_last_word(tmp_path):
    location = resolve_run(str(tmp_path / "runs"), "job-1")
    reporter = HealthReporter(location, AgentHealth.starting("pod-a", "gcp", time.time(), every_s=0.3))
    try:
        _wait_for(lambda: reporter.writes >= 1)
        assert _stored(location, "pod-a")["state"] == "waiting-for-ray"
        reporter.update(reporter.health.watching(time.time(), "ef" * 28))
        _wait_for(lambda: _stored(location, "pod-a")["state"] == "watching", 0.25)  # at once, not at the next beat
        first = _stored(location, "pod-a")["t"]
        _wait_for(lambda: _stored(location, "pod-a")["t"] > first, 2.0)  # the beat, with nothing changed
    finally:
        assert reporter.close(reporter.health.stopped(time.time(), "stopped (SIGTERM)"))
    stored = _stored(location, "pod-a")
    assert (stored["state"], stored["detail"], stored["node_id"]) == ("stopped", "stopped (SIGTERM)", "ef" * 28)
    (agent,), more = read_agents(location)
    assert (agent.agent, agent.state, more) == ("pod-a", AgentState.STOPPED, 0)


def test_reporter_rides_out_a_storage_outage_without_holding_up_the_agent(tmp_path):
    control = FaultControl(tmp_path / "faults")
    location = resolve_run(str(tmp_path / "runs"), "job-1", filesystem=faulty_filesystem(control.dir))
    control.start(1.0)
    t0 = time.monotonic()
    reporter = HealthReporter(location, AgentHealth.starting("pod-b", "aws", time.time(), every_s=0.2))
    reporter.update(reporter.health.watching(time.time(), None))
    assert time.monotonic() - t0 < 0.1  # updates never wait for storage
    try:
        _wait_for(lambda: reporter.writes >= 1, 5.0)
        assert _stored(location, "pod-b")["state"] == "watching"
    finally:
        reporter.close(reporter.health.stopped(time.time(), "done"))


def test_status_reads_the_newest_records_and_skips_what_it_cannot_read(tmp_path):
    location = resolve_run(str(tmp_path / "runs"), "job-1")
    folder = Path(location.path(AGENTS_DIR))
    folder.mkdir(parents=True)
    for i in range(5):
        h = AgentHealth.starting(f"pod-{i}", "aws", T + i).watching(T + i, None)
        (folder / f"pod-{i}.json").write_text(json.dumps(h.to_json()))
        os.utime(folder / f"pod-{i}.json", (T + i, T + i))
    (folder / "garbage.json").write_text("{not json")
    (folder / "wrong.json").write_text(json.dumps({"agent": "x", "state": "dancing"}))
    (folder / ".tmp-0123-pod-9.json").write_text("{}")  # a write in progress
    agents, more = read_agents(location, limit=7)
    assert [a.agent for a in agents] == ["pod-4", "pod-3", "pod-2", "pod-1", "pod-0"] and more == 0
    agents, more = read_agents(location, limit=2)
    assert len(agents) <= 2 and more == 5
    assert read_agents(resolve_run(str(tmp_path / "runs"), "no-such-run")) == ([], 0)


# ----------------------------------------------------------------------------- the agent's polls


def test_polls_move_the_health_through_enabling_failing_and_drained():
    """The agent's observe hook carries each poll's outcome into the record."""
    seen: list[AgentHealth] = []
    health = [AgentHealth.starting("vm-1", "azure", T).watching(T, "01" * 28)]

    def observe(result: Any, handled: list[Notice], drained: list[Notice]) -> None:
        health[0] = health[0].after_poll(time.time(), result.problems, result.pending, handled, drained)
        seen.append(health[0])

    azure = FakeAzure()
    try:
        now = [T]
        poller = AzurePoller(azure.url, timeout_s=0.1, first_timeout_s=1.0, enabling_s=300, vm_name="spot-vm-3", clock=lambda: now[0])
        agent = NoticeAgent(poller, lambda n: None, observe=observe, interval_s=0.01)
        azure.delays_s = [0.3]  # the first answer is slow: the service switches on
        agent.poll_once()
        assert seen[-1].state is AgentState.ENABLING and agent.problems == []
        now[0] += 301
        agent.poll_once()
        assert seen[-1].state is AgentState.WATCHING
        azure.status = 503
        agent.poll_once()
        assert (seen[-1].state, seen[-1].detail) == (AgentState.METADATA_FAILING, "azure scheduledevents: HTTP 503")
        azure.status = 200
        azure.events = [{"EventId": "E1", "EventType": "Preempt", "Resources": ["spot-vm-3"], "NotBefore": ""}]
        agent.poll_once()
        assert (seen[-1].state, seen[-1].notices) == (AgentState.DRAINED, 1)
    finally:
        azure.close()


# ----------------------------------------------------------------------------- the real process


def _agent(tmp_path: Path, fake: Any, *args: str, **env: str) -> subprocess.Popen[str]:
    """`spotfallback notice-agent` on a machine where Ray never comes up (no address file)."""
    unset = ("RAY_ADDRESS", "KUBERNETES_SERVICE_HOST", "SPOTFALLBACK_RAY_WAIT_S", "SPOTFALLBACK_IN_POD", "SPOTFALLBACK_NODE_ID")
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    environ.update({"RAY_TMPDIR": str(tmp_path / "no-ray"), "SPOTFALLBACK_HEALTH_EVERY_S": "0.5", **env})
    command = [sys.executable, "-m", "spotfallback.cli", "notice-agent", "--metadata-url", fake.url, *args]
    return subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _record(tmp_path: Path, timeout_s: float = 60.0, state: str | None = None, saying: str = "") -> AgentHealth:
    """The agent's record once there is one (in ``state``, its detail containing ``saying``)."""
    location = resolve_run(str(tmp_path / "runs"), "job-1")
    deadline = time.monotonic() + timeout_s
    while True:
        agents, _ = read_agents(location)
        if agents and (state is None or agents[0].state == state) and saying in agents[0].detail:
            return agents[0]
        assert time.monotonic() < deadline, f"no agent record in state {state} saying {saying!r}: {agents}"
        time.sleep(0.1)


@pytest.fixture()
def gcp():
    s = FakeGcp()
    yield s
    s.close()


def test_in_a_pod_the_agent_waits_for_its_ray_node_until_sigterm_and_says_so(gcp, tmp_path):
    """Pods are not restarted (restartPolicy Never): an agent that gave up would leave every
    eviction on its node undrained, silently. It waits, and its record says what for."""
    run = f"{tmp_path}/runs/job-1"
    proc = _agent(tmp_path, gcp, "--cloud", "gcp", "--run", run, KUBERNETES_SERVICE_HOST="10.0.0.1")
    try:
        waiting = _record(tmp_path, state="waiting-for-ray", saying="ray_current_cluster")  # no Ray address yet
        assert waiting.cloud == "gcp" and waiting.node_id is None
        first_seen = waiting.t
        _wait_for(lambda: _record(tmp_path).t > first_seen + 1.0, 30)  # beats while it waits
        assert proc.poll() is None  # still waiting
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert "waiting for the Ray node" in err and "until the pod stops" in err
    stopped = _record(tmp_path)
    assert (stopped.state, stopped.detail) == (AgentState.STOPPED, "SIGTERM while waiting for the Ray node")


def test_in_a_pod_the_wait_is_not_bounded_by_the_default_ray_wait():
    from spotfallback.cli.notice import in_a_pod

    assert in_a_pod(None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) and not in_a_pod(None, {})
    assert in_a_pod(True, {}) and not in_a_pod(False, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})


def test_outside_a_pod_the_agent_gives_up_after_ray_wait_and_its_record_says_why(gcp, tmp_path):
    proc = _agent(tmp_path, gcp, "--cloud", "gcp", "--run", f"{tmp_path}/runs/job-1", SPOTFALLBACK_RAY_WAIT_S="1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "cannot find the Ray node to drain after 1s" in err
    record = _record(tmp_path, timeout_s=1)
    assert record.state is AgentState.STOPPED and record.detail.startswith("gave up: cannot find the Ray node to drain after 1s")


def test_the_explicit_flag_makes_an_agent_wait_like_in_a_pod(gcp, tmp_path):
    """Where the environment does not say "pod" (or a unit is never restarted): --in-pod."""
    proc = _agent(tmp_path, gcp, "--cloud", "gcp", "--in-pod", "--run", f"{tmp_path}/runs/job-1")
    try:
        assert _record(tmp_path, state="waiting-for-ray")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0 and "until the pod stops" in err


def test_a_watching_agent_reports_metadata_failures_and_recovery(gcp, tmp_path):
    proc = _agent(tmp_path, gcp, "--cloud", "gcp", "--dry-run", "--interval", "0.2", "--timeout", "0.3", "--run", f"{tmp_path}/runs/job-1")
    try:
        assert _record(tmp_path, state="watching")
        gcp.status = 503
        failing = _record(tmp_path, state="metadata-failing", timeout_s=10)
        assert failing.detail == "gcp preempted: HTTP 503"
        gcp.status = 200
        assert _record(tmp_path, state="watching", timeout_s=10).since > failing.since
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0
    assert _record(tmp_path).state is AgentState.STOPPED


def test_an_azure_agent_says_enabling_while_its_first_slow_request_switches_the_service_on(tmp_path):
    """The first Scheduled Events request takes longer than --timeout: waited for (--azure-first-timeout),
    shown as "enabling", never as a failure; and for five minutes after, events may not flow yet."""
    azure = FakeAzure()
    azure.delays_s = [3.0]
    run = f"{tmp_path}/runs/job-1"
    args = ("--cloud", "azure", "--dry-run", "--interval", "0.2", "--timeout", "0.3", "--azure-first-timeout", "10", "--run", run)
    proc = _agent(tmp_path, azure, *args)
    try:
        asking = _record(tmp_path, state="enabling", saying="first request")
        answered = _record(tmp_path, state="enabling", saying="answering", timeout_s=20)
        assert answered.since == asking.since  # one state from the start: never "failing"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            azure.close()
    assert proc.returncode == 0 and "azure scheduledevents:" not in err  # no problem was logged


def test_once_writes_no_health_record(gcp, tmp_path):
    proc = _agent(tmp_path, gcp, "--cloud", "gcp", "--dry-run", "--once", "--run", f"{tmp_path}/runs/job-1")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    location = resolve_run(str(tmp_path / "runs"), "job-1")
    assert location.fs.get_file_info(location.path(AGENTS_DIR)).type == pafs.FileType.NotFound


def test_health_every_must_be_a_positive_number(gcp, tmp_path):
    proc = _agent(tmp_path, gcp, "--cloud", "gcp", "--dry-run", "--once", SPOTFALLBACK_HEALTH_EVERY_S="0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--health-every (SPOTFALLBACK_HEALTH_EVERY_S): 0.0 is not a number of seconds at least 0.1" in err
