"""Independent computations spread over processes, for searches too large for one core.

Why: the hindsight optimum of a long job is one search per start, each deterministic and
independent of the others, and CPU-bound in Python; a few hundred starts of a 300-hour job
take seconds that several cores could share. The answers are the same in any process, so
spreading changes only how long they take.

The other processes are fresh interpreters (``python -c``). Each is handed the caller's
``sys.path``, the function's module and name, the shared input and its items as JSON on
stdin, and answers with JSON on stdout: nothing is pickled, Python's JSON writes every float
(inf and nan too) so that it reads back the same, and the function builds what it needs
from plain data. Nothing is forked, so threads the caller holds (a Ray driver, a web server)
cannot leave a child stuck on a lock, and nothing imports the caller's ``__main__``, so a
script without an ``if __name__ == "__main__":`` guard is safe. The caller computes a share
itself, or leaves it all to the others and does other work beside them. Ctrl-C reaches the
caller alone, which then stops the processes it started; a caller killed outright leaves its
processes to notice and end within a second.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# What a child runs, given the caller's process id: the caller's sys.path first, so that it
# imports what the caller imported.
_CHILD = ("import json, sys; sys.path[:] = json.loads(sys.stdin.readline()); "
          "from spotfallback.sim.spread import serve; serve()")


# Where a container's CPU quota is written: cgroup v2 ("quota period" or "max period"), then v1
# (quota, -1 without one; and the period).
_CGROUP_FILES: tuple[tuple[str, str | None], ...] = (
    ("/sys/fs/cgroup/cpu.max", None),
    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
)
_WATCH_S = 0.5  # how often a child looks whether its caller is still there


def available_cpus() -> int:
    """The CPUs this process may use: those it may run on (its affinity, where the platform says),
    fewer where a container's CPU quota (cgroup v2 or v1) allows less."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, math.ceil(quota)) if quota else cpus)


def _cgroup_quota() -> float | None:
    """CPUs' worth of time per period that this container's cgroup allows, or None without a limit."""
    for path, period_path in _CGROUP_FILES:
        try:
            with open(path) as f:
                fields = f.read().split()
            if period_path is not None:
                with open(period_path) as f:
                    fields.append(f.read().strip())
        except OSError:
            continue
        if len(fields) != 2 or fields[0] in ("max", "-1"):
            return None
        try:
            quota, period = float(fields[0]), float(fields[1])
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


class Spread(Generic[T, R]):
    """``fn(shared, items)`` under way in other processes while the caller goes on; ``result`` collects it.

    ``fn`` is a module-level function that answers one result per item, in order;
    ``shared``, the items and the results are plain JSON data. Each of ``processes`` takes
    every n-th item, so that neighbouring items of like cost are shared out. With
    ``caller_share`` (``spread``) the caller is one of them and computes its share in
    ``result``; without, the others take it all and start on it at once, so that the caller
    can do other work beside them (the plan beside its optimum). With one process or one
    item, or no Python executable to start, nothing is started: ``result`` computes it all.
    Use it as a context manager, or call ``close``: it stops the processes a caller that
    failed no longer needs.
    """

    def __init__(self, fn: Callable[[Any, list[T]], list[R]], shared: Any, items: Sequence[T], processes: int, *,
                 caller_share: bool = True):
        self.fn, self.shared, self.items = fn, shared, list(items)
        n = min(processes, len(self.items))
        self.n = n if n > 1 and sys.executable else 1
        self.own = caller_share or self.n == 1  # whether the caller computes the first share
        self.children: list[subprocess.Popen[bytes]] = []
        self.writers: list[threading.Thread] = []
        if self.n == 1:
            return
        try:
            # Every child first, so that they start their interpreters side by side, then their work.
            self.children = [subprocess.Popen([sys.executable, "-c", _CHILD, str(os.getpid())], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                             for _ in range(1 if self.own else 0, self.n)]
            common = "\n".join([json.dumps(sys.path), json.dumps([fn.__module__, fn.__qualname__]), json.dumps(shared)])
            for j, child in enumerate(self.children, start=1 if self.own else 0):
                assert child.stdin is not None
                # Written by a thread: a child reads its input only once it has imported the function's
                # module, and the caller has its own work to do meanwhile.
                writer = threading.Thread(target=_write_and_close, daemon=True,
                                          args=(child.stdin, f"{common}\n{json.dumps(self.items[j::self.n])}\n".encode()))
                writer.start()
                self.writers.append(writer)
                child.stdin = None  # the writer's: ``communicate`` only reads
        except BaseException:
            self.close()
            raise

    def result(self) -> list[R]:
        """The answers, in the order of the items: the caller's share computed now, the others' awaited."""
        try:
            shares = [self.fn(self.shared, self.items[0::self.n])] if self.own else []
            for child in self.children:
                out, err = child.communicate()
                if child.returncode != 0:
                    raise RuntimeError(f"a process computing part of {self.fn.__qualname__} failed "
                                       f"(exit {child.returncode}):\n" + err.decode(errors="replace").strip())
                shares.append(json.loads(out))
        finally:
            self.close()
        results: list[Any] = [None] * len(self.items)
        for j, share in enumerate(shares):
            results[j::self.n] = share
        return results

    def close(self) -> None:
        """Stop the processes still running (none once ``result`` has answered)."""
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for writer in self.writers:  # a killed child's pipe is broken: its writer ends at once
            writer.join()

    def __enter__(self) -> Spread[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spread(fn: Callable[[Any, list[T]], list[R]], shared: Any, items: Sequence[T], processes: int) -> list[R]:
    """``fn(shared, items)``, its items shared out between this process and up to ``processes - 1`` others
    (``Spread``'s terms), collected at once."""
    with Spread(fn, shared, items, processes) as work:
        return work.result()


def _write_and_close(pipe: IO[bytes], data: bytes) -> None:
    """A child's input, written whole; a child that ended early says why in ``Spread.result``."""
    with contextlib.suppress(BrokenPipeError):
        pipe.write(data)
    with contextlib.suppress(BrokenPipeError):
        pipe.close()


def _exit_with(parent: int) -> None:
    """End this process once its caller is gone (killed before it could stop it): no one would read the answer."""
    while os.getppid() == parent:
        time.sleep(_WATCH_S)
    os._exit(1)


def serve() -> None:
    """A child's side of ``spread``: read the function's name, ``shared`` and the items; write the results."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C and stops this process
    threading.Thread(target=_exit_with, args=(int(sys.argv[1]),), daemon=True).start()
    module, name = json.loads(sys.stdin.readline())
    fn: Any = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    shared = json.loads(sys.stdin.readline())
    items = json.loads(sys.stdin.readline())
    answer = sys.stdout
    sys.stdout = sys.stderr  # anything ``fn`` prints must not mix with the answer
    json.dump(fn(shared, items), answer)
    answer.flush()
