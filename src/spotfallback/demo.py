"""`spotfallback demo`: the whole story on an embedded local spot cluster, in about two minutes.

Starts a head (no CPUs: the driver and Ray Train's controller) with two spot and two
on-demand nodes, trains the PyTorch DDP example on a spot → on-demand ladder, preempts spot
nodes (drain with a notice, then kill) until the spot budget is spent, and prints the tier
timeline, the final accuracy and the spend against an all-on-demand run.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .config import Tier

# AWS us-east-1 p3.2xlarge list prices per instance-hour: on-demand and a typical spot price.
SPOT_PRICE = 0.92
ON_DEMAND_PRICE = 3.06

DEMO_CONFIG = {"total_steps": 40, "checkpoint_every": 5, "step_delay_s": 0.1, "seed": 0}

console = Console(highlight=False)


def _example_root() -> Path:
    """The source checkout holding ``examples/`` (the demo runs the repository's example)."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (base / "examples" / "ddp_digits.py").is_file():
            return base
    raise SystemExit("spotfallback demo runs the repository's examples/ddp_digits.py; run it from a source checkout")


def _env(root: Path) -> None:
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    os.environ.setdefault("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "1")
    os.environ.setdefault("SPOTFALLBACK_LEASE_TTL_S", "10")
    paths = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def _describe(record: Any, t0: float, tiers: list[Tier]) -> str | None:
    ev, tier = record.event, tiers[min(record.tier, len(tiers) - 1)].name
    at = f"[dim]{record.t - t0:6.1f}s[/]"
    decision = record.decision or {}
    match ev.kind:
        case "run_started":
            return f"{at}  run started, waiting for [bold]{tier}[/] workers"
        case "workers_acquired":
            return f"{at}  {ev.num_workers} workers up on [bold]{tier}[/]"
        case "checkpoint_committed":
            return f"{at}  checkpoint committed (step {ev.step})"
        case "preempted" | "node_failed" | "capacity_timed_out" | "application_failed":
            what = {"preempted": "[yellow]preemption[/]", "node_failed": "[yellow]node lost[/]",
                    "capacity_timed_out": "[yellow]no capacity[/]", "application_failed": "[red]training error[/]"}[ev.kind]
            if decision.get("action") == "switch_tier":
                then = f"[bold magenta]→ fall back to {tiers[decision['to_tier']].name}[/] ({decision['reason']})"
            elif decision.get("action") == "retry":
                then = f"→ restart on {tier} from the latest checkpoint"
            else:
                then = f"→ {decision.get('action')}"
            return f"{at}  {what} on [bold]{tier}[/] {then}"
        case "finished":
            return f"{at}  [green]finished[/]"
    return None


def run_demo(verbose: bool = False, keep: bool = False) -> int:
    from .accounting import summarize
    from .local import Injector, LocalSpotCluster, NodeGroup
    from .runner import FallbackTrainer

    root = _example_root()
    _env(root)
    import ray.train
    from examples.ddp_digits import train_fn

    tiers = [
        Tier.spot(2, max_preemptions=1, capacity_timeout_s=60, price_per_worker_hour=SPOT_PRICE),
        Tier.on_demand(2, max_failures=3, price_per_worker_hour=ON_DEMAND_PRICE),
    ]
    storage = tempfile.mkdtemp(prefix="spotfallback-demo-")
    name = f"demo-{uuid.uuid4().hex[:6]}"
    console.print("[bold]spotfallback demo[/]: PyTorch DDP on sklearn digits, ladder "
                  f"spot (max_preemptions=1, ${SPOT_PRICE}/worker-h) → on-demand (${ON_DEMAND_PRICE}/worker-h)")
    console.print(f"starting a local cluster: head + 2 spot + 2 on-demand nodes; run at {storage}/{name}")
    t_start = time.time()
    with LocalSpotCluster([NodeGroup("spot", count=2), NodeGroup("on-demand", count=2)], connect=True, verbose=verbose) as cluster, Injector(cluster) as injector:
        trainer = FallbackTrainer(
            train_fn,
            train_loop_config=DEMO_CONFIG,
            tiers=tiers,
            run_config=ray.train.RunConfig(storage_path=storage, name=name),
        )
        box: dict[str, Any] = {}

        def drive() -> None:
            try:
                box["result"] = trainer.fit()
            except BaseException as e:  # shown below
                box["error"] = e

        import threading

        thread = threading.Thread(target=drive, daemon=True)
        thread.start()
        shown = 0
        t0: float | None = None
        attempts_preempted: set[int] = set()
        while thread.is_alive():
            time.sleep(0.3)
            records = trainer.ledger.read()
            if records and t0 is None:
                t0 = records[0].t
            for rec in records[shown:]:
                line = _describe(rec, t0 or rec.t, tiers)
                if line:
                    console.print(line)
            shown = len(records)
            # Preempt a spot node once each spot attempt has committed a checkpoint, until the
            # spot budget is spent; the first time, a replacement spot node arrives.
            acquired = [i for i, r in enumerate(records) if r.event.kind == "workers_acquired"]
            if (
                acquired
                and records[acquired[-1]].tier == 0
                and acquired[-1] not in attempts_preempted
                and any(r.event.kind == "checkpoint_committed" for r in records[acquired[-1]:])
            ):
                attempts_preempted.add(acquired[-1])
                node = injector.preempt_one("spot", notice_s=1.0)
                console.print(f"[dim]        injected: spot node {node.node_id[:8] if node else '?'} preempted (1 s notice)[/]")
                if len(attempts_preempted) == 1:
                    injector.replenish("spot")
                    console.print("[dim]        injected: a replacement spot node joined[/]")
        thread.join()
        records = trainer.ledger.read()
        for rec in records[shown:]:
            line = _describe(rec, t0 or rec.t, tiers)
            if line:
                console.print(line)
    if "error" in box:
        console.print(f"[bold red]the run failed:[/] {box['error']}")
        return 1
    result = box["result"]
    summary = summarize(trainer.ladder, records)
    table = Table(title="tier timeline", show_lines=False)
    for col in ("tier", "attempts", "running", "waiting", "lost work", "preemptions", "spend"):
        table.add_column(col, justify="right" if col != "tier" else "left")
    for usage in summary.tiers:
        table.add_row(usage.name, str(usage.attempts), f"{usage.running_s:.1f}s", f"{usage.waiting_s:.1f}s",
                      f"{usage.lost_s:.1f}s", str(usage.preemptions), f"${usage.spend:.5f}")
    console.print(table)
    metrics = result.metrics or {}
    saving = 1 - summary.spend / summary.on_demand_spend if summary.on_demand_spend else 0.0
    console.print(f"final step {metrics.get('step')} / {DEMO_CONFIG['total_steps']}, "
                  f"test accuracy [bold]{metrics.get('accuracy', float('nan')):.3f}[/], weights {str(metrics.get('weights_sha256'))[:16]}…")
    console.print(f"spend ${summary.spend:.5f} vs all-on-demand ${summary.on_demand_spend:.5f} for the same useful work "
                  f"({saving:+.0%} saved; {summary.spot_fraction:.0%} of the work on spot)")
    console.print(f"wall time {time.time() - t_start:.0f}s; ledger: {trainer.location.uri()}/_spotfallback/ledger")
    if not keep:
        import shutil

        shutil.rmtree(storage, ignore_errors=True)
    return 0
