"""Downtime per announced eviction when the replacement must be provisioned: moved, held, plain Ray Train.

On ``spotfallback.local.autoscaling`` (Ray's autoscaler v2 over the fake multi-node provider),
in a process of its own (``python -m bench.bench_move_autoscaled --out FILE``: the harness's
driver is connected to the other local cluster). Spot nodes are launched only on request, a
provisioning delay after it; the DDP example (2 workers, 150 steps, a checkpoint every 5) runs
on two of them, no spare up. Once rank 0 has completed step 8, rank 1's node gets a 30 s
notice (a drain with reason PREEMPTION) and is killed at the deadline; the cloud has room for
one more spot node. Provisioning delays of 5 s (with the node's start, shorter than the notice)
and 60 s (longer). *Launch asked* / *replacement up*: from the notice to the autoscaler asking
the provider for the node (its line in ``monitor.log``) / to the new spot node alive.
Ray's autoscaler (v2) launches the replacement at the drain in every variant: the draining node
no longer counts toward Ray Train's standing request for its gang (on the same tier a move asks
for nothing more). ``spotfallback+jit`` trains through the notice and saves, then moves, once the
replacement fits, or saves at the save's lead before the deadline; ``spotfallback+jit+hold`` saves
at the notice and holds until the node goes (the behaviour before); ``ray`` is plain ``TorchTrainer`` with periodic checkpoints. *Stall*: last step
before the eviction → first step beyond it after the restart; *one plain Ray Train restart* is
``ray``'s stall with no provisioning delay, measured in the same run. The target for the moved
run is the issue's: downtime ≤ max(0, delay − notice) + one plain Ray Train restart.
Two more events, with the 5 s delay, check that nothing else got slower than holding (the
behaviour before): an *unannounced kill* of rank 1's node (no notice; the autoscaler replaces it
once it is gone), and a notice when the cloud has *no room* for a replacement until the node
goes (the moved run then saves at its lead and holds, as the held one does after saving at once).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness import REPO, Figure, Measurement, Stat, Target, table, values
from bench.runs import Context, alternating

# A local node takes several seconds to start after its provisioning delay, more on a loaded
# machine: the short delay plus that start must fit in the notice, the long one must not.
NOTICE_S = 30.0
SHORT_DELAY_S, LONG_DELAY_S = 5.0, 60.0
AT_STEP = 8
# Long enough that plain Ray Train, which trains through the notice, is still running at the kill.
CONFIG = {"total_steps": 150, "checkpoint_every": 5, "step_delay_s": 0.15, "seed": 7}
VARIANTS = ("spotfallback+jit", "spotfallback+jit+hold", "ray")
# What happens to rank 1's node: a notice with room for the replacement, the kill with no notice,
# a notice with no room until the node goes.
EVENTS = ("notice", "kill", "no-room")
SCENARIOS: tuple[tuple[str, float, str], ...] = (
    (("ray", 0.0, "notice"),)
    + tuple((variant, delay, "notice") for delay in (SHORT_DELAY_S, LONG_DELAY_S) for variant in VARIANTS)
    + tuple((variant, SHORT_DELAY_S, event) for event in EVENTS[1:] for variant in VARIANTS)
)
_LABEL = {"spotfallback+jit": "moved", "spotfallback+jit+hold": "held until the node went", "ray": "plain Ray Train"}
_EVENT = {"notice": f"{NOTICE_S:g} s notice", "kill": "unannounced kill", "no-room": f"{NOTICE_S:g} s notice, no room"}


def _cluster(delay_s: float) -> Any:
    from spotfallback import Tier
    from spotfallback.local.autoscaling import AutoscaledGroup, LocalAutoscalingCluster

    spot = Tier.spot(2)
    return LocalAutoscalingCluster([AutoscaledGroup.for_tier(spot, cap=2, delay_s=delay_s)], connect=True)


def launch_asked_s(cluster: Any, since: float) -> float | None:
    """When the autoscaler first asked the provider for a spot node at or after ``since``: the
    provider's "launch of ... asked" line in the session's ``monitor.log`` (local time)."""
    path = os.path.join(cluster.temp_dir or "", "session_latest", "logs", "monitor.log")
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if "launch of" in line and "'spot' nodes asked" in line:
            stamp, _, millis = line[:23].partition(",")
            try:
                t = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
            except ValueError:
                continue
            if t >= since - 0.5:
                return t
    return None


def one_eviction(cluster: Any, storage: Path, scenario: str, delay_s: float, reference: str,
                 event: str = "notice") -> dict[str, Any]:
    """Run the example on two fresh-or-idle spot nodes, take rank 1's node as ``event`` says, measure."""
    from bench import bench_notices
    from spotfallback.notices.drain import drain_for_preemption, gcs_client
    from spotfallback.view.intervals import announced_evictions

    cluster.set_capacity("spot", 2, delay_s=delay_s)
    log, fit, driver, out = bench_notices.start_until_step(storage, scenario, AT_STEP, CONFIG)
    rank0 = bench_notices.read_steps(log)[-1]["node"]
    before = {n["NodeID"] for n in cluster.alive_nodes("spot")}
    doomed = next(n for n in before if n != rank0)
    if event == "notice":
        cluster.set_capacity("spot", 3)  # room for the replacement, a delay away
    notice_t = time.time()
    if event != "kill":
        drain_for_preemption(gcs_client(), doomed, notice_t + NOTICE_S, "a spot notice, from the benchmark")
    up: list[float] = []

    def watch_replacement() -> None:
        while driver.is_alive() and not up:
            if {n["NodeID"] for n in cluster.alive_nodes("spot")} - before:
                up.append(time.time())
            time.sleep(0.5)

    watcher = threading.Thread(target=watch_replacement, daemon=True)
    watcher.start()
    if event != "kill":
        time.sleep(max(0.0, notice_t + NOTICE_S - time.time()))
    gone_early = not cluster.kill_node(doomed)  # the autoscaler may remove the drained node once the gang has left
    kill_t = time.time()
    driver.join(600)
    watcher.join(5)
    if "error" in out:
        raise RuntimeError(f"{scenario}: {out['error']!r}")
    steps = bench_notices.read_steps(log)
    first = [s for s in steps if s["pid"] == steps[0]["pid"]]
    after = [s for s in steps if s["pid"] != steps[0]["pid"]]
    last = first[-1]
    new = next(s for s in after if s["step"] > last["step"])
    held_s, moved, trained_on_s = None, False, None
    ledger = getattr(getattr(fit, "__self__", None), "ledger", None)
    if ledger is not None:
        records = ledger.read()
        evictions = announced_evictions(records)
        if evictions:
            held_s, moved = round(evictions[0].held_s, 2), evictions[0].moved
        started = [r for r in records if r.event.kind == "jit_checkpoint" and r.event.outcome == "started"]
        trained_on_s = started[0].info.get("trained_on_s") if started else None
    cluster.set_capacity("spot", 2)
    asked = launch_asked_s(cluster, notice_t)
    return {
        "scenario": f"{scenario} ({delay_s:g} s provisioning, {_EVENT[event]})", "variant": scenario,
        "event": event, "delay_s": delay_s, "notice_s": 0.0 if event == "kill" else NOTICE_S, "last_before": last["step"], "resumed_at": after[0]["step"],
        "redone": max(0, last["step"] - after[0]["step"] + 1), "stall_s": round(new["t"] - last["t"], 1),
        "kill_to_new_s": round(new["t"] - kill_t, 1), "notice_to_kill_s": round(kill_t - notice_t, 1),
        "held_s": held_s, "moved": moved, "trained_on_s": trained_on_s, "replacement_up_s": round(up[0] - notice_t, 1) if up else None,
        "launch_asked_s": round(asked - notice_t, 1) if asked is not None else None,
        "node_gone_before_deadline": gone_early,
        "weights_ok": out["result"].metrics.get("weights_sha256") == reference,
    }


