"""The Ray half of the benchmark harness: the shared cluster context, trainers, timestamps.

Every measurement builds its trainers here so that the compared variants differ only in
what is being compared: the same training function (``spotfallback.examples.ddp_digits``), the same
label selector, the same retry budgets, the same storage.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

SPOT = {"ray.io/market-type": "spot"}
ON_DEMAND = {"ray.io/market-type": "on-demand"}


@dataclass
class Context:
    """What a measurement gets: the shared local spot cluster, its injector, scratch storage."""

    quick: bool
    storage: Path
    cluster: Any = None
    injector: Any = None
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    log: Callable[[str], None] = print

    def reps(self, full: int, quick: int = 1) -> int:
        return quick if self.quick else full

    def path(self, prefix: str, suffix: str = "") -> Path:
        return self.storage / f"{prefix}-{uuid.uuid4().hex[:6]}{suffix}"

    def one_node_start_s(self, market: str = "spot", timeout_s: float = 120.0) -> float | None:
        """Seconds for one more ``market`` node to come up, after a preemption took one.

        On the pre-started cluster the harness adds it (``replenish``). On the autoscaled one
        the autoscaler has put the node back already or is doing so: the cap is lowered by one
        (killing the newest node if it is back) and raised again, timing the autoscaler's
        launch until the node is up. None if no node came.
        """
        from spotfallback.local import LocalSpotCluster

        t0 = time.time()
        if isinstance(self.cluster, LocalSpotCluster):
            return time.time() - t0 if self.injector.replenish(market) else None
        full = self.cluster.groups[market].configured_cap
        self.injector.scale_to(market, full - 1, notice_s=None)
        t0 = time.time()
        self.injector.replenish(market)
        try:
            self.cluster.wait_for_nodes(market, full, timeout_s)
        except TimeoutError:
            return None
        return time.time() - t0


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a killed writer
            continue
    return out


def stamps_callback(path: str | Path) -> Any:
    """A Train callback that timestamps worker-group starts and reports into ``path`` (JSON lines).

    It runs inside the Train controller (of plain Ray Train and of spotfallback alike), so
    it sees the moment a worker group starts asking for capacity, which no ledger records.
    """
    from ray.train.v2._internal.execution.callback import ReportCallback, WorkerGroupCallback

    target = str(path)

    class Stamps(WorkerGroupCallback, ReportCallback):
        def _write(self, **entry: Any) -> None:
            with open(target, "a") as f:
                f.write(json.dumps({"t": time.time(), **entry}) + "\n")

        def before_worker_group_start(self, worker_group_context: Any) -> None:
            selector = getattr(worker_group_context, "label_selector", None) or [{}]
            self._write(event="acquiring", workers=worker_group_context.num_workers, selector=selector[0])

        def after_worker_group_start(self, worker_group: Any) -> None:
            self._write(event="acquired")

        def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
            step = next((m.get("step") for m in metrics if isinstance(m, dict) and "step" in m), None)
            self._write(event="report", step=step, checkpoint=getattr(training_report, "checkpoint", None) is not None)

    return Stamps()


def torch_trainer(
    config: dict[str, Any],
    storage: Path,
    name: str,
    *,
    selector: dict[str, str] | None = None,
    callbacks: Sequence[Any] = (),
    train_fn: Any = None,
) -> Any:
    """Plain Ray Train: ``TorchTrainer`` on spot with ``FailureConfig(max_failures=3, max_preemption_failures=3)``."""
    import ray.train
    from ray.train.torch import TorchTrainer

    if train_fn is None:
        from spotfallback.examples.ddp_digits import train_fn
    return TorchTrainer(
        train_fn,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1}, label_selector=selector or SPOT
        ),
        run_config=ray.train.RunConfig(
            storage_path=str(storage),
            name=name,
            callbacks=list(callbacks),
            failure_config=ray.train.FailureConfig(max_failures=3, max_preemption_failures=3),
        ),
    )


def fallback_trainer(
    config: dict[str, Any],
    storage: Path,
    name: str,
    tiers: Sequence[Any],
    *,
    callbacks: Sequence[Any] = (),
    failure_config: Any = None,
) -> Any:
    """spotfallback on a ladder of ``tiers``, same training function and storage as ``torch_trainer``."""
    import ray.train

    from spotfallback import FallbackTrainer
    from spotfallback.examples.ddp_digits import train_fn

    return FallbackTrainer(
        train_fn,
        train_loop_config=config,
        tiers=list(tiers),
        run_config=ray.train.RunConfig(
            storage_path=str(storage), name=name, callbacks=list(callbacks), failure_config=failure_config
        ),
    )


def alternating(variants: Sequence[Any], rep: int) -> list[Any]:
    """The variants in order on even repetitions, reversed on odd ones: drift in the machine's
    load then falls on each variant alike, so ratios within one run stay fair."""
    return list(variants) if rep % 2 == 0 else list(variants)[::-1]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------------------- step logs


def step_intervals(steps: Sequence[dict[str, Any]], checkpoint_every: int) -> tuple[list[float], list[float]]:
    """(intervals after ordinary steps, intervals after checkpoint steps) of one attempt's step log.

    The example's rank 0 logs each step when its compute is done, before it reports (and,
    every ``checkpoint_every`` steps, checkpoints): the interval after step k is therefore
    step k's report or checkpoint plus step k+1's compute.
    """
    plain, ckpt = [], []
    for a, b in zip(steps, steps[1:], strict=False):
        if b["step"] != a["step"] + 1 or b.get("pid") != a.get("pid"):
            continue
        (ckpt if a["step"] % checkpoint_every == 0 else plain).append(b["t"] - a["t"])
    return plain, ckpt


def median(xs: Iterable[float], default: float = float("nan")) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else default


def ledger_times(records: Sequence[Any]) -> list[tuple[str, float, int]]:
    """(kind, t, tier) of every ledger record, in order."""
    return [(r.event.kind, r.t, r.tier) for r in records]


def first(records: Sequence[tuple[str, float, int]], kind: str, after: float = float("-inf")) -> float | None:
    return next((t for k, t, _ in records if k == kind and t >= after), None)
