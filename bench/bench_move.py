"""Idle time per announced eviction: the gang moved off the draining node vs held until it goes.

The DDP example (2 workers, 100 steps, a checkpoint every 5, just-in-time checkpoints asking
Ray every second) on the harness's cluster, evicted once rank 0 has completed step 8, on
rank 1's node, with a spare spot node up (the replacement exists: no provisioning delay).
Notices of 4 s (shorter than a restart here) and 20 s (longer). ``spotfallback+jit``
moves: once the just-in-time checkpoint is committed and the next gang fits off the draining
node, rank 0 ends the attempt and Ray Train restarts at once. ``spotfallback+jit+hold``
holds until the node goes (``PreemptionWatch(move=False)``, the behaviour before moving).
``ray`` is plain ``TorchTrainer`` with periodic checkpoints, for comparison. Per eviction:
*held* = just-in-time checkpoint reported → the gang stopped (from the ledger); *stall* =
last step before the eviction → first step beyond it after the restart; *kill → new step*:
negative when the gang trained again before the node went. Every run's final weights are
compared with an uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.harness import Figure, Measurement, Stat, Target, table, values
from bench.runs import Context, alternating

SHORT_S, LONG_S = 4.0, 20.0
AT_STEP = 8
# The example as in bench_notices, long enough that plain Ray Train, which trains through the
# notice, is still running when the node goes after the longer notice.
CONFIG = {"total_steps": 100, "checkpoint_every": 5, "step_delay_s": 0.15, "seed": 7}
SCENARIOS: tuple[tuple[str, float], ...] = tuple(
    (variant, notice)
    for notice in (SHORT_S, LONG_S)
    for variant in ("spotfallback+jit", "spotfallback+jit+hold", "ray")
)
_LABEL = {"spotfallback+jit": "moved", "spotfallback+jit+hold": "held until the node went", "ray": "plain Ray Train"}


def run(ctx: Context) -> list[dict[str, Any]]:
    from bench import bench_notices

    reference = bench_notices.make_fit("spotfallback", ctx.storage, "move-reference", dict(CONFIG))()
    ref_hash = reference.metrics["weights_sha256"]
    rows = []
    for rep in range(ctx.reps(2, 1)):
        for scenario, notice in alternating(SCENARIOS, rep):
            row = bench_notices.run_scenario(
                ctx.cluster, ctx.injector, ctx.storage, scenario, notice, AT_STEP, 1, ref_hash, base=CONFIG
            )
            d = dataclasses.asdict(row)
            d.update(variant=scenario, notice_s=notice, rep=rep)
            ctx.log(f"move {d['scenario']} rep {rep}: held {row.held_s} s, stall {row.stall_s} s, "
                    f"kill -> new step {row.kill_to_new_s} s")
            rows.append(d)
    return rows


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    out = []
    for notice in (SHORT_S, LONG_S):
        moved = Stat.of(values(rows, "held_s", variant="spotfallback+jit", notice_s=notice))
        held = Stat.of(values(rows, "held_s", variant="spotfallback+jit+hold", notice_s=notice))
        out.append(Figure(11, f"Held after the just-in-time checkpoint, moved, {notice:g} s notice", "s",
                          Target("≤ 1 s (the commit, then the move)", max=1.0), moved, 1,
                          note=f"held until the node went: {held.median:.1f} s", worst=True))
        for variant in ("spotfallback+jit", "spotfallback+jit+hold", "ray"):
            stall = Stat.of(values(rows, "stall_s", variant=variant, notice_s=notice))
            ray = Stat.of(values(rows, "stall_s", variant="ray", notice_s=notice))
            target = (Target("≤ plain Ray Train's", max=ray.median) if variant == "spotfallback+jit" and ray.n
                      else Target("report (comparison)"))
            out.append(Figure(11, f"Downtime per eviction ({_LABEL[variant]}), {notice:g} s notice", "s", target, stall, 1))
    trained = Stat.of(values(rows, "kill_to_new_s", variant="spotfallback+jit", notice_s=LONG_S))
    out.append(Figure(11, f"Node gone → first new step, moved, {LONG_S:g} s notice (< 0: training before the node went)",
                      "s", Target("< 0", max=0.0), trained, 1, worst=True))
    return out


def describe(rows: list[dict[str, Any]]) -> str:
    body = [
        (r["rep"], r["scenario"], r["held_s"] if r["held_s"] is not None else float("nan"), r["moved"],
         r["stall_s"], r["kill_to_new_s"], r["redone"], r["weights_ok"])
        for r in rows
    ]
    return (__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n" + table(
        ["rep", "scenario", "held (s)", "moved", "stall (s)", "kill → new step (s)", "steps redone",
         "weights bit-identical"],
        body,
    )


MEASUREMENT = Measurement(
    name="move", items=(11,), title="Idle time per announced eviction: move vs hold", run=run, figures=figures,
    describe=describe,
)