def measure(reps: int, log: Any = print, events: tuple[str, ...] = EVENTS) -> list[dict[str, Any]]:
    """Every scenario of ``events`` ``reps`` times on one autoscaled local cluster, alternated.

    The plain Ray Train restart with no delay, the other rows' yardstick, is always measured.
    """
    from tests.support.helpers_e2e import apply_env

    from bench import bench_notices

    apply_env()
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.25"
    storage = Path(tempfile.mkdtemp(prefix="sf-move-as-"))
    rows = []
    with _cluster(0.0) as cluster:
        reference = bench_notices.make_fit("spotfallback", storage, "move-reference", dict(CONFIG))()
        ref_hash = reference.metrics["weights_sha256"]
        for rep in range(reps):
            chosen = [sc for sc in SCENARIOS if sc[2] in events or sc[1] == 0.0]
            for scenario, delay, event in alternating(chosen, rep):
                row = one_eviction(cluster, storage, scenario, delay, ref_hash, event)
                row["rep"] = rep
                log(f"move-autoscaled {row['scenario']} rep {rep}: stall {row['stall_s']} s, held {row['held_s']} s, "
                    f"trained on {row['trained_on_s']} s of the notice, "
                    f"replacement launch asked {row['launch_asked_s']} s and up {row['replacement_up_s']} s after the notice, "
                    f"kill -> new step {row['kill_to_new_s']} s")
                rows.append(row)
    return rows


