"""Work spread over processes comes back as one process would give it, in order, and fails loudly."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from spotfallback.sim import spread as spread_module
from spotfallback.sim.spread import Spread, available_cpus, spread

# What the other processes run: module-level functions, named by module and name.


def scaled(factor: float, items: list[float]) -> list[float]:
    return [factor * i for i in items]


def inverted(_: None, items: list[float]) -> list[float]:
    return [1.0 / i for i in items]


def printed(text: str, items: list[int]) -> list[int]:
    print(text)
    return items


def test_spread_work_comes_back_in_order_whatever_the_share():
    items = list(range(11))
    want = [3 * i for i in items]
    for processes in (1, 2, 4, 20):
        assert spread(scaled, 3, items, processes) == want
    assert spread(scaled, 3, [], 4) == []
    assert available_cpus() >= 1


def test_floats_come_back_the_same_to_the_last_bit():
    items = [0.1, 1 / 3, math.pi * 1e-300, 2.0**60 + 1, math.inf, -math.inf, math.nan, 5e-324]
    back = spread(scaled, 1.0, items, 3)
    assert [x.hex() for x in back] == [x.hex() for x in items]


def whose(_: None, items: list[int]) -> list[int]:
    import os

    return [os.getpid()] * len(items)


def test_work_left_to_the_others_comes_back_in_order_while_the_caller_goes_on():
    import os

    with Spread(scaled, 3, list(range(11)), 2, caller_share=False) as work:
        assert len(work.children) == 2  # both shares under way at once
        assert work.result() == [3 * i for i in range(11)]
    with Spread(whose, None, list(range(6)), 2, caller_share=False) as work:
        pids = work.result()
    assert os.getpid() not in pids and len(set(pids)) == 2 and pids[0::2] == [pids[0]] * 3
    with Spread(whose, None, [7], 2, caller_share=False) as work:  # one item: computed here, in ``result``
        assert not work.children and work.result() == [os.getpid()]


def test_closing_work_under_way_stops_its_processes_at_once():
    import time

    t0 = time.monotonic()
    with Spread(napping, 60.0, [1, 2], 2, caller_share=False) as work:
        children = list(work.children)
    assert all(c.returncode is not None for c in children) and not any(w.is_alive() for w in work.writers)
    assert time.monotonic() - t0 < 30


def test_one_process_or_one_item_starts_nothing(monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError("started a process")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    assert spread(scaled, 2, [1, 2, 3], 1) == [2, 4, 6]
    assert spread(scaled, 2, [5], 8) == [10]


def test_a_process_that_fails_fails_the_call_with_its_error():
    # The second process takes the items at odd places: 0.0 among them.
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        spread(inverted, None, [1.0, 0.0, 2.0, 4.0], 2)


def test_what_a_process_prints_does_not_mix_with_its_answer():
    assert spread(printed, "printed", [1, 2, 3, 4], 2) == [1, 2, 3, 4]


@pytest.mark.parametrize(("v2", "v1", "cpus"), [
    ("150000 100000", None, 2),  # a quota of 1.5 CPUs: two processes share it
    ("max 100000", None, None),  # no quota: the CPUs it may run on
    (None, ("50000", "100000"), 1),
    (None, ("-1", "100000"), None),
    (None, None, None),
])
def test_a_containers_cpu_quota_caps_the_processes(tmp_path: Path, monkeypatch, v2, v1, cpus):
    files: list[tuple[str, str | None]] = []
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2 + "\n")
        files.append((str(tmp_path / "cpu.max"), None))
    if v1 is not None:
        (tmp_path / "quota").write_text(v1[0] + "\n")
        (tmp_path / "period").write_text(v1[1] + "\n")
        files.append((str(tmp_path / "quota"), str(tmp_path / "period")))
    files.append((str(tmp_path / "absent"), None))
    monkeypatch.setattr(spread_module, "_CGROUP_FILES", tuple(files))
    monkeypatch.setattr(spread_module.os, "sched_getaffinity", lambda _: set(range(8)), raising=False)
    assert available_cpus() == (8 if cpus is None else cpus)


def napping(seconds: float, items: list[int]) -> list[int]:
    import time

    time.sleep(seconds)
    return items


def _children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_processes_end_soon_after_their_caller_is_killed(tmp_path: Path):
    import os
    import signal
    import sys
    import time

    script = tmp_path / "caller.py"
    script.write_text("from spotfallback.sim.spread import spread\n"
                      f"from {__name__} import napping\n"
                      "spread(napping, 60.0, [1, 2], 2)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    caller = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not (children := _children_of(caller.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children, "the caller started no process"
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{c}").exists() and "Z" not in _state(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{c}").exists() and "Z" not in _state(c) for c in children)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_process_that_cannot_find_the_function_fails_the_call_with_its_error():
    def stray(shared: str, items: list[int]) -> list[int]:
        return items

    stray.__module__ = "no_such_module_for_spread"
    # A large input: the process ends before it has read it all.
    with pytest.raises(RuntimeError, match="ModuleNotFoundError: No module named 'no_such_module_for_spread'"):
        spread(stray, "x" * 1_000_000, [1, 2], 2)
