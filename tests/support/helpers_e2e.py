"""Shared pieces of the end-to-end tests on the local spot cluster."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest

if TYPE_CHECKING:
    from spotfallback.local import Injector, LocalSpotCluster, NodeGroup
    from spotfallback.local.autoscaling import LocalAutoscalingCluster

REPO = Path(__file__).resolve().parents[2]

# Ray Train V2, fast health checks so reports and failures are seen quickly, and the repo on
# every worker's path so `spotfallback.examples.ddp_digits` imports there. Raylets inherit this environment.
E2E_ENV = {
    "RAY_TRAIN_V2_ENABLED": "1",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    "SPOTFALLBACK_LEASE_TTL_S": "10",
}

# The per-test limit (pyproject's 420 s) catches a hung test in minutes; these tests, whole runs
# with faults and restarts, have taken 90 s to 5 minutes on a loaded 2-core CI, so they get 900 s.
SLOW_UNDER_LOAD = pytest.mark.timeout(900)

# Small and quick, but long enough to inject faults between checkpoints.
TRAIN_CONFIG = {"total_steps": 30, "checkpoint_every": 5, "step_delay_s": 0.15, "seed": 7}


def at_full_speed(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without its per-step sleep and with metrics only at checkpoints.

    Neither shapes the training math, so a reference run's weights are the same; each report
    waits for the controller's poll, so a 30-step reference takes about 10 s less.
    """
    return {**config, "step_delay_s": 0.0, "report_every": config["total_steps"]}


def apply_env() -> None:
    os.environ.update(E2E_ENV)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def module_env(env: Mapping[str, str] | None, unset: Sequence[str], e2e_env: bool) -> Iterator[None]:
    """The e2e environment (unless ``e2e_env=False``), ``env`` set and ``unset`` removed, restored after."""
    if e2e_env:
        apply_env()
    with mock.patch.dict(os.environ, dict(env or {})):  # restores the whole environment after
        for key in unset:
            os.environ.pop(key, None)
        yield


@contextlib.contextmanager
def local_cluster(
    groups: Sequence[NodeGroup] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
    e2e_env: bool = True,
) -> Iterator[LocalSpotCluster]:
    """A module's connected local spot cluster, always shut down: by default two spot, two on-demand nodes.

    Raylets (hence controllers and workers) inherit this process's environment: the e2e
    environment is applied first (``e2e_env=False``: a user's plain environment), then ``env``
    is set and ``unset`` removed for the cluster's lifetime, and both restored after, so one
    module's knobs do not leak into the next.
    """
    from spotfallback.local import LocalSpotCluster, NodeGroup

    with module_env(env, unset, e2e_env):
        c = LocalSpotCluster(groups or [NodeGroup("spot", count=2), NodeGroup("on-demand", count=2)], connect=True)
        try:
            c.start()
            yield c
        finally:
            c.shutdown()


@contextlib.contextmanager
def autoscaled_cluster(
    groups: Sequence[NodeGroup] | None = None, *, env: Mapping[str, str] | None = None, e2e_env: bool = True
) -> Iterator[LocalAutoscalingCluster]:
    """The same on Ray's autoscaler: each group a node type kept at its ``count`` nodes (``min_workers``),
    capped there, launched as soon as its cap allows; returned once every group's nodes are up.

    A preempted node is replaced by the autoscaler, as a cloud's node pool replaces one; the
    injector's capacity changes set the caps. ``e2e_env=False`` keeps this process's
    environment as it is (the benchmark harness sets its own Ray Train poll).
    """
    from spotfallback.local import NodeGroup
    from spotfallback.local.autoscaling import AutoscaledGroup, LocalAutoscalingCluster

    node_groups = groups or [NodeGroup("spot", count=2), NodeGroup("on-demand", count=2)]
    with module_env(env, (), e2e_env), LocalAutoscalingCluster(
        [AutoscaledGroup(g, max_workers=g.count, min_workers=g.count) for g in node_groups], connect=True
    ) as c:
        for g in node_groups:
            c.wait_for_nodes(g.name, g.count)
        yield c


