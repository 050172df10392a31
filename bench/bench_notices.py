"""Work lost per eviction, with and without a preemption notice, spotfallback vs plain Ray Train.

`.venv/bin/python bench/bench_notices.py [--repeat N] [--notice S] [--at-step K] [--only NAME ...]`

One local cluster (head without CPUs + three one-CPU spot nodes) runs the DDP digits example
(2 workers, 30 steps, a checkpoint every 5) once per scenario; when rank 0 has completed
step K one spot node hosting a worker is evicted, either announced (drain with reason
PREEMPTION and a deadline ``--notice`` s ahead, then kill: the drain the notice agent
issues) or not (kill). Rank 0's step log gives, per eviction: steps redone, the stall
(last step before the eviction -> first step beyond it after the restart) and the time
from the kill to that step. Prints a Markdown table and the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CONFIG = {"total_steps": 30, "checkpoint_every": 5, "step_delay_s": 0.15, "seed": 7}
JIT = {"preemption_check_every_s": 1.0, "preemption_hold_s": 30.0}


@dataclass
class Row:
    scenario: str
    evicted_rank: int
    last_before: int
    resumed_at: int
    redone: int
    stall_s: float
    kill_to_new_s: float
    weights_ok: bool


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def read_steps(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def make_fit(kind: str, storage: Path, name: str, config: dict[str, Any]) -> Callable[[], Any]:
    import ray.train
    from examples.ddp_digits import train_fn
    from ray.train.torch import TorchTrainer

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.notices.jit import jit_failure_config

    if kind == "spotfallback":
        trainer: Any = FallbackTrainer(
            train_fn,
            train_loop_config=config,
            tiers=[Tier.spot(2, max_preemptions=3, max_failures=3)],
            run_config=ray.train.RunConfig(storage_path=str(storage), name=name, failure_config=jit_failure_config()),
        )
    else:  # plain Ray Train: same selector, same retry budgets, same preemption switches
        trainer = TorchTrainer(
            train_fn,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(
                num_workers=2, resources_per_worker={"CPU": 1}, label_selector={"ray.io/market-type": "spot"}
            ),
            run_config=ray.train.RunConfig(
                storage_path=str(storage),
                name=name,
                failure_config=ray.train.FailureConfig(max_failures=3, max_preemption_failures=3),
            ),
        )
    return trainer.fit


def run_scenario(
    cluster: Any, injector: Any, storage: Path, scenario: str, notice_s: float | None, at_step: int, evicted_rank: int, reference: str
) -> Row:
    kind, _, variant = scenario.partition("+")
    log = storage / f"{scenario}-{uuid.uuid4().hex[:6]}.steps"
    config = {**CONFIG, "step_log": str(log), **(JIT if variant == "jit" else {})}
    fit = make_fit(kind, storage, f"bench-{uuid.uuid4().hex[:8]}", config)
    out: dict[str, Any] = {}

    def drive() -> None:
        try:
            out["result"] = fit()
        except BaseException as e:  # noqa: BLE001 - reported below
            out["error"] = e

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    while not any(s["step"] >= at_step for s in read_steps(log)):
        if not driver.is_alive():
            raise RuntimeError(f"{scenario}: the run ended before step {at_step}: {out.get('error')!r}")
        time.sleep(0.1)
    rank0 = read_steps(log)[-1]["node"]
    hosts = [n for n, c in cluster.train_workers_per_node().items() if c]
    target = rank0 if evicted_rank == 0 else next(n for n in hosts if n != rank0)
    if notice_s is None:
        injector.kill(target)
    else:
        injector.preempt(target, notice_s=notice_s)
    kill_t = time.time()
    driver.join(600)
    if "error" in out:
        raise RuntimeError(f"{scenario}: {out['error']!r}")
    steps = read_steps(log)
    first = [s for s in steps if s["pid"] == steps[0]["pid"]]
    after = [s for s in steps if s["pid"] != steps[0]["pid"]]
    last = first[-1]
    new = next(s for s in after if s["step"] > last["step"])
    injector.replenish("spot")
    return Row(
        scenario=f"{scenario} ({'kill, no notice' if notice_s is None else f'{notice_s:g} s notice'})",
        evicted_rank=evicted_rank,
        last_before=last["step"],
        resumed_at=after[0]["step"],
        redone=max(0, last["step"] - after[0]["step"] + 1),
        stall_s=round(new["t"] - last["t"], 1),
        kill_to_new_s=round(new["t"] - kill_t, 1),
        weights_ok=out["result"].metrics.get("weights_sha256") == reference,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--notice", type=float, default=8.0)
    parser.add_argument("--at-step", type=int, default=8)
    parser.add_argument("--rank", type=int, default=1, choices=(0, 1), help="whose node is evicted (0 writes checkpoints)")
    parser.add_argument(
        "--only", nargs="*", default=None, help="scenarios: spotfallback+jit, spotfallback, ray+jit, ray"
    )
    args = parser.parse_args()

    from helpers_e2e import apply_env

    apply_env()
    from spotfallback.local import Injector, LocalSpotCluster, NodeGroup

    scenarios = [
        ("spotfallback+jit", args.notice),
        ("spotfallback+jit", None),
        ("ray", args.notice),
        ("ray", None),
        ("ray+jit", args.notice),
    ]
    if args.only:
        scenarios = [s for s in scenarios if s[0] in args.only]
    storage = Path(tempfile.mkdtemp(prefix="sf-bench-notices-"))
    load_before = os.getloadavg()
    rows: list[Row] = []
    t0 = time.time()
    try:
        with LocalSpotCluster([NodeGroup("spot", count=3)], connect=True) as cluster, Injector(cluster) as injector:
            print(f"cluster up in {cluster.start_seconds:.1f}s", file=sys.stderr)
            reference = make_fit("spotfallback", storage, "reference", dict(CONFIG))().metrics["weights_sha256"]
            for _ in range(args.repeat):
                for name, notice in scenarios:
                    row = run_scenario(cluster, injector, storage, name, notice, args.at_step, args.rank, reference)
                    print(json.dumps(asdict(row)), file=sys.stderr)
                    rows.append(row)
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, load average before/after: "
          f"{load_before[0]:.1f}/{os.getloadavg()[0]:.1f}, total {time.time() - t0:.0f}s")
    print("\n| scenario | evicted rank | last step before | resumed at | steps redone | stall (s) | kill -> new step (s) | weights bit-identical |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.scenario} | {r.evicted_rank} | {r.last_before} | {r.resumed_at} | {r.redone} | {r.stall_s} | {r.kill_to_new_s} | {r.weights_ok} |")


if __name__ == "__main__":
    main()