def run(ctx: Context) -> list[dict[str, Any]]:
    """In a process of its own: this process's driver belongs to the harness's cluster."""
    out = ctx.path("move-autoscaled", ".json")
    cmd = [sys.executable, "-m", "bench.bench_move_autoscaled", "--out", str(out), "--reps", str(ctx.reps(2, 1))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    for line in proc.stderr.splitlines():
        if line.startswith("move-autoscaled "):
            ctx.log(line)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows


def one_restart_s(rows: list[dict[str, Any]]) -> float:
    """One plain Ray Train restart, measured: its stall with the replacement provisioned at once."""
    return Stat.of(values(rows, "stall_s", variant="ray", delay_s=0.0)).median


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    restart = one_restart_s(rows)
    out = []
    for delay in (SHORT_DELAY_S, LONG_DELAY_S):
        bound = max(0.0, delay - NOTICE_S) + restart
        for variant in VARIANTS:
            measured = values(rows, "stall_s", variant=variant, delay_s=delay, event="notice")
            if not measured:
                continue
            stall = Stat.of(measured)
            target = (Target(f"≤ max(0, delay − notice) + one plain Ray Train restart ({bound:.1f} s)", max=bound)
                      if variant == "spotfallback+jit" else Target("report (comparison)"))
            out.append(Figure(12, f"Downtime per eviction ({_LABEL[variant]}), {delay:g} s provisioning, "
                                  f"{NOTICE_S:g} s notice", "s", target, stall, 1))
    for event in EVENTS[1:]:
        held = values(rows, "stall_s", variant="spotfallback+jit+hold", delay_s=SHORT_DELAY_S, event=event)
        if not held:
            continue
        today = Stat.of(held).median
        for variant in VARIANTS:
            stall = Stat.of(values(rows, "stall_s", variant=variant, delay_s=SHORT_DELAY_S, event=event))
            target = (Target(f"no slower than holding, the behaviour before ({today:.1f} s, +10% for noise)", max=1.1 * today)
                      if variant == "spotfallback+jit" else Target("report (comparison)"))
            out.append(Figure(12, f"Downtime per eviction ({_LABEL[variant]}), {SHORT_DELAY_S:g} s provisioning, "
                                  f"{_EVENT[event]}", "s", target, stall, 1))
    return out


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def describe(rows: list[dict[str, Any]]) -> str:
    body = [
        (r["rep"], r["scenario"], _or_nan(r.get("trained_on_s")), _or_nan(r["held_s"]), r["moved"],
         _or_nan(r.get("launch_asked_s")), _or_nan(r.get("replacement_up_s")), r["stall_s"], r["kill_to_new_s"],
         r["redone"], r["weights_ok"])
        for r in rows
    ]
    return (__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n" + table(
        ["rep", "scenario", "trained on (s)", "held (s)", "moved", "launch asked (s)", "replacement up (s)", "stall (s)",
         "kill → new step (s)", "steps redone", "weights bit-identical"],
        body,
    ) + f"\n\nOne plain Ray Train restart (its stall, no provisioning delay): {one_restart_s(rows):.1f} s."


MEASUREMENT = Measurement(
    name="move-autoscaled", items=(12,), title="Downtime per announced eviction with provisioning: move vs hold",
    run=run, figures=figures, describe=describe, cluster=False,
)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.bench_move_autoscaled", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="write the rows here (JSON)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--events", default=",".join(EVENTS),
                   help=f"which evictions to measure, comma-separated, of {', '.join(EVENTS)} (default: all)")
    args = p.parse_args()
    events = tuple(e.strip() for e in args.events.split(",") if e.strip())
    if unknown := sorted(set(events) - set(EVENTS)):
        p.error(f"--events: unknown {', '.join(unknown)}; choose from {', '.join(EVENTS)}")
    rows = measure(args.reps, log=lambda s: print(s, file=sys.stderr, flush=True), events=events)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
