"""Profile a repetition that missed its target: py-spy over the driver and every Ray process it started.

The local cluster's raylets, the Train controller and the workers are all descendants of
the harness process, so one ``py-spy record --subprocesses`` on it sees the whole run.
The summary names where the samples went: per process, the hottest functions (own time),
and spotfallback's own frames (inclusive time).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

_STACK = re.compile(r"(.+?) (\d+)$", re.M | re.S)


def py_spy() -> str | None:
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def record(fn: Callable[[], Any], rate: int = 25, *, wall: bool = False) -> str:
    """Run ``fn`` under py-spy and return the summary (or why there is none).

    Default: CPU time of this process and every Ray process it started. ``wall=True``: wall
    time of this process alone, waiting included (``--idle``), to see where a driver waits.
    """
    exe = py_spy()
    if exe is None:
        fn()
        return "py-spy is not installed (`.venv/bin/python -m pip install py-spy`): no profile"
    out = Path(tempfile.mkdtemp(prefix="sf-bench-prof-")) / "stacks.txt"
    mode = ["--idle"] if wall else ["--subprocesses"]
    spy = subprocess.Popen(
        [exe, "record", "--pid", str(os.getpid()), *mode, "--rate", str(rate), "--format", "raw",
         "-o", str(out), "--nonblocking"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        fn()
    finally:
        spy.send_signal(signal.SIGINT)
        log = spy.communicate(timeout=120)[0].decode(errors="replace")
    if not out.exists():
        return f"py-spy wrote no profile: {log.strip().splitlines()[-1:] or ['?']}"
    text = out.read_text(errors="replace")
    shutil.rmtree(out.parent, ignore_errors=True)
    return summarize(text, rate, wall=wall)


def _process_name(frame: str) -> str:
    cmd = frame.split(":", 1)[1].strip('"') if ":" in frame else frame
    first = cmd.split()[0] if cmd.split() else cmd
    if first.startswith("ray::"):
        return first
    for part in cmd.split():
        if part.endswith(".py") or part.startswith("-m"):
            return f"{Path(first).name} {Path(part).name}"
    return Path(first).name


def summarize(text: str, rate: int, top: int = 12, wall: bool = False) -> str:
    """py-spy's raw (collapsed) stacks -> the lines worth reading."""
    per_process: Counter[str] = Counter()
    leaves: Counter[tuple[str, str]] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for m in _STACK.finditer(text):
        frames = [f.strip() for f in m.group(1).split(";") if f.strip()]
        n = int(m.group(2))
        procs = [f for f in frames if f.startswith("process ")]
        proc = _process_name(procs[-1]) if procs else "?"
        code = [f for f in frames if not f.startswith("process ")]
        if not code:
            continue
        total += n
        per_process[proc] += n
        leaves[(proc, code[-1])] += n
        for f in dict.fromkeys(f for f in code if "spotfallback" in f or "/bench/" in f):
            ours[f] += n
    if not total:
        return "no samples"
    secs = 1.0 / rate
    what = "thread-seconds, waiting included" if wall else "CPU-seconds of Python"
    lines = [f"{total} samples at {rate} Hz ({total * secs:.0f} {what}); by process:"]
    lines += [f"  {n * secs:7.1f} s  {p}" for p, n in per_process.most_common(8)]
    lines.append("hottest functions (own time):")
    lines += [f"  {n * secs:7.1f} s  {p}: {f}" for (p, f), n in leaves.most_common(top)]
    if ours:
        lines.append("spotfallback and harness frames (inclusive time):")
        lines += [f"  {n * secs:7.1f} s  {f}" for f, n in ours.most_common(top)]
    return "\n".join(lines)
