"""The autoscaled local cluster's capacity cap counts what a cloud counts: VMs that still run.

A cloud frees a spot VM's quota when it takes the VM; the fake provider keeps a killed node
listed until Ray's autoscaler notices the death and terminates it, seconds later. The cap
must not count it meanwhile, or a replacement is refused for Ray's node-death detection time.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _entry(*polls: int | None) -> dict[str, Any]:
    from ray._private import ray_constants

    raylets = [SimpleNamespace(process=SimpleNamespace(poll=lambda p=p: p)) for p in polls]
    return {"tags": {}, "node": SimpleNamespace(all_processes={ray_constants.PROCESS_TYPE_RAYLET: raylets})}


def test_a_node_counts_while_its_raylet_runs_and_not_once_it_is_killed() -> None:
    from spotfallback.local.autoscaling import _running

    assert _running({"tags": {}})  # the head: the fake provider starts no process for it
    assert _running(_entry(None))
    assert not _running(_entry(-9))
    assert _running(_entry())  # no raylet recorded: nothing says it died


def test_a_really_killed_process_stops_counting() -> None:
    from ray._private import ray_constants

    from spotfallback.local.autoscaling import _running

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    entry = {"tags": {}, "node": SimpleNamespace(all_processes={ray_constants.PROCESS_TYPE_RAYLET: [SimpleNamespace(process=proc)]})}
    try:
        assert _running(entry)
        proc.kill()
        deadline = time.monotonic() + 10
        while _running(entry) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(entry)
    finally:
        proc.kill()
        proc.wait()


def test_the_fake_provider_keeps_the_node_object_the_cap_looks_at() -> None:
    """Pinned on Ray 2.60: each fake node's entry holds its ``Node``, whose raylet is listed by type."""
    from ray._private import node, ray_constants
    from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

    assert '"node": node' in inspect.getsource(FakeMultiNodeProvider._create_node_with_resources_and_labels)
    assert "self.all_processes" in inspect.getsource(node.Node.__init__)
    assert ray_constants.PROCESS_TYPE_RAYLET == "raylet"


def test_the_benchmark_reads_the_first_launch_after_the_notice(tmp_path: Path) -> None:
    from bench.bench_move_autoscaled import launch_asked_s

    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    logs.joinpath("monitor.log").write_text(
        "2026-11-26 00:41:37,452\tINFO autoscaling.py:149 -- launch of 1 'spot' nodes asked: cap 3, 1 allowed, delay 5.0 s\n"
        "2026-11-26 00:44:39,086\tINFO autoscaling.py:149 -- launch of 1 'spot' nodes asked: cap 3, 1 allowed, delay 60.0 s\n"
    )
    cluster = SimpleNamespace(temp_dir=str(tmp_path))
    first = time.mktime(time.strptime("2026-11-26 00:41:37", "%Y-%m-%d %H:%M:%S")) + 0.452
    second = time.mktime(time.strptime("2026-11-26 00:44:39", "%Y-%m-%d %H:%M:%S")) + 0.086
    assert launch_asked_s(cluster, first - 10) == first
    assert launch_asked_s(cluster, second - 1) == second
    assert launch_asked_s(cluster, second + 1) is None
    assert launch_asked_s(SimpleNamespace(temp_dir=str(tmp_path / "gone")), 0.0) is None
