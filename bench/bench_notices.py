"""Work lost per eviction, with and without a preemption notice, spotfallback vs plain Ray Train.

`.venv/bin/python -m bench.bench_notices [--repeat N] [--notice S] [--at-step K] [--only NAME ...]
[--scenario NAME:EVICTION ...]`

One local cluster (head without CPUs + three one-CPU spot nodes) runs the DDP digits example
(2 workers, 30 steps, a checkpoint every 5) once per scenario; when rank 0 has completed
step K one spot node hosting a worker is evicted, either announced (drain with reason
PREEMPTION and a deadline ``--notice`` s ahead, then kill: the drain the notice agent
issues) or not (kill). Rank 0's step log gives, per eviction: steps redone, the stall
(last step before the eviction -> first step beyond it after the restart) and the time
from the kill to that step. Prints a Markdown table and the machine it ran on.

Scenario names: ``spotfallback`` or ``ray`` (plain ``TorchTrainer``, same selector and
budgets), plus ``+jit`` (the example's ``PreemptionWatch``) and ``+relax``
(``relax_collectives_on_preemption=True``); an eviction is a notice length in seconds or
``kill``. For spotfallback runs the ledger also times, from the kill, when the failure was
decided (``failure_s``) and when the new worker group was up (``workers_s``).
"""

from __future__ import annotations

import argparse
import json
import os
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

from bench.harness import cpu_model

ROOT = Path(__file__).resolve().parents[1]

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
    failure_s: float | None = None  # kill -> the failure decided (spotfallback's ledger)
    workers_s: float | None = None  # kill -> the next worker group up (spotfallback's ledger)
    held_s: float | None = None  # just-in-time checkpoint reported -> the gang stopped (spotfallback's ledger)
    moved: bool = False  # the gang left before its node went (spotfallback's ledger)


def read_steps(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def make_fit(kind: str, storage: Path, name: str, config: dict[str, Any], *, relax: bool = False) -> Callable[[], Any]:
    import ray.train
    from ray.train.torch import TorchTrainer

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.examples.ddp_digits import train_fn
    from spotfallback.notices.jit import jit_failure_config

    if kind == "spotfallback":
        trainer: Any = FallbackTrainer(
            train_fn,
            train_loop_config=config,
            tiers=[Tier.spot(2, max_preemptions=3, max_failures=3)],
            run_config=ray.train.RunConfig(
                storage_path=str(storage),
                name=name,
                failure_config=jit_failure_config(relax_collectives_on_preemption=relax),
            ),
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
                failure_config=ray.train.FailureConfig(
                    max_failures=3, max_preemption_failures=3, relax_collectives_on_preemption=relax
                ),
            ),
        )
    return trainer.fit


def start_until_step(
    storage: Path, scenario: str, at_step: int, base: dict[str, Any]
) -> tuple[Path, Callable[[], Any], threading.Thread, dict[str, Any]]:
    """Start ``scenario``'s run of the example (config ``base``) on a thread, return once rank 0
    has completed ``at_step``: (its step log, its ``fit``, the thread, where the thread puts
    ``result`` or ``error``)."""
    kind, *variants = scenario.split("+")
    log = storage / f"{scenario}-{uuid.uuid4().hex[:6]}.steps"
    config = {**base, "step_log": str(log), **(JIT if "jit" in variants else {}), "preemption_move": "hold" not in variants,
              "preemption_train_on": "hold" not in variants}  # hold: the behaviour before (save at once, hold)
    fit = make_fit(kind, storage, f"bench-{uuid.uuid4().hex[:8]}", config, relax="relax" in variants)
    out: dict[str, Any] = {}

    def drive() -> None:
        try:
            out["result"] = fit()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            out["error"] = e

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    while not any(s["step"] >= at_step for s in read_steps(log)):
        if not driver.is_alive():
            raise RuntimeError(f"{scenario}: the run ended before step {at_step}: {out.get('error')!r}")
        time.sleep(0.1)
    return log, fit, driver, out


