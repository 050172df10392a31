"""`spotfallback demo`: the whole story on an embedded local cluster run by Ray's own autoscaler, in about two minutes.

Starts a head (no CPUs: the driver, Ray Train's controller and Ray's autoscaler v2) whose
autoscaler launches spot and on-demand nodes when the run asks for them, a few seconds after
each request (``spotfallback.local.autoscaling``, as KubeRay's autoscaler adds pods), and
trains the PyTorch DDP example (``spotfallback.examples.ddp_digits``, part of the installed
package, so the demo runs from any directory) on a spot → on-demand ladder. It preempts spot
nodes until the spot budget is spent, the way a cloud does: a preemption notice (the node is
drained with a deadline, as ``spotfallback notice-agent`` does for a real notice), then the
node goes. At each notice the replacement is launched at once (the first time on spot, where
the cloud has room for one more node; the second time on on-demand, the spot budget being
spent); the gang trains on through the notice, takes its just-in-time checkpoint once the
replacement is up and moves onto it before the node goes, so each eviction redoes no steps.
At the end it prints the tier timeline, the steps redone per eviction (measured from the
example's step log), the final accuracy and the spend against all-on-demand, and draws the
run's timeline picture.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from spotfallback.config import Tier
from spotfallback.errors import EXIT_BAD_INPUT
from spotfallback.store.files import replace_file, write_problem

# AWS us-east-1 p3.2xlarge list prices per instance-hour: on-demand and a typical spot price.
SPOT_PRICE = 0.92
ON_DEMAND_PRICE = 3.06
# Longer than a node's launch (LAUNCH_DELAY_S plus its start) and a checkpoint write, even on a
# busy laptop, so the gang moves before the node goes; clouds give 30 s (GCP, Azure) to 2 minutes (AWS).
NOTICE_S = 20.0
LAUNCH_DELAY_S = 2.0  # from the autoscaler's launch to the node starting, as a cloud's VM takes longer

DEMO_CONFIG: dict[str, Any] = {
    "total_steps": 80,
    "checkpoint_every": 5,
    "step_delay_s": 0.2,
    "seed": 0,
    "preemption_check_every_s": 1.0,  # ask Ray about a notice about once a second; train on, then JIT checkpoint
    "preemption_hold_s": 30.0,
}

console = Console(highlight=False, soft_wrap=True)  # long lines stay whole in logs


def _env() -> None:
    """Ray Train V2 with short polls, and a short lease: set before Ray starts the cluster."""
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    os.environ.setdefault("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "1")
    os.environ.setdefault("SPOTFALLBACK_LEASE_TTL_S", "10")


def steps_redone(step_log: Path) -> list[tuple[int, int, int]]:
    """(last step done before an eviction, first step after it, steps redone) per restart.

    Rank 0 of each attempt appends every step it completes, with its process id; a new process
    id is a new attempt. Steps redone = last step before - first step after + 1 (0 when the run
    resumed at exactly the next step).
    """
    attempts: list[list[int]] = []
    last_pid = None
    for line in step_log.read_text().splitlines() if step_log.exists() else []:
        entry = json.loads(line)
        if entry["pid"] != last_pid:
            attempts.append([])
            last_pid = entry["pid"]
        attempts[-1].append(int(entry["step"]))
    return [(a[-1], b[0], max(0, a[-1] - b[0] + 1)) for a, b in zip(attempts, attempts[1:], strict=False) if a and b]


def run_demo(verbose: bool = False, keep: bool = False, out: Path | None = None) -> int:
    """Run the demo; returns the exit code. ``out``: where the timeline picture goes."""
    from spotfallback.accounting import summarize
    from spotfallback.local import Injector, NodeGroup
    from spotfallback.local.autoscaling import AutoscaledGroup, LocalAutoscalingCluster
    from spotfallback.notices.jit import jit_failure_config
    from spotfallback.runtime.trainer import FallbackTrainer
    from spotfallback.view.report import cost_report
    from spotfallback.view.text import describe_event, money, print_wide
    from spotfallback.view.timeline import timeline_png

    _env()
    import ray.train

    from spotfallback.examples.ddp_digits import train_fn

    out = out or Path("spotfallback-demo-timeline.png")
    tiers = [
        Tier.spot(2, max_preemptions=1, capacity_timeout_s=60, price_per_worker_hour=SPOT_PRICE),
        Tier.on_demand(2, max_failures=3, price_per_worker_hour=ON_DEMAND_PRICE),
    ]
    storage = tempfile.mkdtemp(prefix="spotfallback-demo-")
    name = f"demo-{uuid.uuid4().hex[:6]}"
    step_log = Path(storage) / "steps.jsonl"
    console.print("[bold]spotfallback demo[/]: PyTorch DDP on handwritten digits, ladder "
                  f"spot (max_preemptions=1, ${SPOT_PRICE}/worker-h) → on-demand (${ON_DEMAND_PRICE}/worker-h)")
    console.print("starting a local cluster: a head running Ray's autoscaler, which launches up to 2 spot and 2 "
                  f"on-demand nodes when asked ({LAUNCH_DELAY_S:g} s + a node's start each); run at {storage}/{name}")
    t_start = time.time()
    groups = [
        AutoscaledGroup(NodeGroup("spot"), max_workers=3, cap=2, delay_s=LAUNCH_DELAY_S),
        AutoscaledGroup(NodeGroup("on-demand"), max_workers=2, delay_s=LAUNCH_DELAY_S),
    ]
    with LocalAutoscalingCluster(groups, connect=True, verbose=verbose) as cluster, Injector(cluster) as injector:
        trainer = FallbackTrainer(
            train_fn,
            train_loop_config={**DEMO_CONFIG, "step_log": str(step_log)},
            tiers=tiers,
            run_config=ray.train.RunConfig(storage_path=storage, name=name, failure_config=jit_failure_config()),
        )
        injector.record_notices(trainer.location)  # the notices go into the run's ledger and timeline
        box: dict[str, Any] = {}

        def drive() -> None:
            try:
                box["result"] = trainer.fit()
            except BaseException as e:  # shown below
                box["error"] = e

        thread = threading.Thread(target=drive, daemon=True)
        thread.start()
        shown = 0
        t0: float | None = None
        attempts_preempted: set[int] = set()

        def show(records: list[Any]) -> None:
            nonlocal shown, t0
            if records and t0 is None:
                t0 = records[0].t
            for rec in records[shown:]:
                line = describe_event(rec, t0 or rec.t, trainer.ladder)
                if line:
                    console.print(line, soft_wrap=True)
            shown = len(records)

        while thread.is_alive():
            time.sleep(0.3)
            records = trainer.ledger.read()
            show(records)
            # Preempt a spot node once each spot attempt has committed a checkpoint, until the
            # spot budget is spent; the first time the cloud has room for a replacement spot node.
            acquired = [i for i, r in enumerate(records) if r.event.kind == "workers_acquired"]
            if (
                acquired
                and records[acquired[-1]].tier == 0
                and acquired[-1] not in attempts_preempted
                and any(r.event.kind == "checkpoint_committed" for r in records[acquired[-1]:])
            ):
                attempts_preempted.add(acquired[-1])
                room = len(attempts_preempted) == 1
                if room:
                    cluster.set_capacity("spot", 3)
                console.print(f"[dim]        injecting: a preemption notice for a spot node ({NOTICE_S:g} s), then the "
                              "node goes" + ("; the cloud has room for one more spot node" if room else "") + "[/]")
                injector.preempt_one("spot", notice_s=NOTICE_S)  # returns once the node is gone
                if room:
                    cluster.set_capacity("spot", 2)
        thread.join()
        records = trainer.ledger.read()
        show(records)
    if "error" in box:
        console.print(f"[bold red]the run failed:[/] {box['error']}")
        return 1
    result = box["result"]
    summary = summarize(trainer.ladder, records)
    report = cost_report(trainer.ladder, records)
    table = Table(title="tier timeline", show_lines=False)
    for col in ("tier", "attempts", "running", "waiting", "redone", "held", "preemptions", "spend"):
        table.add_column(col, justify="right" if col != "tier" else "left")
    for t in report.tiers:
        table.add_row(t.name, str(t.attempts), f"{t.running_h * 3600:.1f}s", f"{t.waiting_h * 3600:.1f}s",
                      f"{t.redone_h * 3600:.1f}s", f"{t.held_h * 3600:.1f}s", str(t.preemptions), money(t.spend))
    print_wide(console, table)  # whole numbers even in a narrow or piped terminal
    console.print("[dim]redone: work done again after a restart; held: after a just-in-time checkpoint, the "
                  "workers wait for the replacement or for the node to go (billed, nothing to redo)[/]")
    for i, (last, first, redone) in enumerate(steps_redone(step_log), 1):
        console.print(f"eviction {i}: last step done {last}, resumed at step {first}: "
                      f"[bold]{redone} steps redone[/]" + (" (just-in-time checkpoint)" if redone == 0 else ""))
    metrics = result.metrics or {}
    saving = 1 - summary.spend / summary.on_demand_spend if summary.on_demand_spend else 0.0
    console.print(f"final step {metrics.get('step')} / {DEMO_CONFIG['total_steps']}, "
                  f"test accuracy [bold]{metrics.get('accuracy', float('nan')):.3f}[/], weights {str(metrics.get('weights_sha256'))[:16]}…")
    console.print(f"spend {money(summary.spend)} vs all-on-demand {money(summary.on_demand_spend)} for the same useful work "
                  f"({saving:+.0%} saved; {summary.spot_fraction:.0%} of the work on spot)")
    try:
        replace_file(out, timeline_png(trainer.ladder, records, title="spotfallback demo: spot → on-demand"))
    except OSError as e:  # e.g. the disk filled during the run: the run's figures above stand
        console.print(f"[red]error:[/red] --out: {escape(write_problem(out, e))}")
        code = EXIT_BAD_INPUT
    else:
        console.print(f"timeline picture: {out}; wall time {time.time() - t_start:.0f}s; "
                      f"ledger: {trainer.location.uri()}/_spotfallback/ledger" + ("" if keep else " (removed; --keep keeps it)"))
        code = 0
    if not keep:
        import shutil

        shutil.rmtree(storage, ignore_errors=True)
    return code
