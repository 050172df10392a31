"""Ranks without Ray: threads whose Ray collectives are real barriers.

A rank that asks Ray a different number of times than another deadlocks the barrier (with a
timeout) and fails the test, exactly as it would hang a real worker group.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spotfallback.notices.jit import PreemptionWatch
from spotfallback.notices.runlog import RunLog


@dataclass(frozen=True)
class Info:
    """Shaped like ray.train.PreemptionInfo."""

    deadline_ms: int | None
    preempted_node_ids: tuple[str, ...] = ("node-a",)
    preempted_ranks: tuple[int, ...] = (1,)


class Group:
    """What Ray's SynchronizationActor does: every rank must arrive; rank 0's value wins."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=5)
        self.slot: Any = None
        self.notice: Any = None  # what Ray would tell rank 0 now
        self.asks: list[tuple[int, int]] = []  # (rank, call number) of every ask
        self.lock = threading.Lock()

    def collective(self, rank: int, value: Any) -> Any:
        if rank == 0:
            self.slot = value
        self.barrier.wait()
        out = self.slot
        self.barrier.wait()
        return out


class FakeSession:
    def __init__(self, group: Group, rank: int, run_log: RunLog | None = None) -> None:
        self.group, self.rank, self._run_log = group, rank, run_log
        self.watch: PreemptionWatch | None = None

    def world_rank(self) -> int:
        return self.rank

    def preemption_info(self) -> Any:
        with self.group.lock:
            self.group.asks.append((self.rank, self.watch.calls if self.watch else -1))
        return self.group.collective(self.rank, self.group.notice if self.rank == 0 else None)

    def broadcast(self, value: Any) -> Any:
        return self.group.collective(self.rank, value)

    def run_log(self) -> RunLog | None:
        return self._run_log


def as_ranks(world: int, rank_main: Callable[[int], None], timeout_s: float = 20.0) -> None:
    """Run ``rank_main(rank)`` for every rank, each on its own thread; fail with what any rank raised."""
    errors: list[BaseException] = []

    def guarded(rank: int) -> None:
        try:
            rank_main(rank)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not errors, errors