def run_scenario(
    cluster: Any, injector: Any, storage: Path, scenario: str, notice_s: float | None, at_step: int, evicted_rank: int, reference: str,
    base: dict[str, Any] | None = None,
) -> Row:
    """One eviction of the example (``base``: its config, ``CONFIG`` by default) in ``scenario``."""
    log, fit, driver, out = start_until_step(storage, scenario, at_step, base or CONFIG)
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
    failure_s = workers_s = held_s = None
    moved = False
    ledger = getattr(getattr(fit, "__self__", None), "ledger", None)
    if ledger is not None:  # spotfallback: when the failure was decided, when workers were back
        from spotfallback.view.intervals import announced_evictions

        evictions = announced_evictions(ledger.read())
        if evictions:
            held_s, moved = round(evictions[0].held_s, 2), evictions[0].moved
        later = [r for r in ledger.read() if r.t >= kill_t - 1.0]
        failed = next((r for r in later if r.event.kind in ("preempted", "node_failed", "application_failed")), None)
        if failed is not None:
            failure_s = round(failed.t - kill_t, 1)
            up = next((r for r in later if r.event.kind == "workers_acquired" and r.t >= failed.t), None)
            workers_s = None if up is None else round(up.t - kill_t, 1)
    return Row(
        scenario=f"{scenario} ({'kill, no notice' if notice_s is None else f'{notice_s:g} s notice'})",
        evicted_rank=evicted_rank,
        last_before=last["step"],
        resumed_at=after[0]["step"],
        redone=max(0, last["step"] - after[0]["step"] + 1),
        stall_s=round(new["t"] - last["t"], 1),
        kill_to_new_s=round(new["t"] - kill_t, 1),
        weights_ok=out["result"].metrics.get("weights_sha256") == reference,
        failure_s=failure_s,
        workers_s=workers_s,
        held_s=held_s,
        moved=moved,
    )


def parse_scenario(spec: str) -> tuple[str, float | None]:
    """``NAME:EVICTION`` -> (name, notice seconds or None for a kill)."""
    name, sep, eviction = spec.partition(":")
    kind, *variants = name.split("+")
    if not sep or kind not in ("spotfallback", "ray") or not set(variants) <= {"jit", "relax", "hold"}:
        raise SystemExit(f"--scenario {spec!r}: expected (spotfallback|ray)[+jit][+relax][+hold]:(SECONDS|kill)")
    if eviction == "kill":
        return name, None
    try:
        return name, float(eviction)
    except ValueError:
        raise SystemExit(f"--scenario {spec!r}: the eviction is a notice in seconds or 'kill'") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--notice", type=float, default=8.0)
    parser.add_argument("--at-step", type=int, default=8)
    parser.add_argument("--rank", type=int, default=1, choices=(0, 1), help="whose node is evicted (0 writes checkpoints)")
    parser.add_argument(
        "--only", nargs="*", default=None, help="scenarios: spotfallback+jit, spotfallback, ray+jit, ray"
    )
    parser.add_argument(
        "--scenario",
        action="append",
        default=None,
        metavar="NAME:EVICTION",
        help="instead of the default five: e.g. spotfallback:kill, ray+jit:8, spotfallback+jit+relax:8 (repeatable)",
    )
    args = parser.parse_args()

    from tests.support.helpers_e2e import apply_env

    apply_env()
    from spotfallback.local import Injector, LocalSpotCluster, NodeGroup

    scenarios = [
        ("spotfallback+jit", args.notice),
        ("spotfallback+jit", None),
        ("ray", args.notice),
        ("ray", None),
        ("ray+jit", args.notice),
    ]
    if args.scenario:
        scenarios = [parse_scenario(spec) for spec in args.scenario]
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
    print("\n| scenario | evicted rank | last step before | resumed at | steps redone | stall (s) | kill -> new step (s) "
          "| kill -> failure decided (s) | kill -> workers up (s) | weights bit-identical |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.scenario} | {r.evicted_rank} | {r.last_before} | {r.resumed_at} | {r.redone} | {r.stall_s} "
              f"| {r.kill_to_new_s} | {_dash(r.failure_s)} | {_dash(r.workers_s)} | {r.weights_ok} |")


def _dash(value: float | None) -> str:
    return "-" if value is None else f"{value}"


if __name__ == "__main__":
    main()
