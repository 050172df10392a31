"""Items 2 and 3: recovery after a preemption and the tier switch, next to a plain Ray Train restart.

Three scenarios, alternated and repeated on the harness's cluster (a spare node of each
market is always up, so node start-up time does not enter the comparison; on the autoscaled
cluster the autoscaler replaces the preempted node meanwhile):

- ``ray-restart``: plain ``TorchTrainer`` pinned to spot, ``FailureConfig(max_failures=3,
  max_preemption_failures=3)``: a preemption and Ray's own restart on spot.
- ``sf-restart``: ``FallbackTrainer`` with spot ``max_preemptions=3``: same-tier restart.
- ``sf-switch``: ``FallbackTrainer`` with spot ``max_preemptions=0``: the preemption spends
  the budget and the run resumes on the on-demand tier.

Each run trains the DDP example; once rank 0 has completed step 8, the spot node hosting
the most workers is preempted (1 s notice, then killed). Recovery is the time from the kill
to the first step completed by the restarted gang (rank 0's step log: the first step logged
by a new process). Ray Train's controller callbacks split every variant's recovery into
kill → new worker group asked for → group placed and started → first step; for spotfallback
its ledger also gives detection (kill → failure recorded), placement (→ workers acquired)
and restart overhead (→ first step starts), which calibrate figure 7.

Standalone: ``python -m bench.bench_recovery [--quick]`` (= ``python -m bench --only recovery``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import Figure, Measurement, Results, Stat, Target, ratio_pairs, table, values
from bench.runs import (
    Context,
    alternating,
    fallback_trainer,
    first,
    ledger_times,
    median,
    read_jsonl,
    stamps_callback,
    step_intervals,
    torch_trainer,
    unique,
)

CONFIG = {"total_steps": 24, "checkpoint_every": 4, "step_delay_s": 0.1, "seed": 3}
AT_STEP = 8
NOTICE_S = 1.0
SCENARIOS = ("ray-restart", "sf-restart", "sf-switch")


def one_run(ctx: Context, scenario: str, rep: int) -> dict[str, Any]:
    from tests.support.helpers_e2e import Background

    from spotfallback import Tier

    log = ctx.path(scenario, ".steps")
    stamps = ctx.path(scenario, ".stamps")
    cfg = {**CONFIG, "step_log": str(log)}
    name = unique(scenario)
    callbacks = [stamps_callback(stamps)]
    if scenario == "ray-restart":
        trainer = torch_trainer(cfg, ctx.storage, name, callbacks=callbacks)
    else:
        budget = 3 if scenario == "sf-restart" else 0
        tiers = [Tier.spot(2, max_preemptions=budget, capacity_timeout_s=120), Tier.on_demand(2)]
        trainer = fallback_trainer(cfg, ctx.storage, name, tiers, callbacks=callbacks)
    driver = Background(trainer.fit)
    deadline = time.monotonic() + 240
    while not any(s["step"] >= AT_STEP for s in read_jsonl(log)):
        if driver.done:
            raise RuntimeError(f"{scenario} ended before the fault: {driver.error!r}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{scenario}: step {AT_STEP} not reached in 240 s")
        time.sleep(0.05)
    t_drain = time.time()
    ctx.injector.preempt_one("spot", notice_s=NOTICE_S)
    killed = time.time()
    driver.join(300)
    if driver.error is not None:
        raise RuntimeError(f"{scenario} failed: {driver.error!r}")
    steps = read_jsonl(log)
    old = [s for s in steps if s["pid"] == steps[0]["pid"]]
    new = [s for s in steps if s["pid"] != steps[0]["pid"]]
    plain, _ = step_intervals(old, CONFIG["checkpoint_every"])
    step_s = median(plain)
    row: dict[str, Any] = {
        "variant": scenario,
        "rep": rep,
        "recovery_s": new[0]["t"] - killed,
        "last_step_before": old[-1]["step"],
        "first_step_after": new[0]["step"],
        "redone_steps": old[-1]["step"] - new[0]["step"] + 1,
        "step_s": step_s,
        "final_step": (driver.result.metrics or {}).get("step"),
        "kill_s": killed - t_drain - NOTICE_S,  # the node's removal, after its notice
    }
    # Where the recovery goes, for every variant alike (Ray Train's own controller callbacks):
    # the kill -> the controller asks for a new worker group -> it is placed and started.
    marks = read_jsonl(stamps)
    asked = next((m["t"] for m in marks if m["event"] == "acquiring" and m["t"] > killed), None)
    started = next((m["t"] for m in marks if m["event"] == "acquired" and m["t"] > killed), None)
    if asked and started:
        row["to_new_group_s"] = asked - killed
        row["new_group_start_s"] = started - asked
        row["to_first_step_s"] = new[0]["t"] - started
    if scenario != "ray-restart":
        times = ledger_times(trainer.ledger.read())
        failed = first(times, "preempted") or first(times, "node_failed")
        acquired = first(times, "workers_acquired", after=failed or killed)
        row["final_tier"] = times[-1][2]
        if failed and acquired:
            row["detect_s"] = failed - killed  # billed on the old gang: kill -> failure recorded
            row["restart_wait_s"] = acquired - failed  # unbilled: new gang placed
            row["restart_overhead_s"] = new[0]["t"] - step_s - acquired  # billed: -> first step starts
    start_s = ctx.one_node_start_s("spot")
    if start_s is not None:
        row["node_start_s"] = start_s  # one spot node started and registered
    return row


def run(ctx: Context) -> list[dict[str, Any]]:
    rows = []
    for rep in range(ctx.reps(3, 1)):
        order = alternating(SCENARIOS, rep)
        for scenario in order:
            row = one_run(ctx, scenario, rep)
            ctx.log(f"recovery {scenario} rep {rep}: {row['recovery_s']:.1f} s, {row['redone_steps']} steps redone")
            rows.append(row)
    return rows


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    return [
        Figure(2, "Recovery after a preemption (kill → first step after restart), same tier: spotfallback / plain Ray Train",
               "×", Target("≤ 1.0×", max=1.0), Stat.of(ratio_pairs(rows, "rep", "sf-restart", "ray-restart", "recovery_s"))),
        Figure(3, "Tier switch (budget spent at the kill → first step on on-demand) / plain Ray same-tier restart",
               "×", Target("≤ 1.1×", max=1.1), Stat.of(ratio_pairs(rows, "rep", "sf-switch", "ray-restart", "recovery_s"))),
        Figure(2, "Recovery, plain Ray Train restart on spot (absolute)", "s", Target("report"),
               Stat.of(values(rows, "recovery_s", variant="ray-restart")), 1),
    ]


def describe(rows: list[dict[str, Any]]) -> str:
    nan = float("nan")
    summary = []
    base = Stat.of(values(rows, "recovery_s", variant="ray-restart")).median
    for s in SCENARIOS:
        st = Stat.of(values(rows, "recovery_s", variant=s))
        parts = [Stat.of(values(rows, k, variant=s)).median for k in ("to_new_group_s", "new_group_start_s", "to_first_step_s")]
        summary.append((s, st.median, f"{st.lo:.1f}–{st.hi:.1f}", st.median / base if base else float("nan"),
                        *parts, str([r["redone_steps"] for r in rows if r["variant"] == s]), st.n))
    body = [
        (r["rep"], r["variant"], r["recovery_s"], r.get("to_new_group_s", nan), r.get("new_group_start_s", nan),
         r.get("to_first_step_s", nan), r.get("detect_s", nan), r.get("restart_wait_s", nan), r.get("restart_overhead_s", nan),
         r["last_step_before"], r["first_step_after"], r.get("final_tier", "-"))
        for r in rows
    ]
    return (
        (__doc__ or "").split("\n\n", 1)[1].split("\n\nStandalone")[0].strip()
        + "\n\n"
        + table(["scenario", "recovery median (s)", "min–max (s)", "ratio to plain Ray (medians)",
                 "kill → new group asked (s)", "→ group started (s)", "→ first step (s)", "steps redone", "runs"], summary)
        + "\n\nEvery run (the first three columns after recovery: Ray Train's controller callbacks, for every "
        "variant; then spotfallback's ledger: kill → failure recorded, → workers acquired, → first step starts):\n\n"
        + table(["rep", "scenario", "recovery (s)", "→ new group asked (s)", "→ group started (s)", "→ first step (s)",
                 "detection (s)", "placement (s)", "restart overhead (s)", "last step before", "first step after",
                 "final tier"], body)
    )


PHASES = (("to_new_group_s", "kill → new group asked for"), ("new_group_start_s", "group placed and started"),
          ("to_first_step_s", "→ first step"))


def explain(rows: list[dict[str, Any]]) -> str:
    """Phase by phase, where spotfallback's recovery differs from plain Ray Train's (medians)."""
    def med(variant: str, key: str) -> float:
        return Stat.of(values(rows, key, variant=variant)).median

    lines = []
    for variant in ("sf-restart", "sf-switch"):
        diffs = [(label, med(variant, key) - med("ray-restart", key)) for key, label in PHASES]
        worst = max(diffs, key=lambda d: d[1])
        lines.append(f"- {variant}: " + "; ".join(f"{label} {d:+.1f} s" for label, d in diffs) + f" (largest: {worst[0]})")
    base = Stat.of(values(rows, "recovery_s", variant="ray-restart"))
    return (
        "Why, phase by phase (median of each variant − median of plain Ray Train's restart):\n\n" + "\n".join(lines)
        + f"\n\nPlain Ray Train's own recovery ranged {base.lo:.1f}–{base.hi:.1f} s over {base.n} runs here. Placing and "
        "starting the new worker group is Ray's own work for every variant (spotfallback only chooses its label "
        "selector and size); a same-tier restart must also wait for the old gang's surviving worker to give its "
        "node back. The CPU profile below shows where the cluster's processes spent their time during one "
        "same-tier restart and one switch."
    )


def write_recovery_page(results: Results, folder: Path) -> None:
    """docs/recovery.md and .json, linked from the README: this measurement's part of the page."""
    rows = results.rows["recovery"]
    mc = results.machine
    data = {"command": results.command, "machine": mc, "results": rows}
    (folder / "recovery.json").write_text(json.dumps(data, indent=1) + "\n")
    figs = "\n".join(
        f"- {f.name}: **{f.stat.fmt()[0]}{f.unit}** (spread {f.stat.fmt()[1] or 'n/a'}, {f.stat.n} pairs; target {f.target.text})"
        for f in figures(rows)[:2]
    )
    (folder / "recovery.md").write_text(
        "# Recovery after a preemption: plain Ray Train vs spotfallback\n\n"
        "Written by `python -m bench` (items 2 and 3 of [benchmarks.md](benchmarks.md)); do not edit by hand.\n\n"
        f"- command: `{results.command}`\n"
        f"- machine: {mc.get('cores')} cores, {mc.get('cpu')}; Ray {mc.get('ray')}; {mc.get('date')}\n"
        "- the machine is shared with other work: compare the ratios within one run, not absolute seconds across runs\n\n"
        f"{figs}\n\n" + describe(rows) + "\n\n"
        "The switch is an ordinary Ray restart with the next tier's label selector and size, so it costs what a "
        "restart costs.\n"
    )


def profile(ctx: Context) -> str:
    """One same-tier and one switching spotfallback recovery under py-spy."""
    from bench.profiling import record

    return record(lambda: [one_run(ctx, s, -1) for s in ("sf-restart", "sf-switch")])


MEASUREMENT = Measurement(
    name="recovery", items=(2, 3), title="Recovery after a preemption and the tier switch",
    run=run, figures=figures, describe=describe, explain=explain,
)

if __name__ == "__main__":
    from bench.cli import main

    sys.exit(main(["--only", "recovery", *sys.argv[1:]]))
