"""Real ``ray start --block`` processes, as a KubeRay pod runs them: a head and workers on free
ports, each with its own temp dir (a pod's /tmp/ray), stopped by pid.

A port found free can be taken by another Ray (another xdist worker's) before this one binds it;
``ray_node`` then starts the node again on fresh ports rather than failing the test.

For tests of what Ray itself does in a pod (its SIGTERM drain, the files the sidecar reads),
where ``ray.cluster_utils.Cluster`` would hide the ``ray start`` process.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def vendored_psutil() -> Any:
    """psutil, which Ray vendors (importing ray puts its ``thirdparty_files`` on sys.path)."""
    import ray  # noqa: F401

    return importlib.import_module("psutil")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment minus any Ray address or node id, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SPOTFALLBACK_NODE_ID")}
    return {**env, **extra}


@contextlib.contextmanager
def ray_start(*args: str, log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``ray start --block ...``; stopped (SIGINT: Ray's own cleanup, then SIGKILL) by pid,
    with every process it started.

    Token authentication off: ``ray start --head`` turns it on by itself when a token file
    exists in ~/.ray (any earlier ``ray.init()`` may have made one), a worker's does not.
    """
    psutil = vendored_psutil()

    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "ray"), "start", "--block", "--disable-usage-stats", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(RAY_AUTH_MODE="disabled", **(env or {})),
        )
    family: list[Any] = []
    try:
        yield proc
    finally:
        with contextlib.suppress(psutil.Error):
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        _, alive = psutil.wait_procs(family, timeout=10)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()


def head_args(temp: str) -> list[str]:
    """``ray start`` arguments for a head with no CPUs on free ports; ``temp``: its own temp dir."""
    return [
        "--head",
        f"--port={free_port()}",
        "--num-cpus=0",
        "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--temp-dir={temp}/ray",
    ]


def worker_args(gcs: str, temp: str) -> list[str]:
    """A one-CPU worker joining ``gcs``, with its own temp dir (a pod's /tmp/ray)."""
    return [f"--address={gcs}", "--num-cpus=1", f"--dashboard-agent-listen-port={free_port()}", f"--temp-dir={temp}/ray"]


@contextlib.contextmanager
def ray_node(
    make_args: Callable[[], list[str]], temp: str, log: Path, env: dict[str, str] | None = None, attempts: int = 3
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``ray start`` node up, with the address it wrote to ``{temp}/ray/ray_current_cluster``.

    ``make_args`` picks fresh ports each call: a start that exits before it writes the file (a
    port taken in between), or right after, is tried again, up to ``attempts`` times in all;
    each failed try's log is kept beside ``log`` as ``<name>.try<N>``.
    """
    written = Path(temp, "ray", "ray_current_cluster")
    for attempt in range(1, attempts + 1):
        written.unlink(missing_ok=True)  # a failed try's, if it got that far
        with ray_start(*make_args(), log=log, env=env) as proc:
            _wait_for(written, proc, 90)
            if proc.poll() is None or attempt == attempts:
                yield proc, wait_file(written, proc, log)
                return
        log.rename(log.with_name(f"{log.name}.try{attempt}"))


def wait_file(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 90) -> str:
    """The text of ``path`` once ``ray start`` has written it; fails with its log if it exits first."""
    _wait_for(path, proc, timeout_s)
    if not path.exists():
        assert proc.poll() is None, f"ray start exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        raise AssertionError(f"no {path} after {timeout_s}s:\n{log.read_text()[-3000:]}")
    return path.read_text().strip()


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll until ``path`` exists, ``proc`` exits or ``timeout_s`` passes, whichever is first."""
    deadline = time.monotonic() + timeout_s
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