@contextlib.contextmanager
def restoring_injector(cluster: LocalSpotCluster | LocalAutoscalingCluster, markets: Sequence[str] = ("spot", "on-demand")) -> Iterator[Injector]:
    """An injector for one test; after it, timed actions stop and every market's nodes (or caps) are back."""
    from spotfallback.local import Injector

    inj = Injector(cluster)
    try:
        yield inj
    finally:
        inj.close()  # stops timed actions and replays first, so nothing takes capacity again
        for market in markets:
            inj.give_back(market)
            inj.replenish(market)


class Background:
    """Run ``fn`` (the driver's ``fit``) on a thread while the test watches and injects faults."""

    def __init__(self, fn: Callable[[], Any]):
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def join(self, timeout: float) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the driver did not finish within {timeout}s")
        return self.result

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


# How much longer than on a quiet machine a wait for progress may take: both workers of a 2-core
# CI run clusters whose Ray processes keep the cores busy (load 10 and more), and a Train worker
# then needs a minute or two to import its libraries and start. A wait that is met returns at once.
WAIT_SLACK = 2.0


def poll_until(predicate: Callable[[], bool], timeout: float, last: Callable[[], object] = lambda: "", *,
               every: float = 0.5, ended: Callable[[], str | None] = lambda: None) -> None:
    """Poll ``predicate`` until it holds, for up to ``timeout`` seconds on a quiet machine
    (:data:`WAIT_SLACK` times that). ``last``: the state a timeout names; ``ended``: why waiting on
    is pointless (a driver that exited), or None."""
    timeout *= WAIT_SLACK
    deadline = time.monotonic() + timeout
    while not predicate():
        if (why := ended()) is not None:
            raise AssertionError(why)
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s; last: {last()}")
        time.sleep(every)


def wait_for(ledger: Any, predicate: Callable[[list[Any]], bool], timeout: float, driver: Background | None = None) -> list[Any]:
    """Poll the run's ledger until ``predicate(records)`` holds (:func:`poll_until`); the records."""
    records: list[Any] = []

    def met() -> bool:
        records[:] = ledger.read()
        return predicate(records)

    def seen() -> list[str]:  # every kind, commits too
        return [r.event.kind for r in records]

    def ended() -> str | None:
        return None if driver is None or not driver.done else f"the driver ended early: {driver.error!r}; ledger: {seen()}"

    poll_until(met, timeout, seen, every=0.25, ended=ended)
    return records


def checkpoints_since(records: list[Any], kind: str, tier: int | None = None) -> int:
    """Checkpoints committed after the last event of ``kind`` (on ``tier`` if given)."""
    last = max((i for i, r in enumerate(records) if r.event.kind == kind), default=-1)
    return sum(
        1 for r in records[last + 1 :] if r.event.kind == "checkpoint_committed" and (tier is None or r.tier == tier)
    )


def kinds(records: list[Any]) -> list[str]:
    return [r.event.kind for r in records if r.event.kind != "checkpoint_committed"]


def preempt_then_kill_the_driver(command: Sequence[str], ledger: Any, injector: Injector, logs: Path,
                                 kill_when: Callable[[list[Any]], bool] | None = None,
                                 env: Mapping[str, str] | None = None) -> str:
    """Run a driver ``command`` on a spot-then-on-demand ladder through the storage suite's core
    fault: once it has checkpointed on spot, preempt a spot node; SIGKILL the driver as soon as
    ``kill_when(records)`` holds (default: the on-demand workers are up, plenty of steps left to
    resume); launch it again to the end. The second launch's log (it must exit 0)."""
    import signal
    import subprocess

    def start(tag: str) -> subprocess.Popen[str]:
        out = open(logs / f"{tag}.log", "w")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(list(command), cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)

    first = start("first")
    try:
        wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 180)
        injector.preempt_one("spot", notice_s=1.0)
        wait_for(ledger, kill_when or (lambda rs: rs[-1].event.kind == "workers_acquired" and rs[-1].tier == 1), 180)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    second = start("second")
    try:
        assert second.wait(300) == 0, (logs / "second.log").read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
    return (logs / "second.log").read_text()
